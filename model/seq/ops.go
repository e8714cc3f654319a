package seq

// Ops is the tensor machine a Net runs on. T is a tensor handle; the zero T
// is "no tensor" where an operand is optional (a gradient not wanted). Every
// method has the semantics of the ABI v4 host function of the same name
// (docs/ABI.md) and of package kernel's function; an implementation aborts,
// or records the first error and does nothing more, on a misuse.
type Ops[T comparable] interface {
	New(rows, cols int) T
	Resize(t T, rows, cols int)
	Fill(t T, v float32)
	Copy(dst, src T)
	Gather(x, labels T, idx []int32)

	Gemm(transA, transB bool, alpha float32, a, b T, beta float32, c T)
	BiasAdd(x, b T)
	ColSum(x, out T)
	Axpy(alpha float32, x, y T)
	ReLU(x, y T)
	ReLUGrad(dy, x, dx T)
	SoftmaxXent(logits, labels, grad T) float64
	CountCorrect(logits, labels T) int
	LayerNorm(x, gamma, beta, y, mean, rstd T, eps float32)
	LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta T)

	Conv2D(x, w, b, y T, inC, inH, inW, k, stride, pad int)
	Conv2DGrad(dy, x, w, dx, dw, db T, inC, inH, inW, k, stride, pad int)
	MaxPool2D(x, y T, c, h, w, k, stride int)
	MaxPool2DGrad(dy, x, dx T, c, h, w, k, stride int)
	AvgPool2D(x, y T, c, h, w, k, stride int)
	AvgPool2DGrad(dy, dx T, c, h, w, k, stride int)
	GroupNorm(x, gamma, beta, y, mean, rstd T, groups, channels int, eps float32)
	GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta T, groups, channels int)
	Dropout(x, y T, p float32, seed uint64)
	DropoutGrad(dy, dx T, p float32, seed uint64)
}
