package server_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fleetlearn/fleetlearn/server"
)

// TestStartRefusesTakenAddress: a server whose listen address another
// process holds fails at once, naming the address and the flag that moves
// it, before it creates its data directory: no CA, keys or admin token are
// minted for a server that cannot run.
func TestStartRefusesTakenAddress(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().String()
	for _, c := range []struct {
		flag string
		set  func(*server.Config)
	}{
		{"--grpc-addr", func(c *server.Config) { c.GRPCAddr = taken }},
		{"--nats-listen", func(c *server.Config) { c.NATSListen = taken }},
		{"--nats-monitor", func(c *server.Config) { c.NATSMonitor = taken }},
		{"--metrics-addr", func(c *server.Config) { c.MetricsAddr = taken }},
		{"--ui", func(c *server.Config) { c.UIAddr = taken }},
	} {
		t.Run(c.flag, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			cfg := server.Config{DataDir: dir, NATSListen: "127.0.0.1:0", GRPCAddr: freeAddr(t), MetricsAddr: "127.0.0.1:0"}
			c.set(&cfg)
			s, err := server.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Start(context.Background())
			if err == nil {
				s.Shutdown(context.Background())
				t.Fatalf("started with %s %s, which another listener holds", c.flag, taken)
			}
			var le *server.ListenError
			if !errors.As(err, &le) || le.Flag != c.flag || le.Addr != taken || !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("err = %v, want a ListenError for %s %s", err, c.flag, taken)
			}
			if msg := err.Error(); !strings.Contains(msg, taken+": the address is in use") || !strings.Contains(msg, c.flag) {
				t.Errorf("message %q does not name the address and %s", msg, c.flag)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the data directory was created (%v): the refused start minted its keys", err)
			}
			// The gRPC address, taken before the one refused, is let go.
			if c.flag != "--grpc-addr" {
				ln, err := net.Listen("tcp", cfg.GRPCAddr)
				if err != nil {
					t.Fatalf("the gRPC address %s is still held after the refused start: %v", cfg.GRPCAddr, err)
				}
				ln.Close()
			}
		})
	}
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
