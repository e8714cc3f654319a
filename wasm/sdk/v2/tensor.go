//go:build wasip1

package sdk

import "runtime"

// Tensor is a handle to a row-major float32 matrix held by the host.
type Tensor struct{ h uint32 }

// None stands for "no tensor" where a kernel takes an optional operand.
var None = Tensor{}

// NewTensor allocates a zeroed rows×cols tensor, counted against the call's budget.
func NewTensor(rows, cols int) Tensor { return Tensor{hostTensorNew(int32(rows), int32(cols))} }

// ParamCount is the number of model parameters.
func ParamCount() int { return int(hostParamCount()) }

// Param returns parameter i in the request's order, viewed as a matrix: rank 0
// and 1 parameters are one row; higher ranks keep their first dimension as rows.
// Writes to it are the trained weights.
func Param(i int) Tensor { return Tensor{hostParam(int32(i))} }

// Free releases a tensor; parameters cannot be freed.
func (t Tensor) Free() { hostTensorFree(t.h) }

// Rows and Cols give the current shape.
func (t Tensor) Rows() int { return int(hostTensorRows(t.h)) }
func (t Tensor) Cols() int { return int(hostTensorCols(t.h)) }

// Resize reshapes within the capacity the tensor was created with; it lets a
// module reuse batch tensors for a short last batch.
func (t Tensor) Resize(rows, cols int) { hostTensorResize(t.h, int32(rows), int32(cols)) }

// Write copies exactly Rows·Cols values into the tensor.
func (t Tensor) Write(v []float32) {
	hostTensorWrite(t.h, ptr(v), uint32(len(v)))
	runtime.KeepAlive(v)
}

// Read copies the tensor's Rows·Cols values into v, which must be that long.
func (t Tensor) Read(v []float32) {
	hostTensorRead(t.h, ptr(v), uint32(len(v)))
	runtime.KeepAlive(v)
}

// Fill sets every value.
func (t Tensor) Fill(v float32) { hostTensorFill(t.h, v) }

// CopyFrom copies src, which must have the same shape.
func (t Tensor) CopyFrom(src Tensor) { hostTensorCopy(t.h, src.h) }

// Examples, Dim and Classes size the local dataset.
func Examples() int { return int(hostDataCount()) }
func Dim() int      { return int(hostDataDim()) }
func Classes() int  { return int(hostDataClasses()) }

// Gather loads the examples idx into x (len(idx)×Dim) and their labels into
// labels (len(idx) values, class indices as float32).
func Gather(x, labels Tensor, idx []int32) {
	hostDataGather(x.h, labels.h, ptr(idx), uint32(len(idx)))
	runtime.KeepAlive(idx)
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// Gemm computes c = alpha·op(a)·op(b) + beta·c.
func Gemm(transA, transB bool, alpha float32, a, b Tensor, beta float32, c Tensor) {
	hostGemm(b2u(transA), b2u(transB), alpha, a.h, b.h, beta, c.h)
}

// BiasAdd adds the row b to every row of x.
func BiasAdd(x, b Tensor) { hostBiasAdd(x.h, b.h) }

// ColSum writes x's column sums into out.
func ColSum(x, out Tensor) { hostColSum(x.h, out.h) }

// ReLU writes max(x,0) into y (which may be x).
func ReLU(x, y Tensor) { hostReLU(x.h, y.h) }

// ReLUGrad writes dy masked by x>0 into dx.
func ReLUGrad(dy, x, dx Tensor) { hostReLUGrad(dy.h, x.h, dx.h) }

// SoftmaxXent returns the mean cross-entropy of logits against labels and, unless
// grad is None, writes the gradient with respect to the logits into grad.
func SoftmaxXent(logits, labels, grad Tensor) float64 {
	return hostSoftmaxXent(logits.h, labels.h, grad.h)
}

// CountCorrect counts rows whose arg-max logit equals the label.
func CountCorrect(logits, labels Tensor) int { return int(hostCountCorrect(logits.h, labels.h)) }

// Axpy computes y += alpha·x.
func Axpy(alpha float32, x, y Tensor) { hostAxpy(alpha, x.h, y.h) }

// Scale computes x *= alpha.
func Scale(alpha float32, x Tensor) { hostScale(alpha, x.h) }

// Norm2 is the Euclidean norm of x.
func Norm2(x Tensor) float64 { return hostNorm2(x.h) }
