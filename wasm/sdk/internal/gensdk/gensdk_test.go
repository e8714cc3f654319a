package gensdk

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesAreCurrent fails when wasm/sdk changed and a later
// version's SDK was not regenerated (go generate ./wasm/sdk/...).
func TestGeneratedFilesAreCurrent(t *testing.T) {
	for _, v := range Versions {
		want, err := Generate(filepath.Join("..", ".."), v)
		if err != nil {
			t.Fatal(err)
		}
		dir := fmt.Sprintf("v%d", v)
		ns := fmt.Sprintf("//go:wasmimport fleetlearn_v%d ", v)
		for name, b := range want {
			got, err := os.ReadFile(filepath.Join("..", "..", dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, b) {
				t.Errorf("wasm/sdk/%s/%s is not what gensdk makes of wasm/sdk: run go generate ./wasm/sdk/...", dir, name)
			}
			if !bytes.Contains(b, []byte(ns)) && bytes.Contains(b, []byte("wasmimport")) {
				t.Errorf("%s/%s imports from another namespace", dir, name)
			}
		}
	}
}
