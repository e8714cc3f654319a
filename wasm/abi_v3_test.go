package wasm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
)

// v3Sigs are the signatures docs/ABI.md gives the host functions the v3
// tests call that hostSigs lacks.
var v3Sigs = map[string]wasmbin.FuncType{
	"sgd_hyper":       {Params: []wasmbin.ValType{vI32}},
	"sgd_order":       {Params: []wasmbin.ValType{vI32, vI32, vI32}},
	"param_name":      {Params: []wasmbin.ValType{vI32, vI32, vI32}, Results: []wasmbin.ValType{vI32}},
	"param_shape":     {Params: []wasmbin.ValType{vI32, vI32, vI32}, Results: []wasmbin.ValType{vI32}},
	"result_examples": {Params: []wasmbin.ValType{vI32}},
	"result_metric":   {Params: []wasmbin.ValType{vI32, vI32, wasmbin.F64}},
	"data_count":      {Results: []wasmbin.ValType{vI32}},
}

// prog hand-builds a module whose train and evaluate run one straight
// sequence of host calls, as a module without a language runtime does. A
// call's result stays on the stack, where the next call may take it as an
// argument: push(ptr), call("param_name", …), call("log") logs the name.
type prog struct {
	ns    string
	m     wasmbin.Module
	index map[string]uint32
	body  []byte
	// version, when set, is the body of fleetlearn_abi_version.
	version []byte
}

// newProg starts a module importing host functions from ns, with one page
// of memory.
func newProg(ns string) *prog {
	return &prog{ns: ns, index: map[string]uint32{},
		m: wasmbin.Module{Types: []wasmbin.FuncType{typeEntry}, Memory: wasmbin.Pages(1)}}
}

// instr is the instruction sequence pushing args and calling fn.
func (p *prog) instr(fn string, args ...any) []byte {
	sig, ok := v3Sigs[fn]
	if !ok {
		if sig, ok = hostSigs[fn]; !ok {
			panic("no signature for host function " + fn)
		}
	}
	f, ok := p.index[fn]
	if !ok {
		p.m.Types = append(p.m.Types, sig)
		f = uint32(len(p.m.Imports))
		p.m.Imports = append(p.m.Imports, wasmbin.Import{Module: p.ns, Name: fn, Type: uint32(len(p.m.Types) - 1)})
		p.index[fn] = f
	}
	var b []byte
	for _, a := range args {
		switch a := a.(type) {
		case int:
			b = append(b, wasmbin.I32Const(int32(a))...)
		case int32:
			b = append(b, wasmbin.I32Const(a)...)
		case uint32:
			b = append(b, wasmbin.I32Const(int32(a))...)
		case float32:
			b = append(b, wasmbin.F32Const(a)...)
		case float64:
			b = append(b, wasmbin.F64Const(a)...)
		default:
			panic(fmt.Sprintf("host call argument %v of type %T", a, a))
		}
	}
	return append(b, wasmbin.Call(f)...)
}

func (p *prog) call(fn string, args ...any) *prog {
	p.body = append(p.body, p.instr(fn, args...)...)
	return p
}

func (p *prog) push(v int32) *prog {
	p.body = append(p.body, wasmbin.I32Const(v)...)
	return p
}

// times4 multiplies the value on the stack by 4 (int32s to bytes).
func (p *prog) times4() *prog {
	p.body = append(append(p.body, wasmbin.I32Const(4)...), 0x6c) // i32.mul
	return p
}

func (p *prog) drop() *prog {
	p.body = append(p.body, wasmbin.OpDrop)
	return p
}

func (p *prog) data(off int32, b []byte) *prog {
	p.m.Data = append(p.m.Data, wasmbin.Data{Offset: off, Bytes: b})
	return p
}

// examples ends the result the v3 way, claiming n examples.
func (p *prog) examples(n int32) *prog { return p.call("result_examples", n) }

// encode returns the module declaring ABI version; train and evaluate run
// the body, then return 0.
func (p *prog) encode(version int32) []byte {
	m := p.m
	m.Types = slices.Clone(m.Types)
	n := uint32(len(m.Imports))
	body := append(slices.Clone(p.body), returnZero...)
	vbody := p.version
	if vbody == nil {
		vbody = wasmbin.I32Const(version)
	}
	m.Funcs = []wasmbin.Func{{Type: 0, Body: vbody}, {Type: 0, Body: body}, {Type: 0, Body: body}}
	m.Exports = []wasmbin.Export{
		{Name: "fleetlearn_abi_version", Kind: wasmbin.ExportFunc, Index: n},
		{Name: "train", Kind: wasmbin.ExportFunc, Index: n + 1},
		{Name: "evaluate", Kind: wasmbin.ExportFunc, Index: n + 2},
		{Name: "memory", Kind: wasmbin.ExportMemory},
	}
	return m.Encode()
}

func v3() *prog { return newProg("fleetlearn_v3") }

// moduleLogs records what modules log through the host's log function, so
// a test module can hand the test bytes the host wrote into its memory.
type moduleLogs struct {
	mu    sync.Mutex
	lines [][]byte
}

func (l *moduleLogs) Enabled(context.Context, slog.Level) bool { return true }
func (l *moduleLogs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *moduleLogs) WithGroup(string) slog.Handler            { return l }

func (l *moduleLogs) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "msg" {
			l.mu.Lock()
			l.lines = append(l.lines, []byte(a.Value.String()))
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *moduleLogs) take() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// v3Env is the sandbox of the v3 tests, which run one at a time: its log
// lines are those of the call a test just made.
var v3Env struct {
	once sync.Once
	sb   *wasm.Sandbox
	err  error
	logs moduleLogs
	mu   sync.Mutex
}

func v3Sandbox(t *testing.T) *wasm.Sandbox {
	t.Helper()
	dir := cacheDir(t)
	v3Env.once.Do(func() {
		v3Env.sb, v3Env.err = wasm.New(wasm.WithCacheDir(dir), wasm.WithLogger(slog.New(&v3Env.logs)))
	})
	if v3Env.err != nil {
		t.Fatal(v3Env.err)
	}
	return v3Env.sb
}

// v3Run loads code and runs its entry point ("train" or "evaluate") on c,
// returning the result, the lines the call logged and its error. A host
// panic fails the test.
func v3Run(t *testing.T, code []byte, entry string, c wasm.Call) (res *wasm.Result, logs [][]byte, err error) {
	t.Helper()
	sb := v3Sandbox(t)
	v3Env.mu.Lock()
	defer v3Env.mu.Unlock()
	m, err := sb.Load(context.Background(), code, wasm.Hash(code))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer m.Close(context.Background())
	if m.ABIVersion() != 3 {
		t.Fatalf("ABIVersion() = %d, want 3", m.ABIVersion())
	}
	v3Env.logs.take()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%s panicked instead of returning an error: %v", entry, p)
		}
	}()
	if entry == "evaluate" {
		res, err = m.Evaluate(context.Background(), c)
	} else {
		res, err = m.Train(context.Background(), c)
	}
	return res, v3Env.logs.take(), err
}

// v3Train trains a v3 program on the tiny model and data.
func v3Train(t *testing.T, p *prog, hyper string, seed uint64) (*wasm.Result, [][]byte, error) {
	t.Helper()
	c := wasm.Call{Model: tinyModel(t), Data: tinyData(), Seed: seed}
	if hyper != "" {
		c.Hyper = []byte(hyper)
	}
	return v3Run(t, p.encode(3), "train", c)
}

// wantLogs checks that a call succeeded and logged exactly want.
func wantLogs(t *testing.T, logs [][]byte, err error, want ...[]byte) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if len(logs) != len(want) {
		t.Fatalf("%d log lines %q, want %d", len(logs), logs, len(want))
	}
	for i := range want {
		if !bytes.Equal(logs[i], want[i]) {
			t.Errorf("log line %d: % x, want % x", i, logs[i], want[i])
		}
	}
}

// v3Healthy: after an attack, the v3 sandbox still serves a good module.
func v3Healthy(t *testing.T) {
	t.Helper()
	res, logs, err := v3Train(t, v3().call("sgd_order", 1024, 24, 0).call("log", 1024, 96).examples(24), "", 5)
	wantLogs(t, logs, err, orderBytes(sgd.Order(24, 5, 0)))
	if res.NumExamples != 24 {
		t.Fatalf("good module after the attack: %d examples", res.NumExamples)
	}
}

// hyperBytes is what sgd_hyper writes for h.
func hyperBytes(h sgd.Hyper) []byte {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], uint32(int32(h.Epochs)))
	binary.LittleEndian.PutUint32(b[4:], uint32(int32(h.BatchSize)))
	binary.LittleEndian.PutUint32(b[8:], uint32(int32(h.EvalBatchSize)))
	binary.LittleEndian.PutUint32(b[12:], math.Float32bits(h.LearningRate))
	binary.LittleEndian.PutUint32(b[16:], math.Float32bits(h.Mu))
	return b
}

func orderBytes(o []int32) []byte {
	b := make([]byte, 4*len(o))
	for i, v := range o {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b
}

// TestABIV3Namespaces: fleetlearn_v3 serves every v1 and v2 function and
// the v3 services; a v2 module cannot reach the v3 services under either
// namespace; trainable lists apply to v3 modules; a v3 service called while
// the host reads the version fails the load.
func TestABIV3Namespaces(t *testing.T) {
	t.Run("v1 and v2 functions", func(t *testing.T) {
		p := v3().call("tensor_new", 2, 2).drop().call("tensor_fill", 5, float32(-1)).call("gelu", 5, 5).
			push(1024).call("param_name", 0, 1024, 64).call("log").examples(24)
		res, logs, err := v3Train(t, p, "", 1)
		wantLogs(t, logs, err, []byte("fc1.weight"))
		if res.NumExamples != 24 || res.Model == nil {
			t.Fatalf("result %+v", res)
		}
	})
	t.Run("trainable", func(t *testing.T) {
		code := v3().call("tensor_fill", 2, float32(0.5)).examples(24).encode(3)
		c := wasm.Call{Model: tinyModel(t), Data: tinyData(), Trainable: []int{1, 3}}
		res, _, err := v3Run(t, code, "train", c)
		if err != nil {
			t.Fatal(err)
		}
		if v := res.Model.Tensors[1].Data[0]; v != 0.5 {
			t.Errorf("fc1.bias[0] = %v, want 0.5", v)
		}
		c.Trainable = []int{0, 3}
		_, _, err = v3Run(t, code, "train", c)
		wantSentinel(t, err, wasm.ErrResult, "frozen parameter fc1.bias changed")
	})
	for _, tc := range []struct {
		name     string
		p        *prog
		version  int32
		mentions []string
	}{
		{"v3 function from fleetlearn_v2", newProg("fleetlearn_v2").call("sgd_hyper", 1024), 2,
			[]string{"fleetlearn_v2.sgd_hyper", "new in v3", "fleetlearn_v3"}},
		{"v2 module importing fleetlearn_v3", v3().call("sgd_hyper", 1024), 2,
			[]string{"declares ABI v2", "fleetlearn_v3.sgd_hyper", "fleetlearn_v2"}},
		{"v3 module importing fleetlearn_v2", newProg("fleetlearn_v2").call("log", 16, 1), 3,
			[]string{"declares ABI v3", "fleetlearn_v2.log", "fleetlearn_v3"}},
		{"v3 function from fleetlearn_v1", newProg("fleetlearn_v1").call("result_examples", 1), 1,
			[]string{"fleetlearn_v1.result_examples", "new in v3", "fleetlearn_v3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code := tc.p.encode(tc.version)
			_, err := v3Sandbox(t).Load(context.Background(), code, wasm.Hash(code))
			wantSentinel(t, err, wasm.ErrForbiddenImport, tc.mentions...)
		})
	}
	t.Run("mistyped import", func(t *testing.T) {
		p := v3()
		p.m.Types = append(p.m.Types, wasmbin.FuncType{Params: []wasmbin.ValType{vI32, vI32}})
		p.m.Imports = append(p.m.Imports, wasmbin.Import{Module: "fleetlearn_v3", Name: "sgd_order", Type: 1})
		code := p.encode(3)
		_, err := v3Sandbox(t).Load(context.Background(), code, wasm.Hash(code))
		wantSentinel(t, err, wasm.ErrABI, "fleetlearn_v3.sgd_order", "[i32 i32 i32]")
	})
	t.Run("service called while the version is read", func(t *testing.T) {
		p := v3()
		p.version = wasmbin.Code(p.instr("sgd_hyper", 1024), wasmbin.I32Const(3))
		code := p.encode(3)
		_, err := v3Sandbox(t).Load(context.Background(), code, wasm.Hash(code))
		wantSentinel(t, err, wasm.ErrABI, "sgd_hyper", "at load")
	})
	v3Healthy(t)
}

// TestABIV3SGDHyper: sgd_hyper writes the task's hyper-parameters as
// model/sgd.ParseHyper gives them, defaults included; a hyper ParseHyper
// refuses fails the call as the caller's error, with ParseHyper's message.
func TestABIV3SGDHyper(t *testing.T) {
	defaults, err := sgd.ParseHyper(nil)
	if err != nil || defaults != sgd.Defaults {
		t.Fatalf("ParseHyper(nil) = %+v, %v", defaults, err)
	}
	p := v3().call("sgd_hyper", 1024).call("log", 1024, 20).
		call("sgd_hyper", 4093).call("log", 4093, 20).examples(24) // twice, unaligned
	for _, tc := range []struct {
		name  string
		hyper string
		want  sgd.Hyper
	}{
		{"default", "", sgd.Defaults},
		{"empty object", "{}", sgd.Defaults},
		{"custom", ` { "epochs": 3, "batch_size": 16, "learning_rate": 0.1, "mu": 0.01, "eval_batch_size": 100 } `,
			sgd.Hyper{Epochs: 3, BatchSize: 16, LearningRate: 0.1, Mu: 0.01, EvalBatchSize: 100}},
		{"partial", `{"learning_rate":1e-3,"epochs":1000}`,
			sgd.Hyper{Epochs: 1000, BatchSize: 32, LearningRate: 1e-3, EvalBatchSize: 512}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parsed, err := sgd.ParseHyper([]byte(tc.hyper))
			if err != nil || parsed != tc.want {
				t.Fatalf("ParseHyper = %+v, %v; want %+v", parsed, err, tc.want)
			}
			want := hyperBytes(parsed)
			_, logs, err := v3Train(t, p, tc.hyper, 1)
			wantLogs(t, logs, err, want, want)
			if tc.name == "custom" {
				// 0.1 has no exact float32: the module gets float32(0.1),
				// the value the native trainer steps with.
				if lr := binary.LittleEndian.Uint32(logs[0][12:]); lr != 0x3dcccccd || lr != math.Float32bits(parsed.LearningRate) {
					t.Errorf("learning_rate bits %#x, want %#x", lr, math.Float32bits(float32(0.1)))
				}
			}
		})
	}
	t.Run("evaluate", func(t *testing.T) {
		_, logs, err := v3Run(t, p.encode(3), "evaluate", wasm.Call{Model: tinyModel(t), Data: tinyData(), Hyper: []byte(`{"eval_batch_size":7}`)})
		want := sgd.Defaults
		want.EvalBatchSize = 7
		wantLogs(t, logs, err, hyperBytes(want), hyperBytes(want))
	})

	for _, hyper := range []string{`{"epochs":0}`, `{"epoch":2}`, `{"learning_rate":-1}`, `{"batch_size":"32"}`, `[1]`} {
		t.Run("invalid "+hyper, func(t *testing.T) {
			_, perr := sgd.ParseHyper([]byte(hyper))
			if perr == nil {
				t.Fatalf("ParseHyper accepts %s", hyper)
			}
			_, _, err := v3Train(t, p, hyper, 1)
			wantSentinel(t, err, wasm.ErrInvalidCall, "sgd_hyper", perr.Error())
			if !errors.Is(err, sgd.ErrHyper) {
				t.Errorf("error %v does not wrap sgd.ErrHyper", err)
			}
		})
	}
	t.Run("invalid hyper not asked for", func(t *testing.T) {
		// The hyper reaches a module verbatim; only sgd_hyper parses it.
		res, _, err := v3Train(t, v3().examples(3), `{"epochs":0}`, 1)
		if err != nil || res.NumExamples != 3 {
			t.Fatalf("%+v, %v", res, err)
		}
	})
	for _, ptr := range []uint32{65536 - 19, 65536, 0xfffffff0, 0xffffffff} {
		t.Run(fmt.Sprintf("ptr %d", ptr), func(t *testing.T) {
			_, _, err := v3Train(t, v3().call("sgd_hyper", ptr).examples(24), "", 1)
			wantSentinel(t, err, wasm.ErrMemoryAccess, "sgd_hyper", fmt.Sprintf("[%d,+20)", ptr))
		})
	}
	t.Run("last bytes of memory", func(t *testing.T) {
		_, logs, err := v3Train(t, v3().call("sgd_hyper", 65536-20).call("log", 65536-20, 20).examples(24), "", 1)
		wantLogs(t, logs, err, hyperBytes(sgd.Defaults))
	})
	v3Healthy(t)
}

// TestABIV3SGDOrder: sgd_order writes model/sgd's example order for the
// call's seed and the epoch asked for, charging one unit of work per
// example; n must be the data count, the epoch within sgd.MaxEpochs.
func TestABIV3SGDOrder(t *testing.T) {
	const seed = 12345
	p := v3().call("sgd_order", 1024, 24, 0).call("log", 1024, 96).
		call("sgd_order", 2047, 24, 1).call("log", 2047, 96).
		call("sgd_order", 4096, 24, sgd.MaxEpochs-1).call("log", 4096, 96).examples(24)
	res, logs, err := v3Train(t, p, "", seed)
	e0, e1 := sgd.Order(24, seed, 0), sgd.Order(24, seed, 1)
	wantLogs(t, logs, err, orderBytes(e0), orderBytes(e1), orderBytes(sgd.Order(24, seed, sgd.MaxEpochs-1)))
	if slices.Equal(e0, e1) || slices.Equal(e0, sgd.Order(24, seed+1, 0)) {
		t.Fatal("epochs 0 and 1, or another seed, give the same order: the check proves nothing")
	}
	base, _, err := v3Train(t, v3().examples(24), "", seed)
	if err != nil {
		t.Fatal(err)
	}
	if res.Work-base.Work != 3*24 {
		t.Errorf("three orders of 24 cost %d work, want 72", res.Work-base.Work)
	}
	t.Run("budget", func(t *testing.T) {
		c := wasm.Call{Model: tinyModel(t), Data: tinyData(), Limits: wasm.Limits{MaxWork: base.Work + 23}}
		_, _, err := v3Run(t, v3().call("sgd_order", 1024, 24, 0).examples(24).encode(3), "train", c)
		wantSentinel(t, err, wasm.ErrBudget, "sgd_order", fmt.Sprintf("exceeds limit %d", base.Work+23))
	})
	t.Run("deadline", func(t *testing.T) {
		// sgd_order forever: the call ends at its timeout.
		p := v3()
		p.body = append(p.body, wasmbin.OpLoop, wasmbin.BlockEmpty)
		p.call("sgd_order", 1024, 24, 0)
		p.body = append(p.body, wasmbin.OpBr, 0, wasmbin.OpEnd)
		c := wasm.Call{Model: tinyModel(t), Data: tinyData(), Limits: wasm.Limits{Timeout: 200 * time.Millisecond}}
		_, _, err := v3Run(t, p.examples(24).encode(3), "train", c)
		wantSentinel(t, err, wasm.ErrDeadline)
	})
	t.Run("empty data", func(t *testing.T) {
		empty := tinyData()
		empty.Features, empty.Labels = nil, nil
		c := wasm.Call{Model: tinyModel(t), Data: empty}
		_, logs, err := v3Run(t, v3().call("sgd_order", 1024, 0, 0).call("log", 1024, 0).examples(0).encode(3), "train", c)
		wantLogs(t, logs, err, []byte{})
	})

	for _, tc := range []struct {
		name          string
		ptr, n, epoch int64
		want          error
		mentions      []string
	}{
		{"n below data count", 1024, 23, 0, wasm.ErrKernel, []string{"sgd_order", "n 23", "epoch 0", "data_count, 24"}},
		{"n above data count", 1024, 25, 0, wasm.ErrKernel, []string{"n 25", "data_count, 24"}},
		{"n negative", 1024, -1, 0, wasm.ErrKernel, []string{"n -1", "data_count, 24"}},
		{"4n wraps to 0", 1024, 1 << 30, 0, wasm.ErrKernel, []string{"n 1073741824", "data_count, 24"}},
		{"4n wraps to 4", 1024, 1<<30 + 1, 0, wasm.ErrKernel, []string{"n 1073741825"}},
		{"epoch negative", 1024, 24, -1, wasm.ErrKernel, []string{"sgd_order", "n 24", "epoch -1", "[0,1000)"}},
		{"epoch MaxEpochs", 1024, 24, sgd.MaxEpochs, wasm.ErrKernel, []string{"epoch 1000", "[0,1000)"}},
		{"epoch MinInt32", 1024, 24, math.MinInt32, wasm.ErrKernel, []string{"epoch -2147483648"}},
		{"past the end", 65536 - 95, 24, 0, wasm.ErrMemoryAccess, []string{"sgd_order", "[65441,+96)"}},
		{"wraps around", 0xfffffff0, 24, 0, wasm.ErrMemoryAccess, []string{"sgd_order", "[4294967280,+96)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A later call that would fail otherwise shows the first one aborted.
			p := v3().call("sgd_order", uint32(tc.ptr), int32(tc.n), int32(tc.epoch)).call("param_name", 99, 0, 0).drop().examples(24)
			_, _, err := v3Train(t, p, "", seed)
			wantSentinel(t, err, tc.want, tc.mentions...)
		})
	}
	v3Healthy(t)
}

// TestABIV3ParamName: param_name copies as much of a parameter's name as
// fits and returns its length; the rest of the buffer is left alone.
func TestABIV3ParamName(t *testing.T) {
	mdl, err := model.New(
		model.Tensor{Name: "encoder.layer0.weight", Shape: []int{2, 2}, Data: make([]float32, 4)},
		model.Tensor{Name: "b", Shape: []int{1}, Data: make([]float32, 1)},
		model.Tensor{Name: "ünïcødé", Shape: []int{1}, Data: make([]float32, 1)})
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, p *prog) (*wasm.Result, [][]byte, error) {
		t.Helper()
		return v3Run(t, p.encode(3), "train", wasm.Call{Model: mdl, Data: tinyData()})
	}
	// Each logs len(name) bytes at its buffer: the name, or the part of it
	// that fitted followed by the zeros that were there.
	p := v3().
		push(1024).call("param_name", 0, 1024, 64).call("log").
		push(2048).call("param_name", 1, 2048, 1).call("log").
		push(3072).call("param_name", 2, 3072, 4).call("log"). // cuts a two-byte rune
		push(4096).call("param_name", 0, 4096, 7).call("log").
		push(5120).call("param_name", 2, 0xfffffff0, 0).call("log"). // cap 0: the pointer is not used
		call("param_name", 2, 65536-9, 9).drop().call("log", 65536-9, 9).
		examples(24)
	res, logs, err := run(t, p)
	cut := func(name string, k int) []byte { return append([]byte(name[:k]), make([]byte, len(name)-k)...) }
	wantLogs(t, logs, err, []byte("encoder.layer0.weight"), []byte("b"), cut("ünïcødé", 4),
		cut("encoder.layer0.weight", 7), cut("ünïcødé", 0), []byte("ünïcødé")[:9])
	base, _, err := run(t, v3().push(1024).call("param_name", 0, 1024, 0).call("log").examples(24))
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(21 + 1 + 4 + 7 + 9); res.Work-base.Work != want {
		t.Errorf("copying %d name bytes cost %d work", want, res.Work-base.Work)
	}

	for _, tc := range []struct {
		name        string
		i, ptr, cap int64
		want        error
		mentions    []string
	}{
		{"index -1", -1, 1024, 64, wasm.ErrKernel, []string{"param_name", "index -1 not in [0,3)"}},
		{"index = count", 3, 1024, 64, wasm.ErrKernel, []string{"index 3 not in [0,3)"}},
		{"index MaxInt32", math.MaxInt32, 1024, 64, wasm.ErrKernel, []string{"index 2147483647"}},
		{"negative cap", 0, 1024, -1, wasm.ErrKernel, []string{"param_name", "capacity -1"}},
		{"past the end", 0, 65536 - 20, 64, wasm.ErrMemoryAccess, []string{"param_name", "[65516,+21)"}},
		{"wraps around", 0, 0xfffffff0, 64, wasm.ErrMemoryAccess, []string{"param_name", "[4294967280,+21)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := run(t, v3().call("param_name", int32(tc.i), uint32(tc.ptr), int32(tc.cap)).drop().examples(24))
			wantSentinel(t, err, tc.want, tc.mentions...)
		})
	}
	v3Healthy(t)
}

// TestABIV3ParamShape: param_shape writes a parameter's dimensions as the
// request gives them, up to the capacity, and returns its rank, which the
// matrix behind a handle does not keep; bad indices, capacities and ranges
// are refused like param_name's.
func TestABIV3ParamShape(t *testing.T) {
	mdl, err := model.New(
		model.Tensor{Name: "w", Shape: []int{3, 2}, Data: make([]float32, 6)},
		model.Tensor{Name: "b", Shape: []int{3}, Data: make([]float32, 3)},
		model.Tensor{Name: "r", Shape: []int{1, 3}, Data: make([]float32, 3)},
		model.Tensor{Name: "c", Shape: []int{2, 1, 2}, Data: make([]float32, 4)})
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, p *prog) (*wasm.Result, [][]byte, error) {
		t.Helper()
		return v3Run(t, p.encode(3), "train", wasm.Call{Model: mdl, Data: tinyData()})
	}
	le := func(v ...uint32) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, x)
		}
		return b
	}
	// Each logs the rank's worth of int32s: the dimensions that fitted, then
	// the zeros that were there.
	p := v3().
		push(1024).call("param_shape", 0, 1024, 8).times4().call("log").
		push(2048).call("param_shape", 1, 2048, 8).times4().call("log").
		push(3072).call("param_shape", 2, 3072, 8).times4().call("log").
		push(4096).call("param_shape", 3, 4096, 2).times4().call("log").
		push(5120).call("param_shape", 3, 0xfffffff0, 0).times4().call("log").
		examples(24)
	_, logs, err := run(t, p)
	wantLogs(t, logs, err, le(3, 2), le(3), le(1, 3), le(2, 1, 0), le(0, 0, 0))
	for _, tc := range []struct {
		name        string
		i, ptr, cap int64
		want        error
		mentions    []string
	}{
		{"index -1", -1, 1024, 4, wasm.ErrKernel, []string{"param_shape", "index -1 not in [0,4)"}},
		{"index = count", 4, 1024, 4, wasm.ErrKernel, []string{"index 4 not in [0,4)"}},
		{"negative cap", 0, 1024, -1, wasm.ErrKernel, []string{"param_shape", "capacity -1"}},
		{"past the end", 0, 65536 - 4, 2, wasm.ErrMemoryAccess, []string{"param_shape"}},
		{"wraps around", 0, 0xfffffffc, 2, wasm.ErrMemoryAccess, []string{"param_shape"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := run(t, v3().call("param_shape", int32(tc.i), uint32(tc.ptr), int32(tc.cap)).drop().examples(24))
			wantSentinel(t, err, tc.want, tc.mentions...)
		})
	}
}

// TestABIV3Result: result_examples and result_metric build the result a
// module would otherwise write as JSON, with the metrics' exact bits and
// decodeResult's rules; mixing the two ways, or metrics without a count, is
// refused.
func TestABIV3Result(t *testing.T) {
	metrics := []struct {
		name  string
		value float64
	}{
		{"loss", math.Pi}, {"accuracy", 0.1 + 0.2}, {"tiny", math.SmallestNonzeroFloat64}, {"zero", math.Copysign(0, -1)},
		{"big", -math.MaxFloat64}, {`<ü&"\>`, 1.0000000000000002}, {strings.Repeat("m", 64), 1e-310},
		{"loss", 2.5}, // replaces
	}
	var mem []byte
	p := v3().examples(-5) // replaced below
	for _, m := range metrics {
		p.call("result_metric", 1024+len(mem), len(m.name), m.value)
		mem = append(mem, m.name...)
	}
	p.data(1024, mem).examples(17)
	want := map[string]float64{}
	for _, m := range metrics {
		want[m.name] = m.value
	}
	for _, entry := range []string{"train", "evaluate"} {
		t.Run(entry, func(t *testing.T) {
			res, _, err := v3Run(t, p.encode(3), entry, wasm.Call{Model: tinyModel(t), Data: tinyData()})
			if err != nil {
				t.Fatal(err)
			}
			if res.NumExamples != 17 || len(res.Metrics) != len(want) {
				t.Fatalf("%d examples, metrics %v; want 17, %v", res.NumExamples, res.Metrics, want)
			}
			for k, v := range want {
				if got, ok := res.Metrics[k]; !ok || math.Float64bits(got) != math.Float64bits(v) {
					t.Errorf("metric %q = %v (%#x), want %v (%#x)", k, got, math.Float64bits(got), v, math.Float64bits(v))
				}
			}
		})
	}
	t.Run("count only", func(t *testing.T) {
		res, _, err := v3Train(t, v3().examples(0), "", 1)
		if err != nil || res.NumExamples != 0 || len(res.Metrics) != 0 {
			t.Fatalf("%+v, %v", res, err)
		}
	})
	names := make([]byte, 65)
	for i := range names {
		names[i] = byte(0x21 + i) // 65 one-byte names
	}
	t.Run("64 metrics and a repeat", func(t *testing.T) {
		p := v3().data(1024, names)
		for i := range 64 {
			p.call("result_metric", 1024+i, 1, float64(i))
		}
		p.call("result_metric", 1024, 1, -1.0).examples(24)
		res, _, err := v3Train(t, p, "", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Metrics) != 64 || res.Metrics["!"] != -1 || res.Metrics[string(names[63:64])] != 63 {
			t.Fatalf("metrics %v", res.Metrics)
		}
	})

	atOnce := map[string]bool{"name empty": true, "name 65 bytes": true, "name length negative": true, "name not UTF-8": true,
		"name past the end": true, "name wraps around": true, "NaN": true, "+Inf": true, "-Inf": true, "65 metrics": true}
	doc := []byte(`{"num_examples":24}`)
	long := bytes.Repeat([]byte("x"), 65)
	for _, tc := range []struct {
		name     string
		p        *prog
		want     error
		mentions []string
	}{
		// The refused metrics are followed by a call that would fail
		// otherwise (atOnce below): the refusal aborts the call at once.
		{"name empty", v3().call("result_metric", 1024, 0, 1.0), wasm.ErrResult, []string{"result_metric", "name of 0 bytes", "1 to 64"}},
		{"name 65 bytes", v3().data(1024, long).call("result_metric", 1024, 65, 1.0), wasm.ErrResult, []string{"name of 65 bytes"}},
		{"name length negative", v3().call("result_metric", 1024, -1, 1.0), wasm.ErrResult, []string{"name of -1 bytes"}},
		{"name not UTF-8", v3().data(1024, []byte{'a', 0xff, 0xfe}).call("result_metric", 1024, 3, 1.0), wasm.ErrResult,
			[]string{"result_metric", `"a\xff\xfe"`, "not UTF-8"}},
		{"name past the end", v3().call("result_metric", 65536-3, 4, 1.0), wasm.ErrMemoryAccess, []string{"result_metric", "[65533,+4)"}},
		{"name wraps around", v3().call("result_metric", 0xfffffffe, 4, 1.0), wasm.ErrMemoryAccess, []string{"result_metric", "[4294967294,+4)"}},
		{"NaN", v3().data(1024, []byte("loss")).call("result_metric", 1024, 4, math.NaN()), wasm.ErrResult, []string{`metric "loss" is NaN`}},
		{"+Inf", v3().data(1024, []byte("loss")).call("result_metric", 1024, 4, math.Inf(1)), wasm.ErrResult, []string{`"loss" is +Inf`}},
		{"-Inf", v3().data(1024, []byte("loss")).call("result_metric", 1024, 4, math.Inf(-1)), wasm.ErrResult, []string{`"loss" is -Inf`}},
		{"65 metrics", func() *prog {
			p := v3().data(1024, names)
			for i := range 65 {
				p.call("result_metric", 1024+i, 1, 0.5)
			}
			return p
		}(), wasm.ErrResult, []string{"result_metric", `"a"`, "65th", "limit 64"}},
		{"examples then output_write", v3().data(16, doc).examples(24).call("output_write", 16, len(doc)), wasm.ErrResult,
			[]string{"use output_write or result_examples/result_metric, not both"}},
		{"output_write then metric", v3().data(16, doc).data(1024, []byte("loss")).call("output_write", 16, len(doc)).
			call("result_metric", 1024, 4, 1.0).examples(24), wasm.ErrResult, []string{"not both"}},
		{"empty output_write and examples", v3().call("output_write", 16, 0).examples(24), wasm.ErrResult, []string{"not both"}},
		{"metric without examples", v3().data(1024, []byte("loss")).call("result_metric", 1024, 4, 1.0), wasm.ErrResult,
			[]string{"result_metric without result_examples"}},
		{"examples above data count", v3().examples(25), wasm.ErrResult, []string{"num_examples 25 not in [0,24]"}},
		{"examples negative", v3().examples(-1), wasm.ErrResult, []string{"num_examples -1 not in [0,24]"}},
		{"examples MinInt32", v3().examples(math.MinInt32), wasm.ErrResult, []string{"num_examples -2147483648"}},
		{"no result", v3().call("data_count").drop(), wasm.ErrResult, []string{"module wrote no result"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if atOnce[tc.name] {
				tc.p.call("param_name", 99, 0, 0).drop().examples(24)
			}
			_, _, err := v3Train(t, tc.p, "", 1)
			wantSentinel(t, err, tc.want, tc.mentions...)
		})
	}
	t.Run("failing module", func(t *testing.T) {
		// A module that reports failure has no result, however it built one.
		p := v3().examples(24)
		p.body = append(p.body, wasmbin.I32Const(7)...)
		p.body = append(p.body, 0x0f) // return
		_, _, err := v3Train(t, p, "", 1)
		wantSentinel(t, err, wasm.ErrModuleFailed, "status 7")
	})
	v3Healthy(t)
}
