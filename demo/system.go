package demo

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// system is what both demos run: an aggregator on loopback, an admin's
// connection to it, and a module publisher it trusts.
type system struct {
	srv       *server.Server
	conn      *grpc.ClientConn
	publisher *identity.Publisher
	tracer    trace.TracerProvider // the server's and the agents' spans; nil records none
	serverDir string
	close     func()
}

// startSystem starts the aggregator with its state in dataDir/server;
// metricsAddr is "off" or an address for /metrics; tp (nil: none) records
// its rounds' spans and, through startFleet, the agents'; ui is the
// dashboard's address ("" for none).
func startSystem(ctx context.Context, dataDir, metricsAddr string, log *slog.Logger, tp trace.TracerProvider, ui string) (*system, error) {
	publisher, publisherJWKS, err := newPublisher()
	if err != nil {
		return nil, err
	}
	srv, err := server.New(server.Config{DataDir: filepath.Join(dataDir, "server"), NATSListen: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0", MetricsAddr: metricsAddr, PaceWindow: 300 * time.Millisecond,
		ModulePublishersJWKS: publisherJWKS, UIAddr: ui}, server.WithLogger(log), server.WithTracerProvider(tp))
	if err != nil {
		return nil, err
	}
	if err := srv.Start(ctx); err != nil {
		return nil, err
	}
	conn, err := client.Dial(srv.GRPCAddr(), client.WithCA(srv.CACertPEM()), client.WithToken(srv.AdminToken()))
	if err != nil {
		srv.Shutdown(context.WithoutCancel(ctx))
		return nil, err
	}
	return &system{srv: srv, conn: conn, publisher: publisher, tracer: tp, serverDir: filepath.Join(dataDir, "server"), close: func() {
		conn.Close()
		srv.Shutdown(context.WithoutCancel(ctx))
	}}, nil
}

// tryUIAddr tries the dashboard's address ("" for none) before the data is
// prepared: the server refuses a taken one before it creates anything, but
// the demo would first spend a while loading and splitting data. The
// server's other listeners take free ports.
func tryUIAddr(addr string) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &server.ListenError{What: "the dashboard", Addr: addr, Flag: "--ui", Err: err}
	}
	return ln.Close()
}

// announceUI prints how to open the dashboard, when it is on: a sign-in
// link whose fragment (never sent to the server) holds a token for both
// views, the operator's and the auditor's.
func (s *system) announceUI(pr *progress) error {
	base := s.srv.UIURL()
	if base == "" {
		return nil
	}
	tok, err := s.srv.MintToken("demo", []identity.Role{identity.RoleOperator, identity.RoleAuditor}, 24*time.Hour)
	if err != nil {
		return err
	}
	pr.printf("dashboard: %s/login#token=%s", base, tok)
	pr.printf("  (TLS with the demo's own CA, %s: accept the browser's warning or import it)", server.CAFile(s.serverDir))
	return nil
}

// keepServingUI holds the system up after the run while the dashboard is
// on, until ctx ends (Ctrl-C).
func (s *system) keepServingUI(ctx context.Context, pr *progress) {
	if s.srv.UIURL() == "" {
		return
	}
	pr.printf("the dashboard stays up at %s until interrupted (Ctrl-C)", s.srv.UIURL())
	<-ctx.Done()
}

// registerExample signs and registers the example module name, which ships
// inside the binary, built reproducibly from wasm/examples: the demos need
// neither a Go toolchain nor the source.
func (s *system) registerExample(ctx context.Context, name string) (*pb.Module, string, error) {
	ex, err := embedded.Lookup(name)
	if err != nil {
		return nil, "", err
	}
	code, err := ex.Code()
	if err != nil {
		return nil, "", err
	}
	sig, err := s.publisher.SignModule(name, code)
	if err != nil {
		return nil, "", err
	}
	// No ABI version in the header: the server reads the one the module
	// declares.
	mod, err := client.RegisterModule(ctx, apiv1.NewModuleServiceClient(s.conn), &pb.RegisterModuleHeader{Name: name,
		Signature: []byte(sig)}, bytes.NewReader(code))
	if err != nil {
		return nil, "", fmt.Errorf("register module: %w", err)
	}
	return mod, ex.SHA256, nil
}

// startFleet enrolls an agent edge-NNN per dataset and runs them over NATS,
// sharing one sandbox's compiled code, until the returned stop is called;
// opts adds options for an agent.
func (s *system) startFleet(ctx context.Context, pr *progress, dataDir string, datasets []*data.Dataset, log *slog.Logger,
	opts func(id string) []edge.Option) (stop func(), err error) {
	sb, err := wasm.New(wasm.WithCacheDir(filepath.Join(dataDir, "edge-wasm-cache")))
	if err != nil {
		return nil, err
	}
	fleetCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait(); sb.Close(context.WithoutCancel(ctx)) }
	ph := pr.start("enrolling agents", len(datasets), fmt.Sprintf("enrolling %d edge agents", len(datasets)))
	devices := apiv1.NewDeviceServiceClient(s.conn)
	for i, d := range datasets {
		id := fmt.Sprintf("edge-%03d", i)
		dir := filepath.Join(dataDir, "edges", strconv.Itoa(i))
		if err := enrollAgent(ctx, s.srv, devices, id, dir); err != nil {
			stop()
			return nil, err
		}
		o := []edge.Option{edge.WithDataset(d), edge.WithSandbox(sb), edge.WithLogger(log), edge.WithTracerProvider(s.tracer)}
		if opts != nil {
			o = append(o, opts(id)...)
		}
		a, err := edge.New(edge.Config{NATSURL: s.srv.NATSURL(), DataDir: dir,
			DeviceID: id, Charging: true, Idle: true, Unmetered: true, DeviceClass: "sim"}, o...)
		if err != nil {
			stop()
			return nil, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(fleetCtx) }()
		ph.step(id)
	}
	pr.end()
	return stop, nil
}

// workDirs makes the output directory first, so that one the demo cannot
// write fails it before minutes of training rather than after, and returns
// the data directory: dataDir, or a temporary one that done removes.
func workDirs(outDir, dataDir string) (dir string, done func(), err error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", nil, fmt.Errorf("output directory: %w", err)
	}
	if dataDir != "" {
		return dataDir, func() {}, nil
	}
	d, err := os.MkdirTemp("", "fleetlearn-demo-")
	if err != nil {
		return "", nil, err
	}
	return d, func() { os.RemoveAll(d) }, nil
}
