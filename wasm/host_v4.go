package wasm

import (
	"fmt"

	"github.com/tetratelabs/wazero/api"

	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// Work charged per value by ABI v4's normalisation and dropout kernels.
const (
	workGroupNorm     = 8
	workGroupNormGrad = 16
	workDropout       = 4
)

var i64 = api.ValueTypeI64

// distinct refuses an output handle that is also another operand of the
// same call: the kernels read their inputs while they write, and would
// compute something else in place. Handle 0 (no tensor) is skipped.
func (s *callState) distinct(op string, hs ...uint32) {
	for i, a := range hs {
		for _, b := range hs[i+1:] {
			if a != 0 && a == b {
				s.abort(fmt.Errorf("%w: %s: tensor %d is passed twice; give the output a tensor of its own", ErrKernel, op, a))
			}
		}
	}
}

// rowsOf checks that x holds examples of the geometry's values (cols) and
// returns how many; the work is charged on it before a kernel runs.
func (s *callState) rowsOf(op, name string, x kernel.Mat, cols int) int {
	if x.Cols != cols {
		s.abort(fmt.Errorf("%w: %s: %s is %v, want rows of %d values", ErrKernel, op, name, x, cols))
	}
	return x.Rows
}

func (s *callState) conv2D(op string, w kernel.Mat, st []uint64) kernel.Conv2D {
	g := kernel.Conv2D{InC: int(s32(st[0])), InH: int(s32(st[1])), InW: int(s32(st[2])), OutC: w.Rows,
		KH: int(s32(st[3])), KW: int(s32(st[4])), Stride: int(s32(st[5])), Pad: int(s32(st[6]))}
	if err := g.Check(); err != nil {
		s.kernelErr(fmt.Errorf("%s: %w", op, err))
	}
	return g
}

func (s *callState) pool2D(op string, st []uint64) kernel.Pool2D {
	p := kernel.Pool2D{C: int(s32(st[0])), H: int(s32(st[1])), W: int(s32(st[2])), K: int(s32(st[3])), Stride: int(s32(st[4]))}
	if err := p.Check(); err != nil {
		s.kernelErr(fmt.Errorf("%s: %w", op, err))
	}
	return p
}

// poolGroupWork is about how much pooling work runs between two deadline
// checks, as gemm's row blocks do: a window of k² reads per output value
// makes one call's work far larger than its tensors.
const poolGroupWork = 1 << 25

// pooled runs a pooling kernel over groups of examples (rows of each
// operand, all with the same number of rows), checking the deadline
// between groups; one example's work is bounded by Pool2D.Check.
func (s *callState) pooled(op string, p kernel.Pool2D, run func(ops []kernel.Mat) error, ops ...kernel.Mat) {
	n := ops[0].Rows
	step := int(max(1, poolGroupWork/max(1, p.Work(1))))
	whole := step >= n
	for _, m := range ops {
		// Operands that do not line up go to the kernel whole, which
		// refuses them naming the operand.
		whole = whole || m.Rows != n || m.Cols == 0 || len(m.Data) < n*m.Cols
	}
	if whole {
		if err := run(ops); err != nil {
			s.kernelErr(err)
		}
		return
	}
	sub := make([]kernel.Mat, len(ops))
	for lo := 0; lo < n; lo += step {
		if lo > 0 {
			if err := s.deadline(); err != nil {
				s.kernelErr(fmt.Errorf("%s: %w", op, err))
			}
		}
		hi := min(n, lo+step)
		for i, m := range ops {
			sub[i] = kernel.Mat{Rows: hi - lo, Cols: m.Cols, Data: m.Data[lo*m.Cols : hi*m.Cols]}
		}
		if err := run(sub); err != nil {
			s.kernelErr(err)
		}
	}
}

// hostFunctionsV4 is what ABI v4 adds to v3's functions: the kernels of
// convolutional networks. fleetlearn_v4 serves these and every earlier
// version's.
var hostFunctionsV4 = []hostFn{
	{"conv2d", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "conv2d"
		x, w, b, y := s.mat(op, u32(st[0])), s.mat(op, u32(st[1])), s.optMat(op, u32(st[2])), s.mat(op, u32(st[3]))
		s.distinct(op, u32(st[0]), u32(st[1]), u32(st[2]), u32(st[3]))
		g := s.conv2D(op, w, st[4:])
		n := s.rowsOf(op, "x", x, g.InC*g.InH*g.InW)
		s.charge(op, g.FLOPs(n))
		if err := kernel.Conv2DForward(g, x, w, b, y, s.deadline); err != nil {
			s.kernelErr(err)
		}
	}},
	{"conv2d_grad", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "conv2d_grad"
		dy, x, w := s.mat(op, u32(st[0])), s.mat(op, u32(st[1])), s.mat(op, u32(st[2]))
		dx, dw, db := s.optMat(op, u32(st[3])), s.optMat(op, u32(st[4])), s.optMat(op, u32(st[5]))
		s.distinct(op, u32(st[0]), u32(st[1]), u32(st[2]), u32(st[3]), u32(st[4]), u32(st[5]))
		g := s.conv2D(op, w, st[6:])
		n := s.rowsOf(op, "x", x, g.InC*g.InH*g.InW)
		s.charge(op, g.GradFLOPs(n, u32(st[3]) != 0, u32(st[4]) != 0 || u32(st[5]) != 0))
		if err := kernel.Conv2DGrad(g, dy, x, w, dx, dw, db, s.deadline); err != nil {
			s.kernelErr(err)
		}
	}},
	{"max_pool2d", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "max_pool2d"
		x, y := s.mat(op, u32(st[0])), s.mat(op, u32(st[1]))
		s.distinct(op, u32(st[0]), u32(st[1]))
		p := s.pool2D(op, st[2:])
		s.charge(op, p.Work(s.rowsOf(op, "x", x, p.C*p.H*p.W)))
		s.pooled(op, p, func(m []kernel.Mat) error { return kernel.MaxPool2D(p, m[0], m[1]) }, x, y)
	}},
	{"max_pool2d_grad", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "max_pool2d_grad"
		dy, x, dx := s.mat(op, u32(st[0])), s.mat(op, u32(st[1])), s.mat(op, u32(st[2]))
		s.distinct(op, u32(st[0]), u32(st[1]), u32(st[2]))
		p := s.pool2D(op, st[3:])
		n := s.rowsOf(op, "x", x, p.C*p.H*p.W)
		s.charge(op, p.Work(n)+int64(n)*int64(p.C*p.H*p.W))
		s.pooled(op, p, func(m []kernel.Mat) error { return kernel.MaxPool2DGrad(p, m[0], m[1], m[2]) }, dy, x, dx)
	}},
	{"avg_pool2d", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "avg_pool2d"
		x, y := s.mat(op, u32(st[0])), s.mat(op, u32(st[1]))
		s.distinct(op, u32(st[0]), u32(st[1]))
		p := s.pool2D(op, st[2:])
		s.charge(op, p.Work(s.rowsOf(op, "x", x, p.C*p.H*p.W)))
		s.pooled(op, p, func(m []kernel.Mat) error { return kernel.AvgPool2D(p, m[0], m[1]) }, x, y)
	}},
	{"avg_pool2d_grad", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "avg_pool2d_grad"
		dy, dx := s.mat(op, u32(st[0])), s.mat(op, u32(st[1]))
		s.distinct(op, u32(st[0]), u32(st[1]))
		p := s.pool2D(op, st[2:])
		n := s.rowsOf(op, "dx", dx, p.C*p.H*p.W)
		s.charge(op, p.Work(n)+int64(n)*int64(p.C*p.H*p.W))
		s.pooled(op, p, func(m []kernel.Mat) error { return kernel.AvgPool2DGrad(p, m[0], m[1]) }, dy, dx)
	}},
	{"group_norm", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, f32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "group_norm"
		x, gamma, beta, y := s.mat(op, u32(st[0])), s.mat(op, u32(st[1])), s.mat(op, u32(st[2])), s.mat(op, u32(st[3]))
		mean, rstd := s.mat(op, u32(st[4])), s.mat(op, u32(st[5]))
		// y may be x, as in layer_norm; the statistics are outputs of their own.
		s.distinct(op, u32(st[0]), u32(st[1]), u32(st[2]), u32(st[4]), u32(st[5]))
		s.distinct(op, u32(st[3]), u32(st[1]), u32(st[2]), u32(st[4]), u32(st[5]))
		s.charge(op, workGroupNorm*int64(x.Len()))
		if err := kernel.GroupNorm(x, gamma, beta, y, mean, rstd, int(s32(st[6])), int(s32(st[7])), fl(st[8])); err != nil {
			s.kernelErr(err)
		}
	}},
	{"group_norm_grad", 4, []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, i32, i32}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "group_norm_grad"
		dy, x, gamma := s.mat(op, u32(st[0])), s.mat(op, u32(st[1])), s.mat(op, u32(st[2]))
		mean, rstd, dx := s.mat(op, u32(st[3])), s.mat(op, u32(st[4])), s.mat(op, u32(st[5]))
		dgamma, dbeta := s.mat(op, u32(st[6])), s.mat(op, u32(st[7]))
		// dx may be dy; nothing else may share.
		s.distinct(op, u32(st[0]), u32(st[1]), u32(st[2]), u32(st[3]), u32(st[4]), u32(st[6]), u32(st[7]))
		s.distinct(op, u32(st[5]), u32(st[1]), u32(st[2]), u32(st[3]), u32(st[4]), u32(st[6]), u32(st[7]))
		s.charge(op, workGroupNormGrad*int64(x.Len()))
		if err := kernel.GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, int(s32(st[8])), int(s32(st[9]))); err != nil {
			s.kernelErr(err)
		}
	}},
	{"dropout", 4, []api.ValueType{i32, i32, f32, i64}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "dropout"
		x, y := s.mat(op, u32(st[0])), s.mat(op, u32(st[1]))
		s.charge(op, workDropout*int64(x.Len()))
		if err := kernel.Dropout(x, y, fl(st[2]), st[3]); err != nil {
			s.kernelErr(err)
		}
	}},
	{"dropout_grad", 4, []api.ValueType{i32, i32, f32, i64}, nil, func(s *callState, _ api.Module, st []uint64) {
		const op = "dropout_grad"
		dy, dx := s.mat(op, u32(st[0])), s.mat(op, u32(st[1]))
		s.charge(op, workDropout*int64(dy.Len()))
		if err := kernel.DropoutGrad(dy, dx, fl(st[2]), st[3]); err != nil {
			s.kernelErr(err)
		}
	}},
}
