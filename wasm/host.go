package wasm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// Per-call caps that do not depend on the task.
const (
	maxHandles  = 1 << 14
	maxFailMsg  = 4 << 10
	maxLogBytes = 16 << 10
)

// tensor is one host-held matrix. cap is the element count its storage was
// allocated (and budgeted) for; resize may change the shape within it.
type tensor struct {
	m     kernel.Mat
	cap   int
	param bool
}

// callState is everything one module call may touch. It reaches host functions
// through the context, so concurrent calls share no state.
type callState struct {
	ctx     context.Context
	input   []byte
	output  []byte
	failMsg string
	logs    int
	log     *slog.Logger
	data    *data.Dataset
	handles []*tensor // index 0 is never used
	pool    *tensorPool
	kept    bool     // the parameters' storage went to the call's result
	free    []uint32 // released handles, reused first
	nparams int
	limits  Limits
	work    int64
	bytes   int64
	err     error // first host-detected error; it aborts the call
	probe   bool  // the load-time version probe: no host function may run
	// timeHost has host functions add their time to hostTime: the call
	// runs on the interpreter, and the time outside them counts towards
	// compiling the module (tiered.go).
	timeHost bool
	hostTime time.Duration
	// wrote is set by output_write, even of no bytes, so that a module
	// using both ways of returning a result is told so.
	wrote bool
	v3    v3State
}

type stateKey struct{}

func stateOf(ctx context.Context) *callState { return ctx.Value(stateKey{}).(*callState) }

// abort records the first error and unwinds the module: wazero recovers the
// panic and returns it from the exported call, where the recorded error wins.
func (s *callState) abort(err error) {
	if s.err == nil {
		s.err = err
	}
	panic(s.err)
}

// kernelErr aborts with a kernel's own error, which already names the kernel.
func (s *callState) kernelErr(err error) {
	if errors.Is(err, ErrDeadline) || errors.Is(err, context.Canceled) {
		s.abort(err)
	}
	s.abort(fmt.Errorf("%w: %v", ErrKernel, err))
}

// release returns the storage of the call's live tensors to the pool, except
// parameters that became the result.
func (s *callState) release() {
	for i, t := range s.handles {
		if t == nil || (t.param && s.kept) {
			continue
		}
		s.handles[i] = nil
		s.pool.put(t.m.Data)
	}
}

func (s *callState) charge(op string, work int64) {
	s.work += work
	if s.limits.MaxWork > 0 && s.work > s.limits.MaxWork {
		s.abort(fmt.Errorf("%w: %s: work %d exceeds limit %d", ErrBudget, op, s.work, s.limits.MaxWork))
	}
}

func (s *callState) tensor(op string, h uint32) *tensor {
	if h == 0 || int(h) >= len(s.handles) || s.handles[h] == nil {
		s.abort(fmt.Errorf("%w: %s: handle %d is not a live tensor of this call", ErrKernel, op, h))
	}
	return s.handles[h]
}

func (s *callState) mat(op string, h uint32) kernel.Mat { return s.tensor(op, h).m }

// apart refuses a product whose output c is also an input (a or b). BLAS
// requires C apart from A and B: gonum splits a large product across
// goroutines, which would then read values of C that others are writing, a
// data race in the host whose result depends on scheduling. Distinct handles
// never share storage, so comparing handles suffices.
func (s *callState) apart(op string, a, b, c uint32) {
	for _, in := range []struct {
		name string
		h    uint32
	}{{"A", a}, {"B", b}} {
		if in.h == c {
			s.abort(fmt.Errorf("%w: %s: C (handle %d) is also %s; write the product into a tensor of its own", ErrKernel, op, c, in.name))
		}
	}
}

// optMat treats handle 0 as "no tensor".
func (s *callState) optMat(op string, h uint32) kernel.Mat {
	if h == 0 {
		return kernel.Mat{}
	}
	return s.mat(op, h)
}

func dims(op string, rows, cols int32) (int, int, error) {
	if rows < 0 || cols < 0 {
		return 0, 0, fmt.Errorf("%w: %s: negative shape %dx%d", ErrKernel, op, rows, cols)
	}
	n := int64(rows) * int64(cols)
	if n > math.MaxInt32 {
		return 0, 0, fmt.Errorf("%w: %s: shape %dx%d too large", ErrKernel, op, rows, cols)
	}
	return int(rows), int(cols), nil
}

func (s *callState) newTensor(op string, rows, cols int, param bool) uint32 {
	n := rows * cols
	size := int64(n) * 4
	if s.limits.MaxTensorBytes > 0 && s.bytes+size > s.limits.MaxTensorBytes {
		s.abort(fmt.Errorf("%w: %s: %d tensor bytes would exceed limit %d", ErrBudget, op, s.bytes+size, s.limits.MaxTensorBytes))
	}
	s.charge(op, int64(n)) // zeroing the storage is work too
	// Parameters are overwritten at once; only new tensors must start at zero.
	t := &tensor{m: kernel.Mat{Rows: rows, Cols: cols, Data: s.pool.get(n, !param)}, cap: n, param: param}
	if k := len(s.free); k > 0 {
		h := s.free[k-1]
		s.free = s.free[:k-1]
		s.handles[h] = t
		s.bytes += size
		return h
	}
	if len(s.handles) >= maxHandles {
		s.abort(fmt.Errorf("%w: %s: more than %d live tensors", ErrBudget, op, maxHandles-1))
	}
	s.bytes += size
	s.handles = append(s.handles, t)
	return uint32(len(s.handles) - 1)
}

// readMem copies n bytes at ptr out of module memory, refusing ranges outside it.
func (s *callState) memRange(op string, mod api.Module, ptr, n uint32) []byte {
	b, ok := mod.Memory().Read(ptr, n)
	if !ok {
		s.abort(fmt.Errorf("%w: %s: [%d,+%d) outside %d bytes of module memory", ErrMemoryAccess, op, ptr, n, mod.Memory().Size()))
	}
	return b
}

func elemBytes(op string, s *callState, n uint32) uint32 {
	if n > math.MaxUint32/4 {
		s.abort(fmt.Errorf("%w: %s: %d elements", ErrMemoryAccess, op, n))
	}
	return n * 4
}

// hostFn is one host function. since is the first ABI version that has it;
// every later version serves the same function, under its own namespace.
type hostFn struct {
	name    string
	since   int
	params  []api.ValueType
	results []api.ValueType
	fn      func(s *callState, mod api.Module, stack []uint64)
}

var (
	i32 = api.ValueTypeI32
	f32 = api.ValueTypeF32
	f64 = api.ValueTypeF64
)

func u32(v uint64) uint32 { return uint32(v) }
func s32(v uint64) int32  { return int32(uint32(v)) }
func fl(v uint64) float32 { return api.DecodeF32(v) }

// hostFunctions is every host function of every ABI version, served from
// this one table so that a function shared by two versions has one
// implementation. docs/ABI.md is its reference.
var hostFunctions = slices.Concat(hostFunctionsV1, hostFunctionsV2, hostFunctionsV3, hostFunctionsV4)

// hostFunctionsV1 is ABI v1's host import module, fleetlearn_v1.
var hostFunctionsV1 = []hostFn{
	{"input_len", 1, nil, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		st[0] = uint64(len(s.input))
	}},
	{"input_read", 1, []api.ValueType{i32, i32}, []api.ValueType{i32}, func(s *callState, mod api.Module, st []uint64) {
		ptr, n := u32(st[0]), u32(st[1])
		if int(n) < len(s.input) {
			s.abort(fmt.Errorf("%w: input_read: buffer of %d bytes, input is %d", ErrKernel, n, len(s.input)))
		}
		if !mod.Memory().Write(ptr, s.input) {
			s.abort(fmt.Errorf("%w: input_read: [%d,+%d) outside module memory", ErrMemoryAccess, ptr, len(s.input)))
		}
		st[0] = uint64(len(s.input))
	}},
	{"output_write", 1, []api.ValueType{i32, i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		ptr, n := u32(st[0]), u32(st[1])
		if n > maxOutputBytes {
			s.abort(fmt.Errorf("%w: output_write: %d bytes, limit %d", ErrResult, n, maxOutputBytes))
		}
		s.output = append(s.output[:0], s.memRange("output_write", mod, ptr, n)...)
		s.wrote = true
	}},
	{"fail", 1, []api.ValueType{i32, i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		ptr, n := u32(st[0]), min(u32(st[1]), maxFailMsg)
		s.failMsg = string(s.memRange("fail", mod, ptr, n))
	}},
	{"log", 1, []api.ValueType{i32, i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		ptr, n := u32(st[0]), u32(st[1])
		msg := s.memRange("log", mod, ptr, n)
		if s.logs+len(msg) > maxLogBytes {
			return // a chatty module loses log lines, never the call
		}
		s.logs += len(msg)
		s.log.Debug("module log", "msg", string(msg))
	}},
	{"param_count", 1, nil, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		st[0] = uint64(s.nparams)
	}},
	{"param", 1, []api.ValueType{i32}, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		i := s32(st[0])
		if i < 0 || int(i) >= s.nparams {
			s.abort(fmt.Errorf("%w: param: index %d not in [0,%d)", ErrKernel, i, s.nparams))
		}
		st[0] = uint64(i + 1) // parameters hold the first handles
	}},
	{"tensor_new", 1, []api.ValueType{i32, i32}, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		r, c, err := dims("tensor_new", s32(st[0]), s32(st[1]))
		if err != nil {
			s.abort(err)
		}
		st[0] = uint64(s.newTensor("tensor_new", r, c, false))
	}},
	{"tensor_free", 1, []api.ValueType{i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		h := u32(st[0])
		t := s.tensor("tensor_free", h)
		if t.param {
			s.abort(fmt.Errorf("%w: tensor_free: handle %d is a model parameter", ErrKernel, h))
		}
		s.bytes -= int64(t.cap) * 4
		s.handles[h] = nil
		s.free = append(s.free, h)
		s.pool.put(t.m.Data)
	}},
	{"tensor_rows", 1, []api.ValueType{i32}, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		st[0] = uint64(s.mat("tensor_rows", u32(st[0])).Rows)
	}},
	{"tensor_cols", 1, []api.ValueType{i32}, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		st[0] = uint64(s.mat("tensor_cols", u32(st[0])).Cols)
	}},
	{"tensor_resize", 1, []api.ValueType{i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		h := u32(st[0])
		t := s.tensor("tensor_resize", h)
		r, c, err := dims("tensor_resize", s32(st[1]), s32(st[2]))
		if err != nil {
			s.abort(err)
		}
		if t.param {
			s.abort(fmt.Errorf("%w: tensor_resize: handle %d is a model parameter", ErrKernel, h))
		}
		if r*c > t.cap {
			s.abort(fmt.Errorf("%w: tensor_resize: %dx%d exceeds the %d values handle %d was created with", ErrKernel, r, c, t.cap, h))
		}
		t.m.Rows, t.m.Cols = r, c
	}},
	{"tensor_write", 1, []api.ValueType{i32, i32, i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		m := s.mat("tensor_write", u32(st[0]))
		ptr, n := u32(st[1]), u32(st[2])
		if int(n) != m.Len() {
			s.abort(fmt.Errorf("%w: tensor_write: %d values for a %v tensor", ErrKernel, n, m))
		}
		b := s.memRange("tensor_write", mod, ptr, elemBytes("tensor_write", s, n))
		s.charge("tensor_write", int64(n))
		v := m.Vals()
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	}},
	{"tensor_read", 1, []api.ValueType{i32, i32, i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		m := s.mat("tensor_read", u32(st[0]))
		ptr, n := u32(st[1]), u32(st[2])
		if int(n) != m.Len() {
			s.abort(fmt.Errorf("%w: tensor_read: buffer of %d values for a %v tensor", ErrKernel, n, m))
		}
		b := s.memRange("tensor_read", mod, ptr, elemBytes("tensor_read", s, n))
		s.charge("tensor_read", int64(n))
		for i, v := range m.Vals() {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}},
	{"tensor_fill", 1, []api.ValueType{i32, f32}, nil, func(s *callState, _ api.Module, st []uint64) {
		m := s.mat("tensor_fill", u32(st[0]))
		s.charge("tensor_fill", int64(m.Len()))
		v := fl(st[1])
		for i := range m.Vals() {
			m.Data[i] = v
		}
	}},
	{"tensor_copy", 1, []api.ValueType{i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		dst, src := s.mat("tensor_copy", u32(st[0])), s.mat("tensor_copy", u32(st[1]))
		if dst.Rows != src.Rows || dst.Cols != src.Cols {
			s.abort(fmt.Errorf("%w: tensor_copy: %v into %v", ErrKernel, src, dst))
		}
		s.charge("tensor_copy", int64(src.Len()))
		copy(dst.Vals(), src.Vals())
	}},
	{"data_count", 1, nil, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		st[0] = uint64(s.data.Len())
	}},
	{"data_dim", 1, nil, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		st[0] = uint64(s.data.Dim)
	}},
	{"data_classes", 1, nil, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		st[0] = uint64(s.data.NumClasses)
	}},
	{"data_gather", 1, []api.ValueType{i32, i32, i32, i32}, nil, func(s *callState, mod api.Module, st []uint64) {
		x, y := s.mat("data_gather", u32(st[0])), s.mat("data_gather", u32(st[1]))
		ptr, n := u32(st[2]), u32(st[3])
		d := s.data
		if x.Rows != int(n) || x.Cols != d.Dim || y.Len() != int(n) {
			s.abort(fmt.Errorf("%w: data_gather: %d examples of width %d into x %v and labels %v", ErrKernel, n, d.Dim, x, y))
		}
		idx := s.memRange("data_gather", mod, ptr, elemBytes("data_gather", s, n))
		s.charge("data_gather", int64(n)*int64(d.Dim))
		for r := 0; r < int(n); r++ {
			i := int32(binary.LittleEndian.Uint32(idx[4*r:]))
			if i < 0 || int(i) >= d.Len() {
				s.abort(fmt.Errorf("%w: data_gather: example index %d not in [0,%d)", ErrKernel, i, d.Len()))
			}
			copy(x.Data[r*d.Dim:(r+1)*d.Dim], d.Features[int(i)*d.Dim:(int(i)+1)*d.Dim])
			y.Data[r] = float32(d.Labels[i])
		}
	}},
	{"gemm", 1, []api.ValueType{i32, i32, f32, i32, i32, f32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		a, b, c := s.mat("gemm", u32(st[3])), s.mat("gemm", u32(st[4])), s.mat("gemm", u32(st[6]))
		s.apart("gemm", u32(st[3]), u32(st[4]), u32(st[6]))
		k := a.Cols
		if u32(st[0]) != 0 {
			k = a.Rows
		}
		// With k = 0 there are no flops but gemm still scales C by beta.
		s.charge("gemm", max(kernel.GemmFLOPs(c.Rows, c.Cols, k), int64(c.Len())))
		// Large products run in row blocks with a deadline check between them,
		// so one huge gemm cannot outlive the call's timeout by much.
		if err := kernel.GemmCheck(u32(st[0]) != 0, u32(st[1]) != 0, fl(st[2]), a, b, fl(st[5]), c, s.deadline); err != nil {
			s.kernelErr(err)
		}
	}},
	{"bias_add", 1, []api.ValueType{i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("bias_add", u32(st[0]))
		s.charge("bias_add", int64(x.Len()))
		if err := kernel.BiasAdd(x, s.mat("bias_add", u32(st[1]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"col_sum", 1, []api.ValueType{i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("col_sum", u32(st[0]))
		s.charge("col_sum", int64(x.Len()))
		if err := kernel.ColSum(x, s.mat("col_sum", u32(st[1]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"relu", 1, []api.ValueType{i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("relu", u32(st[0]))
		s.charge("relu", int64(x.Len()))
		if err := kernel.ReLU(x, s.mat("relu", u32(st[1]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"relu_grad", 1, []api.ValueType{i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		dy := s.mat("relu_grad", u32(st[0]))
		s.charge("relu_grad", int64(dy.Len()))
		if err := kernel.ReLUGrad(dy, s.mat("relu_grad", u32(st[1])), s.mat("relu_grad", u32(st[2]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"softmax_xent", 1, []api.ValueType{i32, i32, i32}, []api.ValueType{f64}, func(s *callState, _ api.Module, st []uint64) {
		logits := s.mat("softmax_xent", u32(st[0]))
		s.charge("softmax_xent", 5*int64(logits.Len()))
		loss, err := kernel.SoftmaxXent(logits, s.mat("softmax_xent", u32(st[1])), s.optMat("softmax_xent", u32(st[2])))
		if err != nil {
			s.kernelErr(err)
		}
		st[0] = api.EncodeF64(loss)
	}},
	{"count_correct", 1, []api.ValueType{i32, i32}, []api.ValueType{i32}, func(s *callState, _ api.Module, st []uint64) {
		logits := s.mat("count_correct", u32(st[0]))
		s.charge("count_correct", int64(logits.Len()))
		n, err := kernel.CountCorrect(logits, s.mat("count_correct", u32(st[1])))
		if err != nil {
			s.kernelErr(err)
		}
		st[0] = uint64(n)
	}},
	{"axpy", 1, []api.ValueType{f32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("axpy", u32(st[1]))
		s.charge("axpy", 2*int64(x.Len()))
		if err := kernel.Axpy(fl(st[0]), x, s.mat("axpy", u32(st[2]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"scale", 1, []api.ValueType{f32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("scale", u32(st[1]))
		s.charge("scale", int64(x.Len()))
		kernel.Scale(fl(st[0]), x)
	}},
	{"norm2", 1, []api.ValueType{i32}, []api.ValueType{f64}, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("norm2", u32(st[0]))
		s.charge("norm2", 2*int64(x.Len()))
		st[0] = api.EncodeF64(kernel.Norm2(x))
	}},
}

var hostByName = func() map[string]*hostFn {
	m := make(map[string]*hostFn, len(hostFunctions))
	for i := range hostFunctions {
		m[hostFunctions[i].name] = &hostFunctions[i]
	}
	return m
}()

// deadline reports the call's context error in the host's terms.
func (s *callState) deadline() error {
	switch err := s.ctx.Err(); {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %v", ErrDeadline, err)
	default:
		return err
	}
}

// instantiateHost registers one host module per served ABI version in r:
// fleetlearn_vN exports every function whose since is at most N. Each function
// checks the call's context first, so a call past its deadline stops at its
// next host call even when the module's own code would not reach a check.
func instantiateHost(ctx context.Context, r wazero.Runtime) error {
	wrapped := make([]api.GoModuleFunc, len(hostFunctions))
	for i, f := range hostFunctions {
		wrapped[i] = func(ctx context.Context, mod api.Module, stack []uint64) {
			s := stateOf(ctx)
			if s.err != nil {
				s.abort(s.err)
			}
			if s.probe {
				s.abort(fmt.Errorf("%w: %s called while the host read fleetlearn_abi_version at load; call host functions only from train and evaluate",
					ErrABI, f.name))
			}
			if err := s.deadline(); err != nil {
				s.abort(fmt.Errorf("%s: %w", f.name, err))
			}
			if !s.timeHost {
				f.fn(s, mod, stack)
				return
			}
			start := time.Now()
			f.fn(s, mod, stack)
			s.hostTime += time.Since(start)
		}
	}
	for v := MinABIVersion; v <= ABIVersion; v++ {
		b := r.NewHostModuleBuilder(HostModuleOf(v))
		for i, f := range hostFunctions {
			if f.since <= v {
				b.NewFunctionBuilder().WithGoModuleFunction(wrapped[i], f.params, f.results).Export(f.name)
			}
		}
		if _, err := b.Instantiate(ctx); err != nil {
			return fmt.Errorf("%s: %w", HostModuleOf(v), err)
		}
	}
	return nil
}
