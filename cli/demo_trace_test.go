package cli_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/cli"
)

// TestDemoTraceFlags: --trace-file opens (creates) the trace file before
// the demo starts, and --otlp-insecure without an endpoint is refused as
// usage.
func TestDemoTraceFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	_, err := run(t, "", "demo", "--trace-file", path, "--edges", "0", "--out", filepath.Join(t.TempDir(), "out"))
	if err == nil || !strings.Contains(err.Error(), "need edges") {
		t.Fatalf("invalid size: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("trace file: %v", err)
	}
	_, err = run(t, "", "demo", "--otlp-insecure", "--edges", "0")
	if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "--otlp-insecure") {
		t.Fatalf("--otlp-insecure alone: %v", err)
	}
}
