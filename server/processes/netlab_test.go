package processes_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// A netLab is a network of hosts on this machine: each host a Linux
// network namespace with its own address on one bridge, so that the
// processes of a test talk across real interfaces, and a link or a route
// can fail between two of them as a network does. The root namespace is a
// host too, at the bridge's address (the test itself, and PostgreSQL).
//
// It needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2's ip; a test
// skips without them, saying so. The addresses come from 198.18.0.0/15,
// which RFC 2544 sets aside for benchmarking networks and nobody routes,
// in a /24 picked at random so that parallel test binaries do not meet.
type netLab struct {
	t      *testing.T
	id     string // a few random hex digits that name everything the lab makes
	bridge string
	subnet string // "198.18.X" or "198.19.X"
	next   int    // the last octet of the next host
	root   *labHost
}

// labHost is one host of a netLab.
type labHost struct {
	lab  *netLab
	name string
	ns   string // "" for the root namespace
	ip   string
	link string // the bridge's side of the host's veth pair
}

// newNetLab makes the bridge, or skips t where this machine cannot.
func newNetLab(t *testing.T) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces (ip netns); run the tests as root, as CI does")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip (apt-get install iproute2)")
	}
	b := make([]byte, 3)
	rand.Read(b)
	l := &netLab{t: t, id: hex.EncodeToString(b), subnet: freeSubnet(t), next: 2}
	l.bridge = "flbr" + l.id
	// Probe: a namespace of our own. Containers without CAP_SYS_ADMIN
	// refuse it; that is a machine that cannot run the test.
	probe := "flprobe" + l.id
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace here (%v: %s): needs CAP_SYS_ADMIN and CAP_NET_ADMIN", err, strings.TrimSpace(string(out)))
	}
	exec.Command("ip", "netns", "del", probe).Run()
	l.ip("link", "add", l.bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", l.bridge).Run() })
	l.ip("addr", "add", l.subnet+".1/24", "dev", l.bridge)
	l.ip("link", "set", l.bridge, "up")
	l.root = &labHost{lab: l, name: "root", ip: l.subnet + ".1"}
	return l
}

// freeSubnet picks a /24 of 198.18.0.0/15 that no route or address of
// this machine touches: a parallel test's, or one a killed test binary
// left behind (its routes in the root namespace outlive it).
func freeSubnet(t *testing.T) string {
	t.Helper()
	var used strings.Builder
	for _, args := range [][]string{{"route", "show", "table", "all"}, {"addr", "show"}} {
		out, err := exec.Command("ip", args...).Output()
		if err != nil {
			t.Fatalf("ip %s: %v", strings.Join(args, " "), err)
		}
		used.Write(out)
	}
	for range 64 {
		n, _ := rand.Int(rand.Reader, big.NewInt(512))
		subnet := fmt.Sprintf("198.%d.%d", 18+n.Int64()/256, n.Int64()%256)
		if !strings.Contains(used.String(), subnet+".") {
			return subnet
		}
	}
	t.Fatal("no free /24 in 198.18.0.0/15")
	return ""
}

// ip runs ip(8) with args, failing the test if it fails.
func (l *netLab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// host adds a host: a namespace with loopback up and one interface on the
// bridge, its default route through the bridge's address.
func (l *netLab) host(name string) *labHost {
	l.t.Helper()
	h := &labHost{lab: l, name: name, ns: fmt.Sprintf("fl%s-%s", l.id, name), ip: fmt.Sprintf("%s.%d", l.subnet, l.next),
		link: fmt.Sprintf("flv%s%d", l.id, l.next)}
	l.next++
	l.ip("netns", "add", h.ns)
	l.t.Cleanup(func() { exec.Command("ip", "netns", "del", h.ns).Run() })
	l.ip("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
	l.ip("link", "set", h.link, "master", l.bridge, "up")
	h.in("ip", "link", "set", "lo", "up")
	h.in("ip", "addr", "add", h.ip+"/24", "dev", "eth0")
	h.in("ip", "link", "set", "eth0", "up")
	return h
}

// in runs a command in the host's namespace, failing the test if it fails.
func (h *labHost) in(prog string, args ...string) {
	h.lab.t.Helper()
	cmd := h.command(prog, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		h.lab.t.Fatalf("%s: %s %s: %v\n%s", h.name, prog, strings.Join(args, " "), err, out)
	}
}

// command is prog with args, to run in the host's namespace.
func (h *labHost) command(prog string, args ...string) *exec.Cmd {
	if h.ns == "" {
		return exec.Command(prog, args...)
	}
	return exec.Command("ip", append([]string{"netns", "exec", h.ns, prog}, args...)...)
}

// addr is the host's address with port.
func (h *labHost) addr(port int) string { return net.JoinHostPort(h.ip, fmt.Sprint(port)) }

// cut takes the host off the network, as a pulled cable or a dead switch
// port does: its packets go nowhere and nobody's reach it, with no error
// to either side until their timeouts. heal puts it back.
func (h *labHost) cut()  { h.lab.ip("link", "set", h.link, "down") }
func (h *labHost) heal() { h.lab.ip("link", "set", h.link, "up") }

// partition drops what h and o send each other, and nothing else: each
// routes the other's address into a black hole. Connections open between
// them go silent; new ones fail at once on the side that tries. The
// returned function undoes it.
//
// The undo also runs when the test ends, however it ends: a route left in
// the root namespace would outlive the test.
func (h *labHost) partition(o *labHost) (undo func()) {
	h.lab.t.Helper()
	h.route("add", o.ip)
	o.route("add", h.ip)
	var once sync.Once
	undo = func() {
		once.Do(func() {
			// Not fatal: it also runs as a cleanup.
			for _, c := range []*exec.Cmd{h.command("ip", "route", "del", "blackhole", o.ip+"/32"),
				o.command("ip", "route", "del", "blackhole", h.ip+"/32")} {
				if out, err := c.CombinedOutput(); err != nil {
					h.lab.t.Errorf("heal %s–%s: %v: %s", h.name, o.name, err, out)
				}
			}
		})
	}
	h.lab.t.Cleanup(undo)
	return undo
}

func (h *labHost) route(op, ip string) {
	h.lab.t.Helper()
	h.in("ip", "route", op, "blackhole", ip+"/32")
}
