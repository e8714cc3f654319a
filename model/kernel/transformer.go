package kernel

// The kernels of a small decoder-only transformer, each with its backward
// pass. Like the rest of the package they check every operand and sum in a
// fixed order. Each product that feeds an addition is rounded by an explicit
// conversion: the Go spec lets the compiler fuse x*y+z into one instruction on
// some architectures (see aggregator/outer.go), which would change the bits.
//
// Work per call, for a host that charges it (same unit as GemmFLOPs, and as
// the host's charges for the existing element-wise kernels):
//
//	Embedding       1 per value of out (a row copy)
//	EmbeddingGrad   1 per value of dout
//	LayerNorm       8 per value of x
//	LayerNormGrad  16 per value of x
//	GELU           12 per value of x (tanh counted as 4)
//	GELUGrad       16 per value of x
//	Softmax         5 per value of x, masked values included
//	SoftmaxGrad     4 per value of y
//	BatchedGemm     BatchedGemmFLOPs

import (
	"errors"
	"fmt"
	"math"
)

// Empty rows: a matrix with no columns holds no values however many rows it
// claims, so a host that charges work per value charges nothing for it, and
// the WASM host lets a module shape an empty tensor 0x(2^31-1) or (2^31-1)x0
// for free. A kernel whose loop runs over rows therefore returns before the
// loop when the rows hold no values; otherwise one call could spin through
// 2^31 empty rows (seconds to minutes, with no deadline check in between).
// With that, every kernel's loop count is bounded by the values of its
// operands.

// ErrArgument reports a scalar argument outside the range a kernel accepts
// (a non-positive epsilon, a negative causal length, a batch count below 1).
var ErrArgument = errors.New("kernel: invalid argument")

// tokenIDs checks that every value of ids (n×1) is a row index of a table
// with rows rows, before any kernel writes, so a refused call changes nothing.
func tokenIDs(op string, ids Mat, n, rows int) error {
	if ids.Rows != n || ids.Cols != 1 {
		return fmt.Errorf("%w: %s: ids is %v, want %dx1", ErrShape, op, ids, n)
	}
	for i, v := range ids.Vals() {
		if _, err := classOf(v, rows); err != nil {
			return fmt.Errorf("%s: ids row %d: %w (token ids must be integers in [0,%d))", op, i, err, rows)
		}
	}
	return nil
}

// Embedding writes row ids[i] of table into row i of out. ids is n×1 and holds
// token ids as float32, as SoftmaxXent's labels do; out is n×table.Cols.
// Ids that are not integers in [0, table.Rows) are refused with ErrLabel.
func Embedding(table, ids, out Mat) error {
	if err := errors.Join(table.check("table"), ids.check("ids"), out.check("out")); err != nil {
		return fmt.Errorf("embedding: %w", err)
	}
	if out.Cols != table.Cols {
		return fmt.Errorf("%w: embedding: table %v, out %v: out needs the table's %d columns", ErrShape, table, out, table.Cols)
	}
	if err := tokenIDs("embedding", ids, out.Rows, table.Rows); err != nil {
		return err
	}
	d := table.Cols
	for i, v := range ids.Vals() {
		t := int(v)
		copy(out.Data[i*d:(i+1)*d], table.Data[t*d:(t+1)*d])
	}
	return nil
}

// EmbeddingGrad adds row i of dout to row ids[i] of dtable for i ascending, so
// repeated ids accumulate in a fixed order. It accumulates: the caller zeroes
// dtable first. Every id is checked before dtable changes.
func EmbeddingGrad(dout, ids, dtable Mat) error {
	if err := errors.Join(dout.check("dout"), ids.check("ids"), dtable.check("dtable")); err != nil {
		return fmt.Errorf("embedding_grad: %w", err)
	}
	if dout.Cols != dtable.Cols {
		return fmt.Errorf("%w: embedding_grad: dout %v, dtable %v: column counts differ", ErrShape, dout, dtable)
	}
	if err := tokenIDs("embedding_grad", ids, dout.Rows, dtable.Rows); err != nil {
		return err
	}
	d := dout.Cols
	for i, v := range ids.Vals() {
		t := int(v)
		addVec(dout.Data[i*d:(i+1)*d], dtable.Data[t*d:(t+1)*d])
	}
	return nil
}

func vecLen(op, name string, m Mat, want int, of string) error {
	if m.Len() != want {
		return fmt.Errorf("%w: %s: %s has %d values, want %d (%s)", ErrShape, op, name, m.Len(), want, of)
	}
	return nil
}

// LayerNorm normalises each row of x (n×d) to zero mean and unit biased
// variance, then scales by gamma and shifts by beta (both 1×d):
// y = (x−mean)·rstd·gamma + beta with rstd = 1/sqrt(var+eps). It saves each
// row's mean and rstd in mean and rstd (n×1) for LayerNormGrad. Statistics are
// accumulated in float64 with a two-pass variance, so rows with a large mean
// keep their precision. eps must be in (0, 1]; y may alias x.
func LayerNorm(x, gamma, beta, y, mean, rstd Mat, eps float32) error {
	if err := errors.Join(x.check("x"), gamma.check("gamma"), beta.check("beta"), y.check("y"),
		mean.check("mean"), rstd.check("rstd")); err != nil {
		return fmt.Errorf("layer_norm: %w", err)
	}
	n, d := x.Rows, x.Cols
	if err := errors.Join(sameShape("layer_norm", x, y),
		vecLen("layer_norm", "gamma", gamma, d, "one per column of x"),
		vecLen("layer_norm", "beta", beta, d, "one per column of x"),
		vecLen("layer_norm", "mean", mean, n, "one per row of x"),
		vecLen("layer_norm", "rstd", rstd, n, "one per row of x")); err != nil {
		return err
	}
	if !(eps > 0 && eps <= 1) {
		return fmt.Errorf("%w: layer_norm: eps %v not in (0, 1]", ErrArgument, eps)
	}
	if n > 0 && d == 0 {
		return fmt.Errorf("%w: layer_norm: x %v has no columns to normalise", ErrShape, x)
	}
	gv, bv, mv, rv := gamma.Vals(), beta.Vals(), mean.Vals(), rstd.Vals()
	fd, fe := float64(d), float64(eps)
	for r := 0; r < n; r++ {
		row := x.Data[r*d : (r+1)*d]
		var s float64
		for _, v := range row {
			s += float64(v)
		}
		mu := s / fd
		var q float64
		for _, v := range row {
			dv := float64(v) - mu
			q += float64(dv * dv)
		}
		rs := 1 / math.Sqrt(q/fd+fe)
		lnNormVec(row, gv, bv, y.Data[r*d:(r+1)*d], mu, rs)
		mv[r], rv[r] = float32(mu), float32(rs)
	}
	return nil
}

// LayerNormGrad is the exact gradient of LayerNorm given the mean and rstd it
// saved: with g = dy·gamma and x̂ = (x−mean)·rstd, it writes
// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) per row, and adds Σ dy·x̂ to dgamma
// and Σ dy to dbeta over rows in ascending order (the caller zeroes them).
// dx may alias dy.
func LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta Mat) error {
	if err := errors.Join(dy.check("dy"), x.check("x"), gamma.check("gamma"), mean.check("mean"),
		rstd.check("rstd"), dx.check("dx"), dgamma.check("dgamma"), dbeta.check("dbeta")); err != nil {
		return fmt.Errorf("layer_norm_grad: %w", err)
	}
	n, d := x.Rows, x.Cols
	if err := errors.Join(sameShape("layer_norm_grad", dy, x), sameShape("layer_norm_grad", dx, x),
		vecLen("layer_norm_grad", "gamma", gamma, d, "one per column of x"),
		vecLen("layer_norm_grad", "dgamma", dgamma, d, "one per column of x"),
		vecLen("layer_norm_grad", "dbeta", dbeta, d, "one per column of x"),
		vecLen("layer_norm_grad", "mean", mean, n, "one per row of x"),
		vecLen("layer_norm_grad", "rstd", rstd, n, "one per row of x")); err != nil {
		return err
	}
	if n == 0 || d == 0 {
		return nil
	}
	gv, mv, rv, dgv, dbv := gamma.Vals(), mean.Vals(), rstd.Vals(), dgamma.Vals(), dbeta.Vals()
	fd := float64(d)
	for r := 0; r < n; r++ {
		xr, dyr, dxr := x.Data[r*d:(r+1)*d], dy.Data[r*d:(r+1)*d], dx.Data[r*d:(r+1)*d]
		mu, rs := float64(mv[r]), float64(rv[r])
		var s1, s2 float64
		for j, v := range xr {
			xh := (float64(v) - mu) * rs
			g := float64(dyr[j]) * float64(gv[j]) // exact: both factors are float32
			s1 += g
			s2 += float64(g * xh)
			dgv[j] += float32(float64(dyr[j]) * xh)
			dbv[j] += dyr[j]
		}
		m1, m2 := s1/fd, s2/fd
		// Each dx[j] reads only dy[j] and x[j], so dx may overwrite dy in place.
		for j, v := range xr {
			xh := (float64(v) - mu) * rs
			g := float64(dyr[j]) * float64(gv[j])
			dxr[j] = float32(rs * (g - m1 - float64(xh*m2)))
		}
	}
	return nil
}

const geluK = 0.044715

// GELU writes the tanh approximation of the Gaussian error linear unit,
// 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))) (PyTorch's approximate="tanh"),
// into y. It computes in float32 as x·σ(2u), u the argument of tanh, with
// exp32 (see elementwise.go): within 16 float32 ulp of the exact value for
// x ≥ −3 and within 4e-9 absolute below, where GELU is tiny and u rounded
// to float32 dominates the error (tested). y may alias x.
func GELU(x, y Mat) error {
	if err := errors.Join(x.check("x"), y.check("y")); err != nil {
		return fmt.Errorf("gelu: %w", err)
	}
	if err := sameShape("gelu", x, y); err != nil {
		return err
	}
	geluVec(x.Vals(), y.Vals())
	return nil
}

// GELUGrad writes dy times the derivative of GELU at x into dx, in float32
// like GELU; dx may alias dy. Beyond |x| = 10⁴ (±Inf included) the
// derivative is exactly 1 or 0.
func GELUGrad(dy, x, dx Mat) error {
	if err := errors.Join(dy.check("dy"), x.check("x"), dx.check("dx")); err != nil {
		return fmt.Errorf("gelu_grad: %w", err)
	}
	if err := errors.Join(sameShape("gelu_grad", dy, x), sameShape("gelu_grad", dx, x)); err != nil {
		return err
	}
	geluGradVec(dy.Vals(), x.Vals(), dx.Vals())
	return nil
}

// Softmax writes the row-wise softmax of x into y, subtracting each row's
// maximum first so large scores cannot overflow. With causal 0 every column
// takes part. With causal > 0, x must have causal columns and row r sees only
// columns c ≤ r mod causal: the layout of attention scores of shape
// (batch·heads·T)×T with causal = T. Masked columns get exactly 0 and are
// never read, so whatever they hold cannot leak into the row. It computes
// in float32: exp32 of each score less the row's maximum, summed in 16
// lanes (see elementwise.go), each divided by the sum. y may alias x.
func Softmax(x, y Mat, causal int) error {
	if err := errors.Join(x.check("x"), y.check("y")); err != nil {
		return fmt.Errorf("softmax: %w", err)
	}
	if err := sameShape("softmax", x, y); err != nil {
		return err
	}
	if causal < 0 {
		return fmt.Errorf("%w: softmax: causal %d is negative (0 disables the mask, T masks T×T blocks)", ErrArgument, causal)
	}
	c := x.Cols
	if causal > 0 && c != causal {
		return fmt.Errorf("%w: softmax: causal %d but x %v has %d columns; causal scores are (batch·heads·T)×T with causal = T", ErrShape, causal, x, c)
	}
	if c == 0 {
		return nil
	}
	for r := 0; r < x.Rows; r++ {
		lim := c
		if causal > 0 {
			lim = r%causal + 1
		}
		out := y.Data[r*c : (r+1)*c]
		softmaxRow(x.Data[r*c:r*c+lim], out)
		clear(out[lim:])
	}
	return nil
}

// SoftmaxGrad writes the gradient through a row-wise softmax whose output was
// y: dx = y ⊙ (dy − rowsum(dy ⊙ y)). Masked columns of a causal softmax have
// y = 0 and so get dx = 0. dx may alias dy.
func SoftmaxGrad(dy, y, dx Mat) error {
	if err := errors.Join(dy.check("dy"), y.check("y"), dx.check("dx")); err != nil {
		return fmt.Errorf("softmax_grad: %w", err)
	}
	if err := errors.Join(sameShape("softmax_grad", dy, y), sameShape("softmax_grad", dx, y)); err != nil {
		return err
	}
	c := y.Cols
	if c == 0 {
		return nil // see Empty rows above ErrArgument
	}
	for r := 0; r < y.Rows; r++ {
		dyr, yr, dxr := dy.Data[r*c:(r+1)*c], y.Data[r*c:(r+1)*c], dx.Data[r*c:(r+1)*c]
		var s float64
		for j, g := range dyr {
			s += float64(g) * float64(yr[j]) // exact product of float32s: fusing cannot change it
		}
		for j, g := range dyr {
			dxr[j] = float32(float64(yr[j]) * (float64(g) - s))
		}
	}
	return nil
}

// BatchedGemm runs batch independent Gemms on equal contiguous row blocks:
// block i of a ((batch·ra)×ca), of b ((batch·rb)×cb) and of c ((batch·m)×n)
// give C_i = alpha·op(A_i)·op(B_i) + beta·C_i, with Gemm's semantics and, as
// each block is a Gemm call on a view, Gemm's exact bits. Per-head attention
// products (Q·Kᵀ, P·V and their gradients) are its use. batch must be ≥ 1; the
// shapes are checked before any block is written.
func BatchedGemm(transA, transB bool, alpha float32, a, b Mat, beta float32, c Mat, batch int) error {
	if err := errors.Join(a.check("A"), b.check("B"), c.check("C")); err != nil {
		return fmt.Errorf("batched_gemm: %w", err)
	}
	if batch < 1 {
		return fmt.Errorf("%w: batched_gemm: batch %d, want at least 1", ErrArgument, batch)
	}
	for _, m := range []struct {
		n string
		m Mat
	}{{"A", a}, {"B", b}, {"C", c}} {
		if m.m.Rows%batch != 0 {
			return fmt.Errorf("%w: batched_gemm: %s %v does not split into %d equal row blocks", ErrShape, m.n, m.m, batch)
		}
	}
	block := func(m Mat, i int) Mat {
		r := m.Rows / batch
		sz := r * m.Cols
		return Mat{Rows: r, Cols: m.Cols, Data: m.Data[i*sz : (i+1)*sz : (i+1)*sz]}
	}
	if c.Len() == 0 {
		// Every block of C is empty: check block 0's shapes and stop, rather
		// than call Gemm on up to 2^31 empty blocks (see Empty rows above).
		if err := Gemm(transA, transB, alpha, block(a, 0), block(b, 0), beta, block(c, 0)); err != nil {
			return fmt.Errorf("batched_gemm: block 0 of %d: %w", batch, err)
		}
		return nil
	}
	// Every block has the same shape, so block 0 failing Gemm's check (which
	// writes nothing) stops the call before any block changes.
	for i := 0; i < batch; i++ {
		if err := Gemm(transA, transB, alpha, block(a, i), block(b, i), beta, block(c, i)); err != nil {
			return fmt.Errorf("batched_gemm: block %d of %d: %w", i, batch, err)
		}
	}
	return nil
}

// BatchedGemmFLOPs is the work BatchedGemm does for batch m×k by k×n products.
func BatchedGemmFLOPs(batch, m, n, k int) int64 { return int64(batch) * GemmFLOPs(m, n, k) }

// headShape checks that x, in token-major layout (seqs·T)×(heads·dh), and y,
// in head-major layout (seqs·heads·T)×dh, hold the same attention heads.
func headShape(op string, x, y Mat, seq, heads int) error {
	if err := errors.Join(x.check("x"), y.check("y")); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if seq < 1 || heads < 1 {
		return fmt.Errorf("%w: %s: sequence length %d and heads %d must be at least 1", ErrArgument, op, seq, heads)
	}
	if x.Rows%seq != 0 || x.Cols%heads != 0 {
		return fmt.Errorf("%w: %s: token-major %v is not whole sequences of %d tokens by %d heads", ErrShape, op, x, seq, heads)
	}
	if y.Rows != x.Rows*heads || y.Cols != x.Cols/heads {
		return fmt.Errorf("%w: %s: head-major %v, want %dx%d for token-major %v with %d heads", ErrShape, op, y, x.Rows*heads, x.Cols/heads, x, heads)
	}
	return nil
}

// SplitHeads copies x, laid out (seqs·T)×(heads·dh) with head h of token t in
// columns [h·dh, (h+1)·dh) (what a projection x·Wᵀ produces), into y laid out
// (seqs·heads·T)×dh, one T×dh block per (sequence, head): the layout
// BatchedGemm and a causal Softmax work on. It is a permutation: no value
// changes. seq is T.
func SplitHeads(x, y Mat, seq, heads int) error {
	if err := headShape("split_heads", x, y, seq, heads); err != nil {
		return err
	}
	permuteHeads(x, y, seq, heads, false)
	return nil
}

// MergeHeads is SplitHeads' inverse: y (seqs·heads·T)×dh back into x
// (seqs·T)×(heads·dh). It is also SplitHeads' gradient, as SplitHeads is
// MergeHeads'.
func MergeHeads(y, x Mat, seq, heads int) error {
	if err := headShape("merge_heads", x, y, seq, heads); err != nil {
		return err
	}
	permuteHeads(x, y, seq, heads, true)
	return nil
}

func permuteHeads(x, y Mat, seq, heads int, merge bool) {
	dh := y.Cols
	if dh == 0 {
		return // no values to move (see Empty rows above ErrArgument)
	}
	seqs := x.Rows / seq
	for s := 0; s < seqs; s++ {
		for h := 0; h < heads; h++ {
			for t := 0; t < seq; t++ {
				xr := x.Data[(s*seq+t)*x.Cols+h*dh:][:dh]
				yr := y.Data[((s*heads+h)*seq+t)*dh:][:dh]
				if merge {
					copy(xr, yr)
				} else {
					copy(yr, xr)
				}
			}
		}
	}
}

// AdamW holds the scalars of one AdamW step (Loshchilov and Hutter,
// decoupled weight decay). Step counts from 1 and sets the bias corrections.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	Step                               int
}

func (h AdamW) check() error {
	ok := func(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }
	switch {
	case !ok(h.LR) || h.LR < 0:
		return fmt.Errorf("learning rate %v, want finite and ≥ 0", h.LR)
	case !ok(h.Beta1) || h.Beta1 < 0 || h.Beta1 >= 1, !ok(h.Beta2) || h.Beta2 < 0 || h.Beta2 >= 1:
		return fmt.Errorf("betas %v, %v, want each in [0, 1)", h.Beta1, h.Beta2)
	case !ok(h.Eps) || h.Eps <= 0:
		return fmt.Errorf("eps %v, want finite and > 0", h.Eps)
	case !ok(h.WeightDecay) || h.WeightDecay < 0:
		return fmt.Errorf("weight decay %v, want finite and ≥ 0", h.WeightDecay)
	case h.Step < 1 || h.Step > 1<<30:
		return fmt.Errorf("step %d, want in [1, 2^30]", h.Step)
	}
	return nil
}

// AdamWStep applies one AdamW update to p from gradient g, updating the
// first and second moments m and v in place (all the same shape; start m
// and v at zero):
//
//	m ← β1·m + (1−β1)·g,  v ← β2·v + (1−β2)·g²
//	p ← p − lr·(m̂/(√v̂ + ε) + wd·p),  m̂ = m/(1−β1^t), v̂ = v/(1−β2^t)
//
// in float64 per value, rounded to float32 once per stored value. Work: 12
// per value.
func AdamWStep(p, g, m, v Mat, h AdamW) error {
	if err := errors.Join(p.check("p"), g.check("g"), m.check("m"), v.check("v")); err != nil {
		return fmt.Errorf("adamw: %w", err)
	}
	if err := errors.Join(sameShape("adamw", p, g), sameShape("adamw", p, m), sameShape("adamw", p, v)); err != nil {
		return err
	}
	if err := h.check(); err != nil {
		return fmt.Errorf("%w: adamw: %v", ErrArgument, err)
	}
	b1, b2 := float64(h.Beta1), float64(h.Beta2)
	c := adamConst{
		b1: b1, ob1: 1 - b1, b2: b2, ob2: 1 - b2,
		c1: 1 / (1 - math.Pow(b1, float64(h.Step))),
		c2: 1 / (1 - math.Pow(b2, float64(h.Step))),
		lr: float64(h.LR), eps: float64(h.Eps), wd: float64(h.WeightDecay),
	}
	adamwVec(p.Vals(), g.Vals(), m.Vals(), v.Vals(), &c)
	return nil
}
