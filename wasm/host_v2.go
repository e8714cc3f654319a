package wasm

import (
	"fmt"
	"math"

	"github.com/tetratelabs/wazero/api"

	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// Work charged per value by ABI v2's element-wise kernels, as package kernel
// counts it (docs/ABI.md lists which operand's values are counted).
const (
	workEmbedding     = 1
	workEmbeddingGrad = 1
	workLayerNorm     = 8
	workLayerNormGrad = 16
	workGELU          = 12
	workGELUGrad      = 16
	workSoftmax       = 5
	workSoftmaxGrad   = 4
	workHeads         = 1
	workAdamW         = 12
)

// batchGroupWork is about how much batched gemm work runs between two
// deadline checks, as gemm's row blocks do.
const batchGroupWork = 1 << 25

// batchBlockWork is what batched_gemm charges per block on top of its flops:
// about the cost of the Gemm call on one block's views.
const batchBlockWork = 64

// hostFunctionsV2 is what ABI v2 adds to v1's functions: the kernels of
// transformer-style models. fleetlearn_v2 serves these and all of v1's.
var hostFunctionsV2 = []hostFn{
	{"embedding", 2, []api.ValueType{i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		table, ids, out := s.mat("embedding", u32(st[0])), s.mat("embedding", u32(st[1])), s.mat("embedding", u32(st[2]))
		// Every id is read even when the rows are empty.
		s.charge("embedding", workEmbedding*int64(out.Len())+int64(ids.Len()))
		if err := kernel.Embedding(table, ids, out); err != nil {
			s.kernelErr(err)
		}
	}},
	{"embedding_grad", 2, []api.ValueType{i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		dout, ids, dtable := s.mat("embedding_grad", u32(st[0])), s.mat("embedding_grad", u32(st[1])), s.mat("embedding_grad", u32(st[2]))
		s.charge("embedding_grad", workEmbeddingGrad*int64(dout.Len())+int64(ids.Len()))
		if err := kernel.EmbeddingGrad(dout, ids, dtable); err != nil {
			s.kernelErr(err)
		}
	}},
	{"layer_norm", 2, []api.ValueType{i32, i32, i32, i32, i32, i32, f32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "layer_norm"
		x := s.mat(op, u32(st[0]))
		gamma, beta, y := s.mat(op, u32(st[1])), s.mat(op, u32(st[2])), s.mat(op, u32(st[3]))
		mean, rstd := s.mat(op, u32(st[4])), s.mat(op, u32(st[5]))
		s.charge(op, workLayerNorm*int64(x.Len()))
		if err := kernel.LayerNorm(x, gamma, beta, y, mean, rstd, fl(st[6])); err != nil {
			s.kernelErr(err)
		}
	}},
	{"layer_norm_grad", 2, []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "layer_norm_grad"
		dy, x, gamma := s.mat(op, u32(st[0])), s.mat(op, u32(st[1])), s.mat(op, u32(st[2]))
		mean, rstd := s.mat(op, u32(st[3])), s.mat(op, u32(st[4]))
		dx, dgamma, dbeta := s.mat(op, u32(st[5])), s.mat(op, u32(st[6])), s.mat(op, u32(st[7]))
		s.charge(op, workLayerNormGrad*int64(dy.Len()))
		if err := kernel.LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta); err != nil {
			s.kernelErr(err)
		}
	}},
	{"gelu", 2, []api.ValueType{i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("gelu", u32(st[0]))
		s.charge("gelu", workGELU*int64(x.Len()))
		if err := kernel.GELU(x, s.mat("gelu", u32(st[1]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"gelu_grad", 2, []api.ValueType{i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		dy := s.mat("gelu_grad", u32(st[0]))
		s.charge("gelu_grad", workGELUGrad*int64(dy.Len()))
		if err := kernel.GELUGrad(dy, s.mat("gelu_grad", u32(st[1])), s.mat("gelu_grad", u32(st[2]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"softmax", 2, []api.ValueType{i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x := s.mat("softmax", u32(st[0]))
		y := s.mat("softmax", u32(st[1]))
		s.charge("softmax", workSoftmax*int64(x.Len()))
		if err := kernel.Softmax(x, y, int(s32(st[2]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"softmax_grad", 2, []api.ValueType{i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		dy := s.mat("softmax_grad", u32(st[0]))
		s.charge("softmax_grad", workSoftmaxGrad*int64(dy.Len()))
		if err := kernel.SoftmaxGrad(dy, s.mat("softmax_grad", u32(st[1])), s.mat("softmax_grad", u32(st[2]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"split_heads", 2, []api.ValueType{i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		x, y := s.mat("split_heads", u32(st[0])), s.mat("split_heads", u32(st[1]))
		s.charge("split_heads", workHeads*int64(x.Len()))
		if err := kernel.SplitHeads(x, y, int(s32(st[2])), int(s32(st[3]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"merge_heads", 2, []api.ValueType{i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		y, x := s.mat("merge_heads", u32(st[0])), s.mat("merge_heads", u32(st[1]))
		s.charge("merge_heads", workHeads*int64(x.Len()))
		if err := kernel.MergeHeads(y, x, int(s32(st[2])), int(s32(st[3]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"adamw", 2, []api.ValueType{i32, i32, i32, i32, f32, f32, f32, f32, f32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "adamw"
		p, g, m, v := s.mat(op, u32(st[0])), s.mat(op, u32(st[1])), s.mat(op, u32(st[2])), s.mat(op, u32(st[3]))
		s.charge(op, workAdamW*int64(p.Len()))
		h := kernel.AdamW{LR: fl(st[4]), Beta1: fl(st[5]), Beta2: fl(st[6]), Eps: fl(st[7]), WeightDecay: fl(st[8]), Step: int(s32(st[9]))}
		if err := kernel.AdamWStep(p, g, m, v, h); err != nil {
			s.kernelErr(err)
		}
	}},
	{"batched_gemm", 2, []api.ValueType{i32, i32, f32, i32, i32, f32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		s.batchedGemm(u32(st[0]) != 0, u32(st[1]) != 0, fl(st[2]), u32(st[3]), u32(st[4]), fl(st[5]), u32(st[6]), s32(st[7]))
	}},
}

// batchedGemm serves batched_gemm: batch independent products, slice i of
// each operand being its i-th block of Rows/batch rows. It charges the whole
// batch before any arithmetic. The kernel has no deadline hook, so small
// slices run in groups of about batchGroupWork flops with a check between
// groups, and a slice larger than that runs alone through GemmCheck, which
// checks between row blocks. kernel.BatchedGemm computes each slice as one
// Gemm on a view of it, so neither changes a bit of the result.
func (s *callState) batchedGemm(transA, transB bool, alpha float32, ha, hb uint32, beta float32, hc uint32, batch int32) {
	const op = "batched_gemm"
	a, b, c := s.mat(op, ha), s.mat(op, hb), s.mat(op, hc)
	s.apart(op, ha, hb, hc)
	if batch <= 0 {
		s.abort(fmt.Errorf("%w: batched_gemm: batch %d must be positive", ErrKernel, batch))
	}
	n := int(batch)
	for _, o := range []struct {
		name string
		m    kernel.Mat
	}{{"A", a}, {"B", b}, {"C", c}} {
		if o.m.Rows%n != 0 {
			s.abort(fmt.Errorf("%w: batched_gemm: %s is %v, not %d slices of equal rows", ErrKernel, o.name, o.m, n))
		}
	}
	k := a.Cols
	if transA {
		k = a.Rows / n
	}
	m, cols := c.Rows/n, c.Cols
	// A product this large cannot come from real tensors under the tensor
	// budget, but the budget is the task's to set: do not let the count wrap.
	if k > 0 && int64(m)*int64(cols) > math.MaxInt64/4/int64(k)/int64(n) {
		s.abort(fmt.Errorf("%w: batched_gemm: %d products of %dx%dx%d overflow the work count", ErrBudget, n, m, cols, k))
	}
	// A block costs its flops, or its values when k is 0 (gemm then scales
	// C), plus a fixed cost for the call: empty blocks are not free, so a
	// module cannot run 2^31 of them uncharged between deadline checks.
	slice := max(kernel.GemmFLOPs(m, cols, k), int64(m)*int64(cols)) + batchBlockWork
	s.charge(op, int64(n)*slice)
	if slice > batchGroupWork {
		for i := 0; i < n; i++ {
			err := kernel.GemmCheck(transA, transB, alpha, batchSlices(a, n, i, 1), batchSlices(b, n, i, 1),
				beta, batchSlices(c, n, i, 1), s.deadline)
			if err != nil {
				s.kernelErr(fmt.Errorf("batched_gemm: block %d of %d: %w", i, n, err))
			}
		}
		return
	}
	group := n
	if slice > 0 {
		group = int(min(int64(n), batchGroupWork/slice))
	}
	for b0 := 0; b0 < n; b0 += group {
		if b0 > 0 {
			if err := s.deadline(); err != nil {
				s.abort(fmt.Errorf("batched_gemm: %w", err))
			}
		}
		g := min(group, n-b0)
		err := kernel.BatchedGemm(transA, transB, alpha, batchSlices(a, n, b0, g), batchSlices(b, n, b0, g),
			beta, batchSlices(c, n, b0, g), g)
		if err != nil {
			s.kernelErr(err)
		}
	}
}

// batchSlices is slices [b0, b0+g) of x cut into n slices of equal rows.
func batchSlices(x kernel.Mat, n, b0, g int) kernel.Mat {
	if g == n {
		return x
	}
	rows := x.Rows / n
	lo, hi := b0*rows*x.Cols, (b0+g)*rows*x.Cols
	return kernel.Mat{Rows: g * rows, Cols: x.Cols, Data: x.Data[lo:hi:hi]}
}
