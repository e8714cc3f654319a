package gensdk

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesAreCurrent fails when wasm/sdk changed and wasm/sdk/v2
// was not regenerated (go generate ./wasm/sdk/v2).
func TestGeneratedFilesAreCurrent(t *testing.T) {
	want, err := Generate(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join("..", "..", "v2", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Errorf("wasm/sdk/v2/%s is not what gensdk makes of wasm/sdk: run go generate ./wasm/sdk/v2", name)
		}
	}
	for _, b := range want {
		if !bytes.Contains(b, []byte("//go:wasmimport fleetlearn_v2 ")) && bytes.Contains(b, []byte("wasmimport")) {
			t.Error("a generated file imports from another namespace")
		}
	}
}
