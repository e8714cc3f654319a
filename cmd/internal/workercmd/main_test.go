package workercmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := run(t.Context(), args, &out, &out)
	return code, out.String()
}

func TestCommandLine(t *testing.T) {
	if code, out := runCLI(t, "version"); code != 0 || !strings.HasPrefix(out, "fleetlearn-worker ") {
		t.Fatalf("version: %d %q", code, out)
	}
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "--server is required"},
		{[]string{"run", "--server", "h:7070"}, "fleetlearn token mint"},
		{[]string{"run", "--server", "h:7070", "--token-file", tok}, "--ca is required"},
		{[]string{"run", "--server", "h:7070", "--token-file", tok, "--insecure"}, "--work-dir is required"},
		{[]string{"run", "--bogus"}, "unknown flag"},
		{[]string{"rank"}, "--lease is required"},
		{[]string{"frobnicate"}, "unknown command"},
	} {
		if code, out := runCLI(t, c.args...); code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, out, c.want)
		}
	}
	// A rank reports to its agent on the process's own standard output.
	if code, out := runCLI(t, "rank", "--lease", "/nonexistent/lease.json"); code != 1 {
		t.Errorf("rank without its lease file: exit %d, %q", code, out)
	}
	if code, out := runCLI(t, "run", "--help"); code != 0 || !strings.Contains(out, "--role pool-worker") {
		t.Errorf("help: %d %q", code, out)
	}
}
