package wasm

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/tetratelabs/wazero"
)

// Under EngineAuto a module starts on the interpreter and moves to the
// compiler once it has earned it, by the rule of renting skis: keep
// renting until the rent paid equals the price of buying. The rent is the
// time each call spends in the module itself, outside host kernels, where
// the interpreter is slow (instantiation, the Go runtime's start, the
// module's own loops); the price is compiling, which costs compileFactor
// times what preparing the module for the interpreter cost at load. The
// device then pays at most about twice what the better of the two choices,
// made with hindsight, would have cost it (about: part of the rent is time
// the compiled module would spend too). A module that does all its work
// in host kernels (the MLP) runs interpreted for a few dozen rounds; one that
// computes in the module (the transformer's bookkeeping) compiles after a
// few calls. docs/ABI.md ("Starting a module") has the figures.

// compileFactor is how many times longer wazero's compiler takes to compile
// a module than its interpreter takes to prepare it: 8 to 17 for the
// example modules on amd64, 8 to 10 counting the CPU time of the garbage
// collection each leaves behind (docs/ABI.md).
const compileFactor = 10

// tier is what an entry running on the interpreter keeps towards its
// compilation; every field is under the sandbox's mu.
type tier struct {
	hash     string        // the module's
	code     []byte        // the bytes to compile; nil once compiling started
	budget   time.Duration // rent after which compiling pays
	rent     time.Duration // time spent in the module so far
	promoted chan struct{} // closed when compiling ended, compiled or not
	retired  []wazero.CompiledModule
}

// newTier starts the rent of a module prepared for the interpreter in
// prepared.
func (s *Sandbox) newTier(hash string, code []byte, prepared time.Duration) tier {
	budget := compileFactor * prepared
	if s.cfg.compileBudget != 0 {
		budget = s.cfg.compileBudget
	}
	return tier{hash: hash, code: code, budget: budget, promoted: make(chan struct{})}
}

// current returns the runtime and compiled module a call of e runs with,
// and whether that is the interpreter standing in for the compiler.
func (s *Sandbox) current(e *entry) (wazero.Runtime, wazero.CompiledModule, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.rt, e.cm, s.irt != nil && e.rt == s.irt
}

// charge adds one interpreted call's time in the module to e's rent and
// starts compiling the module once the rent reaches its budget.
func (s *Sandbox) charge(e *entry, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.rent += max(d, 0)
	if e.code == nil || e.rent < e.budget || s.closed {
		return
	}
	code := e.code
	e.code = nil
	s.promoting.Add(1)
	go s.promote(e, code)
}

// promote compiles code, which e runs on the interpreter, and has e's later
// calls run the compiled code. Calls in flight finish on the interpreter.
func (s *Sandbox) promote(e *entry, code []byte) {
	ctx := context.Background()
	defer s.promoting.Done()
	defer close(e.promoted)
	start := time.Now()
	cm, err := s.rt.CompileModule(ctx, code)
	hash := e.hash[:12]
	if err != nil {
		// The interpreter accepted the same bytes, so only a closed
		// sandbox gets here; the module stays interpreted.
		s.cfg.logger.Warn("wasm module not compiled; it stays on the interpreter", "module", hash, "err", err)
		return
	}
	s.mu.Lock()
	if e.refs == 0 || s.closed {
		s.mu.Unlock()
		cm.Close(ctx)
		return
	}
	e.retired = append(e.retired, e.cm)
	e.rt, e.cm = s.rt, cm
	rent := e.rent
	s.mu.Unlock()
	s.cfg.logger.Info("wasm module compiled to machine code", "module", hash,
		"interpreted", rent.Round(time.Millisecond), "compile", time.Since(start).Round(time.Millisecond))
	s.markCompiled(e)
}

// The compilation cache has no index to ask whether it holds a module: a
// marker file per module, beside it, says that the compiler of this build
// of wazero compiled it on this device, so that a restarted agent loads it
// from the cache at once instead of interpreting it again.

func (s *Sandbox) markerPath(hash string) string {
	if s.cfg.cacheDir == "" {
		return ""
	}
	return filepath.Join(s.cfg.cacheDir, "fleetlearn-compiled-"+wazeroVersion()+"-"+runtime.GOOS+"-"+runtime.GOARCH, hash)
}

// compiledBefore reports whether the cache holds the module hashing to hash.
func (s *Sandbox) compiledBefore(hash string) bool {
	p := s.markerPath(hash)
	if p == "" {
		return false
	}
	_, err := os.Stat(p)
	return err == nil
}

// markCompiled records that e's module is in the cache. A marker that
// cannot be written costs the next process an interpreted start, no more.
func (s *Sandbox) markCompiled(e *entry) {
	p := s.markerPath(e.hash)
	if p == "" {
		return
	}
	err := os.MkdirAll(filepath.Dir(p), 0o700)
	if err == nil {
		err = os.WriteFile(p, nil, 0o600)
	}
	if err != nil {
		s.cfg.logger.Warn("compiled module not marked in the cache; the next start interprets it first", "err", err)
	}
}

// wazeroVersion is the version of wazero built in, which the compilation
// cache is keyed by.
func wazeroVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/tetratelabs/wazero" {
				if d.Replace != nil {
					return d.Replace.Version
				}
				return d.Version
			}
		}
	}
	return "unknown"
}
