package wasm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// attackerPkg is the hostile Go module; its "attack" hyper-parameter picks the attack.
const attackerPkg = "./testdata/hostile/attacker"

// farAddr is the address the attacker passes for "outside memory", as the host prints it.
const farAddr = "4294967280"

// attackEnv is the one sandbox the hostile tests attack. Every test ends by
// running a good module in it, so an attack that damaged it shows up there.
var attackEnv struct {
	once sync.Once
	sb   *wasm.Sandbox
	err  error
	logs *logHook

	mu      sync.Mutex
	modules map[string]*wasm.Module
}

func sharedSandbox(t testing.TB) *wasm.Sandbox {
	t.Helper()
	dir := cacheDir(t)
	attackEnv.once.Do(func() {
		attackEnv.logs = &logHook{waiters: map[string]chan string{}}
		// A generous default deadline keeps a broken test from hanging for minutes.
		attackEnv.sb, attackEnv.err = wasm.New(wasm.WithCacheDir(dir), wasm.WithLogger(slog.New(attackEnv.logs)),
			wasm.WithLimits(wasm.Limits{Timeout: 30 * time.Second}))
	})
	if attackEnv.err != nil {
		t.Fatal(attackEnv.err)
	}
	return attackEnv.sb
}

// sharedModule builds and loads a Go module once for the whole test binary.
func sharedModule(t testing.TB, pkg string) *wasm.Module {
	t.Helper()
	sb := sharedSandbox(t)
	code := wasmtest.Build(t, pkg)
	attackEnv.mu.Lock()
	defer attackEnv.mu.Unlock()
	if m, ok := attackEnv.modules[pkg]; ok {
		return m
	}
	m, err := sb.Load(context.Background(), code, wasm.Hash(code))
	if err != nil {
		t.Fatalf("load %s: %v", pkg, err)
	}
	if attackEnv.modules == nil {
		attackEnv.modules = map[string]*wasm.Module{}
	}
	attackEnv.modules[pkg] = m
	return m
}

// logHook is the shared sandbox's log handler. It lets a test wait for the
// attacker's "ready <token> <value>" line, sent once an attack reaches its loop.
type logHook struct {
	mu      sync.Mutex
	waiters map[string]chan string
}

func (h *logHook) expect(token string) <-chan string {
	ch := make(chan string, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiters[token] = ch
	return ch
}

func (h *logHook) Enabled(context.Context, slog.Level) bool { return true }
func (h *logHook) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logHook) WithGroup(string) slog.Handler            { return h }

func (h *logHook) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		f := strings.Fields(a.Value.String())
		if a.Key != "msg" || len(f) != 3 || f[0] != "ready" {
			return true
		}
		h.mu.Lock()
		ch := h.waiters[f[1]]
		h.mu.Unlock()
		if ch != nil {
			select {
			case ch <- f[2]:
			default:
			}
		}
		return false
	})
	return nil
}

// tinyData is a separable 24-example, 4-feature, 3-class dataset.
func tinyData() *data.Dataset {
	d := &data.Dataset{Dim: 4, NumClasses: 3}
	for i := range 24 {
		c := i % 3
		d.Labels = append(d.Labels, uint8(c))
		for j := range 4 {
			v := float32(0.1 * float64((i+j)%5))
			if j == c {
				v += 2
			}
			d.Features = append(d.Features, v)
		}
	}
	return d
}

func tinyModel(t testing.TB) *model.Model {
	t.Helper()
	m, err := train.InitMLP([]int{4, 8, 3}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// requireHealthy trains the example MLP in the shared sandbox: after any
// attack, the host must still run a good module correctly.
func requireHealthy(t *testing.T) {
	t.Helper()
	init := tinyModel(t)
	d := tinyData()
	res, err := sharedModule(t, wasmtest.MLP).Train(context.Background(), wasm.Call{Model: init, Data: d, Seed: 3})
	if err != nil {
		t.Fatalf("host no longer runs a good module: %v", err)
	}
	if res.NumExamples != d.Len() || res.Model == nil {
		t.Fatalf("good module after the attack: %d examples, model %v", res.NumExamples, res.Model)
	}
	for k, v := range res.Metrics {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("good module after the attack: metric %s = %v", k, v)
		}
	}
	changed := false
	for i, tn := range res.Model.Tensors {
		for j, v := range tn.Data {
			changed = changed || v != init.Tensors[i].Data[j]
		}
	}
	if !changed {
		t.Fatal("good module after the attack: training left the weights unchanged")
	}
}

var allSentinels = []error{wasm.ErrHashMismatch, wasm.ErrInvalidModule, wasm.ErrForbiddenImport, wasm.ErrABI,
	wasm.ErrABIVersion, wasm.ErrDeadline, wasm.ErrMemoryLimit, wasm.ErrBudget, wasm.ErrKernel,
	wasm.ErrMemoryAccess, wasm.ErrResult, wasm.ErrModuleFailed, wasm.ErrInvalidCall, wasm.ErrLimits, wasm.ErrClosed}

// wantSentinel checks that err wraps want and no other sentinel, and that its
// message names everything in mentions.
func wantSentinel(t *testing.T, err, want error, mentions ...string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
	for _, s := range allSentinels {
		if s != want && errors.Is(err, s) {
			t.Errorf("error %q wraps %v as well as %v", err, s, want)
		}
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
}

// attackHyper is the attacker's hyper-parameters; see testdata/hostile/attacker.
type attackHyper struct {
	Attack string `json:"attack"`
	Handle uint32 `json:"handle,omitempty"`
	Token  string `json:"token,omitempty"`
	N      int32  `json:"n,omitempty"`
}

func (h attackHyper) call(t testing.TB, lim wasm.Limits) wasm.Call {
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return wasm.Call{Model: tinyModel(t), Data: tinyData(), Hyper: b, Seed: 1, Limits: lim}
}

// train runs m's train entry point, turning a host panic into a test failure.
func safeTrain(t *testing.T, ctx context.Context, m *wasm.Module, c wasm.Call) (res *wasm.Result, err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Train panicked instead of returning an error: %v", p)
		}
	}()
	return m.Train(ctx, c)
}

// runAttack runs one attack in the shared sandbox.
func runAttack(t *testing.T, h attackHyper, lim wasm.Limits) (*wasm.Result, error) {
	t.Helper()
	return safeTrain(t, context.Background(), sharedModule(t, attackerPkg), h.call(t, lim))
}

// Function types of the hand-built modules.
var (
	typeEntry  = wasmbin.FuncType{Results: []wasmbin.ValType{wasmbin.I32}}             // () -> i32
	typePtrLen = wasmbin.FuncType{Params: []wasmbin.ValType{wasmbin.I32, wasmbin.I32}} // (i32, i32) -> ()
)

// handModule is the smallest module shaped like ABI v1: fleetlearn_abi_version
// returns version, train and evaluate both run body, and it exports one page
// of memory holding seg at offset 16. Imported functions use type 1,
// (i32, i32) -> (), and take function indices 0, 1, … in order.
func handModule(version int32, body []byte, imports []wasmbin.Import, seg []byte) wasmbin.Module {
	var n uint32 // imported functions come first in the function index space
	for _, im := range imports {
		if !im.Memory {
			n++
		}
	}
	m := wasmbin.Module{
		Types:   []wasmbin.FuncType{typeEntry, typePtrLen},
		Imports: imports,
		Funcs:   []wasmbin.Func{{Type: 0, Body: wasmbin.I32Const(version)}, {Type: 0, Body: body}, {Type: 0, Body: body}},
		Memory:  wasmbin.Pages(1),
		Exports: []wasmbin.Export{
			{Name: "fleetlearn_abi_version", Kind: wasmbin.ExportFunc, Index: n},
			{Name: "train", Kind: wasmbin.ExportFunc, Index: n + 1},
			{Name: "evaluate", Kind: wasmbin.ExportFunc, Index: n + 2},
			{Name: "memory", Kind: wasmbin.ExportMemory},
		},
	}
	if seg != nil {
		m.Data = []wasmbin.Data{{Offset: 16, Bytes: seg}}
	}
	return m
}

var returnZero = wasmbin.I32Const(0)

// loadHand loads hand-built module bytes into the shared sandbox under their own hash.
func loadHand(t *testing.T, code []byte) (*wasm.Module, error) {
	t.Helper()
	return sharedSandbox(t).Load(context.Background(), code, wasm.Hash(code))
}

// TestDeadline: a module that never returns is stopped at its Timeout; the
// spec allows 200 ms of slack between the deadline and the error. It holds
// with one P too, as the edge agent runs by default: a spinning module must
// not starve the goroutine that enforces the deadline.
func TestDeadline(t *testing.T) {
	for _, procs := range []int{runtime.GOMAXPROCS(0), 1} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			testDeadline(t)
		})
	}
}

func testDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	wasmLoop := handModule(1, wasmbin.Code([]byte{wasmbin.OpLoop, wasmbin.BlockEmpty, wasmbin.OpBr, 0, wasmbin.OpEnd}, returnZero), nil, nil).Encode()
	for _, tc := range []struct {
		name string
		mod  func(t *testing.T) *wasm.Module
		c    func(t *testing.T) wasm.Call
	}{
		{"go loop", func(t *testing.T) *wasm.Module { return sharedModule(t, attackerPkg) },
			func(t *testing.T) wasm.Call {
				return attackHyper{Attack: "loop"}.call(t, wasm.Limits{Timeout: timeout})
			}},
		{"wasm loop", func(t *testing.T) *wasm.Module {
			m, err := loadHand(t, wasmLoop)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}, func(t *testing.T) wasm.Call {
			return wasm.Call{Model: tinyModel(t), Data: tinyData(), Limits: wasm.Limits{Timeout: timeout}}
		}},
		// Each 2048×2048 gemm is 1.7e10 flops, over a second on a two-core machine:
		// the deadline must hold for modules that spend their time in host kernels too.
		{"kernel loop", func(t *testing.T) *wasm.Module { return sharedModule(t, attackerPkg) },
			func(t *testing.T) wasm.Call {
				return attackHyper{Attack: "kernel_loop", N: 2048}.call(t, wasm.Limits{Timeout: timeout})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, c := tc.mod(t), tc.c(t)
			start := time.Now()
			_, err := safeTrain(t, context.Background(), m, c)
			elapsed := time.Since(start)
			wantSentinel(t, err, wasm.ErrDeadline, "train")
			if elapsed >= timeout+200*time.Millisecond {
				t.Errorf("deadline error came %v after the call started, want < %v", elapsed, timeout+200*time.Millisecond)
			}
			requireHealthy(t)
		})
	}
}

// TestMemoryLimit: growing memory past Limits.MemoryPages fails the call with
// ErrMemoryLimit whether the module is a Go program, whose runtime reports
// "out of memory", or raw wasm that traps once memory.grow refuses.
func TestMemoryLimit(t *testing.T) {
	const pages = 512
	lim := wasm.Limits{MemoryPages: pages}
	// The same module fits under the cap when it does not attack, so the cap,
	// not the module's baseline, is what stops it.
	if _, err := runAttack(t, attackHyper{Attack: "none"}, lim); err != nil {
		t.Fatalf("attacker without an attack under %d pages: %v", pages, err)
	}
	t.Run("go allocations", func(t *testing.T) {
		_, err := runAttack(t, attackHyper{Attack: "grow"}, lim)
		wantSentinel(t, err, wasm.ErrMemoryLimit, "512 pages")
		requireHealthy(t)
	})
	t.Run("memory.grow then trap", func(t *testing.T) {
		body := wasmbin.Code([]byte{wasmbin.OpLoop, wasmbin.BlockEmpty}, wasmbin.I32Const(1), wasmbin.MemoryGrow(),
			wasmbin.I32Const(-1), []byte{wasmbin.OpI32Ne, wasmbin.OpBrIf, 0, wasmbin.OpEnd, wasmbin.OpUnreachable})
		m, err := loadHand(t, handModule(1, body, nil, nil).Encode())
		if err != nil {
			t.Fatal(err)
		}
		_, err = safeTrain(t, context.Background(), m, wasm.Call{Model: tinyModel(t), Data: tinyData(), Limits: lim})
		wantSentinel(t, err, wasm.ErrMemoryLimit, "512 pages")
		requireHealthy(t)
	})
}

// TestForbiddenImport: Load refuses a module importing anything outside ABI
// v1, naming the import, while the same module with a granted import loads.
func TestForbiddenImport(t *testing.T) {
	granted := handModule(1, returnZero, []wasmbin.Import{{Module: "fleetlearn_v1", Name: "output_write", Type: 1}}, nil).Encode()
	if _, err := loadHand(t, granted); err != nil {
		t.Fatalf("module with a granted import: %v", err)
	}
	for _, tc := range []struct {
		imp  wasmbin.Import
		want string
	}{
		{wasmbin.Import{Module: "wasi_snapshot_preview1", Name: "sock_accept", Type: 1}, "wasi_snapshot_preview1.sock_accept"},
		{wasmbin.Import{Module: "wasi_snapshot_preview1", Name: "path_open", Type: 1}, "wasi_snapshot_preview1.path_open"},
		{wasmbin.Import{Module: "env", Name: "anything", Type: 1}, "env.anything"},
		{wasmbin.Import{Module: "fleetlearn_v2", Name: "log", Type: 1}, "fleetlearn_v2.log"},
		{wasmbin.Import{Module: "env", Name: "memory", Memory: true}, "env.memory"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			imps := []wasmbin.Import{{Module: "fleetlearn_v1", Name: "log", Type: 1}, tc.imp}
			m := handModule(1, returnZero, imps, nil)
			if tc.imp.Memory {
				m.Memory = nil // a module has one memory; it exports the imported one
			}
			_, err := loadHand(t, m.Encode())
			wantSentinel(t, err, wasm.ErrForbiddenImport, tc.want)
			requireHealthy(t)
		})
	}
}

// TestABI: a module must export the ABI's entry points with their signatures
// and declare an ABI version the host serves; Load reads the version.
func TestABI(t *testing.T) {
	t.Run("version 5", func(t *testing.T) {
		_, err := loadHand(t, handModule(5, returnZero, nil, nil).Encode())
		wantSentinel(t, err, wasm.ErrABIVersion, "v5")
		requireHealthy(t)
	})
	drop := func(name string) func(*wasmbin.Module) {
		return func(m *wasmbin.Module) {
			for i, e := range m.Exports {
				if e.Name == name {
					m.Exports = append(m.Exports[:i], m.Exports[i+1:]...)
					return
				}
			}
			panic("no export " + name)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*wasmbin.Module)
		want   string
	}{
		{"missing train", drop("train"), `"train"`},
		{"missing evaluate", drop("evaluate"), `"evaluate"`},
		{"missing version", drop("fleetlearn_abi_version"), `"fleetlearn_abi_version"`},
		{"no memory", drop("memory"), "memory"},
		{"train takes a parameter", func(m *wasmbin.Module) {
			m.Types = append(m.Types, wasmbin.FuncType{Params: []wasmbin.ValType{wasmbin.I32}, Results: []wasmbin.ValType{wasmbin.I32}})
			m.Funcs[1] = wasmbin.Func{Type: 2, Body: returnZero}
		}, `"train"`},
		// The name is granted but the signature is not ABI v1's log(ptr, len).
		{"import with the wrong signature", func(m *wasmbin.Module) {
			*m = handModule(1, returnZero, []wasmbin.Import{{Module: "fleetlearn_v1", Name: "log", Type: 0}}, nil)
		}, "fleetlearn_v1.log"},
		{"evaluate returns i64", func(m *wasmbin.Module) {
			m.Types = append(m.Types, wasmbin.FuncType{Results: []wasmbin.ValType{wasmbin.I64}})
			m.Funcs[2] = wasmbin.Func{Type: 2, Body: []byte{0x42, 0}} // i64.const 0
		}, `"evaluate"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := handModule(1, returnZero, nil, nil)
			tc.change(&m)
			_, err := loadHand(t, m.Encode())
			wantSentinel(t, err, wasm.ErrABI, tc.want)
			requireHealthy(t)
		})
	}
}

// TestInvalidBytes: bytes that are not a valid module fail Load with
// ErrInvalidModule, even under their own (correct) hash.
func TestInvalidBytes(t *testing.T) {
	mlp := wasmtest.Build(t, wasmtest.MLP)
	bodies, err := wasmbin.FuncBodies(mlp)
	if err != nil {
		t.Fatal(err)
	}
	// 0xff is an opcode no WebAssembly proposal assigns; the last function's
	// first instruction becomes it, so only validating every body catches it.
	badCode := append([]byte(nil), mlp...)
	badCode[bodies[len(bodies)-1].Code] = 0xff
	badMagic := append([]byte(nil), mlp...)
	badMagic[1] ^= 0xff
	for _, tc := range []struct {
		name string
		code []byte
	}{
		{"empty", nil},
		{"truncated", mlp[:len(mlp)/2]},
		{"bad magic", badMagic},
		{"version 2 header", append([]byte("\x00asm\x02\x00\x00\x00"), mlp[8:]...)},
		{"invalid opcode in the code section", badCode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadHand(t, tc.code)
			wantSentinel(t, err, wasm.ErrInvalidModule)
			requireHealthy(t)
		})
	}
	t.Run("over the size limit", func(t *testing.T) {
		sb, err := wasm.New(wasm.WithMaxModuleBytes(len(mlp) - 1))
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close(context.Background())
		_, err = sb.Load(context.Background(), mlp, wasm.Hash(mlp))
		wantSentinel(t, err, wasm.ErrInvalidModule, fmt.Sprint(len(mlp)))
	})
}

// TestHashMismatch: Load checks the bytes against the hash before anything else.
func TestHashMismatch(t *testing.T) {
	mlp := wasmtest.Build(t, wasmtest.MLP)
	good := wasm.Hash(mlp)
	other := wasm.Hash(wasmtest.Build(t, attackerPkg))
	for _, tc := range []struct{ name, hash string }{
		{"another module's hash", other},
		{"one hex digit short", good[:63]},
		{"one hex digit long", good + "0"},
		{"empty", ""},
		{"not hex", strings.Repeat("zz", 32)},
		{"hash of nothing", wasm.Hash(nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sharedSandbox(t).Load(context.Background(), mlp, tc.hash)
			wantSentinel(t, err, wasm.ErrHashMismatch, good)
			requireHealthy(t)
		})
	}
}

// TestHostileCalls: a module abusing host calls or lying in its result gets a
// clear error naming what it did.
func TestHostileCalls(t *testing.T) {
	for _, tc := range []struct {
		attack   string
		want     error
		mentions []string
	}{
		{"input_read_far", wasm.ErrMemoryAccess, []string{"input_read", farAddr}},
		{"output_write_far", wasm.ErrMemoryAccess, []string{"output_write", farAddr}},
		{"fail_far", wasm.ErrMemoryAccess, []string{"fail", farAddr}},
		{"tensor_read_far", wasm.ErrMemoryAccess, []string{"tensor_read", farAddr}},
		{"tensor_write_far", wasm.ErrMemoryAccess, []string{"tensor_write", farAddr}},
		{"data_gather_far", wasm.ErrMemoryAccess, []string{"data_gather", farAddr}},
		{"log_past_memory", wasm.ErrMemoryAccess, []string{"log", "2147483648"}},
		{"tensor_write_short", wasm.ErrKernel, []string{"tensor_write", "3 values", "2x2"}},
		{"output_huge", wasm.ErrResult, []string{"output_write", "65537"}},
		{"claim_examples", wasm.ErrResult, []string{"num_examples 25"}},
		{"negative_examples", wasm.ErrResult, []string{"num_examples -1"}},
		{"nan_weight", wasm.ErrResult, []string{"fc1.weight[0]", "NaN"}},
		{"inf_weight", wasm.ErrResult, []string{"fc1.bias[0]", "-Inf"}},
		{"fail", wasm.ErrModuleFailed, []string{"status 1", "attacker gives up on purpose"}},
		{"panic", wasm.ErrModuleFailed, []string{"attacker panics on purpose"}},
		{"exit0", wasm.ErrModuleFailed, []string{"train"}},
		{"no such attack", wasm.ErrModuleFailed, []string{`unknown attack "no such attack"`}},
	} {
		t.Run(tc.attack, func(t *testing.T) {
			_, err := runAttack(t, attackHyper{Attack: tc.attack}, wasm.Limits{})
			wantSentinel(t, err, tc.want, tc.mentions...)
			requireHealthy(t)
		})
	}
}

// TestHostileResults: hand-built modules hand the host exactly the result
// bytes they like through output_write, or return a failure status.
func TestHostileResults(t *testing.T) {
	write := []wasmbin.Import{{Module: "fleetlearn_v1", Name: "output_write", Type: 1}}
	writes := func(doc string) ([]byte, []byte) {
		return wasmbin.Code(wasmbin.I32Const(16), wasmbin.I32Const(int32(len(doc))), wasmbin.Call(0), returnZero), []byte(doc)
	}
	// The module behind the rows is sound: given a valid document it succeeds.
	body, doc := writes(`{"num_examples":24,"metrics":{"loss":0.5}}`)
	m, err := loadHand(t, handModule(1, body, write, doc).Encode())
	if err != nil {
		t.Fatal(err)
	}
	res, err := safeTrain(t, context.Background(), m, wasm.Call{Model: tinyModel(t), Data: tinyData()})
	if err != nil || res.NumExamples != 24 || res.Metrics["loss"] != 0.5 {
		t.Fatalf("valid hand-built result: %+v, %v", res, err)
	}

	for _, tc := range []struct {
		name     string
		doc      string // written when body is nil
		body     []byte
		want     error
		mentions []string
	}{
		{name: "malformed JSON", doc: `{"num_examples":`, want: wasm.ErrResult},
		{name: "not an object", doc: `[1,2,3]`, want: wasm.ErrResult},
		{name: "trailing data", doc: `{"num_examples":1}{}`, want: wasm.ErrResult, mentions: []string{"trailing"}},
		{name: "unknown field", doc: `{"num_examples":1,"weights":[1]}`, want: wasm.ErrResult, mentions: []string{"weights"}},
		{name: "too many examples", doc: `{"num_examples":25}`, want: wasm.ErrResult, mentions: []string{"num_examples 25"}},
		{name: "huge examples", doc: `{"num_examples":1e300}`, want: wasm.ErrResult},
		{name: "overflowing metric", doc: `{"num_examples":1,"metrics":{"loss":1e999}}`, want: wasm.ErrResult},
		{name: "empty metric name", doc: `{"num_examples":1,"metrics":{"":1}}`, want: wasm.ErrResult},
		{name: "no result", body: returnZero, want: wasm.ErrResult, mentions: []string{"no result"}},
		{name: "nonzero status", body: wasmbin.I32Const(7), want: wasm.ErrModuleFailed, mentions: []string{"status 7", "no message"}},
		{name: "trap", body: []byte{wasmbin.OpUnreachable}, want: wasm.ErrModuleFailed, mentions: []string{"unreachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, seg := tc.body, []byte(nil)
			if body == nil {
				body, seg = writes(tc.doc)
			}
			m, err := loadHand(t, handModule(1, body, write, seg).Encode())
			if err != nil {
				t.Fatal(err)
			}
			_, err = safeTrain(t, context.Background(), m, wasm.Call{Model: tinyModel(t), Data: tinyData()})
			wantSentinel(t, err, tc.want, tc.mentions...)
			requireHealthy(t)
		})
	}
}
