// Command kubeprobe runs one container probe with the kubelet's own probe
// code (k8s.io/kubernetes/pkg/probe/...), so that deploy's tests check the
// Kubernetes manifests' probes against what the kubelet really does rather
// than against a reimplementation of it.
//
//	kubeprobe [--timeout D] http [--header 'Name: value']... URL
//	kubeprobe [--timeout D] grpc [--tls] [--service NAME] HOST PORT
//	kubeprobe [--timeout D] tcp HOST PORT
//	kubeprobe [--timeout D] exec CMD [ARG]...
//
// It prints the probe's result and output and exits 0 when the kubelet
// would count the probe as passed (success or warning), 1 when it would
// not, and 2 on a command-line error. The module is separate from
// Fleetlearn's so that k8s.io/kubernetes and its dependencies stay out of
// the main go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/kubernetes/pkg/probe"
	execprobe "k8s.io/kubernetes/pkg/probe/exec"
	grpcprobe "k8s.io/kubernetes/pkg/probe/grpc"
	httpprobe "k8s.io/kubernetes/pkg/probe/http"
	tcpprobe "k8s.io/kubernetes/pkg/probe/tcp"
	utilexec "k8s.io/utils/exec"
)

// errUsage marks errors that are the command line's fault.
var errUsage = errors.New("usage")

const usageText = `usage:
  kubeprobe [--timeout D] http [--header 'Name: value']... URL
  kubeprobe [--timeout D] grpc [--tls] [--service NAME] HOST PORT
  kubeprobe [--timeout D] tcp HOST PORT
  kubeprobe [--timeout D] exec CMD [ARG]...`

func main() {
	res, out, err := run(os.Args[1:])
	if errors.Is(err, errUsage) {
		fmt.Fprintf(os.Stderr, "kubeprobe: %v\n%s\n", err, usageText)
		os.Exit(2)
	}
	fmt.Printf("result: %s\n", res)
	if out != "" {
		fmt.Printf("output: %s\n", strings.TrimRight(out, "\n"))
	}
	if err != nil {
		fmt.Printf("error: %v\n", err)
	}
	// The kubelet's prober worker counts a warning as a pass and an error as
	// a failure; so does kubeprobe.
	if err == nil && (res == probe.Success || res == probe.Warning) {
		os.Exit(0)
	}
	os.Exit(1)
}

func usagef(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

// run parses the command line and runs the probe it names.
func run(args []string) (probe.Result, string, error) {
	fs := newFlagSet("kubeprobe")
	// The kubelet's default timeoutSeconds.
	timeout := fs.Duration("timeout", time.Second, "probe timeout")
	if err := fs.Parse(args); err != nil {
		return "", "", usagef("%v", err)
	}
	if fs.NArg() == 0 {
		return "", "", usagef("no probe kind given")
	}
	if *timeout <= 0 {
		return "", "", usagef("--timeout must be positive")
	}
	kind, rest := fs.Arg(0), fs.Args()[1:]
	switch kind {
	case "http":
		return probeHTTP(rest, *timeout)
	case "grpc":
		return probeGRPC(rest, *timeout)
	case "tcp":
		return probeTCP(rest, *timeout)
	case "exec":
		return probeExec(rest, *timeout)
	}
	return "", "", usagef("unknown probe kind %q: http, grpc, tcp or exec", kind)
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// headers is a repeatable --header flag, the httpGet probe's httpHeaders.
type headers http.Header

func (h headers) String() string { return "" }

func (h headers) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("header %q: want 'Name: value'", v)
	}
	http.Header(h).Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}

// probeHTTP is an httpGet probe: the kubelet builds the request with
// NewProbeRequest (its User-Agent and Accept headers) and does not follow
// redirects to other hosts unless told to.
func probeHTTP(args []string, timeout time.Duration) (probe.Result, string, error) {
	fs := newFlagSet("http")
	h := headers{}
	fs.Var(h, "header", "request header 'Name: value' (repeatable)")
	if err := fs.Parse(args); err != nil {
		return "", "", usagef("http: %v", err)
	}
	if fs.NArg() != 1 {
		return "", "", usagef("http: want one URL")
	}
	u, err := url.Parse(fs.Arg(0))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", usagef("http: %q is not an http or https URL", fs.Arg(0))
	}
	req, err := httpprobe.NewProbeRequest(u, http.Header(h))
	if err != nil {
		return "", "", fmt.Errorf("http: new probe request: %w", err)
	}
	return httpprobe.New(false).Probe(req, timeout)
}

// probeGRPC is a grpc probe: grpc.health.v1.Health/Check in plaintext, or,
// with --tls, over TLS without verification, as the kubelet does with
// mode: TLS behind the GRPCContainerProbeTLS feature gate.
func probeGRPC(args []string, timeout time.Duration) (probe.Result, string, error) {
	fs := newFlagSet("grpc")
	useTLS := fs.Bool("tls", false, "connect with TLS (mode: TLS)")
	service := fs.String("service", "", "service name in the HealthCheckRequest")
	if err := fs.Parse(args); err != nil {
		return "", "", usagef("grpc: %v", err)
	}
	if fs.NArg() != 2 {
		return "", "", usagef("grpc: want HOST PORT")
	}
	port, err := parsePort(fs.Arg(1))
	if err != nil {
		return "", "", usagef("grpc: %v", err)
	}
	return grpcprobe.New().Probe(fs.Arg(0), *service, port, timeout, grpcprobe.ProbeOptions{UseTLS: *useTLS})
}

// probeTCP is a tcpSocket probe: the port accepts a connection.
func probeTCP(args []string, timeout time.Duration) (probe.Result, string, error) {
	if len(args) != 2 {
		return "", "", usagef("tcp: want HOST PORT")
	}
	port, err := parsePort(args[1])
	if err != nil {
		return "", "", usagef("tcp: %v", err)
	}
	return tcpprobe.New().Probe(args[0], port, timeout)
}

// probeExec is an exec probe. The kubelet runs the command in the
// container through the runtime; here it runs on this host, and the
// timeout kills it as the runtime's would.
func probeExec(args []string, timeout time.Duration) (probe.Result, string, error) {
	if len(args) == 0 {
		return "", "", usagef("exec: want CMD [ARG]...")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return execprobe.New().Probe(utilexec.New().CommandContext(ctx, args[0], args[1:]...))
}

func parsePort(s string) (int, error) {
	port, err := strconv.Atoi(s)
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("port %q: want a number from 1 to 65535", s)
	}
	return port, nil
}
