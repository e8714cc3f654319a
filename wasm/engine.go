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
	// arm64) before their first call.
	EngineCompiler = "compiler"
	// EngineInterpreter interprets them: every other platform (32-bit
	// arm, riscv64, ...), much slower but the same results.
	EngineInterpreter = "interpreter"
	// EngineAuto, the default where the compiler runs, starts each module
	// on the interpreter, which prepares it some ten times faster than
	// the compiler compiles it, and compiles it in the background once the
	// time the module has spent outside host kernels would have paid for
	// compiling it; a module whose compiled code the cache already holds
	// starts compiled. docs/ABI.md ("Starting a module") has the figures.
	EngineAuto = "auto"
)

// Engine names the best engine sandboxes have on this machine: EngineCompiler
// where wazero can compile for it, else EngineInterpreter. A sandbox uses
// EngineAuto by default where this is the compiler. Agents print it with
// their version, since it decides how fast a device trains.
func Engine() string {
	if compilerSupported(runtime.GOOS, runtime.GOARCH, cpu.X86.HasSSE41) {
		return EngineCompiler
	}
	return EngineInterpreter
}

// Engines lists the engine names WithEngine accepts on this machine.
func Engines() []string {
	if Engine() == EngineCompiler {
		return []string{EngineAuto, EngineCompiler, EngineInterpreter}
	}
	return []string{EngineInterpreter}
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

// resolveEngine returns the engine a sandbox asked for name runs: the
// default ("") is EngineAuto where the compiler runs and the interpreter
// elsewhere. The compiler and EngineAuto are refused where wazero cannot
// compile.
func resolveEngine(name string) (string, error) {
	switch name {
	case "":
		if Engine() == EngineCompiler {
			return EngineAuto, nil
		}
		return EngineInterpreter, nil
	case EngineCompiler, EngineAuto:
		if Engine() != EngineCompiler {
			return "", fmt.Errorf("%w: wazero cannot compile for %s/%s; use the %s engine", ErrEngine, runtime.GOOS, runtime.GOARCH, EngineInterpreter)
		}
		return name, nil
	case EngineInterpreter:
		return name, nil
	}
	return "", fmt.Errorf("%w: %q is not an engine; use %s, %s or %s", ErrEngine, name, EngineAuto, EngineCompiler, EngineInterpreter)
}

// newRuntimeConfig is the runtime configuration of one of the two wazero
// engines.
func newRuntimeConfig(engine string) wazero.RuntimeConfig {
	if engine == EngineCompiler {
		return wazero.NewRuntimeConfigCompiler()
	}
	return wazero.NewRuntimeConfigInterpreter()
}
