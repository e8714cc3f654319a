package train

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// The kernels package seq's layer lists need beyond package lm's.

func opt(m *kernel.Mat) kernel.Mat {
	if m == nil {
		return kernel.Mat{}
	}
	return *m
}

func (k *kops) ReLU(x, y *kernel.Mat)          { k.fail("relu", kernel.ReLU(*x, *y)) }
func (k *kops) ReLUGrad(dy, x, dx *kernel.Mat) { k.fail("relu_grad", kernel.ReLUGrad(*dy, *x, *dx)) }

func conv(inC, inH, inW, outC, kk, stride, pad int) kernel.Conv2D {
	return kernel.Conv2D{InC: inC, InH: inH, InW: inW, OutC: outC, KH: kk, KW: kk, Stride: stride, Pad: pad}
}

func (k *kops) Conv2D(x, w, b, y *kernel.Mat, inC, inH, inW, kk, stride, pad int) {
	k.fail("conv2d", kernel.Conv2DForward(conv(inC, inH, inW, w.Rows, kk, stride, pad), *x, *w, opt(b), *y, nil))
}
func (k *kops) Conv2DGrad(dy, x, w, dx, dw, db *kernel.Mat, inC, inH, inW, kk, stride, pad int) {
	k.fail("conv2d_grad", kernel.Conv2DGrad(conv(inC, inH, inW, w.Rows, kk, stride, pad), *dy, *x, *w, opt(dx), opt(dw), opt(db), nil))
}
func (k *kops) MaxPool2D(x, y *kernel.Mat, c, h, w, kk, stride int) {
	k.fail("max_pool2d", kernel.MaxPool2D(kernel.Pool2D{C: c, H: h, W: w, K: kk, Stride: stride}, *x, *y))
}
func (k *kops) MaxPool2DGrad(dy, x, dx *kernel.Mat, c, h, w, kk, stride int) {
	k.fail("max_pool2d_grad", kernel.MaxPool2DGrad(kernel.Pool2D{C: c, H: h, W: w, K: kk, Stride: stride}, *dy, *x, *dx))
}
func (k *kops) AvgPool2D(x, y *kernel.Mat, c, h, w, kk, stride int) {
	k.fail("avg_pool2d", kernel.AvgPool2D(kernel.Pool2D{C: c, H: h, W: w, K: kk, Stride: stride}, *x, *y))
}
func (k *kops) AvgPool2DGrad(dy, dx *kernel.Mat, c, h, w, kk, stride int) {
	k.fail("avg_pool2d_grad", kernel.AvgPool2DGrad(kernel.Pool2D{C: c, H: h, W: w, K: kk, Stride: stride}, *dy, *dx))
}
func (k *kops) GroupNorm(x, gamma, beta, y, mean, rstd *kernel.Mat, groups, channels int, eps float32) {
	k.fail("group_norm", kernel.GroupNorm(*x, *gamma, *beta, *y, *mean, *rstd, groups, channels, eps))
}
func (k *kops) GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta *kernel.Mat, groups, channels int) {
	k.fail("group_norm_grad", kernel.GroupNormGrad(*dy, *x, *gamma, *mean, *rstd, *dx, *dgamma, *dbeta, groups, channels))
}
func (k *kops) Dropout(x, y *kernel.Mat, p float32, seed uint64) {
	k.fail("dropout", kernel.Dropout(*x, *y, p, seed))
}
func (k *kops) DropoutGrad(dy, dx *kernel.Mat, p float32, seed uint64) {
	k.fail("dropout_grad", kernel.DropoutGrad(*dy, *dx, p, seed))
}

// IsSeq says whether m is a layer-list model (package seq): its Arch says so.
func IsSeq(m *model.Model) bool { return m != nil && strings.HasPrefix(m.Arch, seq.Prefix) }

// InitSeq returns the untrained model of a layer list: convolution and
// dense weights uniform in ±sqrt(6/fan_in) (He uniform, as InitMLP), zero
// biases, normalisation weights one and biases zero, drawn from a
// SplitMix64 stream so the result depends on the architecture and seed
// alone. The model's Arch is a's canonical form.
func InitSeq(a *seq.Arch, seed uint64) (*model.Model, error) {
	r := splitMix(seed)
	var ts []model.Tensor
	for _, p := range a.ParamList() {
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		v := make([]float32, n)
		l := a.Layers[p.Layer]
		switch {
		case p.Bias:
		case l.Kind == seq.GroupNorm || l.Kind == seq.LayerNorm:
			for i := range v {
				v[i] = 1
			}
		default:
			fanIn := n / p.Shape[0]
			bound := math.Sqrt(6 / float64(fanIn))
			for i := range v {
				v[i] = float32((2*r.float64() - 1) * bound)
			}
		}
		ts = append(ts, model.Tensor{Name: p.Name, Shape: p.Shape, Data: v})
	}
	m, err := model.New(ts...)
	if err != nil {
		return nil, err
	}
	m.Arch = a.String()
	return m, nil
}

// seqModel parses m's architecture, checks it against d and binds m's
// tensors (copies, which training changes) as kernel matrices.
func seqModel(m *model.Model, d *data.Dataset, trainable []int) (*seq.Arch, *seq.Model[*kernel.Mat], *model.Model, error) {
	a, err := seq.Parse(m.Arch)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", ErrArch, err)
	}
	if err := a.Check(d.Dim, d.NumClasses); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", ErrArch, err)
	}
	own := m.Clone()
	names := make([]string, len(own.Tensors))
	shapes := make([][]int, len(own.Tensors))
	params := make([]*kernel.Mat, len(own.Tensors))
	for i, t := range own.Tensors {
		names[i], shapes[i] = t.Name, t.Shape
		r, c := seq.MatShape(t.Shape)
		params[i] = &kernel.Mat{Rows: r, Cols: c, Data: t.Data}
	}
	bind, err := a.Bind(names, shapes)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", ErrArch, err)
	}
	sm := &seq.Model[*kernel.Mat]{Params: params, Shapes: shapes, Bind: bind}
	if len(trainable) > 0 {
		sm.Trainable = make([]bool, len(params))
		for _, i := range trainable {
			if i < 0 || i >= len(params) {
				return nil, nil, nil, fmt.Errorf("%w: trainable tensor %d of %d", ErrArch, i, len(params))
			}
			sm.Trainable[i] = true
		}
	}
	return a, sm, own, nil
}

// TrainSeq trains a layer-list model (IsSeq) on d as the seq module does,
// with the same kernels in the same order, so the weights agree bit for
// bit; trainable lists the tensors that change (none: all), as a task's
// trainable list does.
func TrainSeq(m *model.Model, d *data.Dataset, h sgd.Hyper, seed uint64, trainable []int) (*model.Model, seq.Metrics, error) {
	a, sm, own, err := seqModel(m, d, trainable)
	if err != nil {
		return nil, seq.Metrics{}, fmt.Errorf("train seq: %w", err)
	}
	k := &kops{d: d}
	met, err := seq.Train[*kernel.Mat](k, a, sm, h, d.Len(), seed)
	if err = errors.Join(err, k.err); err != nil {
		return nil, met, fmt.Errorf("train seq: %w", err)
	}
	if !finiteModel(own) || math.IsNaN(met.Loss) || math.IsInf(met.Loss, 0) {
		return nil, met, fmt.Errorf("train seq: %w", ErrDiverged)
	}
	return own, met, nil
}

// EvaluateSeq measures a layer-list model on d in batches of batch examples.
func EvaluateSeq(m *model.Model, d *data.Dataset, batch int) (seq.Metrics, error) {
	a, sm, _, err := seqModel(m, d, nil)
	if err != nil {
		return seq.Metrics{}, fmt.Errorf("evaluate seq: %w", err)
	}
	k := &kops{d: d}
	met, err := seq.Evaluate[*kernel.Mat](k, a, sm, sgd.Hyper{EvalBatchSize: max(1, batch)}, d.Len())
	if err = errors.Join(err, k.err); err != nil {
		return seq.Metrics{}, fmt.Errorf("evaluate seq: %w", err)
	}
	return met, nil
}

// AddSeqLoRA returns the layer-list model m with a rank-r LoRA adapter on
// the dense layers at the positions in layers (none: every dense layer): A
// [r, in] uniform in ±1/√in, B [out, r] zero, so the adapted model computes
// exactly what m does until B trains. Adapters follow their weight in the
// tensor order, as AddLoRA places them.
func AddSeqLoRA(m *model.Model, rank int, seed uint64, layers ...int) (*model.Model, error) {
	if !IsSeq(m) {
		return nil, fmt.Errorf("%w: add lora: the model records no layer list", ErrArch)
	}
	if rank < 1 || rank > seq.MaxRank {
		return nil, fmt.Errorf("%w: LoRA rank %d, want 1..%d", ErrArch, rank, seq.MaxRank)
	}
	a, err := seq.Parse(m.Arch)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrArch, err)
	}
	want := map[int]bool{}
	for _, l := range layers {
		if l < 0 || l >= len(a.Layers) || a.Layers[l].Kind != seq.Dense {
			return nil, fmt.Errorf("%w: layer %d of %s is not a dense layer", ErrArch, l, m.Arch)
		}
		want[l] = true
	}
	r := splitMix(seed)
	var ts []model.Tensor
	added := 0
	for _, t := range m.Tensors {
		ts = append(ts, model.Tensor{Name: t.Name, Shape: append([]int(nil), t.Shape...), Data: append([]float32(nil), t.Data...)})
		base, ok := strings.CutSuffix(t.Name, ".weight")
		if !ok {
			continue
		}
		li, err := strconv.Atoi(base)
		if err != nil || li < 0 || li >= len(a.Layers) || a.Layers[li].Kind != seq.Dense || (len(want) > 0 && !want[li]) {
			continue
		}
		if tensorOf(m, base+".lora_a") != nil {
			return nil, fmt.Errorf("%w: layer %s already has a LoRA adapter (fold it in first: fleetlearn model lora merge)", ErrArch, base)
		}
		ts = append(ts, loraPair(base, t.Shape[0], t.Shape[1], rank, &r)...)
		added++
	}
	if added == 0 {
		return nil, fmt.Errorf("%w: %s has no dense layer to adapt", ErrArch, m.Arch)
	}
	out, err := model.New(ts...)
	if err != nil {
		return nil, err
	}
	out.Arch = m.Arch
	return out, nil
}
