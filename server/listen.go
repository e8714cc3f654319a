package server

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// ListenError is an address the server cannot listen on, found before it
// creates anything: a second server on a taken port fails at once, without
// minting keys, a CA or tokens into its data directory.
type ListenError struct {
	// What listens there: "the gRPC API".
	What string
	// Addr is the address as configured.
	Addr string
	// Flag is the fleetlearn-server flag that sets it (fleetlearn demo
	// names --ui alike).
	Flag string
	Err  error
}

func (e *ListenError) Error() string {
	if errors.Is(e.Err, syscall.EADDRINUSE) {
		return fmt.Sprintf("server: %s cannot listen on %s: the address is in use (another fleetlearn-server or "+
			"fleetlearn demo?): stop that process, or give a free address with %s", e.What, e.Addr, e.Flag)
	}
	return fmt.Sprintf("server: %s cannot listen on %s: %v: give another address with %s", e.What, e.Addr, e.Err, e.Flag)
}

func (e *ListenError) Unwrap() error { return e.Err }

// listenFirst takes the addresses the server listens on before Start
// creates anything. The API's, the metrics' and the dashboard's listeners
// are kept for Start to serve on; the embedded NATS server binds its own,
// so its addresses are only tried (and natsx still fails fast should
// another process take one in between).
func (s *Server) listenFirst() error {
	type addr struct {
		what, addr, flag string
		keep             *net.Listener // nil: only try it
	}
	addrs := []addr{{"the gRPC API", s.cfg.GRPCAddr, "--grpc-addr", &s.grpcLn}}
	if s.cfg.NATSURL == "" {
		addrs = append(addrs, addr{"the embedded NATS server", s.cfg.NATSListen, "--nats-listen", nil})
		if s.cfg.NATSMonitor != "" {
			addrs = append(addrs, addr{"the NATS monitoring endpoint", s.cfg.NATSMonitor, "--nats-monitor", nil})
		}
	}
	if s.cfg.MetricsAddr != "off" {
		addrs = append(addrs, addr{"the metrics and health endpoint", s.cfg.MetricsAddr, "--metrics-addr", &s.httpLn})
	}
	if s.cfg.UIAddr != "" {
		addrs = append(addrs, addr{"the dashboard", s.cfg.UIAddr, "--ui", &s.uiLn})
	}
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a.addr)
		if err != nil {
			// Those taken so far are closed by Shutdown.
			return &ListenError{What: a.what, Addr: a.addr, Flag: a.flag, Err: err}
		}
		if a.keep != nil {
			*a.keep = ln
		} else {
			ln.Close()
		}
	}
	return nil
}

// closeListeners closes the listeners listenFirst kept, for a start that
// failed before serving on them; those already served are closed by their
// servers, and closing them again does nothing.
func (s *Server) closeListeners() {
	if s.grpcHandoff != nil {
		s.grpcHandoff.Close()
	}
	for _, ln := range []net.Listener{s.grpcLn, s.httpLn, s.uiLn} {
		if ln != nil {
			ln.Close()
		}
	}
}
