package cli_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/data"
)

// TestDemoHelpHidesGlobalFlags: the demo talks to no server, so its help
// leaves out --server, --token-file and the rest, and only its own: the
// flags are shared with the other commands, whose help still lists them.
func TestDemoHelpHidesGlobalFlags(t *testing.T) {
	root := cli.NewRootCommand(cli.WithGetenv(func(string) string { return "" }), cli.WithTerminal(false))
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"demo", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	for _, global := range []string{"--server", "--token-file", "--token ", "--ca ", "--insecure", "--timeout", "Global Flags"} {
		if strings.Contains(help, global) {
			t.Errorf("demo --help lists %q:\n%s", global, help)
		}
	}
	for _, own := range []string{"--out ", "--edges", "--rounds", "fleetlearn-demo-out"} {
		if !strings.Contains(help, own) {
			t.Errorf("demo --help lacks %q:\n%s", own, help)
		}
	}
	if strings.Contains(help, "--out-dir") {
		t.Errorf("demo --help lists the deprecated --out-dir:\n%s", help)
	}

	out.Reset()
	root.SetArgs([]string{"task", "list", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--server") {
		t.Errorf("task list --help lost the global flags after demo --help:\n%s", out.String())
	}
}

func TestDemoRefusesBadFlagsAtOnce(t *testing.T) {
	// --out-dir is still accepted (pflag prints its deprecation notice to
	// the process's standard error); the demo then fails on its sizes,
	// before it writes anything, and says so once.
	dir := filepath.Join(t.TempDir(), "out")
	_, err := run(t, "", "demo", "--out-dir", dir, "--edges", "0")
	if err == nil || !strings.Contains(err.Error(), "need edges") || strings.Count(err.Error(), "demo:") != 1 {
		t.Errorf("invalid size: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a demo that could not start made its output directory: %v", err)
	}
	_, err = run(t, "", "demo", "--dp", "local")
	if err == nil || !strings.Contains(err.Error(), `--dp "local"`) {
		t.Errorf("bad --dp: %v", err)
	}
}

// TestDemoWritesIntoItsFolder runs a tiny demo from an empty working
// directory: everything it writes lands in ./fleetlearn-demo-out.
func TestDemoWritesIntoItsFolder(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on MNIST through the whole system")
	}
	if _, err := data.MNISTDir(); errors.Is(err, data.ErrMNISTNotFound) {
		t.Skipf("MNIST not in the module cache: %v", err)
	}
	wd := t.TempDir()
	t.Chdir(wd)
	out, err := run(t, "", "demo", "--edges", "4", "--rounds", "1", "--cohort", "2", "--base-examples", "1000")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("escape sequences in output that is no terminal:\n%q", out)
	}
	entries, err := os.ReadDir(wd)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "fleetlearn-demo-out" {
		t.Fatalf("working directory holds %v, want only fleetlearn-demo-out", entries)
	}
	for _, name := range []string{"results.csv", "accuracy.png"} {
		if fi, err := os.Stat(filepath.Join(wd, "fleetlearn-demo-out", name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestDemoRefusesTakenUIAddress: a second demo whose --ui address another
// process holds fails at once, before it loads data or makes its output
// directory, naming the address and --ui; for either task.
func TestDemoRefusesTakenUIAddress(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	addr := held.Addr().String()
	for _, task := range []string{"mnist", "lm"} {
		dir := filepath.Join(t.TempDir(), "out")
		_, err := run(t, "", "demo", "--task", task, "--ui", addr, "--out", dir)
		if err == nil || !strings.Contains(err.Error(), addr+": the address is in use") ||
			!strings.Contains(err.Error(), "--ui") || strings.Count(err.Error(), "demo:") != 1 {
			t.Errorf("--task %s on a taken --ui: %v", task, err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--task %s: a demo that could not start made its output directory: %v", task, err)
		}
	}
}
