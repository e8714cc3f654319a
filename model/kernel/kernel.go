// Package kernel holds the float32 tensor kernels that Fleetlearn runs natively: the
// native reference trainer calls them directly and the WASM sandbox exposes them to
// update modules as host functions, so both paths execute the same arithmetic in the
// same order and agree bit for bit.
//
// Every kernel checks its operands' shapes and returns an error wrapping ErrShape
// rather than panicking: the WASM host passes operands chosen by untrusted modules.
package kernel

import (
	"errors"
	"fmt"
	"math"
)

// ErrShape reports operands whose shapes do not fit the kernel.
var ErrShape = errors.New("kernel: shape mismatch")

// Mat is a row-major float32 matrix view. Data may be longer than Rows*Cols only
// through Resize-style reuse by callers; kernels use the first Rows*Cols values.
type Mat struct {
	Rows, Cols int
	Data       []float32
}

// NewMat allocates a zeroed rows×cols matrix.
func NewMat(rows, cols int) Mat {
	return Mat{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
}

// Len is Rows*Cols.
func (m Mat) Len() int { return m.Rows * m.Cols }

// Vals returns the matrix's values, exactly Rows*Cols long.
func (m Mat) Vals() []float32 { return m.Data[:m.Rows*m.Cols] }

func (m Mat) check(name string) error {
	// Rows > len/Cols rather than len < Rows·Cols: the product of two
	// caller-chosen sizes can overflow, and the SIMD kernels read through
	// pointers past any bounds check.
	if m.Rows < 0 || m.Cols < 0 || (m.Cols > 0 && m.Rows > len(m.Data)/m.Cols) {
		return fmt.Errorf("%w: %s is %dx%d over %d values", ErrShape, name, m.Rows, m.Cols, len(m.Data))
	}
	return nil
}

func (m Mat) String() string { return fmt.Sprintf("%dx%d", m.Rows, m.Cols) }

func sameShape(op string, a, b Mat) error {
	if a.Rows != b.Rows || a.Cols != b.Cols {
		return fmt.Errorf("%w: %s: %v vs %v", ErrShape, op, a, b)
	}
	return nil
}

// BiasAdd adds the 1×Cols row b to every row of x.
func BiasAdd(x, b Mat) error {
	if err := errors.Join(x.check("x"), b.check("b")); err != nil {
		return fmt.Errorf("bias_add: %w", err)
	}
	if b.Len() != x.Cols {
		return fmt.Errorf("%w: bias_add: x %v, bias has %d values", ErrShape, x, b.Len())
	}
	if x.Cols == 0 {
		return nil // no values: do not walk the rows of an empty x (see Empty rows above ErrArgument)
	}
	bv := b.Vals()
	for r := 0; r < x.Rows; r++ {
		addVec(bv, x.Data[r*x.Cols:(r+1)*x.Cols])
	}
	return nil
}

// ColSum writes the column sums of x into out (1×Cols); it is the bias gradient.
func ColSum(x, out Mat) error {
	if err := errors.Join(x.check("x"), out.check("out")); err != nil {
		return fmt.Errorf("col_sum: %w", err)
	}
	if out.Len() != x.Cols {
		return fmt.Errorf("%w: col_sum: x %v, out has %d values", ErrShape, x, out.Len())
	}
	ov := out.Vals()
	clear(ov)
	if x.Cols == 0 {
		return nil // see Empty rows above ErrArgument
	}
	for r := 0; r < x.Rows; r++ {
		addVec(x.Data[r*x.Cols:(r+1)*x.Cols], ov)
	}
	return nil
}

// ReLU writes max(x, 0) into y; x and y may be the same matrix.
func ReLU(x, y Mat) error {
	if err := errors.Join(x.check("x"), y.check("y")); err != nil {
		return fmt.Errorf("relu: %w", err)
	}
	if err := sameShape("relu", x, y); err != nil {
		return err
	}
	reluVec(x.Vals(), y.Vals())
	return nil
}

// ReLUGrad writes dy masked by x > 0 into dx; dx may alias dy.
func ReLUGrad(dy, x, dx Mat) error {
	if err := errors.Join(dy.check("dy"), x.check("x"), dx.check("dx")); err != nil {
		return fmt.Errorf("relu_grad: %w", err)
	}
	if err := errors.Join(sameShape("relu_grad", dy, x), sameShape("relu_grad", dy, dx)); err != nil {
		return err
	}
	reluGradVec(dy.Vals(), x.Vals(), dx.Vals())
	return nil
}

// SoftmaxXent returns the mean softmax cross-entropy of logits (n×c) against
// labels (n×1, class indices stored as float32) and, when grad is non-empty,
// writes its gradient with respect to the logits, (softmax − onehot)/n.
func SoftmaxXent(logits, labels, grad Mat) (float64, error) {
	if err := errors.Join(logits.check("logits"), labels.check("labels"), grad.check("grad")); err != nil {
		return 0, fmt.Errorf("softmax_xent: %w", err)
	}
	n, c := logits.Rows, logits.Cols
	if labels.Len() != n {
		return 0, fmt.Errorf("%w: softmax_xent: logits %v, %d labels", ErrShape, logits, labels.Len())
	}
	withGrad := grad.Len() != 0
	if withGrad {
		if err := sameShape("softmax_xent", logits, grad); err != nil {
			return 0, err
		}
	}
	if n == 0 {
		return 0, nil
	}
	lv := labels.Vals()
	inv := 1 / float32(n)
	var total float64
	for r := 0; r < n; r++ {
		y, err := classOf(lv[r], c)
		if err != nil {
			return 0, fmt.Errorf("softmax_xent: row %d: %w", r, err)
		}
		row := logits.Data[r*c : (r+1)*c]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		var sum float64
		for _, v := range row {
			sum += math.Exp(float64(v - mx))
		}
		lse := float64(mx) + math.Log(sum)
		total += lse - float64(row[y])
		if withGrad {
			g := grad.Data[r*c : (r+1)*c]
			for j, v := range row {
				p := float32(math.Exp(float64(v) - lse))
				if j == y {
					p--
				}
				g[j] = p * inv
			}
		}
	}
	return total / float64(n), nil
}

// ErrLabel reports a label that is not a class index of the logits.
var ErrLabel = errors.New("kernel: label out of range")

func classOf(v float32, classes int) (int, error) {
	y := int(v)
	if float32(y) != v || y < 0 || y >= classes {
		return 0, fmt.Errorf("%w: %v not in [0,%d)", ErrLabel, v, classes)
	}
	return y, nil
}

// CountCorrect counts rows whose arg-max logit is the label (ties go to the lowest index).
func CountCorrect(logits, labels Mat) (int, error) {
	if err := errors.Join(logits.check("logits"), labels.check("labels")); err != nil {
		return 0, fmt.Errorf("count_correct: %w", err)
	}
	n, c := logits.Rows, logits.Cols
	if labels.Len() != n {
		return 0, fmt.Errorf("%w: count_correct: logits %v, %d labels", ErrShape, logits, labels.Len())
	}
	correct := 0
	for r := 0; r < n; r++ {
		y, err := classOf(labels.Data[r], c)
		if err != nil {
			return 0, fmt.Errorf("count_correct: row %d: %w", r, err)
		}
		row := logits.Data[r*c : (r+1)*c]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		if best == y {
			correct++
		}
	}
	return correct, nil
}

// Axpy computes y += alpha·x over matrices of the same shape, rounding the
// product before the sum (no fused multiply-add) on every CPU.
func Axpy(alpha float32, x, y Mat) error {
	if err := errors.Join(x.check("x"), y.check("y")); err != nil {
		return fmt.Errorf("axpy: %w", err)
	}
	if err := sameShape("axpy", x, y); err != nil {
		return err
	}
	axpyVec(alpha, x.Vals(), y.Vals())
	return nil
}

// Scale computes x *= alpha; a zero alpha clears x, NaNs included, as BLAS does for beta.
func Scale(alpha float32, x Mat) {
	xv := x.Data[:min(len(x.Data), max(x.Len(), 0))]
	if alpha == 0 {
		clear(xv)
		return
	}
	scaleVec(alpha, xv)
}

// Norm2 is the Euclidean norm of x's values, accumulated in float64.
func Norm2(x Mat) float64 {
	var s float64
	for _, v := range x.Data[:min(len(x.Data), max(x.Len(), 0))] {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}
