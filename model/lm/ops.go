package lm

// Ops is the tensor machine a Net runs on. T is a tensor handle; the zero T
// is "no tensor" (SoftmaxXent's optional gradient). Every method has the
// semantics of the ABI v2 host function of the same name (docs/ABI.md) and of
// package kernel's function; an implementation aborts, or records the first
// error and does nothing more, on a misuse.
type Ops[T comparable] interface {
	New(rows, cols int) T
	Free(t T)
	Resize(t T, rows, cols int)
	Write(t T, v []float32)
	Read(t T, v []float32)
	Fill(t T, v float32)
	Copy(dst, src T)
	Gather(x, labels T, idx []int32)

	Gemm(transA, transB bool, alpha float32, a, b T, beta float32, c T)
	BatchedGemm(transA, transB bool, alpha float32, a, b T, beta float32, c T, batch int)
	BiasAdd(x, b T)
	ColSum(x, out T)
	Axpy(alpha float32, x, y T)
	Scale(alpha float32, x T)
	Norm2(x T) float64

	Embedding(table, ids, out T)
	EmbeddingGrad(dout, ids, dtable T)
	LayerNorm(x, gamma, beta, y, mean, rstd T, eps float32)
	LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta T)
	GELU(x, y T)
	GELUGrad(dy, x, dx T)
	Softmax(x, y T, causal int)
	SoftmaxGrad(dy, y, dx T)
	SplitHeads(x, y T, seq, heads int)
	MergeHeads(y, x T, seq, heads int)
	SoftmaxXent(logits, labels, grad T) float64
	CountCorrect(logits, labels T) int
	AdamW(p, g, m, v T, lr, beta1, beta2, eps, weightDecay float32, step int)
}
