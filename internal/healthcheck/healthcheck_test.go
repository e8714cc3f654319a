package healthcheck_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/healthcheck"
)

// serve runs Register's endpoints on a loopback port and returns its
// address, with ready saying what readiness answers.
func serve(t *testing.T, host string, ready func(context.Context) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	healthcheck.Register(mux, ready)
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestReadyAndLive(t *testing.T) {
	var down atomic.Pointer[error]
	addr := serve(t, "127.0.0.1", func(context.Context) error {
		if e := down.Load(); e != nil {
			return *e
		}
		return nil
	})
	var out strings.Builder
	if err := healthcheck.Get(t.Context(), addr, healthcheck.Readyz, &out); err != nil || out.String() != "ok\n" {
		t.Fatalf("ready: %v, %q", err, out.String())
	}
	why := errors.New("NATS is RECONNECTING")
	down.Store(&why)
	err := healthcheck.Get(t.Context(), addr, healthcheck.Readyz, &out)
	if !errors.Is(err, healthcheck.ErrUnhealthy) || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "NATS is RECONNECTING") {
		t.Fatalf("not ready: %v", err)
	}
	out.Reset()
	if err := healthcheck.Get(t.Context(), addr, healthcheck.Healthz, &out); err != nil || out.String() != "ok\n" {
		t.Fatalf("live while not ready: %v, %q", err, out.String())
	}
}

// A listen address on every interface is asked on loopback: the health
// subcommands take the same address the process was given.
func TestUnspecifiedHostMeansLoopback(t *testing.T) {
	addr := serve(t, "127.0.0.1", func(context.Context) error { return nil })
	_, port, _ := net.SplitHostPort(addr)
	for _, a := range []string{":" + port, "0.0.0.0:" + port} {
		if err := healthcheck.Get(t.Context(), a, healthcheck.Readyz, new(strings.Builder)); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
}

func TestRefusals(t *testing.T) {
	addr := serve(t, "127.0.0.1", func(context.Context) error { return nil })
	if err := healthcheck.Get(t.Context(), "no-port", healthcheck.Readyz, new(strings.Builder)); err == nil {
		t.Error("an address without a port was accepted")
	}
	if err := healthcheck.Get(t.Context(), addr, "/nope", new(strings.Builder)); !errors.Is(err, healthcheck.ErrUnhealthy) {
		t.Errorf("404: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if err := healthcheck.Get(t.Context(), closed, healthcheck.Readyz, new(strings.Builder)); err == nil ||
		!strings.Contains(err.Error(), "health endpoints") {
		t.Errorf("nothing listening: %v", err)
	}
	// POST is not a probe: the endpoints answer GET (and HEAD) only.
	resp, err := http.Post("http://"+addr+healthcheck.Readyz, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s", resp.Status)
	}
}
