package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/internal/freeport"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/internal/natsembed"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// remoteDeviceEnv carries a remoteJob to the test binary re-run as a device
// in another network namespace (TestRemoteDeviceProcess).
const remoteDeviceEnv = "FLEETLEARN_TEST_REMOTE_DEVICE"

// remoteJob is what a device on another host is given: the API address, the
// CA and a token, as an operator hands them out.
type remoteJob struct {
	API   string
	CAPEM []byte
	Token string
	Dir   string
	ID    string
}

// remoteResult is what the device saw.
type remoteResult struct {
	DeviceID, NATSURL string
	Reports           int64
}

const resultFile = "remote-result.json"

// runRemoteDevice enrolls as the README says a device does and runs the
// agent until one of its reports was accepted.
func runRemoteDevice(t testing.TB, job remoteJob) remoteResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // bounds a hang only
	defer cancel()
	e, err := edge.Enroll(ctx, edge.EnrollConfig{API: job.API, CAPEM: job.CAPEM, Token: job.Token, DataDir: job.Dir, DeviceID: job.ID})
	if err != nil {
		t.Fatalf("enroll through %s: %v", job.API, err)
	}
	a, err := edge.New(edge.Config{NATSURL: edge.SavedNATSURL(job.Dir), DataDir: job.Dir, DeviceID: e.DeviceID},
		edge.WithDataset(datatest.Synthetic(20, 4, 2, 1)), edge.WithSandbox(sharedSandbox(t)))
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	for a.Stats().Reports == 0 && ctx.Err() == nil {
		select {
		case err := <-done:
			t.Fatalf("agent stopped before reporting: %v (%+v)", err, a.Stats())
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	<-done
	return remoteResult{DeviceID: e.DeviceID, NATSURL: e.NATSURL, Reports: a.Stats().Reports}
}

// TestRemoteDeviceProcess is the device side of TestRemoteEnrollment when
// that runs it in a network namespace; on its own it does nothing.
func TestRemoteDeviceProcess(t *testing.T) {
	spec := os.Getenv(remoteDeviceEnv)
	if spec == "" {
		t.Skip("runs only as TestRemoteEnrollment's device process")
	}
	var job remoteJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(runRemoteDevice(t, job))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(job.Dir, resultFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// network is where the remote device runs: serverIP is the server's
// address as the device sees it, not a loopback one; run runs the device.
type network struct {
	serverIP string
	how      string
	run      func(t *testing.T, job remoteJob) remoteResult
}

// netnsNetwork puts the device in a network namespace joined to this one by
// a veth pair: its packets reach the server through an interface, not
// loopback. It needs root and ip(8); the reason is returned when it cannot.
func netnsNetwork(t *testing.T) (*network, string) {
	if os.Geteuid() != 0 {
		return nil, "not root"
	}
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		return nil, "no ip(8) in PATH"
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err.Error()
	}
	ip := func(args ...string) error {
		out, err := exec.Command(ipPath, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	// Names and a /30 in 198.18.0.0/15 (RFC 2544, for tests) from the pid,
	// so that test processes running at once do not collide.
	pid := os.Getpid() % 16384
	ns, hostEnd, devEnd := fmt.Sprintf("fltest%d", pid), fmt.Sprintf("flh%d", pid), fmt.Sprintf("fld%d", pid)
	base := fmt.Sprintf("198.18.%d.", pid/64)
	hostIP, devIP := base+strconv.Itoa(pid%64*4+1), base+strconv.Itoa(pid%64*4+2)
	if err := ip("netns", "add", ns); err != nil {
		return nil, err.Error()
	}
	t.Cleanup(func() {
		_ = ip("link", "del", hostEnd) // also removes its peer; gone already if the namespace went first
		if err := ip("netns", "del", ns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for _, args := range [][]string{
		{"link", "add", hostEnd, "type", "veth", "peer", "name", devEnd},
		{"link", "set", devEnd, "netns", ns},
		{"addr", "add", hostIP + "/30", "dev", hostEnd},
		{"link", "set", hostEnd, "up"},
		{"-n", ns, "addr", "add", devIP + "/30", "dev", devEnd},
		{"-n", ns, "link", "set", devEnd, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			return nil, err.Error()
		}
	}
	run := func(t *testing.T, job remoteJob) remoteResult {
		spec, err := json.Marshal(job)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(ipPath, "netns", "exec", ns, exe, "-test.run=^TestRemoteDeviceProcess$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), remoteDeviceEnv+"="+string(spec))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("device in namespace %s: %v\n%s", ns, err, out)
		}
		b, err := os.ReadFile(filepath.Join(job.Dir, resultFile))
		if err != nil {
			t.Fatalf("device in namespace %s left no result: %v\n%s", ns, err, out)
		}
		var r remoteResult
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	return &network{serverIP: hostIP, how: "from network namespace " + ns + " (" + devIP + ") over a veth pair", run: run}, ""
}

// interfaceNetwork runs the device in this process against one of the
// machine's non-loopback addresses.
func interfaceNetwork() (*network, string) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err.Error()
	}
	var v6 string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || !n.IP.IsGlobalUnicast() {
			continue
		}
		if n.IP.To4() != nil {
			return localNetwork(n.IP.String()), ""
		}
		if v6 == "" {
			v6 = n.IP.String()
		}
	}
	if v6 != "" {
		return localNetwork(v6), ""
	}
	return nil, "no non-loopback interface address"
}

func localNetwork(ip string) *network {
	return &network{serverIP: ip, how: "in process to interface address " + ip,
		run: func(t *testing.T, job remoteJob) remoteResult { return runRemoteDevice(t, job) }}
}

// TestRemoteEnrollment: a server started with PublicHost (the README's
// command) listens beyond loopback; a device elsewhere enrolls with
// --api PUBLIC_HOST:PORT against the CA, gets a NATS URL on the public host
// that the certificate covers, and completes a round over it, with NATS in
// plaintext and over TLS.
func TestRemoteEnrollment(t *testing.T) {
	nw, why := netnsNetwork(t)
	if nw == nil {
		var why2 string
		if nw, why2 = interfaceNetwork(); nw == nil {
			t.Skipf("needs a second network to enroll from: a network namespace (%s) or a non-loopback interface address (%s)", why, why2)
		}
		t.Logf("no network namespace (%s): device runs %s", why, nw.how)
	} else {
		t.Logf("device runs %s", nw.how)
	}
	anyHost := "0.0.0.0"
	if net.ParseIP(nw.serverIP).To4() == nil {
		anyHost = "::"
	}
	for _, natsTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("nats-tls=%v", natsTLS), func(t *testing.T) {
			// The ports are picked at random; every interface, as
			// PublicHost's defaults are.
			h := servertest.New(t, servertest.WithPace(50*time.Millisecond), servertest.WithConfig(func(c *server.Config) {
				c.PublicHost, c.NATSTLS = nw.serverIP, natsTLS
				c.GRPCAddr, c.NATSListen = ":0", net.JoinHostPort(anyHost, "0")
			}))
			_, port, err := net.SplitHostPort(h.GRPCAddr())
			if err != nil {
				t.Fatal(err)
			}
			// The operator works on the server host, over loopback.
			conn, err := client.Dial(net.JoinHostPort("127.0.0.1", port), client.WithCA(h.CACertPEM()), client.WithToken(h.AdminToken()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			h.Conn, h.Tasks, h.Models, h.Modules, h.Devices = conn, apiv1.NewTaskServiceClient(conn), apiv1.NewModelServiceClient(conn),
				apiv1.NewModuleServiceClient(conn), apiv1.NewDeviceServiceClient(conn)

			u, err := url.Parse(h.NATSURL())
			if err != nil {
				t.Fatal(err)
			}
			if wantScheme := map[bool]string{false: "nats", true: "tls"}[natsTLS]; u.Hostname() != nw.serverIP || u.Scheme != wantScheme {
				t.Fatalf("devices are told NATS is at %s, want %s://%s:PORT", h.NATSURL(), wantScheme, nw.serverIP)
			}
			task := trivialTask(t, h, 1)
			tok, err := h.Devices.CreateEnrollmentToken(t.Context(), &pb.CreateEnrollmentTokenRequest{})
			if err != nil {
				t.Fatal(err)
			}
			id := "remote-" + map[bool]string{false: "plain", true: "tls"}[natsTLS]
			got := nw.run(t, remoteJob{API: net.JoinHostPort(nw.serverIP, port), CAPEM: h.CACertPEM(), Token: tok.GetToken(),
				Dir: t.TempDir(), ID: id})
			if got.DeviceID != id || got.NATSURL != h.NATSURL() || got.Reports == 0 {
				t.Fatalf("device: %+v; want id %s, NATS %s, a report", got, id, h.NATSURL())
			}
			done := h.WaitTask(t, task.Id, time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
			if done.State != pb.TaskState_TASK_STATE_COMPLETED {
				t.Fatalf("task %v: %s", done.State, done.StateReason)
			}
			list, err := h.Devices.ListDevices(t.Context(), &pb.ListDevicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.GetDevices()) != 1 || list.GetDevices()[0].GetId() != id {
				t.Fatalf("enrolled devices: %v", list.GetDevices())
			}
		})
	}
}

// TestEmbeddedNATSURL: what enrollment tells devices about the embedded
// NATS server: a loopback listener as it is, even with PublicHost; on every
// interface, the advertised URL or PublicHost; never 0.0.0.0, and without
// either the server refuses to start and says what to set.
func TestEmbeddedNATSURL(t *testing.T) {
	h := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.PublicHost = "fl.example.com" }))
	if u, err := url.Parse(h.NATSURL()); err != nil || u.Hostname() != "127.0.0.1" {
		t.Errorf("loopback listener with a public host: devices are told %s", h.NATSURL())
	}
	h = servertest.New(t, servertest.WithConfig(func(c *server.Config) {
		c.NATSListen, c.NATSTLS, c.PublicHost, c.GRPCAddr = "0.0.0.0:0", true, "fl.example.com", "127.0.0.1:0"
	}))
	if u, err := url.Parse(h.NATSURL()); err != nil || u.Hostname() != "fl.example.com" || u.Scheme != "tls" || u.Port() == "0" {
		t.Errorf("every interface with a public host: devices are told %s, want tls://fl.example.com:PORT", h.NATSURL())
	}
	h = servertest.New(t, servertest.WithConfig(func(c *server.Config) {
		c.NATSListen, c.NATSAdvertise = "0.0.0.0:0", "nats://lb.example.com:4222,nats://lb2.example.com:4222"
	}))
	if h.NATSURL() != "nats://lb.example.com:4222,nats://lb2.example.com:4222" {
		t.Errorf("advertised URL: devices are told %s", h.NATSURL())
	}
	_, err := server.New(server.Config{DataDir: t.TempDir(), NATSListen: "0.0.0.0:4222"})
	if err == nil || !strings.Contains(err.Error(), "--public-host") || !strings.Contains(err.Error(), "--nats-advertise") {
		t.Errorf("every interface without a public host or advertised URL: %v", err)
	}
}

func TestPublicConfigRefused(t *testing.T) {
	for name, cfg := range map[string]server.Config{
		"public host with a port":    {PublicHost: "fl.example.com:7070"},
		"public host as a URL":       {PublicHost: "https://fl.example.com"},
		"public host unspecified":    {PublicHost: "0.0.0.0"},
		"nats on every interface":    {NATSListen: "[::]:4222"},
		"advertise unspecified":      {NATSAdvertise: "nats://0.0.0.0:4222"},
		"advertise not a URL":        {NATSAdvertise: "lb.example.com:4222"},
		"advertise bad scheme":       {NATSAdvertise: "http://lb.example.com:4222"},
		"advertise one of two bad":   {NATSAdvertise: "nats://lb.example.com:4222,nats://[::]:4222"},
		"external NATS unspecified":  {NATSURL: "nats://0.0.0.0:4222"},
		"monitor with external NATS": {NATSURL: "nats://nats-1:4222", NATSMonitor: "127.0.0.1:8222"},
		"monitor without a port":     {NATSMonitor: "127.0.0.1"},
		"monitor on port 0":          {NATSMonitor: "127.0.0.1:0"},
	} {
		cfg.DataDir = t.TempDir()
		if _, err := server.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	_, err := server.New(server.Config{DataDir: t.TempDir(), NATSMonitor: ":0"})
	if !errors.Is(err, natsembed.ErrMonitorAddr) {
		t.Errorf("monitor on :0: %v, want %v", err, natsembed.ErrMonitorAddr)
	}
}

// TestNATSMonitor: with NATSMonitor the embedded NATS server serves its
// monitoring endpoints, in operator mode with JetStream, there.
func TestNATSMonitor(t *testing.T) {
	// nats-server cannot be asked which port it picked through the
	// server: take one that is free now.
	addr := freeport.Addr(t)
	servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.NATSMonitor = addr }))
	for path, key := range map[string]string{"/varz": "server_id", "/jsz": "config", "/connz": "connections", "/healthz": "status"} {
		res, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		err = json.NewDecoder(res.Body).Decode(&v)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK || v[key] == nil {
			t.Errorf("GET %s: %s, %v, %v", path, res.Status, err, v)
		}
		if n, _ := v["num_connections"].(float64); path == "/connz" && n < 1 {
			t.Errorf("/connz shows no connections: the server's own are missing: %v", v)
		}
	}
}
