package servercmd

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/cliflags"
)

// TestTakenPort: fleetlearn-server on a NATS port another process holds
// (a second server on the defaults) exits at once with the address and
// the flag that moves it, before it writes a CA or a token.
func TestTakenPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	addr := held.Addr().String()
	dir := filepath.Join(t.TempDir(), "data")
	root := newRootCommand(serve)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(cliflags.SingleDash(root, []string{"--data-dir", dir, "--nats-listen", addr,
		"--grpc-addr", "127.0.0.1:0", "--metrics-addr", "off", "--log-level", "error"}))
	err = root.ExecuteContext(t.Context())
	if err == nil || isUsage(err) || !strings.Contains(err.Error(), "embedded NATS server cannot listen on "+addr) ||
		!strings.Contains(err.Error(), "--nats-listen") {
		t.Errorf("err = %v\n%s", err, out.String())
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused start made its data directory (and minted a CA and token): %v", err)
	}
}
