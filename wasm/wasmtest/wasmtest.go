// Package wasmtest builds Fleetlearn update modules from Go source for tests.
// The shipped examples come prebuilt from wasm/examples/embedded, which CI
// checks against their source (go generate ./wasm/examples/embedded): a
// test that uses one then builds nothing, where building for wasip1 on
// empty Go caches compiles the runtime and standard library once more.
// Other builds are cached per process and per package; the go build cache
// makes repeat builds across processes cheap.
package wasmtest

import (
	"context"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/wasm/build"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// Example module packages shipped with Fleetlearn.
const (
	MLP     = build.MLP
	Softmax = build.Softmax
	LM      = build.LM
	Seq     = build.Seq
	// MLPAsm is the MLP assembled without a language runtime: Build returns
	// the embedded module, which CI checks against mlpasm.Module.
	MLPAsm = "github.com/fleetlearn/fleetlearn/wasm/examples/mlpasm"
)

// prebuilt names the embedded module of each shipped example package.
var prebuilt = map[string]string{MLPAsm: "mlp", MLP: "mlp-go", Softmax: "softmax", LM: "lm", Seq: "seq"}

var (
	mu    sync.Mutex
	built = map[string][]byte{}
)

// Build compiles the Go package pkg (an import path or a directory) into a
// module and returns its bytes, failing the test on error; a shipped
// example (MLP, Softmax, LM) comes prebuilt.
func Build(tb testing.TB, pkg string) []byte {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if b, ok := built[pkg]; ok {
		return b
	}
	if name, ok := prebuilt[pkg]; ok {
		m, err := embedded.Lookup(name)
		if err != nil {
			tb.Fatalf("wasmtest: %v", err)
		}
		b, err := m.Code()
		if err != nil {
			tb.Fatalf("wasmtest: %v", err)
		}
		built[pkg] = b
		return b
	}
	b, err := build.Module(context.Background(), "", pkg)
	if err != nil {
		tb.Fatalf("wasmtest: %v", err)
	}
	built[pkg] = b
	return b
}
