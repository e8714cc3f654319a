package lm

import (
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// lnEps is every layer norm's epsilon.
const lnEps = 1e-5

// Metrics summarise a pass over a dataset: mean next-token cross-entropy
// over every predicted position, the fraction of positions whose arg-max is
// the next token, and how many examples and optimizer steps it took.
type Metrics struct {
	Loss     float64
	Accuracy float64
	Examples int
	Steps    int
}

// Perplexity is exp(Loss).
func (m Metrics) Perplexity() float64 { return math.Exp(m.Loss) }

// buffer is a tensor sized per sequence: perSeq rows of cols for each
// sequence of the batch, resized with it.
type buffer[T comparable] struct {
	t            T
	perSeq, cols int
}

// lora holds one adapted Linear layer's saved x·Aᵀ and its gradient.
type lora[T comparable] struct{ t, dt T }

type blockActs[T comparable] struct {
	a, m1, r1, q, k, v, qh, kh, vh, p, o, xmid, b, m2, r2, hfc, g T
	lora                                                          [6]lora[T]
}

// net is the model on one Ops with batch-sized buffers.
type net[T comparable] struct {
	o         Ops[T]
	a         *Arch
	h         Hyper
	p         []T
	train     []bool
	g, m, v   []T
	step      int
	lowest    int // lowest block the backward pass must reach
	embTrain  bool
	seqs      int // sequences the buffers are sized for now
	bufs      []buffer[T]
	x, labels T // x is seqs×T as gathered, then (seqs·T)×1 token ids
	pos, tgt  T
	xs        []T
	acts      []blockActs[T]
	f, mf, rf T
	logits    T
	dlogits   T
	headLoRA  lora[T]
	oh        T // attention output before merging heads
	// backward scratch
	dx, dtmp, do, doh, dp, dqh, dkh, dvh, dq, dk, dv, da, dg, db, df T
	zg, zb                                                           T // layer-norm gradients of frozen norms
	xbuf, lbuf, tbuf                                                 []float32
}

func newNet[T comparable](o Ops[T], a *Arch, h Hyper, p []T, train []bool, seqs int, backward bool) *net[T] {
	n := &net[T]{o: o, a: a, h: h, p: p, train: train, seqs: seqs}
	T_, D, H, F := a.Context, a.Dim, a.Heads, a.Hidden
	buf := func(perSeq, cols int) T {
		t := o.New(seqs*perSeq, cols)
		n.bufs = append(n.bufs, buffer[T]{t, perSeq, cols})
		return t
	}
	loraOf := func(l *Linear) lora[T] {
		if l.A < 0 {
			return lora[T]{}
		}
		r := lora[T]{t: buf(T_, l.Rank)}
		if backward {
			r.dt = buf(T_, l.Rank)
		}
		return r
	}
	n.x, n.labels = o.New(seqs, T_), buf(1, 1)
	n.pos, n.tgt = buf(T_, 1), buf(T_, 1)
	n.xs = make([]T, len(a.Blocks)+1)
	for i := range n.xs {
		n.xs[i] = buf(T_, D)
	}
	n.acts = make([]blockActs[T], len(a.Blocks))
	for i := range n.acts {
		b, act := &a.Blocks[i], &n.acts[i]
		act.a, act.m1, act.r1 = buf(T_, D), buf(T_, 1), buf(T_, 1)
		act.q, act.k, act.v = buf(T_, D), buf(T_, D), buf(T_, D)
		act.qh, act.kh, act.vh = buf(T_*H, D/H), buf(T_*H, D/H), buf(T_*H, D/H)
		act.p, act.o, act.xmid = buf(T_*H, T_), buf(T_, D), buf(T_, D)
		act.b, act.m2, act.r2 = buf(T_, D), buf(T_, 1), buf(T_, 1)
		act.hfc, act.g = buf(T_, F), buf(T_, F)
		for j, l := range []*Linear{&b.Q, &b.K, &b.V, &b.Proj, &b.FC, &b.Out} {
			act.lora[j] = loraOf(l)
		}
	}
	n.f, n.mf, n.rf = buf(T_, D), buf(T_, 1), buf(T_, 1)
	n.logits = buf(T_, a.Vocab)
	n.headLoRA = loraOf(&a.Head)
	n.oh = buf(T_*H, D/H)
	n.xbuf, n.lbuf, n.tbuf = make([]float32, seqs*T_), make([]float32, seqs), make([]float32, seqs*T_)
	if !backward {
		return n
	}
	n.dlogits = buf(T_, a.Vocab)
	n.dx, n.dtmp, n.do, n.df = buf(T_, D), buf(T_, D), buf(T_, D), buf(T_, D)
	n.doh, n.dqh, n.dkh, n.dvh = buf(T_*H, D/H), buf(T_*H, D/H), buf(T_*H, D/H), buf(T_*H, D/H)
	n.dp = buf(T_*H, T_)
	n.dq, n.dk, n.dv, n.da = buf(T_, D), buf(T_, D), buf(T_, D), buf(T_, D)
	n.dg, n.db = buf(T_, F), buf(T_, D)
	n.zg, n.zb = o.New(1, D), o.New(1, D)
	n.g, n.m, n.v = make([]T, len(p)), make([]T, len(p)), make([]T, len(p))
	for i, tr := range train {
		if tr {
			r, c := shape2(a.Params[i].Shape)
			n.g[i], n.m[i], n.v[i] = o.New(r, c), o.New(r, c), o.New(r, c)
		}
	}
	n.embTrain = train[a.TokEmb] || train[a.PosEmb]
	n.lowest = len(a.Blocks)
	if n.embTrain {
		n.lowest = 0
	} else {
		for i := len(a.Blocks) - 1; i >= 0; i-- {
			if a.blockTrains(i, train) {
				n.lowest = i
			}
		}
	}
	return n
}

// shape2 is how the host shows a parameter: rank 0 and 1 as one row, higher
// ranks with the first dimension as rows.
func shape2(s []int) (rows, cols int) {
	if len(s) == 0 {
		return 1, 1
	}
	if len(s) == 1 {
		return 1, s[0]
	}
	c := 1
	for _, d := range s[1:] {
		c *= d
	}
	return s[0], c
}

func (a *Arch) blockTrains(i int, train []bool) bool {
	b := &a.Blocks[i]
	for _, j := range []int{b.LN1W, b.LN1B, b.LN2W, b.LN2B} {
		if train[j] {
			return true
		}
	}
	for _, l := range []*Linear{&b.Q, &b.K, &b.V, &b.Proj, &b.FC, &b.Out} {
		for _, j := range []int{l.W, l.Bias, l.A, l.B} {
			if j >= 0 && train[j] {
				return true
			}
		}
	}
	return false
}

// load gathers examples idx and derives the token ids, positions and
// next-token targets of every position.
func (n *net[T]) load(idx []int32) {
	o, T_ := n.o, n.a.Context
	if len(idx) != n.seqs {
		n.seqs = len(idx)
		for _, b := range n.bufs {
			o.Resize(b.t, n.seqs*b.perSeq, b.cols)
		}
	}
	o.Resize(n.x, n.seqs, T_)
	o.Gather(n.x, n.labels, idx)
	N := n.seqs * T_
	xs, ls, ts := n.xbuf[:N], n.lbuf[:n.seqs], n.tbuf[:N]
	o.Read(n.x, xs)
	o.Read(n.labels, ls)
	for s := 0; s < n.seqs; s++ {
		copy(ts[s*T_:(s+1)*T_-1], xs[s*T_+1:(s+1)*T_])
		ts[(s+1)*T_-1] = ls[s]
	}
	o.Write(n.tgt, ts)
	for i := range ts {
		ts[i] = float32(i % T_)
	}
	o.Write(n.pos, ts)
	o.Resize(n.x, N, 1)
}

func (n *net[T]) linFwd(l *Linear, x, y T, beta float32, r lora[T]) {
	o := n.o
	o.Gemm(false, true, 1, x, n.p[l.W], beta, y)
	if l.Bias >= 0 {
		o.BiasAdd(y, n.p[l.Bias])
	}
	if l.A >= 0 {
		o.Gemm(false, true, 1, x, n.p[l.A], 0, r.t)
		o.Gemm(false, true, 1, r.t, n.p[l.B], 1, y)
	}
}

// linBwd takes dy of a Linear whose input was x: the gradients of its
// trainable parameters, and dx (added to dx·beta).
func (n *net[T]) linBwd(l *Linear, dy, x, dx T, beta float32, r lora[T]) {
	o := n.o
	if n.train[l.W] {
		o.Gemm(true, false, 1, dy, x, 0, n.g[l.W])
	}
	if l.Bias >= 0 && n.train[l.Bias] {
		o.ColSum(dy, n.g[l.Bias])
	}
	if l.A >= 0 {
		if n.train[l.B] {
			o.Gemm(true, false, 1, dy, r.t, 0, n.g[l.B])
		}
		o.Gemm(false, false, 1, dy, n.p[l.B], 0, r.dt)
		if n.train[l.A] {
			o.Gemm(true, false, 1, r.dt, x, 0, n.g[l.A])
		}
	}
	o.Gemm(false, false, 1, dy, n.p[l.W], beta, dx)
	if l.A >= 0 {
		o.Gemm(false, false, 1, r.dt, n.p[l.A], 1, dx)
	}
}

func (n *net[T]) forward() {
	o, a := n.o, n.a
	T_, H := a.Context, a.Heads
	scale := float32(1 / math.Sqrt(float64(a.Dim/H)))
	bh := n.seqs * H
	o.Embedding(n.p[a.TokEmb], n.x, n.xs[0])
	o.Embedding(n.p[a.PosEmb], n.pos, n.f) // f is free until the final norm
	o.Axpy(1, n.f, n.xs[0])
	for l := range a.Blocks {
		b, act := &a.Blocks[l], &n.acts[l]
		o.LayerNorm(n.xs[l], n.p[b.LN1W], n.p[b.LN1B], act.a, act.m1, act.r1, lnEps)
		n.linFwd(&b.Q, act.a, act.q, 0, act.lora[0])
		n.linFwd(&b.K, act.a, act.k, 0, act.lora[1])
		n.linFwd(&b.V, act.a, act.v, 0, act.lora[2])
		o.SplitHeads(act.q, act.qh, T_, H)
		o.SplitHeads(act.k, act.kh, T_, H)
		o.SplitHeads(act.v, act.vh, T_, H)
		o.BatchedGemm(false, true, scale, act.qh, act.kh, 0, act.p, bh)
		o.Softmax(act.p, act.p, T_)
		o.BatchedGemm(false, false, 1, act.p, act.vh, 0, n.oh, bh)
		o.MergeHeads(n.oh, act.o, T_, H)
		o.Copy(act.xmid, n.xs[l])
		n.linFwd(&b.Proj, act.o, act.xmid, 1, act.lora[3])
		o.LayerNorm(act.xmid, n.p[b.LN2W], n.p[b.LN2B], act.b, act.m2, act.r2, lnEps)
		n.linFwd(&b.FC, act.b, act.hfc, 0, act.lora[4])
		o.GELU(act.hfc, act.g)
		o.Copy(n.xs[l+1], act.xmid)
		n.linFwd(&b.Out, act.g, n.xs[l+1], 1, act.lora[5])
	}
	o.LayerNorm(n.xs[len(a.Blocks)], n.p[a.LNFW], n.p[a.LNFB], n.f, n.mf, n.rf, lnEps)
	n.linFwd(&a.Head, n.f, n.logits, 0, n.headLoRA)
}

// lnGrads are where the gradients of norm (gamma, beta) go: their gradient
// tensors, zeroed, or scratch when the norm is frozen.
func (n *net[T]) lnGrads(w, b int) (T, T) {
	gw, gb := n.zg, n.zb
	if n.train[w] {
		gw = n.g[w]
	}
	if n.train[b] {
		gb = n.g[b]
	}
	n.o.Fill(gw, 0)
	n.o.Fill(gb, 0)
	return gw, gb
}

func (n *net[T]) backward() {
	o, a := n.o, n.a
	T_, H := a.Context, a.Heads
	scale := float32(1 / math.Sqrt(float64(a.Dim/H)))
	bh := n.seqs * H
	L := len(a.Blocks)
	n.linBwd(&a.Head, n.dlogits, n.f, n.df, 0, n.headLoRA)
	gw, gb := n.lnGrads(a.LNFW, a.LNFB)
	o.LayerNormGrad(n.df, n.xs[L], n.p[a.LNFW], n.mf, n.rf, n.dx, gw, gb)
	for l := L - 1; l >= n.lowest; l-- {
		b, act := &a.Blocks[l], &n.acts[l]
		n.linBwd(&b.Out, n.dx, act.g, n.dg, 0, act.lora[5])
		o.GELUGrad(n.dg, act.hfc, n.dg)
		n.linBwd(&b.FC, n.dg, act.b, n.db, 0, act.lora[4])
		gw, gb := n.lnGrads(b.LN2W, b.LN2B)
		o.LayerNormGrad(n.db, act.xmid, n.p[b.LN2W], act.m2, act.r2, n.dtmp, gw, gb)
		o.Axpy(1, n.dtmp, n.dx)

		n.linBwd(&b.Proj, n.dx, act.o, n.do, 0, act.lora[3])
		o.SplitHeads(n.do, n.doh, T_, H)
		o.BatchedGemm(false, true, 1, n.doh, act.vh, 0, n.dp, bh)
		o.BatchedGemm(true, false, 1, act.p, n.doh, 0, n.dvh, bh)
		o.SoftmaxGrad(n.dp, act.p, n.dp)
		o.BatchedGemm(false, false, scale, n.dp, act.kh, 0, n.dqh, bh)
		o.BatchedGemm(true, false, scale, n.dp, act.qh, 0, n.dkh, bh)
		o.MergeHeads(n.dqh, n.dq, T_, H)
		o.MergeHeads(n.dkh, n.dk, T_, H)
		o.MergeHeads(n.dvh, n.dv, T_, H)
		n.linBwd(&b.Q, n.dq, act.a, n.da, 0, act.lora[0])
		n.linBwd(&b.K, n.dk, act.a, n.da, 1, act.lora[1])
		n.linBwd(&b.V, n.dv, act.a, n.da, 1, act.lora[2])
		gw, gb = n.lnGrads(b.LN1W, b.LN1B)
		o.LayerNormGrad(n.da, n.xs[l], n.p[b.LN1W], act.m1, act.r1, n.dtmp, gw, gb)
		o.Axpy(1, n.dtmp, n.dx)
	}
	if n.train[a.TokEmb] {
		o.Fill(n.g[a.TokEmb], 0)
		o.EmbeddingGrad(n.dx, n.x, n.g[a.TokEmb])
	}
	if n.train[a.PosEmb] {
		o.Fill(n.g[a.PosEmb], 0)
		o.EmbeddingGrad(n.dx, n.pos, n.g[a.PosEmb])
	}
}

func (n *net[T]) update() {
	o, h := n.o, n.h
	n.step++
	if h.GradClip > 0 {
		var ss float64
		for i, tr := range n.train {
			if tr {
				g := o.Norm2(n.g[i])
				ss += g * g
			}
		}
		if norm := math.Sqrt(ss); norm > float64(h.GradClip) {
			s := float32(float64(h.GradClip) / norm)
			for i, tr := range n.train {
				if tr {
					o.Scale(s, n.g[i])
				}
			}
		}
	}
	lr := h.lr(n.step)
	for i, tr := range n.train {
		if !tr {
			continue
		}
		var wd float32
		if n.a.Decayed(i) {
			wd = h.WeightDecay
		}
		o.AdamW(n.p[i], n.g[i], n.m[i], n.v[i], lr, h.Beta1, h.Beta2, h.Eps, wd, n.step)
	}
}

// Trainable turns a list of parameter indices into a mask over params; an
// empty list trains every parameter. Indices out of range or repeated are
// refused, and so is a list that trains nothing.
func Trainable(nparams int, idx []int) ([]bool, error) {
	t := make([]bool, nparams)
	if len(idx) == 0 {
		for i := range t {
			t[i] = true
		}
		return t, nil
	}
	for _, i := range idx {
		if i < 0 || i >= nparams {
			return nil, fmt.Errorf("%w: trainable index %d outside the %d parameters", ErrArch, i, nparams)
		}
		if t[i] {
			return nil, fmt.Errorf("%w: trainable index %d listed twice", ErrArch, i)
		}
		t[i] = true
	}
	return t, nil
}

// Trainer is a model's training state on an Ops: batch buffers, the
// gradients and AdamW moments of the trainable parameters, and the number
// of steps taken (AdamW's bias correction and the warm-up follow it).
type Trainer[T comparable] struct{ n *net[T] }

// NewTrainer prepares to train the parameters p (as a lists them, held by
// o) in place, those train marks, with batches of up to seqs examples.
func NewTrainer[T comparable](o Ops[T], a *Arch, p []T, train []bool, examples int, h Hyper, seqs int) (*Trainer[T], error) {
	if err := check(a, p, train, examples); err != nil {
		return nil, err
	}
	if seqs < 1 || seqs > MaxBatchSize {
		return nil, fmt.Errorf("%w: batch of %d sequences", ErrHyper, seqs)
	}
	return &Trainer[T]{newNet(o, a, h, p, train, seqs, true)}, nil
}

// Step trains on the examples idx (at most the trainer's batch size): one
// forward and backward pass and one AdamW update. It returns the batch's
// mean loss and the positions whose arg-max was right, measured before the
// update.
func (t *Trainer[T]) Step(idx []int32) (loss float64, correct int) {
	n := t.n
	n.load(idx)
	n.forward()
	loss = n.o.SoftmaxXent(n.logits, n.tgt, n.dlogits)
	correct = n.o.CountCorrect(n.logits, n.tgt)
	n.backward()
	n.update()
	return loss, correct
}

// Steps is the number of updates so far.
func (t *Trainer[T]) Steps() int { return t.n.step }

// SetSteps sets the update count, for resuming with restored moments.
func (t *Trainer[T]) SetSteps(s int) { t.n.step = max(s, 0) }

// Moments returns AdamW's first and second moment tensors, indexed like the
// parameters (the zero T for frozen ones), to save or restore them.
func (t *Trainer[T]) Moments() (m, v []T) { return t.n.m, t.n.v }

// Free releases the trainer's tensors; the parameters stay.
func (t *Trainer[T]) Free() { t.n.free() }

// Train trains the parameters p (as a lists them, held by o) in place on
// the examples o.Gather reaches: epochs of shuffled mini-batches (sgd.Order
// and sgd.Batches, so both sides visit the same batches), AdamW on the
// parameters train marks, until h.Epochs or h.MaxSteps. Metrics are those of
// the last epoch's batches; Examples counts the distinct examples trained
// on.
func Train[T comparable](o Ops[T], a *Arch, p []T, train []bool, examples int, h Hyper, seed uint64) (Metrics, error) {
	tr, err := NewTrainer(o, a, p, train, examples, h, min(h.BatchSize, max(examples, 1)))
	if err != nil {
		return Metrics{}, err
	}
	defer tr.Free()
	var met Metrics
	seen := 0
	for epoch := 0; epoch < h.Epochs; epoch++ {
		var lossSum float64
		correct, tokens := 0, 0
		for _, batch := range sgd.Batches(sgd.Order(examples, seed, epoch), h.BatchSize) {
			if h.MaxSteps > 0 && tr.Steps() >= h.MaxSteps {
				break
			}
			loss, c := tr.Step(batch)
			k := len(batch) * a.Context
			lossSum += loss * float64(k)
			correct += c
			tokens += k
			if epoch == 0 {
				seen += len(batch)
			}
		}
		if tokens > 0 {
			met.Loss, met.Accuracy = lossSum/float64(tokens), float64(correct)/float64(tokens)
		}
	}
	met.Examples, met.Steps = seen, tr.Steps()
	return met, nil
}

// Evaluate runs the model over every example in order, h.EvalBatchSize at a
// time, and reports held-out next-token metrics.
func Evaluate[T comparable](o Ops[T], a *Arch, p []T, examples int, h Hyper) (Metrics, error) {
	train := make([]bool, len(p))
	if err := check(a, p, train, examples); err != nil {
		return Metrics{}, err
	}
	n := newNet(o, a, h, p, train, min(h.EvalBatchSize, examples), false)
	defer n.free()
	var lossSum float64
	correct := 0
	var zero T
	idx := make([]int32, 0, h.EvalBatchSize)
	for start := 0; start < examples; start += h.EvalBatchSize {
		idx = idx[:0]
		for i := start; i < min(start+h.EvalBatchSize, examples); i++ {
			idx = append(idx, int32(i))
		}
		n.load(idx)
		n.forward()
		lossSum += o.SoftmaxXent(n.logits, n.tgt, zero) * float64(len(idx)*a.Context)
		correct += o.CountCorrect(n.logits, n.tgt)
	}
	tokens := float64(examples * a.Context)
	return Metrics{Loss: lossSum / tokens, Accuracy: float64(correct) / tokens, Examples: examples}, nil
}

func check[T comparable](a *Arch, p []T, train []bool, examples int) error {
	switch {
	case len(p) != len(a.Params) || len(train) != len(a.Params):
		return fmt.Errorf("%w: %d tensors and %d flags for %d parameters", ErrArch, len(p), len(train), len(a.Params))
	case examples < 1:
		return fmt.Errorf("%w: no local examples", ErrArch)
	}
	return nil
}

func (n *net[T]) free() {
	var zero T
	for _, b := range n.bufs {
		n.o.Free(b.t)
	}
	for _, t := range []T{n.x, n.zg, n.zb} {
		if t != zero {
			n.o.Free(t)
		}
	}
	for i := range n.g {
		if n.g[i] != zero {
			n.o.Free(n.g[i])
			n.o.Free(n.m[i])
			n.o.Free(n.v[i])
		}
	}
}

// CheckData says whether a dataset of width dim and classes classes fits the
// model: windows of Context tokens over its vocabulary.
func (a *Arch) CheckData(dim, classes int) error {
	if dim != a.Context || classes != a.Vocab {
		return fmt.Errorf("%w: data of width %d with %d classes; the model takes windows of %d tokens over %d ids", ErrArch, dim, classes, a.Context, a.Vocab)
	}
	return nil
}

// Gradient returns the mean loss of the batch idx and the gradient of every
// parameter train marks (the zero T for the rest), changing no parameter:
// for gradient checks, and for callers that bring their own optimizer. The
// caller frees the gradients with the release function.
func Gradient[T comparable](o Ops[T], a *Arch, p []T, train []bool, examples int, h Hyper, idx []int32) (float64, []T, func(), error) {
	if err := check(a, p, train, examples); err != nil {
		return 0, nil, nil, err
	}
	if len(idx) == 0 {
		return 0, nil, nil, fmt.Errorf("%w: empty batch", ErrArch)
	}
	n := newNet(o, a, h, p, train, len(idx), true)
	n.load(idx)
	n.forward()
	loss := o.SoftmaxXent(n.logits, n.tgt, n.dlogits)
	n.backward()
	return loss, n.g, n.free, nil
}
