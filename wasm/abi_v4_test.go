package wasm_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
)

// v4Sigs are the signatures wasm/host_v4.go gives ABI v4's host functions,
// and the v1 functions the v4 tests call that hostSigs lacks.
var v4Sigs = func() map[string]wasmbin.FuncType {
	i := func(n int) []wasmbin.ValType {
		v := make([]wasmbin.ValType, n)
		for k := range v {
			v[k] = wasmbin.I32
		}
		return v
	}
	return map[string]wasmbin.FuncType{
		"conv2d":          {Params: i(11)},
		"conv2d_grad":     {Params: i(13)},
		"max_pool2d":      {Params: i(7)},
		"max_pool2d_grad": {Params: i(8)},
		"avg_pool2d":      {Params: i(7)},
		"avg_pool2d_grad": {Params: i(7)},
		"group_norm":      {Params: append(i(8), wasmbin.F32)},
		"group_norm_grad": {Params: i(10)},
		"dropout":         {Params: []wasmbin.ValType{wasmbin.I32, wasmbin.I32, wasmbin.F32, wasmbin.I64}},
		"dropout_grad":    {Params: []wasmbin.ValType{wasmbin.I32, wasmbin.I32, wasmbin.F32, wasmbin.I64}},
		"tensor_free":     {Params: i(1)},
		"tensor_resize":   {Params: i(3)},
	}
}()

func v4Sig(fn string) wasmbin.FuncType {
	if s, ok := v4Sigs[fn]; ok {
		return s
	}
	if s, ok := hostSigs[fn]; ok {
		return s
	}
	panic("no signature for host function " + fn)
}

// i64Const is i64.const v. wasmbin has no i64 constant and opsModule takes
// only int32 and float32 arguments, so dropout's i64 seed needs this
// builder.
func i64Const(v int64) []byte {
	b := []byte{0x42}
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// v4Module is opsModule (without its loop) for ABI v4's signatures, which
// also takes int64 arguments: a module declaring version that imports from
// ns the functions ops call, runs ops in train and evaluate, and reports 24
// examples.
func v4Module(version int32, ns string, ops ...hostOp) []byte {
	const doc = `{"num_examples":24}`
	ops = append(ops, op("output_write", int32(16), int32(len(doc))))
	m := wasmbin.Module{Types: []wasmbin.FuncType{typeEntry}, Memory: wasmbin.Pages(1),
		Data: []wasmbin.Data{{Offset: 16, Bytes: []byte(doc)}}}
	index := map[string]uint32{}
	var body []byte
	for _, o := range ops {
		sig := v4Sig(o.fn)
		f, ok := index[o.fn]
		if !ok {
			m.Types = append(m.Types, sig)
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
			case int64:
				body = append(body, i64Const(a)...)
			default:
				panic(fmt.Sprintf("host call argument %v of type %T", a, a))
			}
		}
		body = append(body, wasmbin.Call(f)...)
		if len(sig.Results) > 0 {
			body = append(body, wasmbin.OpDrop)
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

// runV4 loads an ABI v4 module running ops into the shared sandbox and
// trains it on the tiny model, whose four parameters hold handles 1–4.
func runV4(t *testing.T, lim wasm.Limits, ops ...hostOp) (*wasm.Result, error) {
	t.Helper()
	m, err := loadHand(t, v4Module(4, "fleetlearn_v4", ops...))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer m.Close(context.Background())
	if m.ABIVersion() != 4 {
		t.Fatalf("ABIVersion() = %d, want 4", m.ABIVersion())
	}
	return safeTrain(t, context.Background(), m, wasm.Call{Model: tinyModel(t), Data: tinyData(), Limits: lim})
}

// i32s turns geometry ints into host call arguments.
func i32s(vs ...int32) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return out
}

// with returns g with g[i] = v.
func with(g []int32, i int, v int32) []int32 {
	g = append([]int32(nil), g...)
	g[i] = v
	return g
}

// Geometry argument indices.
const (
	gInC, gInH, gInW, gKH, gKW, gStride, gPad = 0, 1, 2, 3, 4, 5, 6
	pC, pH, pW, pK, pStride                   = 0, 1, 2, 3, 4
)

// convSetup allocates two 1×4×4 images x (5), three 3×3 filters w (6), a
// bias b (7), the 2×2 maps y (8), and the gradients dy (9), dx (10), dw
// (11) and db (12). convGeom is their geometry: in_c, in_h, in_w, kh, kw,
// stride, pad.
var (
	convSetup = []hostOp{newT(2, 16), newT(3, 9), newT(1, 3), newT(2, 12), newT(2, 12), newT(2, 16), newT(3, 9), newT(1, 3),
		fill(5, 0.5), fill(6, -0.25), fill(7, 0.125), fill(9, 1)}
	convGeom = []int32{1, 4, 4, 3, 3, 1, 0}
)

func conv(x, w, b, y int32, g []int32) hostOp {
	return op("conv2d", append(i32s(x, w, b, y), i32s(g...)...)...)
}

func convGrad(dy, x, w, dx, dw, db int32, g []int32) hostOp {
	return op("conv2d_grad", append(i32s(dy, x, w, dx, dw, db), i32s(g...)...)...)
}

// poolSetup allocates two 2×4×4 inputs x (5), their 2×2 pooled maps y
// (6), dy (7) and dx (8). poolGeom is c, h, w, k, stride.
var (
	poolSetup = []hostOp{newT(2, 32), newT(2, 8), newT(2, 8), newT(2, 32), fill(5, 0.5), fill(7, 1)}
	poolGeom  = []int32{2, 4, 4, 2, 2}
)

func pool(fn string, hs []int32, g []int32) hostOp {
	return op(fn, append(i32s(hs...), i32s(g...)...)...)
}

// normSetup allocates two examples of 4 channels of 2×2, x (5), gamma (6),
// beta (7), y (8), the statistics of 2 groups, mean (9) and rstd (10), and
// dy (11), dx (12), dgamma (13), dbeta (14).
var normSetup = []hostOp{newT(2, 16), newT(1, 4), newT(1, 4), newT(2, 16), newT(2, 2), newT(2, 2),
	newT(2, 16), newT(2, 16), newT(1, 4), newT(1, 4), fill(6, 1), fill(11, 0.5)}

func groupNorm(x, gamma, beta, y, mean, rstd, groups, channels int32, eps float32) hostOp {
	return op("group_norm", x, gamma, beta, y, mean, rstd, groups, channels, eps)
}

func groupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, groups, channels int32) hostOp {
	return op("group_norm_grad", dy, x, gamma, mean, rstd, dx, dgamma, dbeta, groups, channels)
}

// dropSetup allocates x (5) and y (6), 4×8 each.
var dropSetup = []hostOp{newT(4, 8), newT(4, 8), fill(5, 1)}

func setup(base []hostOp, ops ...hostOp) []hostOp {
	return append(append([]hostOp(nil), base...), ops...)
}

// Sizes derived from kernel.MaxConvValues (B), the bound on every size and
// product of a geometry, so the cases below stay at the edge it sets: a
// map of side sideB holds B values, and windows of side quartB at stride 1
// over a map of side 2·quartB−1 visit quartB⁴ ≤ B values.
var (
	sideB  = int32(math.Sqrt(float64(kernel.MaxConvValues)))
	quartB = int32(math.Sqrt(math.Sqrt(float64(kernel.MaxConvValues))))
	maxB   = int32(kernel.MaxConvValues)
)

// TestV4KernelAbuse: ABI v4's kernels called with geometry, shapes, handles
// or scalars a well-behaved module would never pass fail the call with
// ErrKernel, and the well-formed calls each case departs from succeed, so
// every refusal is the departure's.
func TestV4KernelAbuse(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	const huge = 1 << 30
	pg, cg := poolGeom, convGeom

	t.Run("well-formed", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			ops  []hostOp
		}{
			{"conv2d", setup(convSetup, conv(5, 6, 7, 8, cg))},
			{"conv2d without bias", setup(convSetup, conv(5, 6, 0, 8, cg))},
			// Stride 2, pad 1: (4+2−3)/2+1 = 2, the same 2×2 maps.
			{"conv2d stride 2 pad 1", setup(convSetup, conv(5, 6, 7, 8, []int32{1, 4, 4, 3, 3, 2, 1}))},
			// A resized tensor keeps the storage it was created with: the
			// kernels must use only its first rows·cols values.
			{"conv2d into a resized tensor", setup(convSetup, newT(4, 12), op("tensor_resize", int32(13), int32(2), int32(12)),
				conv(5, 6, 7, 13, cg))},
			{"conv2d_grad", setup(convSetup, convGrad(9, 5, 6, 10, 11, 12, cg))},
			{"conv2d_grad dx only", setup(convSetup, convGrad(9, 5, 6, 10, 0, 0, cg))},
			{"conv2d_grad db only", setup(convSetup, convGrad(9, 5, 6, 0, 0, 12, cg))},
			{"max_pool2d", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, pg))},
			{"max_pool2d_grad", setup(poolSetup, pool("max_pool2d_grad", []int32{7, 5, 8}, pg))},
			{"max_pool2d_grad into a resized tensor", setup(poolSetup, newT(8, 32), op("tensor_resize", int32(9), int32(2), int32(32)),
				pool("max_pool2d_grad", []int32{7, 5, 9}, pg))},
			{"avg_pool2d", setup(poolSetup, pool("avg_pool2d", []int32{5, 6}, pg))},
			{"avg_pool2d_grad", setup(poolSetup, pool("avg_pool2d_grad", []int32{7, 8}, pg))},
			{"group_norm", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, 4, 1e-5))},
			// y = x is allowed, as in layer_norm.
			{"group_norm in place", setup(normSetup, groupNorm(5, 6, 7, 5, 9, 10, 2, 4, 1e-5))},
			{"group_norm_grad", setup(normSetup, groupNormGrad(11, 5, 6, 9, 10, 12, 13, 14, 2, 4))},
			{"group_norm_grad in place", setup(normSetup, groupNormGrad(11, 5, 6, 9, 10, 11, 13, 14, 2, 4))},
			{"dropout", setup(dropSetup, op("dropout", int32(5), int32(6), float32(0.5), int64(-1)))},
			{"dropout in place", setup(dropSetup, op("dropout", int32(5), int32(5), float32(0.5), int64(math.MinInt64)))},
			{"dropout p 0", setup(dropSetup, op("dropout", int32(5), int32(6), float32(0), int64(7)))},
			{"dropout_grad", setup(dropSetup, op("dropout_grad", int32(5), int32(6), float32(0.25), int64(math.MaxInt64)))},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := runV4(t, wasm.Limits{}, tc.ops...); err != nil {
					t.Fatal(err)
				}
			})
		}
	})

	for _, tc := range []struct {
		name     string
		ops      []hostOp
		mentions []string
	}{
		// conv2d geometry.
		{"conv2d in_c 0", setup(convSetup, conv(5, 6, 7, 8, with(cg, gInC, 0))), []string{"conv2d", "InC 0"}},
		{"conv2d in_c -1", setup(convSetup, conv(5, 6, 7, 8, with(cg, gInC, -1))), []string{"conv2d", "InC -1"}},
		{"conv2d in_c 2^30", setup(convSetup, conv(5, 6, 7, 8, with(cg, gInC, huge))), []string{"conv2d", "InC 1073741824"}},
		{"conv2d in_c min int32", setup(convSetup, conv(5, 6, 7, 8, with(cg, gInC, math.MinInt32))), []string{"conv2d", "InC -2147483648"}},
		{"conv2d in_h 0", setup(convSetup, conv(5, 6, 7, 8, with(cg, gInH, 0))), []string{"conv2d", "InH 0"}},
		{"conv2d in_h -1", setup(convSetup, conv(5, 6, 7, 8, with(cg, gInH, -1))), []string{"conv2d", "InH -1"}},
		{"conv2d in_w max int32", setup(convSetup, conv(5, 6, 7, 8, with(cg, gInW, math.MaxInt32))), []string{"conv2d", "InW 2147483647"}},
		{"conv2d kh 0", setup(convSetup, conv(5, 6, 7, 8, with(cg, gKH, 0))), []string{"conv2d", "KH 0"}},
		{"conv2d kw -1", setup(convSetup, conv(5, 6, 7, 8, with(cg, gKW, -1))), []string{"conv2d", "KW -1"}},
		{"conv2d kh 2^30", setup(convSetup, conv(5, 6, 7, 8, with(cg, gKH, huge))), []string{"conv2d", "KH 1073741824"}},
		{"conv2d stride 0", setup(convSetup, conv(5, 6, 7, 8, with(cg, gStride, 0))), []string{"conv2d", "Stride 0"}},
		{"conv2d stride -1", setup(convSetup, conv(5, 6, 7, 8, with(cg, gStride, -1))), []string{"conv2d", "Stride -1"}},
		{"conv2d stride 2^30", setup(convSetup, conv(5, 6, 7, 8, with(cg, gStride, huge))), []string{"conv2d", "Stride 1073741824"}},
		{"conv2d pad -1", setup(convSetup, conv(5, 6, 7, 8, with(cg, gPad, -1))), []string{"conv2d", "Pad -1"}},
		{"conv2d pad = kernel", setup(convSetup, conv(5, 6, 7, 8, with(cg, gPad, 3))), []string{"conv2d", "Pad 3", "kernel 3x3"}},
		{"conv2d pad > kernel", setup(convSetup, conv(5, 6, 7, 8, with(cg, gPad, 1<<20))), []string{"conv2d", "Pad 1048576"}},
		{"conv2d pad 2^30", setup(convSetup, conv(5, 6, 7, 8, with(cg, gPad, huge))), []string{"conv2d", "Pad 1073741824"}},
		{"conv2d kernel larger than padded input", setup(convSetup, conv(5, 6, 7, 8, []int32{1, 4, 4, 7, 7, 1, 1})),
			[]string{"conv2d", "larger than the padded input"}},
		// Each size passes its own bound; their products do not. B·B·B
		// overflows int64, 2^16·2^16 int32.
		{"conv2d input overflows int64", setup(convSetup, conv(5, 6, 7, 8, []int32{maxB, maxB, maxB, 3, 3, 1, 0})),
			[]string{"conv2d", "input InC·InH·InW exceeds"}},
		{"conv2d input overflows int32", setup(convSetup, conv(5, 6, 7, 8, []int32{1, 1 << 16, 1 << 16, 3, 3, 1, 0})),
			[]string{"conv2d", "input InC·InH·InW exceeds"}},
		// Input, weight and output fit; one example unfolded would be
		// (sideB/2)²·(sideB/2+1)² values.
		{"conv2d im2col too large", setup(convSetup, conv(5, 6, 7, 8, []int32{1, sideB, sideB, sideB / 2, sideB / 2, 1, 0})),
			[]string{"conv2d", "im2col InC·KH·KW·OutH·OutW exceeds"}},
		{"conv2d output too large", []hostOp{newT(2, 16), newT(maxB, 0), newT(2, 12), conv(5, 6, 0, 7, []int32{1, 4, 4, 1, 1, 1, 0})},
			[]string{"conv2d", "output OutC·OutH·OutW exceeds"}},
		// OutC is w's row count: B rows of nothing cost nothing to
		// allocate, but the weight is then 9·B values.
		{"conv2d B empty filters", []hostOp{newT(2, 16), newT(maxB, 0), newT(2, 12), conv(5, 6, 0, 7, cg)},
			[]string{"conv2d", "weight OutC·InC·KH·KW exceeds"}},
		{"conv2d B+1 empty filters", []hostOp{newT(2, 16), newT(maxB+1, 0), newT(2, 12), conv(5, 6, 0, 7, cg)},
			[]string{"conv2d", fmt.Sprintf("OutC %d not in", maxB+1)}},
		{"conv2d filters of no values", []hostOp{newT(2, 16), newT(0, 9), newT(2, 12), conv(5, 6, 0, 7, cg)}, []string{"conv2d", "OutC 0"}},
		// conv2d operands.
		{"conv2d x columns", []hostOp{newT(2, 15), newT(3, 9), newT(2, 12), conv(5, 6, 0, 7, cg)}, []string{"conv2d", "x is 2x15", "16"}},
		{"conv2d x of 2^31-1 empty rows", []hostOp{newT(math.MaxInt32, 0), newT(3, 9), newT(2, 12), conv(5, 6, 0, 7, cg)},
			[]string{"conv2d", "2147483647x0"}},
		{"conv2d w columns", []hostOp{newT(2, 16), newT(3, 8), newT(2, 12), conv(5, 6, 0, 7, cg)}, []string{"conv2d", "w is 3x8"}},
		{"conv2d y too small", []hostOp{newT(2, 16), newT(3, 9), newT(2, 11), conv(5, 6, 0, 7, cg)}, []string{"conv2d", "y is 2x11"}},
		{"conv2d y too few rows", []hostOp{newT(2, 16), newT(3, 9), newT(1, 12), conv(5, 6, 0, 7, cg)}, []string{"conv2d", "y is 1x12"}},
		{"conv2d y too large", []hostOp{newT(2, 16), newT(3, 9), newT(3, 12), conv(5, 6, 0, 7, cg)}, []string{"conv2d", "y is 3x12"}},
		{"conv2d bias length", setup(convSetup, newT(1, 2), conv(5, 6, 13, 8, cg)), []string{"conv2d", "b is 1x2"}},
		{"conv2d bias 0x0", setup(convSetup, newT(0, 0), conv(5, 6, 13, 8, cg)), []string{"conv2d", "b is 0x0"}},
		{"conv2d x is y", setup(convSetup, conv(5, 6, 7, 5, cg)), []string{"conv2d", "tensor 5 is passed twice"}},
		{"conv2d w is y", setup(convSetup, conv(5, 6, 7, 6, cg)), []string{"conv2d", "tensor 6 is passed twice"}},
		{"conv2d b is y", setup(convSetup, conv(5, 6, 7, 7, cg)), []string{"conv2d", "tensor 7 is passed twice"}},
		{"conv2d x is w", setup(convSetup, conv(5, 5, 7, 8, cg)), []string{"conv2d", "tensor 5 is passed twice"}},
		{"conv2d y is a parameter of x's shape", setup(convSetup, conv(5, 6, 7, 1, cg)), []string{"conv2d", "y is 8x4"}},
		{"conv2d handle never live", setup(convSetup, conv(5, 6, 7, 99, cg)), []string{"conv2d", "handle 99 is not a live tensor"}},
		{"conv2d y handle 0", setup(convSetup, conv(5, 6, 7, 0, cg)), []string{"conv2d", "handle 0"}},
		{"conv2d x handle 0", setup(convSetup, conv(0, 6, 7, 8, cg)), []string{"conv2d", "handle 0"}},
		{"conv2d handle -1", setup(convSetup, conv(5, 6, 7, -1, cg)), []string{"conv2d", "handle 4294967295"}},
		{"conv2d freed y", setup(convSetup, op("tensor_free", int32(8)), conv(5, 6, 7, 8, cg)), []string{"conv2d", "handle 8 is not a live tensor"}},
		// conv2d_grad.
		{"conv2d_grad every output 0", setup(convSetup, convGrad(9, 5, 6, 0, 0, 0, cg)), []string{"conv2d_grad", "all absent"}},
		{"conv2d_grad dx is dy", []hostOp{newT(2, 12), newT(2, 16), newT(3, 9), convGrad(5, 6, 7, 5, 0, 0, cg)},
			[]string{"conv2d_grad", "tensor 5 is passed twice"}},
		{"conv2d_grad dx is x", setup(convSetup, convGrad(9, 5, 6, 5, 11, 12, cg)), []string{"conv2d_grad", "tensor 5 is passed twice"}},
		{"conv2d_grad dw is w", setup(convSetup, convGrad(9, 5, 6, 10, 6, 12, cg)), []string{"conv2d_grad", "tensor 6 is passed twice"}},
		{"conv2d_grad dw is db", setup(convSetup, convGrad(9, 5, 6, 10, 11, 11, cg)), []string{"conv2d_grad", "tensor 11 is passed twice"}},
		{"conv2d_grad dy columns", setup(convSetup, convGrad(10, 5, 6, 0, 11, 12, cg)), []string{"conv2d_grad", "dy is 2x16"}},
		{"conv2d_grad dy rows", setup(convSetup, newT(1, 12), convGrad(13, 5, 6, 10, 11, 12, cg)), []string{"conv2d_grad", "x is 2x16"}},
		{"conv2d_grad dx shape", setup(convSetup, newT(2, 15), convGrad(9, 5, 6, 13, 0, 0, cg)), []string{"conv2d_grad", "dx is 2x15"}},
		{"conv2d_grad dw shape", setup(convSetup, newT(9, 3), convGrad(9, 5, 6, 0, 13, 0, cg)), []string{"conv2d_grad", "dw is 9x3"}},
		{"conv2d_grad db length", setup(convSetup, newT(1, 4), convGrad(9, 5, 6, 0, 0, 13, cg)), []string{"conv2d_grad", "db is 1x4"}},
		{"conv2d_grad stride -1", setup(convSetup, convGrad(9, 5, 6, 10, 11, 12, with(cg, gStride, -1))), []string{"conv2d_grad", "Stride -1"}},
		{"conv2d_grad pad = kernel", setup(convSetup, convGrad(9, 5, 6, 10, 11, 12, with(cg, gPad, 3))), []string{"conv2d_grad", "Pad 3"}},
		{"conv2d_grad in_c 2^30", setup(convSetup, convGrad(9, 5, 6, 10, 11, 12, with(cg, gInC, huge))), []string{"conv2d_grad", "InC"}},
		{"conv2d_grad dead handle", setup(convSetup, convGrad(9, 5, 6, 10, 11, 77, cg)), []string{"conv2d_grad", "handle 77"}},
		// Pooling geometry.
		{"max_pool2d c 0", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pC, 0))), []string{"max_pool2d", "C 0"}},
		{"max_pool2d c -1", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pC, -1))), []string{"max_pool2d", "C -1"}},
		{"max_pool2d c 2^30", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pC, huge))), []string{"max_pool2d", "C 1073741824"}},
		{"max_pool2d h 0", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pH, 0))), []string{"max_pool2d", "H 0"}},
		{"max_pool2d w -1", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pW, -1))), []string{"max_pool2d", "W -1"}},
		{"max_pool2d k 0", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pK, 0))), []string{"max_pool2d", "K 0"}},
		{"max_pool2d k -1", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pK, -1))), []string{"max_pool2d", "K -1"}},
		{"max_pool2d k larger than input", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pK, 5))), []string{"max_pool2d", "window K 5"}},
		{"max_pool2d stride 0", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pStride, 0))), []string{"max_pool2d", "Stride 0"}},
		{"max_pool2d stride max int32", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, with(pg, pStride, math.MaxInt32))),
			[]string{"max_pool2d", "Stride 2147483647"}},
		{"max_pool2d input overflows int32", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, []int32{2, 1 << 16, 1 << 16, 2, 2})),
			[]string{"max_pool2d", "input C·H·W exceeds"}},
		{"max_pool2d input overflows int64", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, []int32{maxB, maxB, maxB, 2, 2})),
			[]string{"max_pool2d", "input C·H·W exceeds"}},
		// The input fits, but windows half its side at stride 1 visit
		// (sideB/2)²·(sideB/2+1)² values.
		{"max_pool2d windows too many", setup(poolSetup, pool("max_pool2d", []int32{5, 6}, []int32{1, sideB, sideB, sideB / 2, 1})),
			[]string{"max_pool2d", "windows C·K·K·OutH·OutW exceeds"}},
		{"max_pool2d x columns", setup(poolSetup, pool("max_pool2d", []int32{6, 5}, pg)), []string{"max_pool2d", "x is 2x8"}},
		{"max_pool2d y too small", setup(poolSetup, newT(2, 7), pool("max_pool2d", []int32{5, 9}, pg)), []string{"max_pool2d", "y is 2x7"}},
		{"max_pool2d y too few rows", setup(poolSetup, newT(1, 8), pool("max_pool2d", []int32{5, 9}, pg)), []string{"max_pool2d", "y is 1x8"}},
		{"max_pool2d x is y", []hostOp{newT(2, 32), pool("max_pool2d", []int32{5, 5}, []int32{2, 4, 4, 1, 1})},
			[]string{"max_pool2d", "tensor 5 is passed twice"}},
		{"max_pool2d dead handle", setup(poolSetup, pool("max_pool2d", []int32{5, 1000}, pg)), []string{"max_pool2d", "handle 1000"}},
		{"max_pool2d_grad dx is x", setup(poolSetup, pool("max_pool2d_grad", []int32{7, 5, 5}, pg)), []string{"max_pool2d_grad", "tensor 5 is passed twice"}},
		{"max_pool2d_grad dx is dy", []hostOp{newT(2, 32), newT(2, 32), pool("max_pool2d_grad", []int32{5, 6, 5}, []int32{2, 4, 4, 1, 1})},
			[]string{"max_pool2d_grad", "tensor 5 is passed twice"}},
		// dx sets the example count, so a dx of too few rows is reported
		// as a dy of too many.
		{"max_pool2d_grad dx rows", setup(poolSetup, newT(1, 32), pool("max_pool2d_grad", []int32{7, 5, 9}, pg)),
			[]string{"max_pool2d_grad", "dy is 2x8, want 1x8"}},
		{"max_pool2d_grad x rows", setup(poolSetup, newT(1, 32), pool("max_pool2d_grad", []int32{7, 9, 8}, pg)),
			[]string{"max_pool2d_grad", "1x32 vs 2x32"}},
		{"max_pool2d_grad dy shape", setup(poolSetup, pool("max_pool2d_grad", []int32{5, 8, 6}, pg)), []string{"max_pool2d_grad"}},
		{"max_pool2d_grad k 0", setup(poolSetup, pool("max_pool2d_grad", []int32{7, 5, 8}, with(pg, pK, 0))), []string{"max_pool2d_grad", "K 0"}},
		{"avg_pool2d stride -1", setup(poolSetup, pool("avg_pool2d", []int32{5, 6}, with(pg, pStride, -1))), []string{"avg_pool2d", "Stride -1"}},
		{"avg_pool2d h 2^30", setup(poolSetup, pool("avg_pool2d", []int32{5, 6}, with(pg, pH, huge))), []string{"avg_pool2d", "H 1073741824"}},
		{"avg_pool2d y too small", setup(poolSetup, newT(2, 4), pool("avg_pool2d", []int32{5, 9}, pg)), []string{"avg_pool2d", "y is 2x4"}},
		{"avg_pool2d x is y", []hostOp{newT(2, 32), pool("avg_pool2d", []int32{5, 5}, []int32{2, 4, 4, 1, 1})},
			[]string{"avg_pool2d", "tensor 5 is passed twice"}},
		{"avg_pool2d_grad dx is dy", []hostOp{newT(2, 32), pool("avg_pool2d_grad", []int32{5, 5}, []int32{2, 4, 4, 1, 1})},
			[]string{"avg_pool2d_grad", "tensor 5 is passed twice"}},
		{"avg_pool2d_grad dy shape", setup(poolSetup, pool("avg_pool2d_grad", []int32{5, 8}, pg)), []string{"avg_pool2d_grad", "dy is 2x32"}},
		{"avg_pool2d_grad dx columns", setup(poolSetup, pool("avg_pool2d_grad", []int32{7, 6}, pg)), []string{"avg_pool2d_grad", "dx is 2x8"}},
		{"avg_pool2d_grad k -1", setup(poolSetup, pool("avg_pool2d_grad", []int32{7, 8}, with(pg, pK, -1))), []string{"avg_pool2d_grad", "K -1"}},
		// group_norm.
		{"group_norm groups 0", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 0, 4, 1e-5)), []string{"group_norm", "0 groups"}},
		{"group_norm groups -1", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, -1, 4, 1e-5)), []string{"group_norm", "-1 groups"}},
		{"group_norm groups 2^30", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, huge, 4, 1e-5)), []string{"group_norm", "1073741824 groups"}},
		{"group_norm groups not dividing channels", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 3, 4, 1e-5)), []string{"group_norm", "3 groups of 4"}},
		{"group_norm channels 0", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 1, 0, 1e-5)), []string{"group_norm", "of 0 channels"}},
		{"group_norm channels -1", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, -1, -1, 1e-5)), []string{"group_norm", "of -1 channels"}},
		{"group_norm channels 2^30", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, huge, 1e-5)), []string{"group_norm", "1073741824 channels"}},
		{"group_norm channels not dividing x", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 1, 5, 1e-5)), []string{"group_norm", "5 channels of equal size"}},
		{"group_norm x of 2^31-1 empty rows", []hostOp{newT(math.MaxInt32, 0), newT(1, 4), newT(1, 4), newT(2, 2), newT(2, 2),
			groupNorm(5, 6, 7, 5, 8, 9, 2, 4, 1e-5)}, []string{"group_norm", "no values"}},
		{"group_norm eps NaN", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, 4, nan)), []string{"group_norm", "eps NaN"}},
		{"group_norm eps 0", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, 4, 0)), []string{"group_norm", "eps 0"}},
		{"group_norm eps -1e-5", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, 4, -1e-5)), []string{"group_norm", "eps -1e-05"}},
		{"group_norm eps +Inf", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, 4, inf)), []string{"group_norm", "eps +Inf"}},
		{"group_norm eps 2", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, 4, 2)), []string{"group_norm", "eps 2"}},
		{"group_norm mean is rstd", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 9, 2, 4, 1e-5)), []string{"group_norm", "tensor 9 is passed twice"}},
		{"group_norm mean is x", []hostOp{newT(2, 2), newT(1, 1), newT(1, 1), newT(2, 2), newT(2, 1),
			groupNorm(5, 6, 7, 8, 5, 9, 1, 1, 1e-5)}, []string{"group_norm", "tensor 5 is passed twice"}},
		{"group_norm y is gamma", setup(normSetup, groupNorm(5, 6, 7, 6, 9, 10, 2, 4, 1e-5)), []string{"group_norm", "tensor 6 is passed twice"}},
		{"group_norm y is rstd", setup(normSetup, groupNorm(5, 6, 7, 10, 9, 10, 2, 4, 1e-5)), []string{"group_norm", "tensor 10 is passed twice"}},
		{"group_norm gamma length", setup(normSetup, newT(1, 3), groupNorm(5, 15, 7, 8, 9, 10, 2, 4, 1e-5)), []string{"group_norm", "gamma"}},
		{"group_norm beta length", setup(normSetup, newT(1, 5), groupNorm(5, 6, 15, 8, 9, 10, 2, 4, 1e-5)), []string{"group_norm", "beta"}},
		{"group_norm mean length", setup(normSetup, newT(1, 3), groupNorm(5, 6, 7, 8, 15, 10, 2, 4, 1e-5)), []string{"group_norm", "mean"}},
		{"group_norm rstd length", setup(normSetup, newT(2, 1), groupNorm(5, 6, 7, 8, 9, 15, 2, 4, 1e-5)), []string{"group_norm", "rstd"}},
		{"group_norm y shape", setup(normSetup, groupNorm(5, 6, 7, 9, 13, 10, 2, 4, 1e-5)), []string{"group_norm", "2x16 vs 2x2"}},
		{"group_norm dead handle", setup(normSetup, groupNorm(5, 6, 7, 8, 9, 123, 2, 4, 1e-5)), []string{"group_norm", "handle 123"}},
		{"group_norm_grad groups 0", setup(normSetup, groupNormGrad(11, 5, 6, 9, 10, 12, 13, 14, 0, 4)), []string{"group_norm_grad", "0 groups"}},
		{"group_norm_grad channels -1", setup(normSetup, groupNormGrad(11, 5, 6, 9, 10, 12, 13, 14, 2, -1)), []string{"group_norm_grad", "-1 channels"}},
		{"group_norm_grad dx is x", setup(normSetup, groupNormGrad(11, 5, 6, 9, 10, 5, 13, 14, 2, 4)), []string{"group_norm_grad", "tensor 5 is passed twice"}},
		{"group_norm_grad dgamma is dbeta", setup(normSetup, groupNormGrad(11, 5, 6, 9, 10, 12, 13, 13, 2, 4)),
			[]string{"group_norm_grad", "tensor 13 is passed twice"}},
		{"group_norm_grad mean is rstd", setup(normSetup, groupNormGrad(11, 5, 6, 9, 9, 12, 13, 14, 2, 4)),
			[]string{"group_norm_grad", "tensor 9 is passed twice"}},
		{"group_norm_grad mean length", setup(normSetup, newT(1, 8), groupNormGrad(11, 5, 6, 15, 10, 12, 13, 14, 2, 4)), []string{"group_norm_grad", "mean"}},
		{"group_norm_grad dgamma length", setup(normSetup, newT(1, 8), groupNormGrad(11, 5, 6, 9, 10, 12, 15, 14, 2, 4)),
			[]string{"group_norm_grad", "dgamma"}},
		{"group_norm_grad dy shape", setup(normSetup, groupNormGrad(9, 5, 6, 13, 10, 12, 11, 14, 2, 4)), []string{"group_norm_grad"}},
		// dropout.
		{"dropout p NaN", setup(dropSetup, op("dropout", int32(5), int32(6), nan, int64(1))), []string{"dropout", "p NaN"}},
		{"dropout p 1", setup(dropSetup, op("dropout", int32(5), int32(6), float32(1), int64(1))), []string{"dropout", "p 1 not in [0, 1)"}},
		{"dropout p -0.5", setup(dropSetup, op("dropout", int32(5), int32(6), float32(-0.5), int64(1))), []string{"dropout", "p -0.5"}},
		{"dropout p +Inf", setup(dropSetup, op("dropout", int32(5), int32(6), inf, int64(1))), []string{"dropout", "p +Inf"}},
		{"dropout p 1.5", setup(dropSetup, op("dropout", int32(5), int32(6), float32(1.5), int64(1))), []string{"dropout", "p 1.5"}},
		{"dropout y shape", setup(dropSetup, newT(8, 4), op("dropout", int32(5), int32(7), float32(0.5), int64(1))), []string{"dropout", "4x8 vs 8x4"}},
		{"dropout dead handle", setup(dropSetup, op("dropout", int32(5), int32(66), float32(0.5), int64(1))), []string{"dropout", "handle 66"}},
		{"dropout handle 0", setup(dropSetup, op("dropout", int32(0), int32(6), float32(0.5), int64(1))), []string{"dropout", "handle 0"}},
		{"dropout_grad p NaN", setup(dropSetup, op("dropout_grad", int32(5), int32(6), nan, int64(1))), []string{"dropout_grad", "p NaN"}},
		{"dropout_grad p 1", setup(dropSetup, op("dropout_grad", int32(5), int32(6), float32(1), int64(-1))), []string{"dropout_grad", "p 1"}},
		{"dropout_grad p -1", setup(dropSetup, op("dropout_grad", int32(5), int32(6), float32(-1), int64(-1))), []string{"dropout_grad", "p -1"}},
		{"dropout_grad dx shape", setup(dropSetup, newT(4, 7), op("dropout_grad", int32(5), int32(7), float32(0.5), int64(1))),
			[]string{"dropout_grad", "4x8 vs 4x7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runV4(t, wasm.Limits{}, tc.ops...)
			wantSentinel(t, err, wasm.ErrKernel, tc.mentions...)
		})
	}

	// Work is charged before the kernel checks the operands, so a refused
	// call under a budget its charge passes fails with ErrBudget, not
	// ErrKernel: the first error the module meets is the one it gets.
	t.Run("conv2d_grad every output 0 over budget", func(t *testing.T) {
		base, err := runV4(t, wasm.Limits{}, convSetup...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = runV4(t, wasm.Limits{MaxWork: base.Work + 1}, setup(convSetup, convGrad(9, 5, 6, 0, 0, 0, cg))...)
		wantSentinel(t, err, wasm.ErrBudget, "conv2d_grad", fmt.Sprintf("exceeds limit %d", base.Work+1))
	})
	requireHealthy(t)
}

// v4Charge is one well-formed v4 call and the work docs and kernel say it
// costs.
type v4Charge struct {
	name  string
	setup []hostOp
	call  hostOp
	want  int64
}

func v4Charges() []v4Charge {
	cg := kernel.Conv2D{InC: 1, InH: 4, InW: 4, OutC: 3, KH: 3, KW: 3, Stride: 1, Pad: 0}
	pg := kernel.Pool2D{C: 2, H: 4, W: 4, K: 2, Stride: 2}
	return []v4Charge{
		{"conv2d", convSetup, conv(5, 6, 7, 8, convGeom), cg.FLOPs(2)},
		{"conv2d stride 2 pad 1", convSetup, conv(5, 6, 7, 8, []int32{1, 4, 4, 3, 3, 2, 1}),
			kernel.Conv2D{InC: 1, InH: 4, InW: 4, OutC: 3, KH: 3, KW: 3, Stride: 2, Pad: 1}.FLOPs(2)},
		{"conv2d_grad", convSetup, convGrad(9, 5, 6, 10, 11, 12, convGeom), cg.GradFLOPs(2, true, true)},
		{"conv2d_grad dx only", convSetup, convGrad(9, 5, 6, 10, 0, 0, convGeom), cg.GradFLOPs(2, true, false)},
		{"conv2d_grad db only", convSetup, convGrad(9, 5, 6, 0, 0, 12, convGeom), cg.GradFLOPs(2, false, true)},
		{"max_pool2d", poolSetup, pool("max_pool2d", []int32{5, 6}, poolGeom), pg.Work(2)},
		{"max_pool2d_grad", poolSetup, pool("max_pool2d_grad", []int32{7, 5, 8}, poolGeom), pg.Work(2) + 2*32},
		{"avg_pool2d", poolSetup, pool("avg_pool2d", []int32{5, 6}, poolGeom), pg.Work(2)},
		{"avg_pool2d_grad", poolSetup, pool("avg_pool2d_grad", []int32{7, 8}, poolGeom), pg.Work(2) + 2*32},
		{"group_norm", normSetup, groupNorm(5, 6, 7, 8, 9, 10, 2, 4, 1e-5), kernel.GroupNormWork(2, 16)},
		{"group_norm_grad", normSetup, groupNormGrad(11, 5, 6, 9, 10, 12, 13, 14, 2, 4), 2 * kernel.GroupNormWork(2, 16)},
		{"dropout", dropSetup, op("dropout", int32(5), int32(6), float32(0.5), int64(3)), 4 * 32},
		{"dropout_grad", dropSetup, op("dropout_grad", int32(5), int32(6), float32(0.5), int64(3)), 4 * 32},
	}
}

// TestV4Budget: ABI v4's kernels charge the work model/kernel gives them
// (Conv2D.FLOPs and GradFLOPs, Pool2D.Work, GroupNormWork, 4 per value of
// dropout) before they run, so a call one unit over its budget fails with
// ErrBudget having done nothing, and one at the budget succeeds.
func TestV4Budget(t *testing.T) {
	for _, tc := range v4Charges() {
		t.Run(tc.name, func(t *testing.T) {
			base, err := runV4(t, wasm.Limits{}, tc.setup...)
			if err != nil {
				t.Fatalf("setup alone: %v", err)
			}
			res, err := runV4(t, wasm.Limits{}, setup(tc.setup, tc.call)...)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Work - base.Work; got != tc.want || tc.want <= 0 {
				t.Fatalf("%s charged %d, want %d", tc.name, got, tc.want)
			}
			_, err = runV4(t, wasm.Limits{MaxWork: res.Work - 1}, setup(tc.setup, tc.call)...)
			wantSentinel(t, err, wasm.ErrBudget, tc.call.fn, fmt.Sprintf("work %d exceeds limit %d", res.Work, res.Work-1))
			if _, err := runV4(t, wasm.Limits{MaxWork: res.Work}, setup(tc.setup, tc.call)...); err != nil {
				t.Fatalf("at exactly its budget: %v", err)
			}
		})
	}

	// 32 examples of 256 channels of 32×32 through 256 filters of 5×5:
	// 1.1·10^11 flops, over a second even at 70 GFLOP/s, over 74 MiB of
	// tensors that cost 2·10^7 to allocate. The whole charge is made
	// before the kernel starts, so the error reports it and comes at once.
	t.Run("conv2d too big for its budget", func(t *testing.T) {
		g := kernel.Conv2D{InC: 256, InH: 32, InW: 32, OutC: 256, KH: 5, KW: 5, Stride: 1, Pad: 2}
		const n = 32
		alloc := []hostOp{newT(n, int32(g.InC*g.InH*g.InW)), newT(int32(g.OutC), int32(g.InC*g.KH*g.KW)),
			newT(n, int32(g.OutC*g.OutH()*g.OutW())), fill(6, 0.5)}
		const limit = 25_000_000
		base, err := runV4(t, wasm.Limits{MaxWork: limit}, alloc...)
		if err != nil {
			t.Fatalf("allocation alone: %v", err)
		}
		start := time.Now()
		_, err = runV4(t, wasm.Limits{MaxWork: limit}, setup(alloc,
			conv(5, 6, 0, 7, []int32{int32(g.InC), int32(g.InH), int32(g.InW), int32(g.KH), int32(g.KW), int32(g.Stride), int32(g.Pad)}))...)
		took := time.Since(start)
		wantSentinel(t, err, wasm.ErrBudget, "conv2d", fmt.Sprintf("work %d exceeds limit %d", base.Work+g.FLOPs(n), limit))
		if took > 500*time.Millisecond {
			t.Errorf("refusal took %v: the convolution ran before it was charged", took)
		}
	})

	// A call costs what the geometry visits, not what its tensors hold:
	// windows of side quartB at stride 1 over a map of side 2·quartB−1 are
	// quartB⁴ (B) comparisons from about 4·quartB² input values.
	t.Run("max_pool2d windows charged", func(t *testing.T) {
		p := kernel.Pool2D{C: 1, H: int(2*quartB - 1), W: int(2*quartB - 1), K: int(quartB), Stride: 1}
		const n = 4
		alloc := []hostOp{newT(n, int32(p.C*p.H*p.W)), newT(n, int32(p.C*p.OutH()*p.OutW()))}
		base, err := runV4(t, wasm.Limits{}, alloc...)
		if err != nil {
			t.Fatal(err)
		}
		limit := base.Work + p.Work(n) - 1
		_, err = runV4(t, wasm.Limits{MaxWork: limit}, setup(alloc,
			pool("max_pool2d", []int32{5, 6}, []int32{int32(p.C), int32(p.H), int32(p.W), int32(p.K), int32(p.Stride)}))...)
		wantSentinel(t, err, wasm.ErrBudget, "max_pool2d", fmt.Sprintf("work %d exceeds limit %d", limit+1, limit))
		if p.Work(n) < 100*base.Work {
			t.Errorf("pooling charged %d for tensors that cost %d: no amplification to test", p.Work(n), base.Work)
		}
	})
	requireHealthy(t)
}

// TestV4Deadline: a v4 kernel stops within a few hundred milliseconds of
// the call's deadline, however much work its geometry makes from few values
// (docs/ABI.md, Limits: a call stops within a few milliseconds of its
// deadline even inside a kernel). Pooling windows of side quartB at stride
// 1 visit about quartB²/4 times the values of their input (1024 times at
// B = 2^24), so a module whose tensors fit the default 1 GiB can ask one
// pooling call for over 2·10^11 comparisons, inside the default budget of
// 2·10^12: minutes of host time with no check. conv2d, which checks its
// deadline between blocks, is the control.
func TestV4Deadline(t *testing.T) {
	// Each call below does seconds of work on an idle 2-core machine, many
	// times the deadline: without checks inside the kernels it would end
	// only when the work does, far past the bound asserted here, which
	// leaves a loaded machine 25 times the deadline to notice it.
	const timeout = 50 * time.Millisecond
	side := 2*quartB - 1
	p := []int32{1, side, side, quartB, 1}
	// 2^32 comparisons: about four seconds.
	n := int32(1 << 32 / kernel.MaxConvValues)
	for _, tc := range []struct {
		name string
		ops  []hostOp
	}{
		// 100 examples of 128 channels of 16×16 through 512 filters of
		// 11×11, pad 5: 4.1·10^11 flops, about three seconds at the
		// packed GEMM's 140 GFLOP/s.
		{"conv2d", []hostOp{newT(100, 128*16*16), newT(512, 128*11*11), newT(100, 512*16*16), fill(5, 1), fill(6, 1),
			conv(5, 6, 0, 7, []int32{128, 16, 16, 11, 11, 1, 5})}},
		{"max_pool2d", []hostOp{newT(n, side*side), newT(n, quartB*quartB), pool("max_pool2d", []int32{5, 6}, p)}},
		{"avg_pool2d", []hostOp{newT(n, side*side), newT(n, quartB*quartB), pool("avg_pool2d", []int32{5, 6}, p)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := runV4(t, wasm.Limits{Timeout: timeout}, tc.ops...)
			took := time.Since(start)
			wantSentinel(t, err, wasm.ErrDeadline)
			if bound := 25 * timeout; took > bound {
				t.Errorf("%s stopped %v after the start of a call with a %v deadline, want under %v", tc.name, took, timeout, bound)
			}
		})
	}
}

// TestV4ScratchMemory: whatever the geometry, one conv2d or conv2d_grad
// call makes the host allocate no more than its tensors and its scratch:
// the unfolded inputs, here one example's kernel.MaxConvValues values, and
// a chunk's outputs (docs/ABI.md: at most 128 MiB in all). The scratch
// is not counted against Limits.MaxTensorBytes, so this bound is all that
// holds it: a geometry at the bound unfolds about 4·quartB² input values
// into B.
func TestV4ScratchMemory(t *testing.T) {
	side := 2*quartB - 1
	g := []int32{1, side, side, quartB, quartB, 1, 0}
	k := quartB * quartB
	for _, tc := range []struct {
		name string
		ops  []hostOp
	}{
		{"conv2d", []hostOp{newT(2, side*side), newT(1, k), newT(2, k), fill(5, 1), fill(6, 1), conv(5, 6, 0, 7, g)}},
		{"conv2d_grad", []hostOp{newT(2, k), newT(2, side*side), newT(1, k), newT(2, side*side), newT(1, k), newT(1, 1),
			fill(5, 1), fill(6, 1), convGrad(5, 6, 7, 8, 9, 10, g)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := runV4(t, wasm.Limits{}, tc.ops...)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			// Everything but the scratch is a few MiB: tensors, the
			// module, the call's bookkeeping.
			if grew, bound := after.TotalAlloc-before.TotalAlloc, uint64(4*kernel.MaxConvValues+16<<20); grew > bound {
				t.Errorf("one call allocated %d MiB, want at most %d MiB", grew>>20, bound>>20)
			}
		})
	}
}

// TestV4Namespaces: ABI v4's kernels are served under fleetlearn_v4 only,
// to modules declaring ABI 4, with the signatures host_v4.go gives them.
func TestV4Namespaces(t *testing.T) {
	v4Funcs := []string{"conv2d", "conv2d_grad", "max_pool2d", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad",
		"group_norm", "group_norm_grad", "dropout", "dropout_grad"}
	// args are zero arguments of fn's signature: enough to import it.
	args := func(fn string) []any {
		var out []any
		for _, p := range v4Sig(fn).Params {
			switch p {
			case wasmbin.I32:
				out = append(out, int32(0))
			case wasmbin.F32:
				out = append(out, float32(0))
			case wasmbin.I64:
				out = append(out, int64(0))
			}
		}
		return out
	}
	t.Run("v4 loads", func(t *testing.T) {
		ops := setup(convSetup, conv(5, 6, 7, 8, convGeom))
		res, err := runV4(t, wasm.Limits{}, ops...)
		if err != nil || res.NumExamples != 24 {
			t.Fatalf("train: %+v, %v", res, err)
		}
		// Every v4 function, and v1's, imported together from fleetlearn_v4.
		var all []hostOp
		for _, fn := range v4Funcs {
			all = append(all, op(fn, args(fn)...))
		}
		m, err := loadHand(t, v4Module(4, "fleetlearn_v4", all...))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(context.Background())
		if m.ABIVersion() != 4 {
			t.Errorf("ABIVersion() = %d, want 4", m.ABIVersion())
		}
	})
	for _, fn := range v4Funcs {
		for v := int32(1); v <= 3; v++ {
			ns := "fleetlearn_v" + strconv.Itoa(int(v))
			t.Run(fn+" from "+ns, func(t *testing.T) {
				_, err := loadHand(t, v4Module(v, ns, op(fn, args(fn)...)))
				wantSentinel(t, err, wasm.ErrForbiddenImport, ns+"."+fn, "new in v4", "fleetlearn_v4")
			})
		}
	}
	for _, tc := range []struct {
		name     string
		code     []byte
		want     error
		mentions []string
	}{
		{"v4 module importing fleetlearn_v3", v4Module(4, "fleetlearn_v3", newT(2, 2)),
			wasm.ErrForbiddenImport, []string{"declares ABI v4", "fleetlearn_v3.tensor_new", "fleetlearn_v4"}},
		{"v3 module importing fleetlearn_v4", v4Module(3, "fleetlearn_v4", newT(2, 2)),
			wasm.ErrForbiddenImport, []string{"declares ABI v3", "fleetlearn_v4.tensor_new", "fleetlearn_v3"}},
		{"v3 module importing conv2d from fleetlearn_v4", v4Module(3, "fleetlearn_v4", op("conv2d", args("conv2d")...)),
			wasm.ErrForbiddenImport, []string{"declares ABI v3", "fleetlearn_v4.conv2d", "fleetlearn_v3"}},
		{"version 5", v4Module(5, "fleetlearn_v4", newT(2, 2)), wasm.ErrABIVersion, []string{"v5", "v1 to v4"}},
		{"fleetlearn_v5", v4Module(4, "fleetlearn_v5", newT(2, 2)), wasm.ErrForbiddenImport, []string{"fleetlearn_v5.tensor_new"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadHand(t, tc.code)
			wantSentinel(t, err, tc.want, tc.mentions...)
		})
	}
	// A module must import each function with its ABI signature: a seed
	// taken as i32, or a conv2d without its pad, is refused at load.
	for _, tc := range []struct {
		fn   string
		sig  wasmbin.FuncType
		want string
	}{
		{"dropout", wasmbin.FuncType{Params: []wasmbin.ValType{vI32, vI32, vF32, vI32}}, "[i32 i32 f32 i64]"},
		{"conv2d", wasmbin.FuncType{Params: v4Sigs["conv2d"].Params[:10]}, "fleetlearn_v4.conv2d"},
		{"group_norm", wasmbin.FuncType{Params: v4Sigs["group_norm_grad"].Params}, "f32"},
	} {
		t.Run("mistyped "+tc.fn, func(t *testing.T) {
			m := handModule(4, returnZero, []wasmbin.Import{{Module: "fleetlearn_v4", Name: tc.fn, Type: 2}}, nil)
			m.Types = append(m.Types, tc.sig)
			_, err := loadHand(t, m.Encode())
			wantSentinel(t, err, wasm.ErrABI, tc.want)
		})
	}
	requireHealthy(t)
}

// fuzzFuncs are the v4 host functions FuzzV4KernelShapes calls, with the
// number of tensor operands and geometry ints each takes; group_norm also
// takes the fuzzed float (eps), the dropouts the float (p) and the seed.
var fuzzFuncs = []struct {
	name        string
	tensors, gs int
}{
	{"conv2d", 4, 7}, {"conv2d_grad", 6, 7}, {"max_pool2d", 2, 5}, {"max_pool2d_grad", 3, 5},
	{"avg_pool2d", 2, 5}, {"avg_pool2d_grad", 2, 5}, {"group_norm", 6, 2}, {"group_norm_grad", 8, 2},
	{"dropout", 2, 0}, {"dropout_grad", 2, 0},
}

// fuzzFills are the values the fuzz target's tensors may hold: NaN, ±Inf
// and extremes reach the kernels as a module could put them there.
var fuzzFills = [8]float32{0.5, -1.25, 3, float32(math.NaN()), float32(math.Inf(1)), 0, 1e30, float32(math.Inf(-1))}

// FuzzV4KernelShapes calls one ABI v4 host function with fuzzed geometry
// over up to eight fuzzed tensors (at most 64×64 each) and fuzzed handles.
// shapes holds (rows, cols) per tensor, handles picks each operand (0: no
// tensor, 1–4: a parameter, 5–12: the tensors, 13: a handle never live;
// operand i defaults to tensor 5+i), the seed's bits pick fill values.
// Whatever the input, the call succeeds or fails with ErrKernel, ErrBudget
// or ErrMemoryAccess; a host panic surfaces as ErrModuleFailed and fails.
func FuzzV4KernelShapes(f *testing.F) {
	// Every input is a new module: the interpreter prepares one far faster
	// than the compiler compiles it. The budget keeps an input to
	// milliseconds (and conv2d's scratch to 16 MiB) whatever its geometry.
	sb, err := wasm.New(wasm.WithEngine(wasm.EngineInterpreter),
		wasm.WithLimits(wasm.Limits{Timeout: 10 * time.Second, MaxWork: 1 << 22}))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { sb.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, fn uint8, shapes, handles []byte, g0, g1, g2, g3, g4, g5, g6 int32, scalar float32, seed int64) {
		spec := fuzzFuncs[int(fn)%len(fuzzFuncs)]
		var ops []hostOp
		for i := range 8 {
			r, c := int32(1), int32(1)
			if 2*i+1 < len(shapes) {
				r, c = int32(shapes[2*i]%65), int32(shapes[2*i+1]%65)
			}
			ops = append(ops, newT(r, c), fill(int32(5+i), fuzzFills[uint64(seed)>>(3*i)&7]))
		}
		var args []any
		for i := range spec.tensors {
			h := int32(5 + i)
			if i < len(handles) {
				if h = int32(handles[i] % 14); h == 13 {
					h = 1 << 20
				}
			}
			args = append(args, h)
		}
		args = append(args, i32s([]int32{g0, g1, g2, g3, g4, g5, g6}[:spec.gs]...)...)
		switch spec.name {
		case "group_norm":
			args = append(args, scalar)
		case "dropout", "dropout_grad":
			args = append(args, scalar, seed)
		}
		ops = append(ops, op(spec.name, args...))

		code := v4Module(4, "fleetlearn_v4", ops...)
		m, err := sb.Load(context.Background(), code, wasm.Hash(code))
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		defer m.Close(context.Background())
		// Evaluate: a kernel may write NaN into a parameter, which train
		// would refuse as a result, not as the kernel call.
		var res *wasm.Result
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("%s panicked: %v", spec.name, p)
				}
			}()
			res, err = m.Evaluate(context.Background(), wasm.Call{Model: tinyModel(t), Data: tinyData()})
		}()
		switch {
		case err == nil:
			if res.NumExamples != 24 {
				t.Fatalf("%s: result %+v", spec.name, res)
			}
		case errors.Is(err, wasm.ErrKernel), errors.Is(err, wasm.ErrBudget), errors.Is(err, wasm.ErrMemoryAccess):
			if strings.Contains(err.Error(), "panic") {
				t.Fatalf("%s: %v", spec.name, err)
			}
		default:
			t.Fatalf("%s%v: %v", spec.name, args, err)
		}
	})
}
