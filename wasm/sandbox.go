package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Limits bound one module call. Zero fields take the sandbox's defaults.
type Limits struct {
	// MemoryPages caps the module's linear memory in 64 KiB pages.
	MemoryPages uint32
	// Timeout is the call's wall-clock limit; the module is closed when it passes.
	Timeout time.Duration
	// MaxWork caps host kernel work, counted in floating-point operations
	// (a gemm of m×k by k×n costs 2mnk; element-wise kernels cost one per value).
	MaxWork int64
	// MaxTensorBytes caps the bytes of host tensors alive at once, parameters included.
	MaxTensorBytes int64
}

// DefaultLimits are used for any field a sandbox's options and a call leave zero.
var DefaultLimits = Limits{
	MemoryPages:    2048, // 128 MiB: the Go runtime plus small module-side state
	Timeout:        5 * time.Minute,
	MaxWork:        2e12,
	MaxTensorBytes: 1 << 30,
}

func (l Limits) orDefault(d Limits) Limits {
	if l.MemoryPages == 0 {
		l.MemoryPages = d.MemoryPages
	}
	if l.Timeout == 0 {
		l.Timeout = d.Timeout
	}
	if l.MaxWork == 0 {
		l.MaxWork = d.MaxWork
	}
	if l.MaxTensorBytes == 0 {
		l.MaxTensorBytes = d.MaxTensorBytes
	}
	return l
}

// Bounds a Limits must respect. MaxMemoryPages is all wasm32 can address
// (4 GiB). MaxTimeout is far above any round a fleet would wait for; it keeps
// a mistaken task from holding a device's sandbox for days on end.
const (
	MaxMemoryPages = 65536
	MaxTimeout     = 24 * time.Hour
)

// Validate reports whether the sandbox can honour l; a zero field stands for
// the sandbox default and is always valid. Errors wrap ErrLimits and say what
// is allowed, since they reach operators who set the limits on a task.
func (l Limits) Validate() error {
	var bad []string
	if l.MemoryPages > MaxMemoryPages {
		bad = append(bad, fmt.Sprintf("memory pages %d above the wasm32 maximum %d (64 KiB pages; 0 takes the sandbox default)",
			l.MemoryPages, MaxMemoryPages))
	}
	if l.Timeout < 0 || l.Timeout > MaxTimeout {
		bad = append(bad, fmt.Sprintf("timeout %v not in [0, %v] (0 takes the sandbox default)", l.Timeout, MaxTimeout))
	}
	if l.MaxWork < 0 {
		bad = append(bad, fmt.Sprintf("max work %d is negative (0 takes the sandbox default)", l.MaxWork))
	}
	if l.MaxTensorBytes < 0 {
		bad = append(bad, fmt.Sprintf("max tensor bytes %d is negative (0 takes the sandbox default)", l.MaxTensorBytes))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrLimits, strings.Join(bad, "; "))
}

// Option configures a Sandbox.
type Option func(*config)

type config struct {
	cacheDir string
	engine   string
	// compileBudget replaces the rent after which EngineAuto compiles a
	// module (tests: a nanosecond compiles after the first call, an hour
	// never).
	compileBudget time.Duration
	limits        Limits
	logger        *slog.Logger
	maxCode       int
}

// WithCacheDir keeps compiled machine code in dir so later processes skip compilation.
func WithCacheDir(dir string) Option { return func(c *config) { c.cacheDir = dir } }

// WithEngine runs modules with the named engine (EngineAuto,
// EngineCompiler or EngineInterpreter) instead of the default, EngineAuto
// where wazero compiles for this machine and the interpreter elsewhere.
// New refuses an engine this machine cannot run with ErrEngine.
func WithEngine(name string) Option { return func(c *config) { c.engine = name } }

// WithLimits sets the defaults for calls that leave a limit zero.
func WithLimits(l Limits) Option { return func(c *config) { c.limits = l } }

// WithLogger receives module log lines (at debug level) and sandbox events.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithMaxModuleBytes refuses modules larger than n bytes (default 64 MiB).
func WithMaxModuleBytes(n int) Option { return func(c *config) { c.maxCode = n } }

// Sandbox compiles and runs update modules. It is safe for concurrent use.
//
// One wazero runtime per engine serves every call: the per-call memory cap
// is enforced by a memory allocator handed to each instantiation, not by the
// runtime, so calls with different caps share compiled code.
type Sandbox struct {
	cfg    config
	engine string // resolved: EngineAuto, EngineCompiler or EngineInterpreter
	cache  wazero.CompilationCache
	rt     wazero.Runtime                    // the compiler's, or the interpreter's under EngineInterpreter
	irt    wazero.Runtime                    // under EngineAuto, the interpreter's
	wasi   map[string]api.FunctionDefinition // signatures of the WASI functions we serve

	mu      sync.Mutex
	closed  bool
	modules map[string]*entry // by sha256

	promoting sync.WaitGroup // background compilations (tiered.go), awaited by Close

	pool       tensorPool
	dataChecks dataChecks
}

// New returns a sandbox. Close releases it.
func New(opts ...Option) (*Sandbox, error) {
	cfg := config{logger: slog.New(slog.DiscardHandler), maxCode: 64 << 20}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.limits = cfg.limits.orDefault(DefaultLimits)
	if err := cfg.limits.Validate(); err != nil {
		return nil, fmt.Errorf("wasm: new: %w", err)
	}
	engine, err := resolveEngine(cfg.engine)
	if err != nil {
		return nil, fmt.Errorf("wasm: new: %w", err)
	}
	s := &Sandbox{cfg: cfg, engine: engine, modules: map[string]*entry{}}
	if cfg.cacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(cfg.cacheDir)
		if err != nil {
			return nil, fmt.Errorf("wasm: new: compilation cache: %w", err)
		}
		s.cache = c
	} else {
		s.cache = wazero.NewCompilationCache()
	}
	main := EngineCompiler
	if engine == EngineInterpreter {
		main = EngineInterpreter
	}
	if s.rt, err = s.newRuntime(main); err != nil {
		s.cache.Close(context.Background())
		return nil, err
	}
	s.wasi = s.rt.Module(wasiModule).ExportedFunctionDefinitions()
	if engine == EngineAuto {
		if s.irt, err = s.newRuntime(EngineInterpreter); err != nil {
			s.rt.Close(context.Background())
			s.cache.Close(context.Background())
			return nil, err
		}
	}
	return s, nil
}

// newRuntime starts a runtime of one engine with the WASI functions and the
// host modules instantiated.
func (s *Sandbox) newRuntime(engine string) (wazero.Runtime, error) {
	ctx := context.Background()
	rc := newRuntimeConfig(engine).
		WithCompilationCache(s.cache).
		WithMemoryLimitPages(MaxMemoryPages).
		WithCloseOnContextDone(true).
		WithCoreFeatures(api.CoreFeaturesV2)
	rt := wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("wasm: new: wasi: %w", err)
	}
	if err := instantiateHost(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("wasm: new: host module: %w", err)
	}
	return rt, nil
}

// Engine is the engine the sandbox runs modules with: EngineAuto,
// EngineCompiler or EngineInterpreter.
func (s *Sandbox) Engine() string { return s.engine }

// Close releases all runtimes and compiled code. It is safe to call twice.
func (s *Sandbox) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	// A compilation under way finishes first: the runtime it compiles in
	// must not close under it.
	s.promoting.Wait()
	errs := []error{s.rt.Close(ctx)}
	if s.irt != nil {
		errs = append(errs, s.irt.Close(ctx))
	}
	return errors.Join(append(errs, s.cache.Close(ctx))...)
}

// Hash returns the lowercase hex sha256 that identifies module bytes.
func Hash(code []byte) string {
	h := sha256.Sum256(code)
	return hex.EncodeToString(h[:])
}

// Load checks that code hashes to wantSHA256 (lowercase hex), compiles it,
// checks that it exports the ABI's entry points and reads the ABI version it
// declares, and refuses it unless this host serves that version and the
// module imports only from that version's namespace. Reading the version runs
// the module's initialisation once, under the sandbox's default limits; each
// call checks the version again, in its own fresh instance.
func (s *Sandbox) Load(ctx context.Context, code []byte, wantSHA256 string) (*Module, error) {
	if len(code) > s.cfg.maxCode {
		return nil, fmt.Errorf("wasm: load: %w: %d bytes, limit %d", ErrInvalidModule, len(code), s.cfg.maxCode)
	}
	got := Hash(code)
	if got != wantSHA256 {
		return nil, fmt.Errorf("wasm: load: %w: bytes hash to %s, want %s", ErrHashMismatch, got, wantSHA256)
	}
	// Loads of the same bytes share one compilation: a fleet of agents in one
	// process (the demo) must not compile the module once per agent.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("wasm: load: %w", ErrClosed)
	}
	e, ok := s.modules[got]
	if !ok {
		e = &entry{ready: make(chan struct{})}
		s.modules[got] = e
	}
	s.mu.Unlock()
	if !ok {
		// The compilation, and the instance that reads the declared
		// version, outlive the caller that started them: a loader whose
		// context ends (a round that closed) must not fail the loaders
		// waiting on the same bytes, nor make the next one start over.
		// Both are bounded by the sandbox's default limits.
		go func() {
			e.err = s.compile(context.WithoutCancel(ctx), e, code, got)
			if e.err != nil {
				s.mu.Lock()
				delete(s.modules, got)
				s.mu.Unlock()
			}
			close(e.ready)
		}()
	}
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("wasm: load %s: %w", got[:12], ctx.Err())
	}
	if e.err != nil {
		return nil, e.err
	}
	s.mu.Lock()
	e.refs++
	s.mu.Unlock()
	return &Module{s: s, hash: got, e: e, version: e.version}, nil
}

// entry is one compiled module shared by every Module loaded from the same
// bytes. Its fields are set before ready is closed; rt and cm, and the
// tiering fields, change afterwards only under the sandbox's mu.
type entry struct {
	ready   chan struct{}
	rt      wazero.Runtime // the runtime that compiled cm
	cm      wazero.CompiledModule
	version int // the ABI version the module declares
	err     error
	refs    int
	memHint atomic.Uint64 // bytes of memory the last call ended with
	tier                  // under EngineAuto, while the module runs on the interpreter
}

// compile compiles code into e, checks its shape and reads the ABI version
// it declares. Reading the version runs the module (its _initialize and
// fleetlearn_abi_version) in a fresh instance under the sandbox's default
// limits, with every host function refused, so that a module importing from
// a namespace its version does not have is refused here rather than on its
// first call. Under EngineAuto a module the compiler has not compiled on this
// device before is prepared for the interpreter (tiered.go).
func (s *Sandbox) compile(ctx context.Context, e *entry, code []byte, hash string) error {
	op := "wasm: load " + hash[:12]
	code = mergeDataSegments(code)
	rt := s.rt
	interpret := s.engine == EngineAuto && !s.compiledBefore(hash)
	if interpret {
		rt = s.irt
	}
	start := time.Now()
	cm, err := rt.CompileModule(ctx, code)
	if err != nil {
		return fmt.Errorf("%s: %w: %v", op, ErrInvalidModule, err)
	}
	prepared := time.Since(start)
	im, err := s.checkShape(cm)
	if err != nil {
		cm.Close(ctx)
		return fmt.Errorf("%s: %w", op, err)
	}
	v, err := s.probeVersion(ctx, op, rt, cm)
	if err == nil {
		err = im.checkVersion(v)
		if err != nil {
			err = fmt.Errorf("%s: %w", op, err)
		}
	}
	if err != nil {
		cm.Close(ctx)
		return err
	}
	e.rt, e.cm, e.version = rt, cm, v
	if interpret {
		e.tier = s.newTier(hash, code, prepared)
	}
	return nil
}

// probeVersion calls fleetlearn_abi_version in a fresh instance of cm.
func (s *Sandbox) probeVersion(ctx context.Context, op string, rt wazero.Runtime, cm wazero.CompiledModule) (int, error) {
	lim := s.cfg.limits
	st := &callState{log: s.cfg.logger, limits: lim, handles: []*tensor{nil}, pool: &s.pool, probe: true}
	inst, err := s.instantiate(ctx, rt, cm, st, lim, 0, 0)
	defer inst.close(ctx)
	if err != nil {
		return 0, callErr(op, "instantiate", st, inst.ctx, err, inst.out, lim, inst.alloc)
	}
	res, err := inst.mod.ExportedFunction(exportVersion).Call(inst.ctx)
	if err != nil || st.err != nil {
		return 0, callErr(op, exportVersion, st, inst.ctx, err, inst.out, lim, inst.alloc)
	}
	return int(int32(uint32(res[0]))), nil
}

// release drops one reference to a shared compilation, closing it with the last.
func (s *Sandbox) release(ctx context.Context, e *entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.refs--
	if e.refs > 0 {
		return nil
	}
	for h, x := range s.modules {
		if x == e {
			delete(s.modules, h)
		}
	}
	errs := []error{e.cm.Close(ctx)}
	for _, cm := range e.retired {
		errs = append(errs, cm.Close(ctx))
	}
	return errors.Join(errs...)
}

// checkShape refuses imports outside the ABI, imports with the wrong
// signature, and modules without the ABI's exports. It returns the version
// whose host namespace the module imports from (0 if it imports none): a
// module imports from exactly one, that of the version it declares.
func (s *Sandbox) checkShape(cm wazero.CompiledModule) (imports, error) {
	var im imports
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		var params, results []api.ValueType
		v := namespaceVersion(mod)
		switch h := hostByName[name]; {
		case v != 0 && h != nil && h.since <= v:
			params, results = h.params, h.results
			if im.ns != 0 && im.ns != v {
				return im, fmt.Errorf("%w: imports both %s and %s.%s; a module imports host functions from one namespace, that of the ABI version it declares",
					ErrForbiddenImport, im.first, mod, name)
			}
			if im.ns == 0 {
				im.ns, im.first = v, mod+"."+name
			}
		case v != 0 && h != nil:
			return im, fmt.Errorf("%w: %s.%s is not in ABI v%d: it is new in v%d; declare fleetlearn_abi_version %d and import it from %s",
				ErrForbiddenImport, mod, name, v, h.since, h.since, HostModuleOf(h.since))
		case mod == wasiModule && wasiAllowed[name]:
			d := s.wasi[name]
			params, results = d.ParamTypes(), d.ResultTypes()
		default:
			return im, fmt.Errorf("%w: %s.%s is not granted by ABI v%d to v%d", ErrForbiddenImport, mod, name, MinABIVersion, ABIVersion)
		}
		if !slices.Equal(f.ParamTypes(), params) || !slices.Equal(f.ResultTypes(), results) {
			return im, fmt.Errorf("%w: import %s.%s has signature %v -> %v, the ABI has %v -> %v", ErrABI, mod, name,
				typeNames(f.ParamTypes()), typeNames(f.ResultTypes()), typeNames(params), typeNames(results))
		}
	}
	for _, m := range cm.ImportedMemories() {
		mod, name, _ := m.Import()
		return im, fmt.Errorf("%w: memory %s.%s (modules must define their own memory)", ErrForbiddenImport, mod, name)
	}
	exports := cm.ExportedFunctions()
	want := map[string][2]int{exportVersion: {0, 1}, exportTrain: {0, 1}, exportEvaluate: {0, 1}}
	for name, sig := range want {
		f, ok := exports[name]
		if !ok {
			return im, fmt.Errorf("%w: missing export %q", ErrABI, name)
		}
		if len(f.ParamTypes()) != sig[0] || len(f.ResultTypes()) != sig[1] || f.ResultTypes()[0] != api.ValueTypeI32 {
			return im, fmt.Errorf("%w: export %q must be () -> i32", ErrABI, name)
		}
	}
	if len(cm.ExportedMemories()) == 0 {
		return im, fmt.Errorf("%w: module exports no memory", ErrABI)
	}
	return im, nil
}

// imports is what checkShape learnt of a module's host imports: the ABI
// version whose namespace they come from (0 when there are none) and the
// first of them, to name in an error.
type imports struct {
	ns    int
	first string
}

// checkVersion refuses a declared ABI version this host does not serve, and
// imports from a namespace other than the declared version's.
func (im imports) checkVersion(declared int) error {
	if declared < MinABIVersion || declared > ABIVersion {
		return fmt.Errorf("%w: module declares ABI v%d, this host serves v%d to v%d", ErrABIVersion, declared, MinABIVersion, ABIVersion)
	}
	if im.ns != 0 && im.ns != declared {
		return fmt.Errorf("%w: module declares ABI v%d but imports %s; ABI v%d modules import host functions from %s",
			ErrForbiddenImport, declared, im.first, declared, HostModuleOf(declared))
	}
	return nil
}

func typeNames(ts []api.ValueType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = api.ValueTypeName(t)
	}
	return out
}

// boundedBuffer keeps the first and the last max/2 bytes written: the start of
// a module's output says what it was doing, the end (a panic) how it failed.
type boundedBuffer struct {
	mu      sync.Mutex
	head    []byte
	tail    []byte // the most recent bytes after head filled up
	max     int
	dropped int
}

func (w *boundedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	half := w.max / 2
	n := min(len(p), half-len(w.head))
	w.head = append(w.head, p[:n]...)
	rest := p[n:]
	w.tail = append(w.tail, rest...)
	if over := len(w.tail) - half; over > 0 {
		w.dropped += over
		w.tail = append(w.tail[:0], w.tail[over:]...)
	}
	return len(p), nil
}

func (w *boundedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dropped > 0 {
		return fmt.Sprintf("%s\n[... %d bytes dropped ...]\n%s", w.head, w.dropped, w.tail)
	}
	return string(w.head) + string(w.tail)
}

var _ io.Writer = (*boundedBuffer)(nil)
