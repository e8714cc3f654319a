package wasmtest

import (
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
)

// TrivialStep is what the Trivial module's train adds to every parameter value.
const TrivialStep = 1e-3

// Trivial returns a hand-assembled update module of a few hundred bytes that
// behaves like wasm/examples/noop — train adds TrivialStep to every parameter
// through host kernels, evaluate reports accuracy 0 — but without a language
// runtime, so that measurements of the system are not dominated by
// instantiating a Go-built module. It reports one example, so FedAvg weighs
// every device equally.
func Trivial() []byte { return Stepping(TrivialStep) }

// Stepping is Trivial with train adding step instead: with a huge step
// (3e38) it is a hostile module whose trained weights are finite but absurd,
// the poisoning a device cannot tell from training by looking at the values.
func Stepping(step float32) []byte {
	const (
		tI32toI32 = iota // (i32) -> i32
		tVoidToI32
		tI32I32toI32
		tI32F32
		tF32I32I32
		tI32
		tI32I32
		tVoid
	)
	types := []wasmbin.FuncType{
		tI32toI32:    {Params: []wasmbin.ValType{wasmbin.I32}, Results: []wasmbin.ValType{wasmbin.I32}},
		tVoidToI32:   {Results: []wasmbin.ValType{wasmbin.I32}},
		tI32I32toI32: {Params: []wasmbin.ValType{wasmbin.I32, wasmbin.I32}, Results: []wasmbin.ValType{wasmbin.I32}},
		tI32F32:      {Params: []wasmbin.ValType{wasmbin.I32, wasmbin.F32}},
		tF32I32I32:   {Params: []wasmbin.ValType{wasmbin.F32, wasmbin.I32, wasmbin.I32}},
		tI32:         {Params: []wasmbin.ValType{wasmbin.I32}},
		tI32I32:      {Params: []wasmbin.ValType{wasmbin.I32, wasmbin.I32}},
		tVoid:        {},
	}
	// Imported functions take indices 0..len(imports)-1, in this order.
	const (
		fParamCount = iota
		fParam
		fRows
		fCols
		fNew
		fFill
		fAxpy
		fFree
		fOutput
		nImports
	)
	imp := func(name string, typ uint32) wasmbin.Import {
		return wasmbin.Import{Module: "fleetlearn_v1", Name: name, Type: typ}
	}
	imports := []wasmbin.Import{
		fParamCount: imp("param_count", tVoidToI32),
		fParam:      imp("param", tI32toI32),
		fRows:       imp("tensor_rows", tI32toI32),
		fCols:       imp("tensor_cols", tI32toI32),
		fNew:        imp("tensor_new", tI32I32toI32),
		fFill:       imp("tensor_fill", tI32F32),
		fAxpy:       imp("axpy", tF32I32I32),
		fFree:       imp("tensor_free", tI32),
		fOutput:     imp("output_write", tI32I32),
	}
	trainDoc := []byte(`{"num_examples":1,"metrics":{}}`)
	evalDoc := []byte(`{"num_examples":1,"metrics":{"accuracy":0}}`)
	const evalAt = 64

	const (
		opBlock    = 0x02
		opLocalGet = 0x20
		opLocalSet = 0x21
		opI32GeS   = 0x4e
		opI32Add   = 0x6a
	)
	get := func(i byte) []byte { return []byte{opLocalGet, i} }
	set := func(i byte) []byte { return []byte{opLocalSet, i} }
	f32 := wasmbin.F32Const
	// Locals: 0 n, 1 i, 2 p (parameter handle), 3 c (scratch tensor).
	train := wasmbin.Code(
		wasmbin.Call(fParamCount), set(0),
		[]byte{opBlock, wasmbin.BlockEmpty, wasmbin.OpLoop, wasmbin.BlockEmpty},
		get(1), get(0), []byte{opI32GeS, wasmbin.OpBrIf, 1},
		get(1), wasmbin.Call(fParam), set(2),
		get(2), wasmbin.Call(fRows), get(2), wasmbin.Call(fCols), wasmbin.Call(fNew), set(3),
		get(3), f32(step), wasmbin.Call(fFill),
		f32(1), get(3), get(2), wasmbin.Call(fAxpy),
		get(3), wasmbin.Call(fFree),
		get(1), wasmbin.I32Const(1), []byte{opI32Add}, set(1),
		[]byte{wasmbin.OpBr, 0, wasmbin.OpEnd, wasmbin.OpEnd},
		wasmbin.I32Const(0), wasmbin.I32Const(int32(len(trainDoc))), wasmbin.Call(fOutput),
		wasmbin.I32Const(0),
	)
	evaluate := wasmbin.Code(
		wasmbin.I32Const(evalAt), wasmbin.I32Const(int32(len(evalDoc))), wasmbin.Call(fOutput),
		wasmbin.I32Const(0),
	)
	funcs := []wasmbin.Func{
		{Type: tVoid}, // _initialize
		{Type: tVoidToI32, Body: wasmbin.I32Const(1)}, // fleetlearn_abi_version
		{Type: tVoidToI32, Locals: []wasmbin.ValType{wasmbin.I32, wasmbin.I32, wasmbin.I32, wasmbin.I32}, Body: train},
		{Type: tVoidToI32, Body: evaluate},
	}
	return wasmbin.Module{
		Types: types, Imports: imports, Funcs: funcs, Memory: wasmbin.Pages(1),
		Exports: []wasmbin.Export{
			{Name: "_initialize", Kind: wasmbin.ExportFunc, Index: nImports},
			{Name: "fleetlearn_abi_version", Kind: wasmbin.ExportFunc, Index: nImports + 1},
			{Name: "train", Kind: wasmbin.ExportFunc, Index: nImports + 2},
			{Name: "evaluate", Kind: wasmbin.ExportFunc, Index: nImports + 3},
			{Name: "memory", Kind: wasmbin.ExportMemory, Index: 0},
		},
		Data: []wasmbin.Data{{Offset: 0, Bytes: trainDoc}, {Offset: evalAt, Bytes: evalDoc}},
	}.Encode()
}
