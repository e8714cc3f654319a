// Package wasmtest builds Fleetlearn update modules from Go source for tests, so
// that no module binary is committed. Builds are cached per process and per
// package; the go build cache makes repeat builds across processes cheap.
package wasmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Example module packages shipped with Fleetlearn.
const (
	MLP     = "github.com/fleetlearn/fleetlearn/wasm/examples/mlp"
	Softmax = "github.com/fleetlearn/fleetlearn/wasm/examples/softmax"
)

var (
	mu    sync.Mutex
	built = map[string][]byte{}
)

// Build compiles the Go package pkg (an import path or a directory) with
// GOOS=wasip1 GOARCH=wasm -buildmode=c-shared and returns the module bytes.
func Build(tb testing.TB, pkg string) []byte {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if b, ok := built[pkg]; ok {
		return b
	}
	dir, err := os.MkdirTemp("", "fleetlearn-wasmtest-")
	if err != nil {
		tb.Fatalf("wasmtest: %v", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "module.wasm")
	cmd := exec.Command(goTool(), "build", "-trimpath", "-buildmode=c-shared", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("wasmtest: building %s: %v\n%s", pkg, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		tb.Fatalf("wasmtest: %v", err)
	}
	built[pkg] = b
	return b
}

func goTool() string {
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return "go"
}
