package train

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/model/lm"
)

// kops runs package lm on package kernel: the native twin of the sandbox's
// host functions. The first kernel error is kept and every later call does
// nothing, as a module's call stops at its first aborted host function.
type kops struct {
	d   *data.Dataset
	err error
}

func (k *kops) fail(op string, err error) {
	if err != nil && k.err == nil {
		k.err = fmt.Errorf("%s: %w", op, err)
	}
}

func (k *kops) New(rows, cols int) *kernel.Mat { m := kernel.NewMat(rows, cols); return &m }
func (k *kops) Free(*kernel.Mat)               {}
func (k *kops) Resize(t *kernel.Mat, rows, cols int) {
	if rows < 0 || cols < 0 || rows*cols > len(t.Data) {
		k.fail("resize", fmt.Errorf("%w: %dx%d beyond capacity %d", kernel.ErrShape, rows, cols, len(t.Data)))
		return
	}
	t.Rows, t.Cols = rows, cols
}
func (k *kops) Write(t *kernel.Mat, v []float32) {
	if len(v) != t.Len() {
		k.fail("write", fmt.Errorf("%w: %d values into %v", kernel.ErrShape, len(v), t))
		return
	}
	copy(t.Data, v)
}
func (k *kops) Read(t *kernel.Mat, v []float32) {
	if len(v) != t.Len() {
		k.fail("read", fmt.Errorf("%w: %d values from %v", kernel.ErrShape, len(v), t))
		return
	}
	copy(v, t.Vals())
}
func (k *kops) Fill(t *kernel.Mat, v float32) {
	for i := range t.Vals() {
		t.Data[i] = v
	}
}
func (k *kops) Copy(dst, src *kernel.Mat) {
	if dst.Rows != src.Rows || dst.Cols != src.Cols {
		k.fail("copy", fmt.Errorf("%w: %v into %v", kernel.ErrShape, src, dst))
		return
	}
	copy(dst.Vals(), src.Vals())
}
func (k *kops) Gather(x, labels *kernel.Mat, idx []int32) {
	d := k.d
	if x.Rows != len(idx) || x.Cols != d.Dim || labels.Len() != len(idx) {
		k.fail("gather", fmt.Errorf("%w: %d examples into %v and %v", kernel.ErrShape, len(idx), x, labels))
		return
	}
	for r, i := range idx {
		if i < 0 || int(i) >= d.Len() {
			k.fail("gather", fmt.Errorf("%w: example %d of %d", kernel.ErrShape, i, d.Len()))
			return
		}
		copy(x.Data[r*d.Dim:(r+1)*d.Dim], d.Features[int(i)*d.Dim:(int(i)+1)*d.Dim])
		labels.Data[r] = float32(d.Labels[i])
	}
}
func (k *kops) Gemm(ta, tb bool, alpha float32, a, b *kernel.Mat, beta float32, c *kernel.Mat) {
	k.fail("gemm", kernel.Gemm(ta, tb, alpha, *a, *b, beta, *c))
}
func (k *kops) BatchedGemm(ta, tb bool, alpha float32, a, b *kernel.Mat, beta float32, c *kernel.Mat, batch int) {
	k.fail("batched_gemm", kernel.BatchedGemm(ta, tb, alpha, *a, *b, beta, *c, batch))
}
func (k *kops) BiasAdd(x, b *kernel.Mat)             { k.fail("bias_add", kernel.BiasAdd(*x, *b)) }
func (k *kops) ColSum(x, out *kernel.Mat)            { k.fail("col_sum", kernel.ColSum(*x, *out)) }
func (k *kops) Axpy(alpha float32, x, y *kernel.Mat) { k.fail("axpy", kernel.Axpy(alpha, *x, *y)) }
func (k *kops) Scale(alpha float32, x *kernel.Mat)   { kernel.Scale(alpha, *x) }
func (k *kops) Norm2(x *kernel.Mat) float64          { return kernel.Norm2(*x) }
func (k *kops) Embedding(table, ids, out *kernel.Mat) {
	k.fail("embedding", kernel.Embedding(*table, *ids, *out))
}
func (k *kops) EmbeddingGrad(dout, ids, dtable *kernel.Mat) {
	k.fail("embedding_grad", kernel.EmbeddingGrad(*dout, *ids, *dtable))
}
func (k *kops) LayerNorm(x, gamma, beta, y, mean, rstd *kernel.Mat, eps float32) {
	k.fail("layer_norm", kernel.LayerNorm(*x, *gamma, *beta, *y, *mean, *rstd, eps))
}
func (k *kops) LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta *kernel.Mat) {
	k.fail("layer_norm_grad", kernel.LayerNormGrad(*dy, *x, *gamma, *mean, *rstd, *dx, *dgamma, *dbeta))
}
func (k *kops) GELU(x, y *kernel.Mat)          { k.fail("gelu", kernel.GELU(*x, *y)) }
func (k *kops) GELUGrad(dy, x, dx *kernel.Mat) { k.fail("gelu_grad", kernel.GELUGrad(*dy, *x, *dx)) }
func (k *kops) Softmax(x, y *kernel.Mat, causal int) {
	k.fail("softmax", kernel.Softmax(*x, *y, causal))
}
func (k *kops) SoftmaxGrad(dy, y, dx *kernel.Mat) {
	k.fail("softmax_grad", kernel.SoftmaxGrad(*dy, *y, *dx))
}
func (k *kops) SplitHeads(x, y *kernel.Mat, seq, heads int) {
	k.fail("split_heads", kernel.SplitHeads(*x, *y, seq, heads))
}
func (k *kops) MergeHeads(y, x *kernel.Mat, seq, heads int) {
	k.fail("merge_heads", kernel.MergeHeads(*y, *x, seq, heads))
}
func (k *kops) SoftmaxXent(logits, labels, grad *kernel.Mat) float64 {
	g := kernel.Mat{}
	if grad != nil {
		g = *grad
	}
	loss, err := kernel.SoftmaxXent(*logits, *labels, g)
	k.fail("softmax_xent", err)
	return loss
}
func (k *kops) CountCorrect(logits, labels *kernel.Mat) int {
	c, err := kernel.CountCorrect(*logits, *labels)
	k.fail("count_correct", err)
	return c
}
func (k *kops) AdamW(p, g, m, v *kernel.Mat, lr, beta1, beta2, eps, wd float32, step int) {
	k.fail("adamw", kernel.AdamWStep(*p, *g, *m, *v, kernel.AdamW{LR: lr, Beta1: beta1, Beta2: beta2, Eps: eps, WeightDecay: wd, Step: step}))
}

// lmParams lists m's tensors as package lm sees them and views their
// storage as matrices, as the sandbox shows them to a module.
func lmParams(m *model.Model) ([]lm.Param, []*kernel.Mat) {
	ps := make([]lm.Param, len(m.Tensors))
	ms := make([]*kernel.Mat, len(m.Tensors))
	for i, t := range m.Tensors {
		ps[i] = lm.Param{Name: t.Name, Shape: t.Shape}
		rows, cols := 1, len(t.Data)
		if len(t.Shape) > 1 {
			rows, cols = t.Shape[0], len(t.Data)/max(t.Shape[0], 1)
		}
		ms[i] = &kernel.Mat{Rows: rows, Cols: cols, Data: t.Data}
	}
	return ps, ms
}

// lmArch parses m as a language model that fits d.
func lmArch(m *model.Model, d *data.Dataset, h lm.Hyper) (*lm.Arch, []*kernel.Mat, error) {
	if d == nil || d.Len() == 0 {
		return nil, nil, fmt.Errorf("%w: no examples", lm.ErrArch)
	}
	ps, ms := lmParams(m)
	a, err := lm.Parse(ps, h.Heads)
	if err != nil {
		return nil, nil, err
	}
	if err := a.CheckData(d.Dim, d.NumClasses); err != nil {
		return nil, nil, err
	}
	return a, ms, nil
}

// TrainLM trains a copy of the language model m on d with the JSON
// hyper-parameters of package lm, exactly as the lm example module does in
// the sandbox: the same kernels in the same order, so the weights agree bit
// for bit. trainable lists the parameter indices that train (empty: all);
// the others come back unchanged.
func TrainLM(m *model.Model, d *data.Dataset, hyper []byte, seed uint64, trainable []int) (*model.Model, lm.Metrics, error) {
	h, err := lm.ParseHyper(hyper)
	if err != nil {
		return nil, lm.Metrics{}, fmt.Errorf("train lm: %w", err)
	}
	own := m.Clone()
	a, ms, err := lmArch(own, d, h)
	if err != nil {
		return nil, lm.Metrics{}, fmt.Errorf("train lm: %w", err)
	}
	tr, err := lm.Trainable(len(ms), trainable)
	if err != nil {
		return nil, lm.Metrics{}, fmt.Errorf("train lm: %w", err)
	}
	k := &kops{d: d}
	met, err := lm.Train[*kernel.Mat](k, a, ms, tr, d.Len(), h, seed)
	if err = errors.Join(err, k.err); err != nil {
		return nil, lm.Metrics{}, fmt.Errorf("train lm: %w", err)
	}
	if !finiteModel(own) || math.IsNaN(met.Loss) || math.IsInf(met.Loss, 0) {
		return nil, met, fmt.Errorf("train lm: %w", ErrDiverged)
	}
	return own, met, nil
}

// EvaluateLM reports m's next-token metrics on d.
func EvaluateLM(m *model.Model, d *data.Dataset, hyper []byte) (lm.Metrics, error) {
	h, err := lm.ParseHyper(hyper)
	if err != nil {
		return lm.Metrics{}, fmt.Errorf("evaluate lm: %w", err)
	}
	a, ms, err := lmArch(m, d, h)
	if err != nil {
		return lm.Metrics{}, fmt.Errorf("evaluate lm: %w", err)
	}
	k := &kops{d: d}
	met, err := lm.Evaluate[*kernel.Mat](k, a, ms, d.Len(), h)
	if err = errors.Join(err, k.err); err != nil {
		return lm.Metrics{}, fmt.Errorf("evaluate lm: %w", err)
	}
	return met, nil
}

func finiteModel(m *model.Model) bool {
	for _, t := range m.Tensors {
		for _, v := range t.Data {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return false
			}
		}
	}
	return true
}

// LMConfig sizes a language model for InitLM.
type LMConfig struct {
	Vocab, Context, Dim, Layers int
	// Hidden is the MLP width; 0 means 4·Dim.
	Hidden int
}

// InitLM returns a language model in package lm's layout: weights and
// embeddings normal with standard deviation 0.02, the projections into the
// residual stream scaled by 1/√(2·Layers) (GPT-2), norms at gain 1 and bias
// 0, biases 0; drawn from a SplitMix64 stream so the result depends on seed
// alone.
func InitLM(c LMConfig, seed uint64) (*model.Model, error) {
	if c.Hidden == 0 {
		c.Hidden = 4 * c.Dim
	}
	switch {
	case c.Vocab < 1 || c.Vocab > lm.MaxVocab, c.Context < 1 || c.Context > lm.MaxContext,
		c.Dim < 1 || c.Dim > lm.MaxDim, c.Layers < 1 || c.Layers > lm.MaxLayers, c.Hidden < 1 || c.Hidden > 4*lm.MaxDim:
		return nil, fmt.Errorf("%w: language model %+v", ErrArch, c)
	}
	r := splitMix(seed)
	normal := func(std float64) float64 {
		// Box–Muller on two uniform draws, the first kept away from 0.
		u1, u2 := 1-r.float64(), r.float64()
		return std * math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
	}
	var ts []model.Tensor
	add := func(name string, std float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(normal(std))
		}
		ts = append(ts, model.Tensor{Name: name, Shape: shape, Data: v})
	}
	fill := func(name string, val float32, n int) {
		v := make([]float32, n)
		for i := range v {
			v[i] = val
		}
		ts = append(ts, model.Tensor{Name: name, Shape: []int{n}, Data: v})
	}
	const std = 0.02
	resid := std / math.Sqrt(2*float64(c.Layers))
	add("tok_emb.weight", std, c.Vocab, c.Dim)
	add("pos_emb.weight", std, c.Context, c.Dim)
	for i := 0; i < c.Layers; i++ {
		p := fmt.Sprintf("blocks.%d.", i)
		fill(p+"ln1.weight", 1, c.Dim)
		fill(p+"ln1.bias", 0, c.Dim)
		add(p+"attn.q.weight", std, c.Dim, c.Dim)
		add(p+"attn.k.weight", std, c.Dim, c.Dim)
		add(p+"attn.v.weight", std, c.Dim, c.Dim)
		add(p+"attn.proj.weight", resid, c.Dim, c.Dim)
		fill(p+"ln2.weight", 1, c.Dim)
		fill(p+"ln2.bias", 0, c.Dim)
		add(p+"mlp.fc.weight", std, c.Hidden, c.Dim)
		fill(p+"mlp.fc.bias", 0, c.Hidden)
		add(p+"mlp.proj.weight", resid, c.Dim, c.Hidden)
		fill(p+"mlp.proj.bias", 0, c.Dim)
	}
	fill("ln_f.weight", 1, c.Dim)
	fill("ln_f.bias", 0, c.Dim)
	add("lm_head.weight", std, c.Vocab, c.Dim)
	return model.New(ts...)
}

// AddLoRA returns m with a rank-r LoRA adapter on every Linear layer whose
// name ends in one of targets (lm.LoRATargets names them): A [r, in] uniform
// in ±1/√in (Kaiming, as PEFT does), B [out, r] zero, so the adapted model
// computes exactly what m does until B trains. Adapters follow their weight
// in the tensor order.
//
// A layer-list model (IsSeq) names its dense layers by position instead:
// targets such as "6", "8" adapt those layers (AddSeqLoRA).
func AddLoRA(m *model.Model, rank int, targets []string, seed uint64) (*model.Model, error) {
	if IsSeq(m) {
		var layers []int
		for _, t := range targets {
			l, err := strconv.Atoi(t)
			if err != nil {
				return nil, fmt.Errorf("%w: LoRA target %q: a layer list's targets are the positions of its dense layers (e.g. 6,8)", ErrArch, t)
			}
			layers = append(layers, l)
		}
		return AddSeqLoRA(m, rank, seed, layers...)
	}
	if rank < 1 || rank > lm.MaxRank {
		return nil, fmt.Errorf("%w: LoRA rank %d, want 1..%d", ErrArch, rank, lm.MaxRank)
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("%w: LoRA needs at least one target (%s)", ErrArch, strings.Join(lm.LoRATargets, ", "))
	}
	for _, t := range targets {
		if !slices.Contains(lm.LoRATargets, t) {
			return nil, fmt.Errorf("%w: LoRA target %q, want one of %s", ErrArch, t, strings.Join(lm.LoRATargets, ", "))
		}
	}
	ps, _ := lmParams(m)
	if _, err := lm.Parse(ps, 1); err != nil {
		return nil, fmt.Errorf("add lora: %w", err)
	}
	r := splitMix(seed)
	var ts []model.Tensor
	added := 0
	for _, t := range m.Tensors {
		ts = append(ts, model.Tensor{Name: t.Name, Shape: slices.Clone(t.Shape), Data: slices.Clone(t.Data)})
		base, ok := strings.CutSuffix(t.Name, ".weight")
		if !ok || len(t.Shape) != 2 || !slices.ContainsFunc(targets, func(s string) bool { return base == s || strings.HasSuffix(base, "."+s) }) {
			continue
		}
		if strings.HasSuffix(base, "_emb") {
			continue
		}
		if tensorOf(m, base+".lora_a") != nil {
			return nil, fmt.Errorf("%w: %s already has a LoRA adapter (fold it in first: fleetlearn model lora merge)", ErrArch, base)
		}
		ts = append(ts, loraPair(base, t.Shape[0], t.Shape[1], rank, &r)...)
		added++
	}
	if added == 0 {
		return nil, fmt.Errorf("%w: no Linear layer matches LoRA targets %v", ErrArch, targets)
	}
	return model.New(ts...)
}

// loraPair is a fresh adapter of base (a Linear weight out×in): A [r, in]
// uniform in ±1/√in (Kaiming, as PEFT does), B [out, r] zero.
func loraPair(base string, out, in, rank int, r *splitMix) []model.Tensor {
	a := make([]float32, rank*in)
	bound := 1 / math.Sqrt(float64(in))
	for i := range a {
		a[i] = float32((2*r.float64() - 1) * bound)
	}
	return []model.Tensor{{Name: base + ".lora_a", Shape: []int{rank, in}, Data: a},
		{Name: base + ".lora_b", Shape: []int{out, rank}, Data: make([]float32, out*rank)}}
}

// LoRAParams lists the indices of m's LoRA adapter tensors: the trainable
// list of a LoRA fine-tuning task.
func LoRAParams(m *model.Model) []int {
	var idx []int
	for i, t := range m.Tensors {
		if lm.IsLoRA(t.Name) {
			idx = append(idx, i)
		}
	}
	return idx
}

// MergeLoRA returns m with every adapter folded into its weight, W + B·A
// (computed in float64 per value), and the adapter tensors removed: the
// model a LoRA fine-tuning exports.
func MergeLoRA(m *model.Model) (*model.Model, error) {
	var ts []model.Tensor
	for _, t := range m.Tensors {
		if lm.IsLoRA(t.Name) {
			continue
		}
		nt := model.Tensor{Name: t.Name, Shape: slices.Clone(t.Shape), Data: slices.Clone(t.Data)}
		if base, ok := strings.CutSuffix(t.Name, ".weight"); ok {
			a, b := tensorOf(m, base+".lora_a"), tensorOf(m, base+".lora_b")
			if (a == nil) != (b == nil) {
				return nil, fmt.Errorf("%w: %s has only one of lora_a and lora_b", ErrArch, base)
			}
			if a != nil {
				if len(t.Shape) != 2 || len(a.Shape) != 2 || len(b.Shape) != 2 ||
					a.Shape[1] != t.Shape[1] || b.Shape[0] != t.Shape[0] || b.Shape[1] != a.Shape[0] {
					return nil, fmt.Errorf("%w: %s %v with adapters %v, %v", ErrArch, base, t.Shape, a.Shape, b.Shape)
				}
				out, in, rank := t.Shape[0], t.Shape[1], a.Shape[0]
				for i := 0; i < out; i++ {
					for j := 0; j < in; j++ {
						var s float64
						for k := 0; k < rank; k++ {
							s += float64(b.Data[i*rank+k]) * float64(a.Data[k*in+j])
						}
						nt.Data[i*in+j] = float32(float64(nt.Data[i*in+j]) + s)
					}
				}
			}
		}
		ts = append(ts, nt)
	}
	out, err := model.New(ts...)
	if err != nil {
		return nil, err
	}
	out.Arch = m.Arch // a layer list's dense layers merge like any Linear
	return out, nil
}

func tensorOf(m *model.Model, name string) *model.Tensor {
	for i := range m.Tensors {
		if m.Tensors[i].Name == name {
			return &m.Tensors[i]
		}
	}
	return nil
}
