package mlpasm_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/fleetlearn/fleetlearn/wasm/examples/mlpasm"
)

// TestModuleValid: the assembled module passes WebAssembly validation under
// both of wazero's engines, and assembling it twice gives the same bytes.
func TestModuleValid(t *testing.T) {
	b := mlpasm.Module()
	if !bytes.Equal(b, mlpasm.Module()) {
		t.Fatal("two assemblies differ")
	}
	for name, cfg := range map[string]wazero.RuntimeConfig{
		"compiler": wazero.NewRuntimeConfigCompiler(), "interpreter": wazero.NewRuntimeConfigInterpreter()} {
		r := wazero.NewRuntimeWithConfig(context.Background(), cfg)
		if _, err := r.CompileModule(context.Background(), b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		r.Close(context.Background())
	}
	t.Logf("%d bytes", len(b))
}
