package deploy_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/freeport"
	"github.com/fleetlearn/fleetlearn/internal/testtool"
)

// kpGuard bounds each wait for a state change. Generous: a loaded CI
// machine may take long to start a server, and the manifests' startup
// probes allow minutes.
const kpGuard = 2 * time.Minute

// TestKubeletProbes runs the probes the Kubernetes manifests use against
// the real fleetlearn-server and fleetlearn-edge, with the kubelet's own
// probe code (testdata/kubeprobe): httpGet on /readyz and /healthz, and
// exec of the binaries' health commands, pass when they should and fail
// when they should; a grpc probe of the TLS-only API fails.
func TestKubeletProbes(t *testing.T) {
	kp := buildKubeprobe(t)
	dir := bins(t)
	serverBin := filepath.Join(dir, "fleetlearn-server")
	edgeBin := filepath.Join(dir, "fleetlearn-edge")
	cli := filepath.Join(dir, "fleetlearn")

	dataDir := t.TempDir()
	grpcAddr, natsAddr, metricsAddr, edgeHealth := kpFreeAddr(t), kpFreeAddr(t), kpFreeAddr(t), kpFreeAddr(t)
	srv := kpStart(t, "fleetlearn-server", serverBin, "--data-dir", dataDir, "--grpc-addr", grpcAddr,
		"--nats-listen", natsAddr, "--metrics-addr", metricsAddr, "--log-level", "debug")
	readyz, healthz := "http://"+metricsAddr+"/readyz", "http://"+metricsAddr+"/healthz"
	edgeReadyz, edgeHealthz := "http://"+edgeHealth+"/readyz", "http://"+edgeHealth+"/healthz"

	if !t.Run("server", func(t *testing.T) {
		// The startup probe's job: wait until the server can run rounds.
		kp.await(t, srv, true, "http", readyz)
		kp.await(t, srv, true, "http", healthz)
		kp.await(t, srv, true, "--timeout", "10s", "exec", serverBin, "health", "--addr", metricsAddr)
		kp.await(t, srv, true, "--timeout", "10s", "exec", serverBin, "health", "--live", "--addr", metricsAddr)

		// The kubelet's grpc probe speaks plaintext HTTP/2 unless the pod
		// asks for mode: TLS, which needs the GRPCContainerProbeTLS feature
		// gate (alpha, off by default in 1.37). Over TLS the API's
		// grpc.health.v1 service answers without a token, so the plaintext
		// probe's failure is the TLS listener's doing, not a slow server:
		// the manifests must not use a grpc probe on the API port.
		_, port, _ := net.SplitHostPort(grpcAddr)
		kp.await(t, srv, true, "--timeout", "5s", "grpc", "--tls", "127.0.0.1", port)
		if ok, out := kp.run(t, "--timeout", "5s", "grpc", "127.0.0.1", port); ok {
			t.Errorf("a plaintext grpc probe of the TLS-only API %s passed:\n%s", grpcAddr, out)
		} else {
			t.Logf("plaintext grpc probe of the API fails, as it must:\n%s", out)
		}
	}) {
		return
	}

	edgeDir, dataset := t.TempDir(), t.TempDir()
	var edge *kpProc
	top := t // the agent outlives this subtest: the next one stops its server
	if !t.Run("edge", func(t *testing.T) {
		kpEnroll(t, cli, edgeBin, grpcAddr, dataDir, edgeDir)
		kpRun(t, cli, "data", "mnist", "--devices", "1", "--out", dataset, "--train-examples", "600",
			"--eval-examples", "0")
		edge = kpStart(top, "fleetlearn-edge", edgeBin, "--data-dir", edgeDir,
			"--dataset", filepath.Join(dataset, "device-0"), "--health-addr", edgeHealth, "--log-level", "debug")
		kp.await(t, edge, true, "http", edgeReadyz)
		kp.await(t, edge, true, "http", edgeHealthz)
		kp.await(t, edge, true, "--timeout", "10s", "exec", edgeBin, "health", "--addr", edgeHealth)
	}) {
		return
	}

	t.Run("server stops", func(t *testing.T) {
		if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM fleetlearn-server: %v", err)
		}
		kp.await(t, srv, false, "http", readyz)
		if err := srv.wait(kpGuard); err != nil {
			t.Errorf("fleetlearn-server after SIGTERM: %v", err)
		}
		kp.await(t, srv, false, "--timeout", "10s", "exec", serverBin, "health", "--addr", metricsAddr)

		// Without its NATS server the agent is alive but not ready: a
		// readiness probe takes it out of service, a liveness probe does
		// not restart it.
		kp.await(t, edge, false, "http", edgeReadyz)
		kp.await(t, edge, false, "--timeout", "10s", "exec", edgeBin, "health", "--addr", edgeHealth)
		kp.await(t, edge, true, "http", edgeHealthz)
		kp.await(t, edge, true, "--timeout", "10s", "exec", edgeBin, "health", "--live", "--addr", edgeHealth)
		if edge.exited() {
			t.Errorf("fleetlearn-edge stopped when NATS went away: %v", edge.wait(0))
		}
	})
}

// kubeprobe is the testdata/kubeprobe binary: one probe per run, with the
// kubelet's code.
type kubeprobe string

// buildKubeprobe finds testdata/kubeprobe, a module of its own so that
// k8s.io/kubernetes stays out of the main go.mod, built by testtool's
// build command.
func buildKubeprobe(t *testing.T) kubeprobe {
	t.Helper()
	return kubeprobe(testtool.Find(t, testtool.KubeProbe))
}

// run runs one probe and reports whether the kubelet would count it as
// passed, with kubeprobe's output. Anything but a pass or a failure (a
// usage error, a crash) fails the test.
func (kp kubeprobe) run(t *testing.T, args ...string) (bool, string) {
	t.Helper()
	out, err := exec.Command(string(kp), args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true, string(out)
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return false, string(out)
	}
	t.Fatalf("kubeprobe %s: %v\n%s", strings.Join(args, " "), err, out)
	return false, ""
}

// await repeats a probe, as the kubelet does every periodSeconds, until it
// passes (pass) or fails (!pass). It gives up early if p, which the probe
// is meant to watch, exits while it should pass.
func (kp kubeprobe) await(t *testing.T, p *kpProc, pass bool, args ...string) {
	t.Helper()
	want := map[bool]string{true: "pass", false: "fail"}[pass]
	end := time.Now().Add(kpGuard)
	for {
		ok, out := kp.run(t, args...)
		if ok == pass {
			return
		}
		if pass && p.exited() {
			t.Fatalf("kubeprobe %s: %s exited before the probe would %s: %v\n%s",
				strings.Join(args, " "), p.name, want, p.wait(0), out)
		}
		if time.Now().After(end) {
			t.Fatalf("kubeprobe %s: did not %s within %v; last:\n%s", strings.Join(args, " "), want, kpGuard, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kpFreeAddr returns a loopback address free a moment ago.
func kpFreeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t)
}

// kpLog collects a child's output, written from exec's copying goroutines.
type kpLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *kpLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *kpLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// kpProc is a running binary whose log is shown if the test fails.
type kpProc struct {
	name string
	cmd  *exec.Cmd
	log  *kpLog
	done chan struct{}
	err  error // set when done closes
}

func kpStart(t *testing.T, name, bin string, args ...string) *kpProc {
	t.Helper()
	p := &kpProc{name: name, cmd: exec.Command(bin, args...), log: &kpLog{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if !p.exited() {
			p.cmd.Process.Signal(syscall.SIGTERM)
			if p.wait(30*time.Second) == errStillRunning {
				p.cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			t.Logf("--- %s %s\n%s", name, strings.Join(args, " "), kpTail(p.log.String(), 8000))
		}
	})
	return p
}

var errStillRunning = errors.New("still running")

func (p *kpProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the process to exit and returns how it did.
func (p *kpProc) wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		return errStillRunning
	}
}

func kpTail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// kpRun runs the fleetlearn CLI and returns its standard output.
func kpRun(t *testing.T, cli string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(cli, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fleetlearn %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// kpEnroll enrolls a device into edgeDir as an operator would: a token
// from the CLI with the server's admin token and CA, then the agent's
// enroll command.
func kpEnroll(t *testing.T, cli, edgeBin, grpcAddr, serverDir, edgeDir string) {
	t.Helper()
	ca := filepath.Join(serverDir, "tls", "ca.crt")
	t.Setenv("FLEETLEARN_CA", ca)
	t.Setenv("FLEETLEARN_TOKEN_FILE", filepath.Join(serverDir, "admin.token"))
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(kpRun(t, cli, "--server", grpcAddr, "device", "token", "--ttl", "10m")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(edgeBin, "enroll", "--api", grpcAddr, "--ca", ca, "--token-file", token,
		"--data-dir", edgeDir, "--device-id", "probe-device").CombinedOutput()
	if err != nil {
		t.Fatalf("fleetlearn-edge enroll: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(edgeDir, "device.creds")); err != nil {
		t.Fatalf("fleetlearn-edge enroll left no NATS credentials: %v\n%s", err, out)
	}
}
