package natsx

import (
	"log/slog"
	"net"
	"strings"
	"testing"
)

// TestStartEmbeddedPortTaken: a client port another process holds fails
// the start with the address and nats-server's reason, as soon as
// nats-server gives up, not after the readiness wait.
func TestStartEmbeddedPortTaken(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	addr := held.Addr().String()
	e, err := StartEmbedded(addr, t.TempDir(), 1<<20, slog.New(slog.DiscardHandler), nil)
	if err == nil {
		e.Shutdown()
		t.Fatalf("started on %s, which another listener holds", addr)
	}
	if !strings.Contains(err.Error(), "embedded server on "+addr+" could not start") ||
		!strings.Contains(err.Error(), "address already in use") {
		t.Errorf("err = %v", err)
	}
}
