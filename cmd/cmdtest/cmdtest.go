// Package cmdtest lets a test binary stand in for Fleetlearn's programs, so
// that tests run fleetlearn, fleetlearn-server, fleetlearn-edge and
// fleetlearn-worker as separate processes without building them.
//
// Building the four binaries inside a test compiles the whole dependency
// graph a second time, beside go test's own build, and on a machine with
// empty Go caches that alone can take most of a package's timeout. The
// test binary already links every program's code (cmd/internal), the same
// code the thin mains in cmd/ run: Dir links it under each program's name,
// and Main, called first in TestMain, runs the program a link was started
// as.
package cmdtest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/fleetlearn/fleetlearn/cmd/internal/clicmd"
	"github.com/fleetlearn/fleetlearn/cmd/internal/edgecmd"
	"github.com/fleetlearn/fleetlearn/cmd/internal/servercmd"
	"github.com/fleetlearn/fleetlearn/cmd/internal/workercmd"
)

// Programs are the names Dir links, one per directory of cmd/ that holds a
// main package.
var Programs = []string{"fleetlearn", "fleetlearn-server", "fleetlearn-edge", "fleetlearn-worker"}

// Main runs the program the test binary was started as, under one of the
// names Dir links, and exits with its status; started under any other name
// it returns at once. Call it first in TestMain, before flags are parsed.
func Main() {
	var run func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int
	switch filepath.Base(os.Args[0]) {
	case "fleetlearn":
		run = func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
			return clicmd.Main(ctx, args, stdout, stderr)
		}
	case "fleetlearn-server":
		run = func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
			return servercmd.Main(ctx, args, stdout, stderr)
		}
	case "fleetlearn-edge":
		// As cmd/fleetlearn-edge: the agent serves no heap profiles.
		runtime.MemProfileRate = 0
		run = edgecmd.Main
	case "fleetlearn-worker":
		run = func(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
			return workercmd.Main(ctx, args, stdout, stderr)
		}
	default:
		return
	}
	// The same signals as the programs' mains.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Dir returns a directory holding the programs, each a link to the running
// test binary (a hard link where the file system allows, so that a program
// that starts itself again — the worker's ranks — finds itself under its
// own name; a copy otherwise). The test's TestMain must call Main.
func Dir(tb testing.TB) string {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatalf("cmdtest: the test binary: %v", err)
	}
	dir := tb.TempDir()
	for _, name := range Programs {
		if err := link(self, filepath.Join(dir, name)); err != nil {
			tb.Fatalf("cmdtest: %v", err)
		}
	}
	return dir
}

func link(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", dst, err)
	}
	return out.Close()
}
