package wasm

import (
	"fmt"
	"runtime"

	"github.com/tetratelabs/wazero"
	"golang.org/x/sys/cpu"
)

// The wazero engines a sandbox can run modules with.
const (
	// EngineCompiler compiles modules to machine code (amd64 with SSE4.1,
	// arm64).
	EngineCompiler = "compiler"
	// EngineInterpreter interprets them: every other platform (32-bit
	// arm, riscv64, ...), much slower but the same results.
	EngineInterpreter = "interpreter"
)

// Engine names the engine sandboxes use on this machine: EngineCompiler
// where wazero can compile for it, else EngineInterpreter. Agents print
// it with their version, since it decides how fast a device trains.
func Engine() string {
	if compilerSupported(runtime.GOOS, runtime.GOARCH, cpu.X86.HasSSE41) {
		return EngineCompiler
	}
	return EngineInterpreter
}

// compilerSupported is wazero's own test (internal/platform
// CompilerSupports, for the core features sandboxes enable, without
// threads): wazero.NewRuntimeConfigCompiler panics elsewhere, so the
// sandbox must choose the interpreter itself there, and the choice made
// here is the one Engine reports.
func compilerSupported(goos, goarch string, sse41 bool) bool {
	switch goos {
	case "linux", "darwin", "freebsd", "netbsd", "windows":
		if goarch == "arm64" {
			return true
		}
		return goarch == "amd64" && sse41
	case "dragonfly", "solaris", "illumos":
		return goarch == "amd64" && sse41
	}
	return false
}

// newRuntimeConfig is the runtime configuration of the engine named, or of
// the one Engine names when name is empty.
func newRuntimeConfig(name string) (wazero.RuntimeConfig, error) {
	switch name {
	case "":
		name = Engine()
	case EngineCompiler:
		if Engine() != EngineCompiler {
			return nil, fmt.Errorf("%w: wazero cannot compile for %s/%s; use the %s engine", ErrEngine, runtime.GOOS, runtime.GOARCH, EngineInterpreter)
		}
	case EngineInterpreter:
	default:
		return nil, fmt.Errorf("%w: %q is not an engine; use %s or %s", ErrEngine, name, EngineCompiler, EngineInterpreter)
	}
	if name == EngineCompiler {
		return wazero.NewRuntimeConfigCompiler(), nil
	}
	return wazero.NewRuntimeConfigInterpreter(), nil
}
