package kernel

// Max and average pooling over NCHW rows, without padding. The loops are
// serial and visit windows in (c, oh, ow) order and each window in
// row-major order, so overlapping windows (Stride < K) add their gradients
// in that fixed order.

import (
	"errors"
	"fmt"
)

// Pool2D is the geometry of 2-D max or average pooling without padding
// (PyTorch's MaxPool2d and AvgPool2d with padding 0 and ceil_mode false):
// C channels of H×W, a K×K window moved by Stride in both directions.
type Pool2D struct{ C, H, W, K, Stride int }

// OutH is the output height, (H−K)/Stride+1.
func (p Pool2D) OutH() int { return outSize(p.H, p.K, p.Stride, 0) }

// OutW is the output width, (W−K)/Stride+1.
func (p Pool2D) OutW() int { return outSize(p.W, p.K, p.Stride, 0) }

// Check refuses a geometry the pooling kernels cannot run: a size below 1,
// a window larger than the input, or more than MaxConvValues values in the
// input (C·H·W), the output (C·OutH·OutW) or the windows of one example
// (C·K·K·OutH·OutW, the work per example). Its error wraps ErrShape and
// names the field.
func (p Pool2D) Check() error {
	const op = "pool2d"
	if err := checkSizes(op, []field{
		{"C", p.C, 1}, {"H", p.H, 1}, {"W", p.W, 1}, {"K", p.K, 1}, {"Stride", p.Stride, 1},
	}, nil); err != nil {
		return err
	}
	if p.K > p.H || p.K > p.W {
		return fmt.Errorf("%w: %s: window K %d larger than the input %dx%d (H, W)", ErrShape, op, p.K, p.H, p.W)
	}
	oh, ow := p.OutH(), p.OutW()
	return checkSizes(op, nil, []product{
		{"input C·H·W", []int{p.C, p.H, p.W}},
		{"output C·OutH·OutW", []int{p.C, oh, ow}},
		{"windows C·K·K·OutH·OutW", []int{p.C, p.K, p.K, oh, ow}},
	})
}

// Work is the work of a pooling kernel or its gradient over n examples,
// n·C·OutH·OutW·K·K; it saturates at math.MaxInt64 and is 0 for n ≤ 0 or a
// geometry Check refuses.
func (p Pool2D) Work(n int) int64 {
	if n <= 0 || p.Check() != nil {
		return 0
	}
	return satMul(int64(n), int64(p.C*p.K*p.K*p.OutH()*p.OutW()))
}

// poolShapes checks the geometry, in (n × C·H·W), out (n × C·OutH·OutW)
// and that extra (if any) is a valid Mat; its shape is the caller's.
func poolShapes(op string, p Pool2D, in, out, extra Mat, inName, outName, extraName string) error {
	if err := errors.Join(in.check(inName), out.check(outName), extra.check(extraName)); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := p.Check(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	n, ic, oc := in.Rows, p.C*p.H*p.W, p.C*p.OutH()*p.OutW()
	if in.Cols != ic {
		return fmt.Errorf("%w: %s: %s is %v, want %d columns (C·H·W)", ErrShape, op, inName, in, ic)
	}
	if out.Rows != n || out.Cols != oc {
		return fmt.Errorf("%w: %s: %s is %v, want %dx%d (C·OutH·OutW, a row for each of %s's %d)", ErrShape, op, outName, out, n, oc, inName, n)
	}
	return nil
}

// MaxPool2D writes the maximum of each window of x (n × C·H·W) into y
// (n × C·OutH·OutW), overwriting it. A window's maximum is its first NaN
// if it holds one (as in PyTorch, a NaN wins), else its first largest value
// in row-major order. y must not share memory with x.
func MaxPool2D(p Pool2D, x, y Mat) error {
	const op = "max_pool2d"
	if err := poolShapes(op, p, x, y, Mat{}, "x", "y", ""); err != nil {
		return err
	}
	if err := disjoint(op, []operand{{"y", y}}, []operand{{"x", x}}); err != nil {
		return err
	}
	oh, ow, hw, ohw := p.OutH(), p.OutW(), p.H*p.W, p.OutH()*p.OutW()
	// Each (example, channel) plane is its own; they run in parallel.
	forExamples(x.Rows*p.C, func(ec int) {
		xc := x.Data[ec*hw:][:hw]
		yc := y.Data[ec*ohw:][:ohw]
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				yc[i*ow+j] = xc[maxAt(p, xc, i, j)]
			}
		}
	})
	return nil
}

// maxAt is the index into one channel xc of the maximum of window (i, j):
// the first NaN, else the first largest value in row-major order.
func maxAt(p Pool2D, xc []float32, i, j int) int {
	r0, c0 := i*p.Stride, j*p.Stride
	best := r0*p.W + c0
	m := xc[best]
	for kh := 0; kh < p.K; kh++ {
		row := (r0+kh)*p.W + c0
		for kw, v := range xc[row : row+p.K] {
			if v > m || (v != v && m == m) {
				m, best = v, row+kw
			}
		}
	}
	return best
}

// MaxPool2DGrad overwrites dx (n × C·H·W) with the gradient of MaxPool2D:
// zero, then each value of dy (n × C·OutH·OutW) added, in (c, oh, ow) order,
// at the position MaxPool2D took its window's maximum from in x. dx must not
// share memory with dy or x.
func MaxPool2DGrad(p Pool2D, dy, x, dx Mat) error {
	const op = "max_pool2d_grad"
	if err := poolShapes(op, p, dx, dy, x, "dx", "dy", "x"); err != nil {
		return err
	}
	if err := sameShape(op, x, dx); err != nil {
		return err
	}
	if err := disjoint(op, []operand{{"dx", dx}}, []operand{{"dy", dy}, {"x", x}}); err != nil {
		return err
	}
	oh, ow, hw, ohw := p.OutH(), p.OutW(), p.H*p.W, p.OutH()*p.OutW()
	clear(dx.Vals())
	// Each (example, channel) plane is its own; they run in parallel.
	forExamples(dx.Rows*p.C, func(ec int) {
		xc := x.Data[ec*hw:][:hw]
		dxc := dx.Data[ec*hw:][:hw]
		dyc := dy.Data[ec*ohw:][:ohw]
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				dxc[maxAt(p, xc, i, j)] += dyc[i*ow+j]
			}
		}
	})
	return nil
}

// AvgPool2D writes the mean of each window of x (n × C·H·W) into y
// (n × C·OutH·OutW), overwriting it: the window's values summed in float64
// in row-major order, divided by K·K and rounded once. y must not share
// memory with x.
func AvgPool2D(p Pool2D, x, y Mat) error {
	const op = "avg_pool2d"
	if err := poolShapes(op, p, x, y, Mat{}, "x", "y", ""); err != nil {
		return err
	}
	if err := disjoint(op, []operand{{"y", y}}, []operand{{"x", x}}); err != nil {
		return err
	}
	oh, ow, hw, ohw := p.OutH(), p.OutW(), p.H*p.W, p.OutH()*p.OutW()
	kk := float64(p.K * p.K)
	// Each (example, channel) plane is its own; they run in parallel.
	forExamples(x.Rows*p.C, func(ec int) {
		xc := x.Data[ec*hw:][:hw]
		yc := y.Data[ec*ohw:][:ohw]
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				var s float64
				for kh := 0; kh < p.K; kh++ {
					row := (i*p.Stride+kh)*p.W + j*p.Stride
					for _, v := range xc[row : row+p.K] {
						s += float64(v)
					}
				}
				yc[i*ow+j] = float32(s / kk)
			}
		}
	})
	return nil
}

// AvgPool2DGrad overwrites dx (n × C·H·W) with the gradient of AvgPool2D:
// zero, then for each value of dy (n × C·OutH·OutW) in (c, oh, ow) order,
// dy/(K·K) (rounded once to float32) added to every position of its window
// in row-major order. dx must not share memory with dy.
func AvgPool2DGrad(p Pool2D, dy, dx Mat) error {
	const op = "avg_pool2d_grad"
	if err := poolShapes(op, p, dx, dy, Mat{}, "dx", "dy", ""); err != nil {
		return err
	}
	if err := disjoint(op, []operand{{"dx", dx}}, []operand{{"dy", dy}}); err != nil {
		return err
	}
	oh, ow, hw, ohw := p.OutH(), p.OutW(), p.H*p.W, p.OutH()*p.OutW()
	kk := float64(p.K * p.K)
	clear(dx.Vals())
	// Each (example, channel) plane is its own; they run in parallel.
	forExamples(dx.Rows*p.C, func(ec int) {
		dxc := dx.Data[ec*hw:][:hw]
		dyc := dy.Data[ec*ohw:][:ohw]
		for i := 0; i < oh; i++ {
			for j := 0; j < ow; j++ {
				g := float32(float64(dyc[i*ow+j]) / kk)
				for kh := 0; kh < p.K; kh++ {
					row := (i*p.Stride+kh)*p.W + j*p.Stride
					seg := dxc[row : row+p.K]
					for kw := range seg {
						seg[kw] += g
					}
				}
			}
		}
	})
	return nil
}
