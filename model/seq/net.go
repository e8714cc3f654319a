package seq

import (
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// normEps is every normalisation layer's epsilon, PyTorch's default.
const normEps = defaultNormEps

// Metrics summarise a pass over a dataset: mean cross-entropy, the
// fraction of arg-max hits, and the examples seen (per epoch).
type Metrics struct {
	Loss     float64
	Accuracy float64
	Examples int
}

// Check says whether the architecture fits a dataset of examples of dim
// values and classes labels.
func (a *Arch) Check(dim, classes int) error {
	if a.Input.Size() != dim {
		return fmt.Errorf("%w: the architecture's input %v has %d values, the dataset's examples %d", ErrArch, a.Input, a.Input.Size(), dim)
	}
	if out := a.Output().C; out != classes {
		return fmt.Errorf("%w: the last layer has %d outputs, the dataset %d classes", ErrArch, out, classes)
	}
	return nil
}

// Model is the parameters a Net trains: handles in model order, their
// shapes, which may change, and which tensors each layer uses.
type Model[T comparable] struct {
	Params    []T
	Shapes    [][]int
	Trainable []bool // nil: all
	Bind      []Binding
}

func (m *Model[T]) trains(i int) bool {
	return i >= 0 && (m.Trainable == nil || m.Trainable[i])
}

// net is an architecture on one Ops with batch-sized buffers.
type net[T comparable] struct {
	o      Ops[T]
	a      *Arch
	m      *Model[T]
	rows   int
	x      T
	lab    T
	acts   []T // output of each layer; a flatten's, and an evaluation dropout's, is its input's
	dacts  []T // gradient of each layer's output (backward only)
	mean   []T
	rstd   []T
	loraH  []T // x·Aᵀ of adapted dense layers
	dh     []T
	grads  []T // per tensor, for the trainable ones
	zg     []T // norm gradients of frozen layers the backward pass crosses
	zb     []T
	lowest int // lowest layer the backward pass reaches (len(Layers): none)
	train  bool
}

type sized[T comparable] struct {
	t    T
	cols int
}

func newNet[T comparable](o Ops[T], a *Arch, m *Model[T], rows int, train bool) (*net[T], []sized[T]) {
	n := &net[T]{o: o, a: a, m: m, rows: rows, train: train}
	var bufs []sized[T]
	buf := func(cols int) T {
		t := o.New(rows, cols)
		bufs = append(bufs, sized[T]{t, cols})
		return t
	}
	n.x = buf(a.Input.Size())
	n.lab = buf(1)
	L := len(a.Layers)
	n.acts = make([]T, L)
	n.mean, n.rstd = make([]T, L), make([]T, L)
	n.loraH, n.dh = make([]T, L), make([]T, L)
	n.zg, n.zb = make([]T, L), make([]T, L)
	// The backward pass stops below the lowest layer with a trainable tensor.
	n.lowest = L
	if train {
		for i := range a.Layers {
			b := m.Bind[i]
			if m.trains(b.W) || m.trains(b.B) || m.trains(b.LoraA) || m.trains(b.LoraB) {
				n.lowest = i
				break
			}
		}
	}
	in := n.x
	for i, l := range a.Layers {
		switch {
		case l.Kind == Flatten, l.Kind == Dropout && !train:
			n.acts[i] = in
		default:
			n.acts[i] = buf(l.OutShape.Size())
		}
		switch l.Kind {
		case GroupNorm:
			n.mean[i], n.rstd[i] = buf(l.Groups), buf(l.Groups)
		case LayerNorm:
			n.mean[i], n.rstd[i] = buf(1), buf(1)
		case Dense:
			if r := m.Bind[i].Rank; r > 0 {
				n.loraH[i] = buf(r)
				if train {
					n.dh[i] = buf(r)
				}
			}
		}
		in = n.acts[i]
	}
	if train {
		n.dacts = make([]T, L)
		for i := n.lowest; i < L; i++ {
			if a.Layers[i].Kind == Flatten {
				// A flatten's output gradient is its input's. It has no
				// tensors, so it is never the lowest layer: i-1 has one.
				n.dacts[i] = n.dacts[i-1]
			} else {
				n.dacts[i] = buf(a.Layers[i].OutShape.Size())
			}
		}
		n.grads = make([]T, len(m.Params))
		for i := range m.Params {
			if m.trains(i) {
				r, c := MatShape(m.Shapes[i])
				n.grads[i] = o.New(r, c)
			}
		}
		for i, l := range a.Layers {
			b := m.Bind[i]
			if (l.Kind == GroupNorm || l.Kind == LayerNorm) && i >= n.lowest {
				if !m.trains(b.W) {
					r, c := MatShape(m.Shapes[b.W])
					n.zg[i] = o.New(r, c)
				}
				if !m.trains(b.B) {
					r, c := MatShape(m.Shapes[b.B])
					n.zb[i] = o.New(r, c)
				}
			}
		}
	}
	return n, bufs
}

// input is layer i's input.
func (n *net[T]) input(i int) T {
	if i == 0 {
		return n.x
	}
	return n.acts[i-1]
}

// DropoutSeed is the mask seed of the dropout layer at position layer for
// the batch-th batch of epoch in a call seeded seed: a SplitMix64 mix, the
// same for the module and the native trainer.
func DropoutSeed(seed uint64, epoch, batch, layer int) uint64 {
	z := seed
	for _, v := range [...]uint64{uint64(epoch), uint64(batch), uint64(layer)} {
		z += 0x9e3779b97f4a7c15 ^ v
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
	}
	return z
}

func (n *net[T]) forward(seed uint64, epoch, batch int) T {
	o, p := n.o, n.m.Params
	for i, l := range n.a.Layers {
		in, out, b := n.input(i), n.acts[i], n.m.Bind[i]
		s := l.In
		switch l.Kind {
		case Conv:
			o.Conv2D(in, p[b.W], p[b.B], out, s.C, s.H, s.W, l.K, l.Stride, l.Pad)
		case Dense:
			o.Gemm(false, true, 1, in, p[b.W], 0, out)
			if b.Rank > 0 {
				o.Gemm(false, true, 1, in, p[b.LoraA], 0, n.loraH[i])
				o.Gemm(false, true, 1, n.loraH[i], p[b.LoraB], 1, out)
			}
			o.BiasAdd(out, p[b.B])
		case ReLU:
			o.ReLU(in, out)
		case MaxPool:
			o.MaxPool2D(in, out, s.C, s.H, s.W, l.K, l.Stride)
		case AvgPool:
			o.AvgPool2D(in, out, s.C, s.H, s.W, l.K, l.Stride)
		case GroupNorm:
			o.GroupNorm(in, p[b.W], p[b.B], out, n.mean[i], n.rstd[i], l.Groups, s.C, normEps)
		case LayerNorm:
			o.LayerNorm(in, p[b.W], p[b.B], out, n.mean[i], n.rstd[i], normEps)
		case Dropout:
			if n.train {
				o.Dropout(in, out, float32(l.P), DropoutSeed(seed, epoch, batch, i))
			}
		}
	}
	return n.acts[len(n.acts)-1]
}

// backward turns the gradient of the logits, in the last layer's dacts,
// into the trainable tensors' gradients.
func (n *net[T]) backward(seed uint64, epoch, batch int) {
	o, p, m := n.o, n.m.Params, n.m
	var none T
	grad := func(i int) T {
		if m.trains(i) {
			return n.grads[i]
		}
		return none
	}
	for i := len(n.a.Layers) - 1; i >= n.lowest; i-- {
		l, b := n.a.Layers[i], m.Bind[i]
		in, dy := n.input(i), n.dacts[i]
		dx := none
		if i > n.lowest {
			dx = n.dacts[i-1]
		}
		s := l.In
		switch l.Kind {
		case Conv:
			dw, db := grad(b.W), grad(b.B)
			if dw != none {
				o.Fill(dw, 0)
			}
			if db != none {
				o.Fill(db, 0)
			}
			if dw != none || db != none || dx != none {
				o.Conv2DGrad(dy, in, p[b.W], dx, dw, db, s.C, s.H, s.W, l.K, l.Stride, l.Pad)
			}
		case Dense:
			if dw := grad(b.W); dw != none {
				o.Gemm(true, false, 1, dy, in, 0, dw)
			}
			if db := grad(b.B); db != none {
				o.ColSum(dy, db)
			}
			if b.Rank > 0 {
				// out += h·Bᵀ with h = x·Aᵀ: dB = dyᵀ·h, dh = dy·B, dA = dhᵀ·x.
				if dB := grad(b.LoraB); dB != none {
					o.Gemm(true, false, 1, dy, n.loraH[i], 0, dB)
				}
				dA := grad(b.LoraA)
				if dA != none || dx != none {
					o.Gemm(false, false, 1, dy, p[b.LoraB], 0, n.dh[i])
				}
				if dA != none {
					o.Gemm(true, false, 1, n.dh[i], in, 0, dA)
				}
			}
			if dx != none {
				o.Gemm(false, false, 1, dy, p[b.W], 0, dx)
				if b.Rank > 0 {
					o.Gemm(false, false, 1, n.dh[i], p[b.LoraA], 1, dx)
				}
			}
		case ReLU:
			if dx != none {
				o.ReLUGrad(dy, in, dx)
			}
		case MaxPool:
			if dx != none {
				o.MaxPool2DGrad(dy, in, dx, s.C, s.H, s.W, l.K, l.Stride)
			}
		case AvgPool:
			if dx != none {
				o.AvgPool2DGrad(dy, dx, s.C, s.H, s.W, l.K, l.Stride)
			}
		case GroupNorm, LayerNorm:
			dg, dbeta := grad(b.W), grad(b.B)
			if dg == none && dbeta == none && dx == none {
				continue
			}
			if dg == none {
				dg = n.zg[i]
			}
			if dbeta == none {
				dbeta = n.zb[i]
			}
			o.Fill(dg, 0)
			o.Fill(dbeta, 0)
			scratch := dx
			if scratch == none {
				// The kernels always write an input gradient; the lowest
				// layer has none to keep, so its own output gradient,
				// no longer needed, takes it.
				scratch = dy
			}
			if l.Kind == GroupNorm {
				o.GroupNormGrad(dy, in, p[b.W], n.mean[i], n.rstd[i], scratch, dg, dbeta, l.Groups, s.C)
			} else {
				o.LayerNormGrad(dy, in, p[b.W], n.mean[i], n.rstd[i], scratch, dg, dbeta)
			}
		case Dropout:
			if dx != none {
				o.DropoutGrad(dy, dx, float32(l.P), DropoutSeed(seed, epoch, batch, i))
			}
		}
	}
}

func resize[T comparable](o Ops[T], bufs []sized[T], rows int) {
	for _, b := range bufs {
		o.Resize(b.t, rows, b.cols)
	}
}

// Train runs h.Epochs epochs of mini-batch SGD over examples local
// examples in sgd.Order, with FedProx's proximal term when h.Mu > 0, on m's
// trainable tensors. Its metrics are the last epoch's.
func Train[T comparable](o Ops[T], a *Arch, m *Model[T], h sgd.Hyper, examples int, seed uint64) (Metrics, error) {
	if examples < 1 {
		return Metrics{}, fmt.Errorf("%w: no local examples", ErrArch)
	}
	rows := min(h.BatchSize, examples)
	n, bufs := newNet(o, a, m, rows, true)
	var anchor []T
	if h.Mu > 0 {
		anchor = make([]T, len(m.Params))
		for i, t := range m.Params {
			if m.trains(i) {
				r, c := MatShape(m.Shapes[i])
				anchor[i] = o.New(r, c)
				o.Copy(anchor[i], t)
			}
		}
	}
	var met Metrics
	for epoch := 0; epoch < h.Epochs; epoch++ {
		var lossSum float64
		correct := 0
		for bi, batch := range sgd.Batches(sgd.Order(examples, seed, epoch), h.BatchSize) {
			if len(batch) != n.rows {
				n.rows = len(batch)
				resize(o, bufs, n.rows)
			}
			o.Gather(n.x, n.lab, batch)
			logits := n.forward(seed, epoch, bi)
			var none T
			dl := none
			if n.lowest < len(a.Layers) {
				dl = n.dacts[len(a.Layers)-1]
			}
			loss := o.SoftmaxXent(logits, n.lab, dl)
			if math.IsNaN(loss) || math.IsInf(loss, 0) {
				// Stop here: every later step would only spread the NaN,
				// and a NaN metric cannot be reported anyway.
				return Metrics{}, fmt.Errorf("%w: the loss is %v at batch %d of epoch %d; lower learning_rate (or the DP noise the model received)", ErrDiverged, loss, bi, epoch)
			}
			correct += o.CountCorrect(logits, n.lab)
			n.backward(seed, epoch, bi)
			for i, t := range m.Params {
				if !m.trains(i) {
					continue
				}
				g := n.grads[i]
				if h.Mu > 0 {
					o.Axpy(h.Mu, t, g)
					o.Axpy(-h.Mu, anchor[i], g)
				}
				o.Axpy(-h.LearningRate, g, t)
			}
			lossSum += loss * float64(len(batch))
		}
		met = Metrics{Loss: lossSum / float64(examples), Accuracy: float64(correct) / float64(examples), Examples: examples}
	}
	return met, nil
}

// Evaluate measures the model on examples local examples in order, in
// batches of h.EvalBatchSize; dropout is off.
func Evaluate[T comparable](o Ops[T], a *Arch, m *Model[T], h sgd.Hyper, examples int) (Metrics, error) {
	if examples < 1 {
		return Metrics{}, fmt.Errorf("%w: no local examples", ErrArch)
	}
	rows := min(h.EvalBatchSize, examples)
	n, bufs := newNet(o, a, m, rows, false)
	var lossSum float64
	correct := 0
	idx := make([]int32, 0, rows)
	var none T
	for start := 0; start < examples; start += rows {
		idx = idx[:0]
		for i := start; i < min(start+rows, examples); i++ {
			idx = append(idx, int32(i))
		}
		if len(idx) != n.rows {
			n.rows = len(idx)
			resize(o, bufs, n.rows)
		}
		o.Gather(n.x, n.lab, idx)
		logits := n.forward(0, 0, 0)
		lossSum += o.SoftmaxXent(logits, n.lab, none) * float64(len(idx))
		correct += o.CountCorrect(logits, n.lab)
	}
	return Metrics{Loss: lossSum / float64(examples), Accuracy: float64(correct) / float64(examples), Examples: examples}, nil
}
