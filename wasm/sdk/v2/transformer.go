//go:build wasip1

package sdk

// Embedding writes row ids[i] of table into row i of out (n×table.Cols). ids
// is n×1 and holds token ids as float32, as labels do; an id that is not an
// integer in [0, table.Rows) aborts the call.
func Embedding(table, ids, out Tensor) { hostEmbedding(table.h, ids.h, out.h) }

// EmbeddingGrad adds row i of dout to row ids[i] of dtable, in ascending i.
// It accumulates: zero dtable first.
func EmbeddingGrad(dout, ids, dtable Tensor) { hostEmbeddingGrad(dout.h, ids.h, dtable.h) }

// LayerNorm normalises each row of x (n×d) to zero mean and unit variance,
// then scales by gamma and shifts by beta (both 1×d), writing y (which may be
// x); it saves each row's mean and 1/sqrt(var+eps) in mean and rstd (n×1)
// for LayerNormGrad. eps must be in (0, 1].
func LayerNorm(x, gamma, beta, y, mean, rstd Tensor, eps float32) {
	hostLayerNorm(x.h, gamma.h, beta.h, y.h, mean.h, rstd.h, eps)
}

// LayerNormGrad writes the gradient of LayerNorm with respect to x into dx
// (which may be dy) and adds those with respect to gamma and beta into dgamma
// and dbeta (zero them first), from the mean and rstd LayerNorm saved.
func LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta Tensor) {
	hostLayerNormGrad(dy.h, x.h, gamma.h, mean.h, rstd.h, dx.h, dgamma.h, dbeta.h)
}

// GELU writes the tanh approximation of GELU of x into y (which may be x).
func GELU(x, y Tensor) { hostGELU(x.h, y.h) }

// GELUGrad writes dy times GELU's derivative at x into dx (which may be dy).
func GELUGrad(dy, x, dx Tensor) { hostGELUGrad(dy.h, x.h, dx.h) }

// Softmax writes the row-wise softmax of x into y (which may be x). With
// causal 0 every column takes part; with causal T > 0, x has T columns and
// row r sees only columns c ≤ r mod T, the layout of attention scores
// (batch·heads·T)×T. Masked columns get exactly 0.
func Softmax(x, y Tensor, causal int) { hostSoftmax(x.h, y.h, int32(causal)) }

// SoftmaxGrad writes the gradient through a row-wise softmax whose output was
// y into dx (which may be dy).
func SoftmaxGrad(dy, y, dx Tensor) { hostSoftmaxGrad(dy.h, y.h, dx.h) }

// BatchedGemm runs batch independent products on equal row blocks: with A_i,
// B_i and C_i the i-th of batch blocks of a, b and c's rows, it computes
// C_i = alpha·op(A_i)·op(B_i) + beta·C_i, exactly as Gemm would on each.
func BatchedGemm(transA, transB bool, alpha float32, a, b Tensor, beta float32, c Tensor, batch int) {
	hostBatchedGemm(b2u(transA), b2u(transB), alpha, a.h, b.h, beta, c.h, int32(batch))
}

// SplitHeads copies x, (seqs·seq)×(heads·dh) with head h in columns
// [h·dh, (h+1)·dh), into y, (seqs·heads·seq)×dh with one seq×dh block per
// sequence and head: the layout BatchedGemm and a causal Softmax take.
func SplitHeads(x, y Tensor, seq, heads int) { hostSplitHeads(x.h, y.h, int32(seq), int32(heads)) }

// MergeHeads is SplitHeads' inverse (and its gradient): y back into x.
func MergeHeads(y, x Tensor, seq, heads int) { hostMergeHeads(y.h, x.h, int32(seq), int32(heads)) }

// AdamW applies one AdamW step (decoupled weight decay) to p from gradient
// g, updating the moments m and v (zero them before the first step). step
// counts from 1 and sets the bias corrections.
func AdamW(p, g, m, v Tensor, lr, beta1, beta2, eps, weightDecay float32, step int) {
	hostAdamW(p.h, g.h, m.h, v.h, lr, beta1, beta2, eps, weightDecay, int32(step))
}
