package wasm_test

import (
	"os"
	"sync"
	"testing"
)

var (
	cacheOnce sync.Once
	cachePath string
)

// cacheDir is one compilation cache for the whole test binary, so each module
// is compiled to machine code once however many sandboxes the tests open.
func cacheDir(t testing.TB) string {
	cacheOnce.Do(func() {
		d, err := os.MkdirTemp("", "fleetlearn-wasm-cache-")
		if err != nil {
			t.Fatal(err)
		}
		cachePath = d
	})
	return cachePath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cachePath != "" {
		os.RemoveAll(cachePath)
	}
	os.Exit(code)
}
