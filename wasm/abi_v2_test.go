package wasm_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// v2Kernels is the ABI v2 crosscheck module; see testdata/v2/kernels.
const v2Kernels = "./testdata/v2/kernels"

var (
	vI32 = wasmbin.I32
	vF32 = wasmbin.F32
)

// hostSigs are the host functions the hand-built modules below call, with
// the signatures docs/ABI.md gives them.
var hostSigs = map[string]wasmbin.FuncType{
	"tensor_new":      {Params: []wasmbin.ValType{vI32, vI32}, Results: []wasmbin.ValType{vI32}},
	"tensor_fill":     {Params: []wasmbin.ValType{vI32, vF32}},
	"output_write":    {Params: []wasmbin.ValType{vI32, vI32}},
	"log":             {Params: []wasmbin.ValType{vI32, vI32}},
	"embedding":       {Params: []wasmbin.ValType{vI32, vI32, vI32}},
	"embedding_grad":  {Params: []wasmbin.ValType{vI32, vI32, vI32}},
	"layer_norm":      {Params: []wasmbin.ValType{vI32, vI32, vI32, vI32, vI32, vI32, vF32}},
	"layer_norm_grad": {Params: []wasmbin.ValType{vI32, vI32, vI32, vI32, vI32, vI32, vI32, vI32}},
	"gelu":            {Params: []wasmbin.ValType{vI32, vI32}},
	"gelu_grad":       {Params: []wasmbin.ValType{vI32, vI32, vI32}},
	"softmax":         {Params: []wasmbin.ValType{vI32, vI32, vI32}},
	"softmax_grad":    {Params: []wasmbin.ValType{vI32, vI32, vI32}},
	"batched_gemm":    {Params: []wasmbin.ValType{vI32, vI32, vF32, vI32, vI32, vF32, vI32, vI32}},
	"gemm":            {Params: []wasmbin.ValType{vI32, vI32, vF32, vI32, vI32, vF32, vI32}},
	"split_heads":     {Params: []wasmbin.ValType{vI32, vI32, vI32, vI32}},
	"merge_heads":     {Params: []wasmbin.ValType{vI32, vI32, vI32, vI32}},
	"bias_add":        {Params: []wasmbin.ValType{vI32, vI32}},
	"tensor_write":    {Params: []wasmbin.ValType{vI32, vI32, vI32}},
	"tensor_read":     {Params: []wasmbin.ValType{vI32, vI32, vI32}},
}

// hostOp is one host call with constant arguments (int32 or float32).
type hostOp struct {
	fn   string
	args []any
}

func op(fn string, args ...any) hostOp { return hostOp{fn, args} }

// newT allocates a rows×cols tensor. The tiny model's four parameters hold
// handles 1–4, so the k-th tensor a hand-built module allocates is handle 4+k.
func newT(rows, cols int32) hostOp { return op("tensor_new", rows, cols) }

func fill(h int32, v float32) hostOp { return op("tensor_fill", h, v) }

// opsModule hand-builds a module declaring ABI version that imports from ns
// the functions ops call, runs ops in train (and evaluate), and when done
// reports 24 examples; loop repeats the last of ops (the others set it up,
// once) until the call is stopped.
func opsModule(version int32, ns string, loop bool, ops ...hostOp) []byte {
	return opsModuleData(nil, version, ns, loop, ops...)
}

// opsModuleData is opsModule with data placed in memory too; offsets 16–33
// hold the result document.
func opsModuleData(data []wasmbin.Data, version int32, ns string, loop bool, ops ...hostOp) []byte {
	const doc = `{"num_examples":24}`
	ops = append(ops, op("output_write", int32(16), int32(len(doc))))
	m := wasmbin.Module{Types: []wasmbin.FuncType{typeEntry}, Memory: wasmbin.Pages(1),
		Data: append([]wasmbin.Data{{Offset: 16, Bytes: []byte(doc)}}, data...)}
	index := map[string]uint32{}
	var body []byte
	for i, o := range ops {
		if loop && i == len(ops)-2 {
			body = append(body, wasmbin.OpLoop, wasmbin.BlockEmpty)
		}
		f, ok := index[o.fn]
		if !ok {
			m.Types = append(m.Types, hostSigs[o.fn])
			f = uint32(len(m.Imports))
			m.Imports = append(m.Imports, wasmbin.Import{Module: ns, Name: o.fn, Type: uint32(len(m.Types) - 1)})
			index[o.fn] = f
		}
		for _, a := range o.args {
			switch a := a.(type) {
			case int32:
				body = append(body, wasmbin.I32Const(a)...)
			case float32:
				body = append(body, wasmbin.F32Const(a)...)
			default:
				panic(fmt.Sprintf("host call argument %v of type %T", a, a))
			}
		}
		body = append(body, wasmbin.Call(f)...)
		if len(hostSigs[o.fn].Results) > 0 {
			body = append(body, wasmbin.OpDrop)
		}
		if loop && i == len(ops)-2 {
			body = append(body, wasmbin.OpBr, 0, wasmbin.OpEnd)
		}
	}
	body = append(body, returnZero...)
	n := uint32(len(m.Imports))
	m.Funcs = []wasmbin.Func{{Type: 0, Body: wasmbin.I32Const(version)}, {Type: 0, Body: body}, {Type: 0, Body: body}}
	m.Exports = []wasmbin.Export{
		{Name: "fleetlearn_abi_version", Kind: wasmbin.ExportFunc, Index: n},
		{Name: "train", Kind: wasmbin.ExportFunc, Index: n + 1},
		{Name: "evaluate", Kind: wasmbin.ExportFunc, Index: n + 2},
		{Name: "memory", Kind: wasmbin.ExportMemory},
	}
	return m.Encode()
}

// runOps loads an ABI v2 module running ops and trains it on the tiny model.
func runOps(t *testing.T, lim wasm.Limits, loop bool, ops ...hostOp) error {
	t.Helper()
	m, err := loadHand(t, opsModule(2, "fleetlearn_v2", loop, ops...))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if m.ABIVersion() != 2 {
		t.Fatalf("ABIVersion() = %d, want 2", m.ABIVersion())
	}
	_, err = safeTrain(t, context.Background(), m, wasm.Call{Model: tinyModel(t), Data: tinyData(), Limits: lim})
	return err
}

// TestABINamespaces: a module imports host functions from the namespace of
// the ABI version it declares and no other, and declares a version the host
// serves; Load refuses anything else with an error that says what to do.
func TestABINamespaces(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version int32
		ns      string
	}{{"v1", 1, "fleetlearn_v1"}, {"v2", 2, "fleetlearn_v2"}} {
		t.Run("loads "+tc.name, func(t *testing.T) {
			m, err := loadHand(t, opsModule(tc.version, tc.ns, false, newT(2, 2), fill(5, 1)))
			if err != nil {
				t.Fatal(err)
			}
			if m.ABIVersion() != int(tc.version) {
				t.Errorf("ABIVersion() = %d, want %d", m.ABIVersion(), tc.version)
			}
			res, err := safeTrain(t, context.Background(), m, wasm.Call{Model: tinyModel(t), Data: tinyData()})
			if err != nil || res.NumExamples != 24 {
				t.Fatalf("train: %+v, %v", res, err)
			}
		})
	}
	if v := sharedModule(t, wasmtest.MLP).ABIVersion(); v != 1 {
		t.Errorf("SDK-built MLP declares ABI v%d, want 1", v)
	}

	for _, tc := range []struct {
		name     string
		code     []byte
		want     error
		mentions []string
	}{
		{"v1 importing fleetlearn_v2", opsModule(1, "fleetlearn_v2", false, newT(2, 2)),
			wasm.ErrForbiddenImport, []string{"declares ABI v1", "fleetlearn_v2.tensor_new", "fleetlearn_v1"}},
		{"v2 importing fleetlearn_v1", opsModule(2, "fleetlearn_v1", false, newT(2, 2)),
			wasm.ErrForbiddenImport, []string{"declares ABI v2", "fleetlearn_v1.tensor_new", "fleetlearn_v2"}},
		{"v2 function from fleetlearn_v1", opsModule(1, "fleetlearn_v1", false, op("gelu", int32(1), int32(1))),
			wasm.ErrForbiddenImport, []string{"fleetlearn_v1.gelu", "new in v2", "fleetlearn_v2"}},
		{"unknown namespace", opsModule(2, "fleetlearn_v5", false, newT(2, 2)),
			wasm.ErrForbiddenImport, []string{"fleetlearn_v5.tensor_new"}},
		{"version 5", opsModule(5, "fleetlearn_v2", false), wasm.ErrABIVersion, []string{"v5", "v1 to v4"}},
		{"version 0", opsModule(0, "fleetlearn_v1", false), wasm.ErrABIVersion, []string{"v0", "v1 to v4"}},
		{"version -1", opsModule(-1, "fleetlearn_v1", false), wasm.ErrABIVersion, []string{"v-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadHand(t, tc.code)
			wantSentinel(t, err, tc.want, tc.mentions...)
		})
	}
	t.Run("both namespaces", func(t *testing.T) {
		imps := []wasmbin.Import{{Module: "fleetlearn_v1", Name: "log", Type: 1}, {Module: "fleetlearn_v2", Name: "log", Type: 1}}
		for _, v := range []int32{1, 2} {
			_, err := loadHand(t, handModule(v, returnZero, imps, nil).Encode())
			wantSentinel(t, err, wasm.ErrForbiddenImport, "fleetlearn_v1.log", "fleetlearn_v2.log", "one namespace")
		}
	})
	t.Run("host call while the version is read", func(t *testing.T) {
		m := handModule(2, returnZero, []wasmbin.Import{{Module: "fleetlearn_v2", Name: "log", Type: 1}}, []byte("hi"))
		m.Funcs[0].Body = wasmbin.Code(wasmbin.I32Const(16), wasmbin.I32Const(2), wasmbin.Call(0), wasmbin.I32Const(2))
		_, err := loadHand(t, m.Encode())
		wantSentinel(t, err, wasm.ErrABI, "log", "at load")
	})
	requireHealthy(t)
}

// TestV2KernelAbuse: ABI v2's kernels called with handles, shapes, token ids
// or arguments a well-behaved module would never pass fail the call with a
// clear error. Allocated tensors are handles 5, 6, … in order.
func TestV2KernelAbuse(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name     string
		ops      []hostOp
		mentions []string
	}{
		{"embedding bad handle", []hostOp{op("embedding", int32(999), int32(1), int32(1))}, []string{"embedding", "handle 999"}},
		{"embedding id out of range", []hostOp{newT(3, 4), newT(2, 1), newT(2, 4), fill(6, 3), op("embedding", int32(5), int32(6), int32(7))},
			[]string{"embedding", "3 not in [0,3)"}},
		{"embedding negative id", []hostOp{newT(3, 4), newT(2, 1), newT(2, 4), fill(6, -1), op("embedding", int32(5), int32(6), int32(7))},
			[]string{"embedding", "-1"}},
		{"embedding NaN id", []hostOp{newT(3, 4), newT(2, 1), newT(2, 4), fill(6, nan), op("embedding", int32(5), int32(6), int32(7))},
			[]string{"embedding", "NaN"}},
		{"embedding fractional id", []hostOp{newT(3, 4), newT(2, 1), newT(2, 4), fill(6, 0.5), op("embedding", int32(5), int32(6), int32(7))},
			[]string{"embedding", "0.5"}},
		{"embedding out shape", []hostOp{newT(3, 4), newT(2, 1), newT(2, 3), op("embedding", int32(5), int32(6), int32(7))},
			[]string{"embedding", "2x3"}},
		{"embedding_grad id out of range", []hostOp{newT(2, 4), newT(2, 1), newT(3, 4), fill(6, 7), op("embedding_grad", int32(5), int32(6), int32(7))},
			[]string{"embedding_grad", "7"}},
		{"embedding_grad NaN id", []hostOp{newT(2, 4), newT(2, 1), newT(3, 4), fill(6, nan), op("embedding_grad", int32(5), int32(6), int32(7))},
			[]string{"embedding_grad", "NaN"}},
		{"embedding_grad ids shape", []hostOp{newT(2, 4), newT(1, 2), newT(3, 4), op("embedding_grad", int32(5), int32(6), int32(7))},
			[]string{"embedding_grad", "1x2"}},
		{"layer_norm gamma length", layerNormOps(3, 4, 1e-5), []string{"layer_norm", "gamma"}},
		{"layer_norm eps zero", layerNormOps(4, 4, 0), []string{"layer_norm", "eps"}},
		{"layer_norm eps NaN", layerNormOps(4, 4, nan), []string{"layer_norm", "NaN"}},
		{"layer_norm handle 0", []hostOp{op("layer_norm", int32(1), int32(2), int32(2), int32(1), int32(0), int32(0), float32(1e-5))},
			[]string{"layer_norm", "handle 0"}},
		{"layer_norm_grad freed-never handle", []hostOp{op("layer_norm_grad", int32(1), int32(1), int32(2), int32(3), int32(4), int32(1), int32(2), int32(77))},
			[]string{"layer_norm_grad", "handle 77"}},
		{"layer_norm_grad shapes", []hostOp{op("layer_norm_grad", int32(1), int32(1), int32(2), int32(3), int32(4), int32(1), int32(2), int32(2))},
			[]string{"layer_norm_grad"}},
		{"gelu shapes", []hostOp{newT(2, 2), newT(2, 3), op("gelu", int32(5), int32(6))}, []string{"gelu", "2x3"}},
		{"gelu_grad bad handle", []hostOp{newT(2, 2), op("gelu_grad", int32(5), int32(5), int32(6))}, []string{"gelu_grad", "handle 6"}},
		{"softmax negative causal", []hostOp{newT(4, 4), op("softmax", int32(5), int32(5), int32(-1))}, []string{"softmax", "-1"}},
		{"softmax causal width", []hostOp{newT(4, 4), op("softmax", int32(5), int32(5), int32(3))}, []string{"softmax", "3"}},
		{"softmax shapes", []hostOp{newT(4, 4), newT(4, 3), op("softmax", int32(5), int32(6), int32(0))}, []string{"softmax", "4x3"}},
		{"softmax_grad shapes", []hostOp{newT(4, 4), newT(3, 4), op("softmax_grad", int32(5), int32(6), int32(5))}, []string{"softmax_grad", "3x4"}},
		{"batched_gemm batch 0", batchedOps(4, 4, 4, 0), []string{"batched_gemm", "batch 0"}},
		{"batched_gemm batch -3", batchedOps(4, 4, 4, -3), []string{"batched_gemm", "batch -3"}},
		{"batched_gemm uneven blocks", batchedOps(6, 4, 6, 4), []string{"batched_gemm", "6x4", "4"}},
		{"batched_gemm shapes", batchedOps(4, 4, 8, 2), []string{"batched_gemm", "block 0"}},
		{"batched_gemm bad handle", []hostOp{op("batched_gemm", int32(0), int32(0), float32(1), int32(1), int32(1), float32(0), int32(123), int32(1))},
			[]string{"batched_gemm", "handle 123"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantSentinel(t, runOps(t, wasm.Limits{}, false, tc.ops...), wasm.ErrKernel, tc.mentions...)
		})
	}
	requireHealthy(t)
}

// layerNormOps normalises a 4×4 tensor with a 1×g gamma and beta.
func layerNormOps(g int32, _ int32, eps float32) []hostOp {
	return []hostOp{newT(4, 4), newT(1, g), newT(1, g), newT(4, 4), newT(4, 1), newT(4, 1),
		op("layer_norm", int32(5), int32(6), int32(7), int32(8), int32(9), int32(10), eps)}
}

// batchedOps multiplies a (ra×4) by bᵀ (rb×4) into c (rc×rb/batch).
func batchedOps(ra, rb, rc, batch int32) []hostOp {
	cols := int32(4)
	if batch > 0 && rb%batch == 0 {
		cols = rb / batch
	}
	return []hostOp{newT(ra, 4), newT(rb, 4), newT(rc, cols),
		op("batched_gemm", int32(0), int32(1), float32(1), int32(5), int32(6), float32(0), int32(7), batch)}
}

// TestV2Budget: ABI v2's kernels charge their work before doing it, so a
// module that spends past the call's budget is stopped with ErrBudget, and
// a batched gemm looping past its deadline is stopped with ErrDeadline.
func TestV2Budget(t *testing.T) {
	big := []hostOp{newT(64, 64), newT(64, 64), newT(64, 64)} // 12288 work to allocate
	for _, tc := range []struct {
		name     string
		ops      []hostOp
		mentions []string
	}{
		// 4 products of 16×64 by 64×64: 4·2·16·64·64 = 524288 flops.
		{"batched_gemm", append(big, op("batched_gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(0), int32(7), int32(4))),
			[]string{"batched_gemm", "exceeds limit 100000"}},
		// 12 per value: 49152 per call, so the second passes the limit.
		{"gelu", append(big, op("gelu", int32(5), int32(6)), op("gelu", int32(5), int32(6))), []string{"gelu", "exceeds limit 100000"}},
		{"softmax", append(big, op("softmax", int32(5), int32(6), int32(0)), op("softmax", int32(5), int32(6), int32(64)),
			op("softmax", int32(5), int32(6), int32(0)), op("softmax", int32(5), int32(6), int32(0)),
			op("softmax", int32(5), int32(6), int32(0))), []string{"softmax", "exceeds limit 100000"}},
		{"layer_norm", append(big, newT(1, 64), newT(1, 64), newT(64, 1), newT(64, 1),
			op("layer_norm", int32(5), int32(8), int32(9), int32(6), int32(10), int32(11), float32(1e-5)),
			op("layer_norm", int32(5), int32(8), int32(9), int32(6), int32(10), int32(11), float32(1e-5)),
			op("layer_norm", int32(5), int32(8), int32(9), int32(6), int32(10), int32(11), float32(1e-5))),
			[]string{"layer_norm", "exceeds limit 100000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantSentinel(t, runOps(t, wasm.Limits{MaxWork: 100_000}, false, tc.ops...), wasm.ErrBudget, tc.mentions...)
		})
	}
	t.Run("batched_gemm deadline", func(t *testing.T) {
		// 64 products of 128×128 by 128×128 per call, repeated until stopped.
		ops := []hostOp{newT(64*128, 128), newT(64*128, 128), newT(64*128, 128),
			op("batched_gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(0), int32(7), int32(64))}
		err := runOps(t, wasm.Limits{Timeout: 300 * time.Millisecond}, true, ops...)
		wantSentinel(t, err, wasm.ErrDeadline)
	})
	requireHealthy(t)
}

// TestV2MatchesNative: an SDK-built ABI v2 module running every kernel v2
// adds gets bit-identical results to the native kernels run in the same
// order, and imports host functions only from fleetlearn_v2.
func TestV2MatchesNative(t *testing.T) {
	code := wasmtest.Build(t, v2Kernels)
	imps, err := wasmbin.Imports(code)
	if err != nil {
		t.Fatal(err)
	}
	sawV2 := false
	for _, im := range imps {
		switch {
		case im.Module == "fleetlearn_v2":
			sawV2 = sawV2 || im.Name == "batched_gemm"
		case im.Module != "wasi_snapshot_preview1":
			t.Errorf("SDK v2 module imports %s.%s", im.Module, im.Name)
		}
	}
	if !sawV2 {
		t.Errorf("SDK v2 module does not import fleetlearn_v2.batched_gemm: %+v", imps)
	}
	mlpImps, err := wasmbin.Imports(wasmtest.Build(t, wasmtest.MLP))
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range mlpImps {
		if im.Module != "fleetlearn_v1" && im.Module != "wasi_snapshot_preview1" {
			t.Errorf("SDK v1 module imports %s.%s", im.Module, im.Name)
		}
	}

	const n, d, v = 8, 4, 5
	shapes := []struct {
		name       string
		rows, cols int
	}{{"gamma", 1, d}, {"beta", 1, d}, {"table", v, d},
		{"y", n, d}, {"g", n, d}, {"s", n, d}, {"p", n, d}, {"p2", n, d}, {"emb", n, d}, {"ds", n, d}, {"dg", n, d}, {"dx", n, d},
		{"dtable", v, d}, {"mean", n, 1}, {"rstd", n, 1}, {"dgamma", 1, d}, {"dbeta", 1, d}, {"norm", 1, 1}}
	var tensors []model.Tensor
	for i, s := range shapes {
		data := make([]float32, s.rows*s.cols)
		if i < 3 {
			for j := range data {
				data[j] = float32(math.Sin(float64(7*i+j))) + float32(i%2)
			}
		}
		tensors = append(tensors, model.Tensor{Name: s.name, Shape: []int{s.rows, s.cols}, Data: data})
	}
	init, err := model.New(tensors...)
	if err != nil {
		t.Fatal(err)
	}
	m := sharedModule(t, v2Kernels)
	if m.ABIVersion() != 2 {
		t.Fatalf("ABIVersion() = %d, want 2", m.ABIVersion())
	}
	ds := tinyData()
	res, err := safeTrain(t, context.Background(), m, wasm.Call{Model: init, Data: ds})
	if err != nil {
		t.Fatal(err)
	}
	// The module writes every parameter: told that "y" is frozen, its
	// result is refused.
	var allButY []int
	for i := range shapes {
		if shapes[i].name != "y" {
			allButY = append(allButY, i)
		}
	}
	if _, err := m.Train(context.Background(), wasm.Call{Model: init, Data: ds, Trainable: allButY}); !errors.Is(err, wasm.ErrResult) ||
		!strings.Contains(err.Error(), "frozen parameter y changed") {
		t.Fatalf("a module changing a frozen parameter: %v, want ErrResult naming y", err)
	}

	// The same sequence, natively.
	mat := func(i int) kernel.Mat {
		s := shapes[i]
		return kernel.Mat{Rows: s.rows, Cols: s.cols, Data: append([]float32(nil), init.Tensors[i].Data...)}
	}
	w := make([]kernel.Mat, len(shapes))
	for i := range w {
		w[i] = mat(i)
	}
	x, ids := kernel.NewMat(n, d), kernel.NewMat(n, 1)
	copy(x.Data, ds.Features[:n*d])
	for i := range n {
		ids.Data[i] = float32(ds.Labels[i])
	}
	gamma, beta, table := w[0], w[1], w[2]
	y, g, s, p, p2, emb, dsm, dg, dx := w[3], w[4], w[5], w[6], w[7], w[8], w[9], w[10], w[11]
	dtable, mean, rstd, dgamma, dbeta := w[12], w[13], w[14], w[15], w[16]
	for _, err := range []error{
		kernel.LayerNorm(x, gamma, beta, y, mean, rstd, 1e-5),
		kernel.GELU(y, g),
		kernel.BatchedGemm(false, true, 1, g, g, 0, s, 2),
		kernel.Softmax(s, p, d),
		kernel.Softmax(g, p2, 0),
		kernel.Embedding(table, ids, emb),
		kernel.EmbeddingGrad(g, ids, dtable),
		kernel.SoftmaxGrad(g, p2, dsm),
		kernel.GELUGrad(dsm, y, dg),
		kernel.LayerNormGrad(dg, x, gamma, mean, rstd, dx, dgamma, dbeta),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	w[17].Data[0] = float32(kernel.Norm2(dx))
	for i, s := range shapes {
		got, want := res.Model.Tensors[i].Data, w[i].Data
		nonzero := false
		for j := range want {
			nonzero = nonzero || want[j] != 0
			if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
				t.Errorf("%s[%d] = %v (%#x), native %v (%#x)", s.name, j, got[j], math.Float32bits(got[j]), want[j], math.Float32bits(want[j]))
				break
			}
		}
		if !nonzero {
			t.Errorf("%s is all zero natively: the check proves nothing", s.name)
		}
	}
	if res.Work <= 0 {
		t.Errorf("work %d", res.Work)
	}
}
