package wasm

import (
	"runtime"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestCompilerSupported: the platforms where wazero compiles are the ones
// its documentation and internal/platform name (amd64 with SSE4.1, arm64,
// on the operating systems it has a code mmap for); 32-bit arm, where
// edge devices often run, interprets.
func TestCompilerSupported(t *testing.T) {
	for _, c := range []struct {
		goos, goarch string
		sse41, want  bool
	}{
		{"linux", "amd64", true, true},
		{"linux", "amd64", false, false},
		{"linux", "arm64", false, true},
		{"darwin", "arm64", false, true},
		{"windows", "amd64", true, true},
		{"illumos", "amd64", true, true},
		{"illumos", "arm64", false, false},
		{"linux", "arm", false, false},
		{"linux", "386", true, false},
		{"linux", "riscv64", false, false},
		{"openbsd", "amd64", true, false},
		{"wasip1", "wasm", false, false},
	} {
		if got := compilerSupported(c.goos, c.goarch, c.sse41); got != c.want {
			t.Errorf("compilerSupported(%s, %s, sse4.1 %v) = %v, want %v", c.goos, c.goarch, c.sse41, got, c.want)
		}
	}
}

// TestEngineHere: the sandbox opens on this machine with the engine Engine
// names; on the platforms CI runs on that is the compiler.
func TestEngineHere(t *testing.T) {
	e := Engine()
	if e != EngineCompiler && e != EngineInterpreter {
		t.Fatalf("Engine() = %q", e)
	}
	if (runtime.GOARCH == "arm64" || runtime.GOARCH == "amd64" && cpu.X86.HasSSE41) && runtime.GOOS == "linux" && e != EngineCompiler {
		t.Errorf("Engine() = %q on %s/%s, want the compiler", e, runtime.GOOS, runtime.GOARCH)
	}
	t.Logf("%s/%s: wazero %s", runtime.GOOS, runtime.GOARCH, e)
}
