package wasm

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model"
)

// Module is a loaded, hash-checked update module. Each call runs in a fresh
// instance, so no state survives from one call to the next.
type Module struct {
	s       *Sandbox
	hash    string
	e       *entry
	version int
	close   sync.Once
}

// SHA256 is the lowercase hex hash of the module's bytes.
func (m *Module) SHA256() string { return m.hash }

// Engine is the engine the module's next call runs on, EngineCompiler or
// EngineInterpreter: under EngineAuto it starts on the interpreter and
// moves to the compiler once compiling it has paid (tiered.go).
func (m *Module) Engine() string {
	if m.s.engine == EngineInterpreter {
		return EngineInterpreter
	}
	if _, _, interpreted := m.s.current(m.e); interpreted {
		return EngineInterpreter
	}
	return EngineCompiler
}

// ABIVersion is the ABI version the module declares (its
// fleetlearn_abi_version), one this host serves.
func (m *Module) ABIVersion() int { return m.version }

// Close releases the module's compiled code. It is safe to call twice.
func (m *Module) Close(ctx context.Context) error {
	var err error
	m.close.Do(func() { err = m.s.release(ctx, m.e) })
	return err
}

// Call is one invocation of a module's train or evaluate entry point.
type Call struct {
	Model *model.Model
	// Data must not change while calls use it: a sandbox validates a
	// dataset's contents once, at its first call.
	Data   *data.Dataset
	Hyper  json.RawMessage // task hyper-parameters, passed to the module verbatim
	Seed   uint64          // drives example order and the module's random source
	Limits Limits          // zero fields take the sandbox defaults
	// Trainable lists, ascending, the indices of the parameters a train
	// call may change; empty means all. It needs ABI 2 or later (the
	// request's "trainable" field): a v1 module cannot be told, so such a
	// call is refused. A module that changes a parameter outside the list
	// fails with ErrResult.
	Trainable []int
}

// Result is what a call returned, validated.
type Result struct {
	// Model holds the weights after a train call (same layout as the input);
	// nil after evaluate.
	Model       *model.Model
	NumExamples int
	Metrics     map[string]float64
	// Work is the kernel work the call used, in the units of Limits.MaxWork.
	Work     int64
	Duration time.Duration
	// Stderr is the start of what the module wrote to stdout and stderr.
	Stderr string
}

// Train runs the module's train entry point on the call's model and data.
func (m *Module) Train(ctx context.Context, c Call) (*Result, error) {
	return m.run(ctx, exportTrain, c)
}

// Evaluate runs the module's evaluate entry point; the model is not changed.
func (m *Module) Evaluate(ctx context.Context, c Call) (*Result, error) {
	return m.run(ctx, exportEvaluate, c)
}

// paramDims views a tensor of any rank as the matrix kernels see: rank 0 and 1
// are one row, higher ranks keep their leading dimension as rows.
func paramDims(shape []int) (int, int) {
	switch len(shape) {
	case 0:
		return 1, 1
	case 1:
		return 1, shape[0]
	}
	cols := 1
	for _, d := range shape[1:] {
		cols *= d
	}
	return shape[0], cols
}

func (m *Module) run(ctx context.Context, entry string, c Call) (*Result, error) {
	op := "wasm: " + entry + " " + m.hash[:12]
	lim := c.Limits.orDefault(m.s.cfg.limits)
	if err := lim.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if c.Model == nil || c.Data == nil {
		return nil, fmt.Errorf("%s: %w: model and data are required", op, ErrInvalidCall)
	}
	if err := c.Model.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w: model: %v", op, ErrInvalidCall, err)
	}
	if err := m.s.dataChecks.validate(c.Data); err != nil {
		return nil, fmt.Errorf("%s: %w: data: %v", op, ErrInvalidCall, err)
	}
	hyper, err := requestHyper(c.Hyper)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	frozen, err := frozenParams(c, m.version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	req := &request{ABI: m.version, Kind: entry, Hyper: hyper, Seed: c.Seed, Trainable: c.Trainable,
		Data: dataInfo{Examples: c.Data.Len(), Dim: c.Data.Dim, Classes: c.Data.NumClasses}}
	if m.version >= 4 {
		req.Arch = c.Model.Arch
	}
	st := &callState{log: m.s.cfg.logger, data: c.Data, limits: lim, handles: []*tensor{nil}, pool: &m.s.pool,
		v3: v3State{req: req}}
	defer st.release()
	// Parameters are budgeted like any tensor; check up front, since outside a
	// module call nothing would recover newTensor's abort.
	var paramBytes int64
	for _, t := range c.Model.Tensors {
		paramBytes += 4 * int64(len(t.Data))
	}
	if len(c.Model.Tensors) >= maxHandles || paramBytes > lim.MaxTensorBytes {
		return nil, fmt.Errorf("%s: %w: model has %d tensors (limit %d live tensors) of %d bytes (limit %d)",
			op, ErrBudget, len(c.Model.Tensors), maxHandles-1, paramBytes, lim.MaxTensorBytes)
	}
	for _, t := range c.Model.Tensors {
		r, cols := paramDims(t.Shape)
		h := st.newTensor("param", r, cols, true)
		copy(st.handles[h].m.Data, t.Data)
		req.Params = append(req.Params, paramInfo{Name: t.Name, Shape: t.Shape})
	}
	st.nparams = len(c.Model.Tensors)
	if st.input, err = json.Marshal(req); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", op, ErrInvalidCall, err)
	}

	rt, cm, interpreted := m.s.current(m.e)
	st.timeHost = interpreted
	start := time.Now()
	if interpreted {
		// Whatever its outcome, the call's time in the module counts
		// towards compiling it.
		defer func() { m.s.charge(m.e, time.Since(start)-st.hostTime) }()
	}
	inst, err := m.s.instantiate(ctx, rt, cm, st, lim, c.Seed, m.e.memHint.Load())
	defer inst.close(ctx)
	defer func() { m.e.memHint.Store(inst.alloc.size()) }()
	cctx, out, alloc := inst.ctx, inst.out, inst.alloc
	if err != nil {
		return nil, callErr(op, "instantiate", st, cctx, err, out, lim, alloc)
	}
	verRes, err := inst.mod.ExportedFunction(exportVersion).Call(cctx)
	if err != nil || st.err != nil {
		return nil, callErr(op, exportVersion, st, cctx, err, out, lim, alloc)
	}
	if v := int(int32(uint32(verRes[0]))); v != m.version {
		return nil, fmt.Errorf("%s: %w: module declared ABI v%d at load and declares v%d now", op, ErrABIVersion, m.version, v)
	}
	res, err := inst.mod.ExportedFunction(entry).Call(cctx)
	if err != nil || st.err != nil {
		return nil, callErr(op, entry, st, cctx, err, out, lim, alloc)
	}
	if code := int32(uint32(res[0])); code != 0 {
		msg := st.failMsg
		if msg == "" {
			msg = "no message"
		}
		return nil, fmt.Errorf("%s: %w: status %d: %s", op, ErrModuleFailed, code, msg)
	}

	doc, err := st.resultDoc()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	mr, err := decodeResult(doc, c.Data.Len())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	result := &Result{NumExamples: mr.NumExamples, Metrics: mr.Metrics, Work: st.work,
		Duration: time.Since(start), Stderr: out.String()}
	if entry == exportTrain {
		// The parameters' host storage becomes the result: no second copy.
		out := &model.Model{Lineage: model.Lineage{Parent: c.Model.Lineage.Version}, Arch: c.Model.Arch, Tensors: make([]model.Tensor, len(c.Model.Tensors))}
		for i, in := range c.Model.Tensors {
			d := st.handles[i+1].m.Data
			if j := floats.FirstNonFinite(d); j >= 0 {
				return nil, fmt.Errorf("%s: %w: weight %s[%d] is %v", op, ErrResult, in.Name, j, d[j])
			}
			if frozen != nil && frozen[i] && !floats.SameBits(d, in.Data) {
				return nil, fmt.Errorf("%s: %w: frozen parameter %s changed (the call trains only %d of %d parameters)",
					op, ErrResult, in.Name, len(c.Trainable), len(c.Model.Tensors))
			}
			out.Tensors[i] = model.Tensor{Name: in.Name, Shape: slices.Clone(in.Shape), Data: d[:len(d):len(d)]}
		}
		st.kept = true
		result.Model = out
	}
	return result, nil
}

// instance is one fresh instantiation of a module under one call's limits.
// ctx carries the call state, the memory allocator and the deadline; it and
// out and alloc are set even when instantiation failed, for callErr.
type instance struct {
	mod    api.Module
	ctx    context.Context
	cancel context.CancelFunc
	out    *boundedBuffer
	alloc  *capAllocator
}

// instantiate runs the module's start function in a fresh instance whose
// host calls see st, whose memory is capped at lim.MemoryPages and which is
// closed when lim.Timeout passes. seed drives the module's random source.
func (s *Sandbox) instantiate(ctx context.Context, rt wazero.Runtime, cm wazero.CompiledModule, st *callState, lim Limits, seed, memHint uint64) (*instance, error) {
	in := &instance{out: &boundedBuffer{max: 16 << 10}, alloc: &capAllocator{maxBytes: uint64(lim.MemoryPages) * memoryPage, hint: memHint}}
	cctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	in.cancel = cancel
	st.ctx = cctx
	cctx = context.WithValue(cctx, stateKey{}, st)
	in.ctx = experimental.WithMemoryAllocator(cctx, in.alloc)
	var rs [32]byte
	binary.LittleEndian.PutUint64(rs[:], seed)
	mc := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(exportInit).
		WithStdout(in.out).WithStderr(in.out).
		WithRandSource(rand.NewChaCha8(rs))
	mod, err := rt.InstantiateModule(in.ctx, cm, mc)
	in.mod = mod
	return in, err
}

// close releases the instance, if there is one, and its deadline.
func (in *instance) close(ctx context.Context) {
	if in.mod != nil {
		in.mod.Close(context.WithoutCancel(ctx))
	}
	in.cancel()
}

// memoryPage is wasm's page size.
const memoryPage = 65536

// callErr turns a failed instantiate or call into one sentinel-wrapped error,
// preferring what the host observed over what the engine reports.
func callErr(op, stage string, st *callState, ctx context.Context, err error, out *boundedBuffer, lim Limits, alloc *capAllocator) error {
	if st.err != nil {
		return fmt.Errorf("%s: %w", op, st.err)
	}
	if alloc.refused() {
		return fmt.Errorf("%s: %w: %s: growth past %d pages (%d MiB) refused", op, ErrMemoryLimit, stage, lim.MemoryPages, uint64(lim.MemoryPages)*memoryPage>>20)
	}
	var exit *sys.ExitError
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded) {
		return fmt.Errorf("%s: %w: %s after %v", op, ErrDeadline, stage, lim.Timeout)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %s: %w", op, stage, ctx.Err())
	}
	if err == nil {
		err = errors.New("no error")
	}
	tail := out.String()
	if len(tail) > 512 {
		tail = tail[len(tail)-512:]
	}
	return fmt.Errorf("%s: %w: %s: %v (output: %q)", op, ErrModuleFailed, stage, firstLine(err), tail)
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// frozenParams checks a call's trainable list and returns which parameters
// it freezes (nil: none).
func frozenParams(c Call, version int) ([]bool, error) {
	if len(c.Trainable) == 0 {
		return nil, nil
	}
	if version < 2 {
		return nil, fmt.Errorf("%w: training only some parameters needs a module of ABI 2 or later; this one declares %d", ErrInvalidCall, version)
	}
	frozen := make([]bool, len(c.Model.Tensors))
	for i := range frozen {
		frozen[i] = true
	}
	for k, i := range c.Trainable {
		if i < 0 || i >= len(frozen) || k > 0 && i <= c.Trainable[k-1] {
			return nil, fmt.Errorf("%w: trainable parameter list %v is not ascending indices below %d", ErrInvalidCall, c.Trainable, len(frozen))
		}
		frozen[i] = false
	}
	return frozen, nil
}
