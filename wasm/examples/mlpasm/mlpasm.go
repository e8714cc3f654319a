// Package mlpasm assembles Fleetlearn's MLP update module as WebAssembly
// directly, without a language runtime: a few kilobytes that a device
// prepares in about a millisecond and starts in microseconds, where the same
// model written in Go (wasm/examples/mlp) is a 3.4 MB module that costs a
// device 1.5–2.5 CPU-s to compile and milliseconds to start on every call.
//
// It trains exactly what wasm/examples/mlp trains — a stack of Linear layers
// (fc1, fc2, … with PyTorch's [out, in] weight layout) and ReLU between them,
// mini-batch SGD with an optional FedProx term — calling the same host
// kernels in the same order, so the two modules and the native trainer
// (package model/train) produce the same weights bit for bit. What a Go
// module does with its runtime, this one asks the host for through ABI v3
// (docs/ABI.md): the hyper-parameters parsed by model/sgd, the example order
// of model/sgd, parameter names and shapes, and a result built from numbers
// rather than from a JSON document.
//
// The module is shipped as `fleetlearn module example mlp`
// (wasm/examples/embedded).
package mlpasm

import (
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
)

// ABIVersion is the module ABI the module declares.
const ABIVersion = 3

// Memory layout. The first page holds the messages, the hyper-parameters
// and name buffers; the handle tables and the example order follow, sized at
// each call from the model's depth and the dataset's size.
const (
	addrHyper = 1024 // epochs, batch_size, eval_batch_size i32; learning_rate, mu f32
	addrShape = 1056 // two i32 dimensions
	addrName  = 1088 // a parameter's name, up to nameCap bytes
	addrWant  = 1152 // the name it should have
	addrTab   = 2048 // the handle and width tables
	nameCap   = 64
	pageBytes = 65536
	// maxExamples keeps the order's byte size and every offset below 2³¹.
	maxExamples = 1 << 28
)

// Offsets of the hyper-parameters at addrHyper.
const (
	hEpochs    = 0
	hBatch     = 4
	hEvalBatch = 8
	hLR        = 12
	hMu        = 16
)

// The tables, each of L+1 i32 values, in this order from addrTab.
var tables = []string{"tW", "tB", "tAW", "tAB", "tACT", "tGRAD", "tDW", "tDB", "tWID"}

// imports are the host functions the module uses, with their signatures.
var imports = []struct {
	name            string
	params, results []wasmbin.ValType
}{
	{"param_count", nil, v(i)},
	{"param", v(i), v(i)},
	{"param_name", v(i, i, i), v(i)},
	{"param_shape", v(i, i, i), v(i)},
	{"tensor_new", v(i, i), v(i)},
	{"tensor_resize", v(i, i, i), nil},
	{"tensor_copy", v(i, i), nil},
	{"data_count", nil, v(i)},
	{"data_dim", nil, v(i)},
	{"data_classes", nil, v(i)},
	{"data_gather", v(i, i, i, i), nil},
	{"gemm", v(i, i, f, i, i, f, i), nil},
	{"bias_add", v(i, i), nil},
	{"col_sum", v(i, i), nil},
	{"relu", v(i, i), nil},
	{"relu_grad", v(i, i, i), nil},
	{"softmax_xent", v(i, i, i), v(d)},
	{"count_correct", v(i, i), v(i)},
	{"axpy", v(f, i, i), nil},
	{"fail", v(i, i), nil},
	{"sgd_hyper", v(i), nil},
	{"sgd_order", v(i, i, i), nil},
	{"result_examples", v(i), nil},
	{"result_metric", v(i, i, d), nil},
}

const (
	i = wasmbin.I32
	f = wasmbin.F32
	d = wasmbin.F64
)

func v(ts ...wasmbin.ValType) []wasmbin.ValType { return ts }

// Messages a call fails with; they name the rule, since the module has no
// formatter to name the values.
var messages = []string{
	"mlp: want weight/bias pairs: the model has no parameters or an odd number of them",
	"mlp: parameters must be fc1.weight, fc1.bias, fc2.weight, fc2.bias, … in this order",
	"mlp: a layer does not continue the previous width: fcN.weight must be [out, in] with in the previous layer's out (the dataset's dim for fc1) and fcN.bias [out]",
	"mlp: the last layer's output width is not the dataset's number of classes",
	"mlp: no local examples",
	"mlp: the call's memory limit is too small for the example order",
	"loss",
	"accuracy",
}

const (
	msgPairs = iota
	msgNames
	msgLayer
	msgClasses
	msgNoExamples
	msgMemory
	strLoss
	strAccuracy
)

// Module returns the module's bytes. They depend only on this package's
// source, so every build gives the same bytes and the same sha256.
func Module() []byte {
	var (
		types   []wasmbin.FuncType
		typeOf  = map[string]uint32{}
		imps    []wasmbin.Import
		impIdx  = map[string]uint32{}
		strAt   []int32
		strData []byte
	)
	typeIndex := func(t wasmbin.FuncType) uint32 {
		key := string(append(append([]byte{}, bytesOf(t.Params)...), append([]byte{0}, bytesOf(t.Results)...)...))
		if k, ok := typeOf[key]; ok {
			return k
		}
		types = append(types, t)
		typeOf[key] = uint32(len(types) - 1)
		return uint32(len(types) - 1)
	}
	for k, im := range imports {
		imps = append(imps, wasmbin.Import{Module: "fleetlearn_v3", Name: im.name,
			Type: typeIndex(wasmbin.FuncType{Params: im.params, Results: im.results})})
		impIdx[im.name] = uint32(k)
	}
	for _, m := range messages {
		strAt = append(strAt, int32(len(strData)))
		strData = append(strData, m...)
	}
	if len(strData) > addrHyper {
		panic("mlpasm: messages overlap the hyper-parameters")
	}
	g := &gen{imports: impIdx, strAt: strAt}

	voidT := typeIndex(wasmbin.FuncType{})
	i32T := typeIndex(wasmbin.FuncType{Results: v(i)})
	nImp := uint32(len(imps))
	funcs := []wasmbin.Func{
		{Type: voidT}, // _initialize: nothing to set up
		{Type: i32T, Body: wasmbin.I32Const(ABIVersion)},
		g.train().finish(i32T),
		g.evaluate().finish(i32T),
	}
	return wasmbin.Module{
		Types: types, Imports: imps, Funcs: funcs, Memory: wasmbin.Pages(1),
		Exports: []wasmbin.Export{
			{Name: "_initialize", Kind: wasmbin.ExportFunc, Index: nImp},
			{Name: "fleetlearn_abi_version", Kind: wasmbin.ExportFunc, Index: nImp + 1},
			{Name: "train", Kind: wasmbin.ExportFunc, Index: nImp + 2},
			{Name: "evaluate", Kind: wasmbin.ExportFunc, Index: nImp + 3},
			{Name: "memory", Kind: wasmbin.ExportMemory, Index: 0},
		},
		Data: []wasmbin.Data{{Offset: 0, Bytes: strData}},
	}.Encode()
}

func bytesOf(ts []wasmbin.ValType) []byte {
	b := make([]byte, len(ts))
	for k, t := range ts {
		b[k] = byte(t)
	}
	return b
}

// gen writes the two entry points; both share the set-up, the forward pass
// and the batch loading, emitted inline into each.
type gen struct {
	imports map[string]uint32
	strAt   []int32
}

func (g *gen) newFn() *fn {
	f := newFn(g.imports)
	for _, name := range []string{"np", "L", "examples", "stride", "end", "need",
		"k", "j", "n", "t", "dg", "pos", "nlen", "elen", "nrows", "labels", "start", "epoch", "c", "correct", "rows"} {
		f.local(name, i)
	}
	for _, name := range tables {
		f.local(name, i)
	}
	f.local("order", i)
	f.local("lossSum", d)
	f.local("lossN", d)
	return f
}

// fail sets message m and returns 1 from the entry point.
func (g *gen) fail(f *fn, m int) {
	f.i32(g.strAt[m]).i32(int32(len(messages[m]))).call("fail").i32(1).ret()
}

// at pushes the address of table[idx].
func at(f *fn, table string, idx func()) { f.get(table); idx(); f.i32(2).shl().add() }

// ld pushes table[idx].
func ld(f *fn, table string, idx func()) { at(f, table, idx); f.loadI32(0) }

// st stores val into table[idx].
func st(f *fn, table string, idx func(), val func()) { at(f, table, idx); val(); f.storeI32(0) }

func local(f *fn, name string) func() { return func() { f.get(name) } }
func konst(f *fn, c int32) func()     { return func() { f.i32(c) } }
func plus(f *fn, name string, c int32) func() {
	return func() { f.get(name).i32(c).add() }
}

// setup reads the hyper-parameters, checks the model's layers against the
// dataset exactly as wasm/examples/mlp does, and lays out the tables.
func (g *gen) setup(f *fn) {
	f.i32(addrHyper).call("sgd_hyper")
	f.call("param_count").tee("np").eqz().get("np").i32(1).and().or()
	f.then(func() { g.fail(f, msgPairs) })
	f.get("np").i32(1).shrU().set("L")
	f.call("data_count").set("examples")
	f.get("examples").i32(maxExamples).gtU().then(func() { g.fail(f, msgMemory) })

	// Tables, then the order; grow memory to hold them.
	f.get("L").i32(1).add().i32(2).shl().set("stride")
	f.i32(addrTab).set(tables[0])
	for k := 1; k < len(tables); k++ {
		f.get(tables[k-1]).get("stride").add().set(tables[k])
	}
	f.get(tables[len(tables)-1]).get("stride").add().set("order")
	f.get("order").get("examples").i32(2).shl().add().set("end")
	f.get("end").i32(pageBytes - 1).add().i32(16).shrU().tee("need")
	f.memorySize().gtU().then(func() {
		f.get("need").memorySize().sub().memoryGrow().i32(-1).eq()
		f.then(func() { g.fail(f, msgMemory) })
	})

	// Layers: names, ranks and widths.
	st(f, "tWID", konst(f, 0), func() { f.call("data_dim") })
	f.loopFor("k", konst(f, 0), local(f, "L"), konst(f, 1), func() {
		st(f, "tW", local(f, "k"), func() { f.get("k").i32(1).shl().call("param") })
		st(f, "tB", local(f, "k"), func() { f.get("k").i32(1).shl().i32(1).add().call("param") })
		g.checkName(f, func() { f.get("k").i32(1).shl() }, ".weight")
		g.checkName(f, func() { f.get("k").i32(1).shl().i32(1).add() }, ".bias")
		// fcN.weight is [out, in] with in the previous width.
		f.get("k").i32(1).shl().i32(addrShape).i32(2).call("param_shape").i32(2).ne()
		f.i32(addrShape).loadI32(4)
		ld(f, "tWID", local(f, "k"))
		f.ne().or().then(func() { g.fail(f, msgLayer) })
		st(f, "tWID", plus(f, "k", 1), func() { f.i32(addrShape).loadI32(0) })
		// fcN.bias is [out].
		f.get("k").i32(1).shl().i32(1).add().i32(addrShape).i32(2).call("param_shape").i32(1).ne()
		f.i32(addrShape).loadI32(0)
		ld(f, "tWID", plus(f, "k", 1))
		f.ne().or().then(func() { g.fail(f, msgLayer) })
	})
	ld(f, "tWID", local(f, "L"))
	f.call("data_classes").ne().then(func() { g.fail(f, msgClasses) })
	f.get("examples").eqz().then(func() { g.fail(f, msgNoExamples) })
}

// checkName fails unless parameter idx is named fcN<suffix>, N = k+1.
func (g *gen) checkName(f *fn, idx func(), suffix string) {
	idx()
	f.i32(addrName).i32(nameCap).call("param_name").set("nlen")
	// Write "fc", N in decimal, suffix at addrWant.
	f.i32(addrWant).i32('f').store8(0)
	f.i32(addrWant).i32('c').store8(1)
	f.i32(0).set("dg")
	f.get("k").i32(1).add().set("t")
	f.block(func(int) { // count N's digits
		f.open(0x03)
		f.get("dg").i32(1).add().set("dg")
		f.get("t").i32(10).divU().tee("t").brIf(0)
		f.end()
	})
	f.i32(addrWant + 2).get("dg").add().set("pos")
	f.get("k").i32(1).add().set("t")
	f.block(func(int) { // write them from the last
		f.open(0x03)
		f.get("pos").i32(1).sub().tee("pos")
		f.get("t").i32(10).remU().i32('0').add().store8(0)
		f.get("t").i32(10).divU().tee("t").brIf(0)
		f.end()
	})
	for n, c := range []byte(suffix) {
		f.get("dg").i32(int32(addrWant + 2 + n)).add().i32(int32(c)).store8(0)
	}
	f.get("dg").i32(int32(2 + len(suffix))).add().set("elen")
	f.get("nlen").get("elen").ne().then(func() { g.fail(f, msgNames) })
	f.loopFor("j", konst(f, 0), local(f, "elen"), konst(f, 1), func() {
		f.get("j").load8U(addrName).get("j").load8U(addrWant).ne()
		f.then(func() { g.fail(f, msgNames) })
	})
}

// newNet allocates the batch-sized activations, gradients and labels, in
// the order wasm/examples/mlp allocates them.
func (g *gen) newNet(f *fn) {
	f.get("rows").set("nrows")
	st(f, "tACT", konst(f, 0), func() { f.get("rows"); ld(f, "tWID", konst(f, 0)); f.call("tensor_new") })
	f.loopFor("k", konst(f, 0), local(f, "L"), konst(f, 1), func() {
		st(f, "tACT", plus(f, "k", 1), func() { f.get("rows"); ld(f, "tWID", plus(f, "k", 1)); f.call("tensor_new") })
		st(f, "tGRAD", local(f, "k"), func() { f.get("rows"); ld(f, "tWID", plus(f, "k", 1)); f.call("tensor_new") })
		st(f, "tDW", local(f, "k"), func() {
			ld(f, "tWID", plus(f, "k", 1))
			ld(f, "tWID", local(f, "k"))
			f.call("tensor_new")
		})
		st(f, "tDB", local(f, "k"), func() { f.i32(1); ld(f, "tWID", plus(f, "k", 1)); f.call("tensor_new") })
	})
	f.get("rows").i32(1).call("tensor_new").set("labels")
}

// gather loads the n examples whose indices are at addr into the first
// activation and the labels, reshaping the batch tensors when n changes.
func (g *gen) gather(f *fn, addr func()) {
	f.get("n").get("nrows").ne().then(func() {
		f.get("n").set("nrows")
		f.loopFor("k", konst(f, 0), plus(f, "L", 1), konst(f, 1), func() {
			ld(f, "tACT", local(f, "k"))
			f.get("n")
			ld(f, "tWID", local(f, "k"))
			f.call("tensor_resize")
		})
		f.loopFor("k", konst(f, 0), local(f, "L"), konst(f, 1), func() {
			ld(f, "tGRAD", local(f, "k"))
			f.get("n")
			ld(f, "tWID", plus(f, "k", 1))
			f.call("tensor_resize")
		})
		f.get("labels").get("n").i32(1).call("tensor_resize")
	})
	ld(f, "tACT", konst(f, 0))
	f.get("labels")
	addr()
	f.get("n").call("data_gather")
}

// forward leaves the logits in tACT[L].
func (g *gen) forward(f *fn) {
	f.loopFor("k", konst(f, 0), local(f, "L"), konst(f, 1), func() {
		f.i32(0).i32(1).f32(1)
		ld(f, "tACT", local(f, "k"))
		ld(f, "tW", local(f, "k"))
		f.f32(0)
		ld(f, "tACT", plus(f, "k", 1))
		f.call("gemm")
		ld(f, "tACT", plus(f, "k", 1))
		ld(f, "tB", local(f, "k"))
		f.call("bias_add")
		f.get("k").get("L").i32(1).sub().ltS().then(func() {
			ld(f, "tACT", plus(f, "k", 1))
			ld(f, "tACT", plus(f, "k", 1))
			f.call("relu")
		})
	})
}

// backward turns the logits' gradient in tGRAD[L-1] into the weight and
// bias gradients, the last layer first.
func (g *gen) backward(f *fn) {
	f.loopDown("k", local(f, "L"), func() {
		f.i32(1).i32(0).f32(1)
		ld(f, "tGRAD", local(f, "k"))
		ld(f, "tACT", local(f, "k"))
		f.f32(0)
		ld(f, "tDW", local(f, "k"))
		f.call("gemm")
		ld(f, "tGRAD", local(f, "k"))
		ld(f, "tDB", local(f, "k"))
		f.call("col_sum")
		f.get("k").i32(0).gtS().then(func() {
			f.i32(0).i32(0).f32(1)
			ld(f, "tGRAD", local(f, "k"))
			ld(f, "tW", local(f, "k"))
			f.f32(0)
			ld(f, "tGRAD", plus(f, "k", -1))
			f.call("gemm")
			ld(f, "tGRAD", plus(f, "k", -1))
			ld(f, "tACT", local(f, "k"))
			ld(f, "tGRAD", plus(f, "k", -1))
			f.call("relu_grad")
		})
	})
}

// result reports the examples, the mean loss and the accuracy.
func (g *gen) result(f *fn) {
	f.get("examples").call("result_examples")
	f.i32(g.strAt[strLoss]).i32(int32(len(messages[strLoss])))
	f.get("lossSum").get("examples").f64FromI32().f64Div().call("result_metric")
	f.i32(g.strAt[strAccuracy]).i32(int32(len(messages[strAccuracy])))
	f.get("correct").f64FromI32().get("examples").f64FromI32().f64Div().call("result_metric")
	f.i32(0)
}

func hyperI32(f *fn, off uint32) func() { return func() { f.i32(addrHyper).loadI32(off) } }
func hyperF32(f *fn, off uint32)        { f.i32(addrHyper).loadF32(off) }

func (g *gen) train() *fn {
	f := g.newFn()
	g.setup(f)
	// FedProx pulls towards the weights the round started from.
	hyperF32(f, hMu)
	f.f32(0).f32Gt().then(func() {
		f.loopFor("k", konst(f, 0), local(f, "L"), konst(f, 1), func() {
			st(f, "tAW", local(f, "k"), func() {
				ld(f, "tWID", plus(f, "k", 1))
				ld(f, "tWID", local(f, "k"))
				f.call("tensor_new")
			})
			st(f, "tAB", local(f, "k"), func() { f.i32(1); ld(f, "tWID", plus(f, "k", 1)); f.call("tensor_new") })
			ld(f, "tAW", local(f, "k"))
			ld(f, "tW", local(f, "k"))
			f.call("tensor_copy")
			ld(f, "tAB", local(f, "k"))
			ld(f, "tB", local(f, "k"))
			f.call("tensor_copy")
		})
	})
	f.minS(hyperI32(f, hBatch), local(f, "examples")).set("rows")
	g.newNet(f)
	f.loopFor("epoch", konst(f, 0), hyperI32(f, hEpochs), konst(f, 1), func() {
		f.f64(0).set("lossSum")
		f.i32(0).set("correct")
		f.get("order").get("examples").get("epoch").call("sgd_order")
		f.loopFor("start", konst(f, 0), local(f, "examples"), hyperI32(f, hBatch), func() {
			f.minS(hyperI32(f, hBatch), func() { f.get("examples").get("start").sub() }).set("n")
			g.gather(f, func() { f.get("order").get("start").i32(2).shl().add() })
			g.forward(f)
			ld(f, "tACT", local(f, "L"))
			f.get("labels")
			ld(f, "tGRAD", plus(f, "L", -1))
			f.call("softmax_xent")
			f.get("n").f64FromI32().f64Mul().set("lossN")
			ld(f, "tACT", local(f, "L"))
			f.get("labels").call("count_correct").set("c")
			g.backward(f)
			f.loopFor("k", konst(f, 0), local(f, "L"), konst(f, 1), func() {
				hyperF32(f, hMu)
				f.f32(0).f32Gt().then(func() {
					for _, p := range [][3]string{{"tW", "tAW", "tDW"}, {"tB", "tAB", "tDB"}} {
						hyperF32(f, hMu)
						ld(f, p[0], local(f, "k"))
						ld(f, p[2], local(f, "k"))
						f.call("axpy")
						hyperF32(f, hMu)
						f.f32Neg()
						ld(f, p[1], local(f, "k"))
						ld(f, p[2], local(f, "k"))
						f.call("axpy")
					}
				})
				for _, p := range [][2]string{{"tDW", "tW"}, {"tDB", "tB"}} {
					hyperF32(f, hLR)
					f.f32Neg()
					ld(f, p[0], local(f, "k"))
					ld(f, p[1], local(f, "k"))
					f.call("axpy")
				}
			})
			f.get("lossSum").get("lossN").f64Add().set("lossSum")
			f.get("correct").get("c").add().set("correct")
		})
	})
	g.result(f)
	return f
}

func (g *gen) evaluate() *fn {
	f := g.newFn()
	g.setup(f)
	f.minS(hyperI32(f, hEvalBatch), local(f, "examples")).set("rows")
	g.newNet(f)
	f.f64(0).set("lossSum")
	f.i32(0).set("correct")
	f.loopFor("start", konst(f, 0), local(f, "examples"), hyperI32(f, hEvalBatch), func() {
		f.minS(hyperI32(f, hEvalBatch), func() { f.get("examples").get("start").sub() }).set("n")
		f.loopFor("k", konst(f, 0), local(f, "n"), konst(f, 1), func() {
			st(f, "order", local(f, "k"), func() { f.get("start").get("k").add() })
		})
		g.gather(f, local(f, "order"))
		g.forward(f)
		ld(f, "tACT", local(f, "L"))
		f.get("labels").i32(0).call("softmax_xent")
		f.get("n").f64FromI32().f64Mul()
		f.get("lossSum").f64Add().set("lossSum")
		ld(f, "tACT", local(f, "L"))
		f.get("labels").call("count_correct")
		f.get("correct").add().set("correct")
	})
	g.result(f)
	return f
}
