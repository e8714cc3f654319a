// Package wasmtest builds Fleetlearn update modules from Go source for tests
// (the shipped examples are prebuilt in wasm/examples/embedded). Builds are cached per process and per
// package; the go build cache makes repeat builds across processes cheap.
package wasmtest

import (
	"context"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/wasm/build"
)

// Example module packages shipped with Fleetlearn.
const (
	MLP     = build.MLP
	Softmax = build.Softmax
	LM      = build.LM
)

var (
	mu    sync.Mutex
	built = map[string][]byte{}
)

// Build compiles the Go package pkg (an import path or a directory) into a
// module and returns its bytes, failing the test on error.
func Build(tb testing.TB, pkg string) []byte {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if b, ok := built[pkg]; ok {
		return b
	}
	b, err := build.Module(context.Background(), "", pkg)
	if err != nil {
		tb.Fatalf("wasmtest: %v", err)
	}
	built[pkg] = b
	return b
}
