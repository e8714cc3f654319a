package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/ui"
)

// dashboard is the web UI's listener and its connection to the API.
type dashboard struct {
	ln     net.Listener
	srv    *http.Server
	conn   *grpc.ClientConn
	cancel context.CancelFunc // ends the live pages' event streams
}

// checkUIConfig refuses a plaintext dashboard off loopback: its session
// cookie is a bearer token.
func checkUIConfig(cfg Config) error {
	if cfg.UIAddr == "" || !cfg.UIInsecure {
		return nil
	}
	host, _, err := net.SplitHostPort(cfg.UIAddr)
	if err != nil {
		return fmt.Errorf("server: --ui %q: want host:port", cfg.UIAddr)
	}
	if !isLoopback(host) {
		return fmt.Errorf("server: --ui-insecure serves the dashboard and its session tokens in the clear: " +
			"only on a loopback address (127.0.0.1:PORT); drop --ui-insecure to serve it over TLS")
	}
	return nil
}

// loopbackTarget is where the server dials its own gRPC listener.
func loopbackTarget(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !everyInterface(host) {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// startUI serves the dashboard on Config.UIAddr, a client of the server's
// own gRPC API: it reads and acts with each viewer's token, so the API's
// roles and audit apply to it as to the CLI.
func (s *Server) startUI(m *metrics.M) error {
	if s.cfg.UIAddr == "" {
		return nil
	}
	conn, err := client.Dial(loopbackTarget(s.GRPCAddr()), s.apiDialOptions()...)
	if err != nil {
		return fmt.Errorf("server: dashboard: %w", err)
	}
	for _, reason := range ui.StreamRefusals {
		m.UIStreamRefusals.WithLabelValues(reason) // each reads 0 from the start, for rate()
	}
	h, err := ui.New(ui.Config{API: conn, Secure: !s.cfg.UIInsecure, Policy: identity.DefaultPolicy(),
		Authenticate: s.apiVerifier.Verify},
		ui.WithLogger(s.o.log.With("component", "ui")), ui.WithClock(s.o.clock),
		ui.WithStreamRefused(func(reason string) { m.UIStreamRefusals.WithLabelValues(reason).Inc() }))
	if err != nil {
		conn.Close()
		return fmt.Errorf("server: dashboard: %w", err)
	}
	ln := s.uiLn
	base, cancel := context.WithCancel(context.Background())
	d := &dashboard{ln: ln, conn: conn, cancel: cancel, srv: &http.Server{Handler: h,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, BaseContext: func(net.Listener) context.Context { return base }}}
	s.ui = d
	if s.cfg.UIInsecure {
		s.o.log.Warn("the dashboard serves plain HTTP (--ui-insecure): for this machine only")
		go d.srv.Serve(ln)
		return nil
	}
	d.srv.TLSConfig = s.tlsCA.ServerConfig(false)
	go d.srv.ServeTLS(ln, "", "")
	return nil
}

// UIAddr is the address the dashboard listens on ("" when off).
func (s *Server) UIAddr() string {
	if s.ui == nil {
		return ""
	}
	return s.ui.ln.Addr().String()
}

// UIURL is the dashboard's base URL ("" when off).
func (s *Server) UIURL() string {
	if s.ui == nil {
		return ""
	}
	scheme := "https"
	if s.cfg.UIInsecure {
		scheme = "http"
	}
	return scheme + "://" + loopbackTarget(s.UIAddr())
}

// stopUI ends the event streams, then the listener, then the API
// connection.
func (s *Server) stopUI(ctx context.Context) error {
	if s.ui == nil {
		return nil
	}
	s.ui.cancel()
	err := s.ui.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = s.ui.srv.Close()
	}
	s.ui.conn.Close()
	return err
}
