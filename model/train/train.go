// Package train is Fleetlearn's native reference trainer: multi-layer perceptrons
// (softmax regression is the zero-hidden-layer case) trained with mini-batch SGD
// and an optional FedProx proximal term. Cloud pretraining uses it to produce base
// models, and tests use it to cross-check WASM update modules, which call the same
// kernels (package kernel) in the same order through the sandbox's host functions.
//
// Layer i of an MLP is the tensors "fc<i>.weight" with shape [out, in] and
// "fc<i>.bias" with shape [out], counted from 1, as PyTorch's nn.Linear stores them,
// so a PyTorch state dict exported as safetensors loads unchanged.
package train

import (
	"errors"
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// ErrArch reports a model that is not an MLP this trainer understands, or one
// that does not fit the dataset.
var ErrArch = errors.New("train: unsupported model architecture")

// ErrDiverged reports non-finite weights or loss after training.
var ErrDiverged = errors.New("train: training diverged")

// Metrics summarise a pass over a dataset.
type Metrics struct {
	Loss     float64 // mean cross-entropy
	Accuracy float64 // fraction of arg-max hits
	Examples int
}

// InitMLP returns an MLP with the given layer sizes (input first, classes last):
// weights uniform in ±sqrt(6/fan_in) (He uniform, suited to ReLU) and zero biases,
// drawn from a SplitMix64 stream so the result depends on seed alone.
func InitMLP(sizes []int, seed uint64) (*model.Model, error) {
	if len(sizes) < 2 {
		return nil, fmt.Errorf("%w: need at least input and output sizes, got %v", ErrArch, sizes)
	}
	for _, s := range sizes {
		if s < 1 || s > 1<<20 {
			return nil, fmt.Errorf("%w: layer size %d", ErrArch, s)
		}
	}
	r := splitMix(seed)
	var ts []model.Tensor
	for i := 1; i < len(sizes); i++ {
		in, out := sizes[i-1], sizes[i]
		w := make([]float32, in*out)
		bound := math.Sqrt(6 / float64(in))
		for j := range w {
			w[j] = float32((2*r.float64() - 1) * bound)
		}
		ts = append(ts,
			model.Tensor{Name: fmt.Sprintf("fc%d.weight", i), Shape: []int{out, in}, Data: w},
			model.Tensor{Name: fmt.Sprintf("fc%d.bias", i), Shape: []int{out}, Data: make([]float32, out)})
	}
	return model.New(ts...)
}

type splitMix uint64

func (s *splitMix) float64() float64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// layer views one Linear layer's parameters as kernel matrices sharing the model's storage.
type layer struct {
	w, b kernel.Mat // w is out×in, b is 1×out
}

// Layers checks that m is an MLP for inputs of width dim and classes outputs and
// returns its layer sizes.
func Layers(m *model.Model, dim, classes int) ([]int, error) {
	ls, err := layersOf(m, dim, classes)
	if err != nil {
		return nil, err
	}
	sizes := []int{dim}
	for _, l := range ls {
		sizes = append(sizes, l.w.Rows)
	}
	return sizes, nil
}

func layersOf(m *model.Model, dim, classes int) ([]layer, error) {
	if m == nil || len(m.Tensors) == 0 || len(m.Tensors)%2 != 0 {
		return nil, fmt.Errorf("%w: want weight/bias pairs", ErrArch)
	}
	var ls []layer
	in := dim
	for i := 0; i < len(m.Tensors); i += 2 {
		w, b := m.Tensors[i], m.Tensors[i+1]
		n := i/2 + 1
		if w.Name != fmt.Sprintf("fc%d.weight", n) || b.Name != fmt.Sprintf("fc%d.bias", n) {
			return nil, fmt.Errorf("%w: tensors %q,%q, want fc%d.weight,fc%d.bias", ErrArch, w.Name, b.Name, n, n)
		}
		if len(w.Shape) != 2 || len(b.Shape) != 1 || w.Shape[1] != in || b.Shape[0] != w.Shape[0] {
			return nil, fmt.Errorf("%w: layer %d shapes %v,%v after width %d", ErrArch, n, w.Shape, b.Shape, in)
		}
		if len(w.Data) != w.Shape[0]*w.Shape[1] || len(b.Data) != b.Shape[0] {
			return nil, fmt.Errorf("%w: layer %d data length", ErrArch, n)
		}
		ls = append(ls, layer{
			w: kernel.Mat{Rows: w.Shape[0], Cols: w.Shape[1], Data: w.Data},
			b: kernel.Mat{Rows: 1, Cols: b.Shape[0], Data: b.Data},
		})
		in = w.Shape[0]
	}
	if in != classes {
		return nil, fmt.Errorf("%w: output width %d, dataset has %d classes", ErrArch, in, classes)
	}
	return ls, nil
}

// net holds the scratch matrices of one forward/backward pass, sized for a batch.
type net struct {
	layers []layer
	acts   []kernel.Mat // acts[0] is the input batch, acts[i] layer i's output (after ReLU for hidden layers)
	grads  []kernel.Mat // grads[i] is d loss / d acts[i+1]
	dw, db []kernel.Mat
	labels kernel.Mat
}

func newNet(ls []layer, rows int) *net {
	n := &net{layers: ls}
	n.acts = append(n.acts, kernel.NewMat(rows, ls[0].w.Cols))
	for _, l := range ls {
		n.acts = append(n.acts, kernel.NewMat(rows, l.w.Rows))
		n.grads = append(n.grads, kernel.NewMat(rows, l.w.Rows))
		n.dw = append(n.dw, kernel.NewMat(l.w.Rows, l.w.Cols))
		n.db = append(n.db, kernel.NewMat(1, l.w.Rows))
	}
	n.labels = kernel.NewMat(rows, 1)
	return n
}

// resize sets the batch row count, reusing storage sized for the largest batch.
func (n *net) resize(rows int) {
	for i := range n.acts {
		n.acts[i].Rows = rows
	}
	for i := range n.grads {
		n.grads[i].Rows = rows
	}
	n.labels.Rows = rows
}

func (n *net) gather(d *data.Dataset, idx []int32) {
	n.resize(len(idx))
	x := n.acts[0]
	for r, i := range idx {
		copy(x.Data[r*d.Dim:(r+1)*d.Dim], d.Features[int(i)*d.Dim:(int(i)+1)*d.Dim])
		n.labels.Data[r] = float32(d.Labels[i])
	}
}

// forward fills acts and returns the logits (the last activation, before softmax).
func (n *net) forward() (kernel.Mat, error) {
	for i, l := range n.layers {
		out := n.acts[i+1]
		if err := kernel.Gemm(false, true, 1, n.acts[i], l.w, 0, out); err != nil {
			return kernel.Mat{}, err
		}
		if err := kernel.BiasAdd(out, l.b); err != nil {
			return kernel.Mat{}, err
		}
		if i < len(n.layers)-1 {
			if err := kernel.ReLU(out, out); err != nil {
				return kernel.Mat{}, err
			}
		}
	}
	return n.acts[len(n.layers)], nil
}

// backward fills dw and db from the loss gradient already in grads[last].
func (n *net) backward() error {
	for i := len(n.layers) - 1; i >= 0; i-- {
		g := n.grads[i]
		if err := kernel.Gemm(true, false, 1, g, n.acts[i], 0, n.dw[i]); err != nil {
			return err
		}
		if err := kernel.ColSum(g, n.db[i]); err != nil {
			return err
		}
		if i == 0 {
			break
		}
		prev := n.grads[i-1]
		if err := kernel.Gemm(false, false, 1, g, n.layers[i].w, 0, prev); err != nil {
			return err
		}
		// acts[i] holds ReLU output, positive exactly where the pre-activation was.
		if err := kernel.ReLUGrad(prev, n.acts[i], prev); err != nil {
			return err
		}
	}
	return nil
}

// step runs one mini-batch SGD update of n's layers in place and returns the
// batch's mean loss and arg-max hits, both measured before the update. Train
// and Stepper share it so that the two cannot drift apart by a single
// rounding. anchor is nil unless h.Mu > 0.
func (n *net) step(d *data.Dataset, batch []int32, anchor []layer, h sgd.Hyper) (float64, int, error) {
	ls := n.layers
	n.gather(d, batch)
	logits, err := n.forward()
	if err != nil {
		return 0, 0, fmt.Errorf("train: forward: %w", err)
	}
	loss, err := kernel.SoftmaxXent(logits, n.labels, n.grads[len(ls)-1])
	if err != nil {
		return 0, 0, fmt.Errorf("train: loss: %w", err)
	}
	c, err := kernel.CountCorrect(logits, n.labels)
	if err != nil {
		return 0, 0, fmt.Errorf("train: %w", err)
	}
	if err := n.backward(); err != nil {
		return 0, 0, fmt.Errorf("train: backward: %w", err)
	}
	for i, l := range ls {
		if h.Mu > 0 {
			// FedProx: grad += mu·(w − w0).
			_ = kernel.Axpy(h.Mu, l.w, n.dw[i])
			_ = kernel.Axpy(-h.Mu, anchor[i].w, n.dw[i])
			_ = kernel.Axpy(h.Mu, l.b, n.db[i])
			_ = kernel.Axpy(-h.Mu, anchor[i].b, n.db[i])
		}
		_ = kernel.Axpy(-h.LearningRate, n.dw[i], l.w)
		_ = kernel.Axpy(-h.LearningRate, n.db[i], l.b)
	}
	return loss, c, nil
}

// Train runs h.Epochs epochs of mini-batch SGD over d, starting from m, and
// returns the trained model (m is left untouched) and the metrics of the last
// epoch, measured on each batch before its update.
func Train(m *model.Model, d *data.Dataset, h sgd.Hyper, seed uint64) (*model.Model, Metrics, error) {
	if err := h.Validate(); err != nil {
		return nil, Metrics{}, fmt.Errorf("train: %w", err)
	}
	if d == nil || d.Len() == 0 {
		return nil, Metrics{}, fmt.Errorf("train: empty dataset")
	}
	out := m.Clone()
	ls, err := layersOf(out, d.Dim, d.NumClasses)
	if err != nil {
		return nil, Metrics{}, err
	}
	var anchor []layer // FedProx anchors at the weights the round started from.
	if h.Mu > 0 {
		if anchor, err = layersOf(m, d.Dim, d.NumClasses); err != nil {
			return nil, Metrics{}, err
		}
	}
	n := newNet(ls, min(h.BatchSize, d.Len()))
	var met Metrics
	for epoch := 0; epoch < h.Epochs; epoch++ {
		met = Metrics{}
		var lossSum float64
		correct := 0
		for _, batch := range sgd.Batches(sgd.Order(d.Len(), seed, epoch), h.BatchSize) {
			loss, c, err := n.step(d, batch, anchor, h)
			if err != nil {
				return nil, Metrics{}, err
			}
			lossSum += loss * float64(len(batch))
			correct += c
		}
		met = Metrics{Loss: lossSum / float64(d.Len()), Accuracy: float64(correct) / float64(d.Len()), Examples: d.Len()}
	}
	if err := out.Validate(); err != nil || math.IsNaN(met.Loss) || math.IsInf(met.Loss, 0) {
		return nil, met, fmt.Errorf("%w: loss %v: %v", ErrDiverged, met.Loss, err)
	}
	return out, met, nil
}

// Evaluate measures m on d in forward passes of at most batch rows.
func Evaluate(m *model.Model, d *data.Dataset, batch int) (Metrics, error) {
	if d == nil || d.Len() == 0 {
		return Metrics{}, fmt.Errorf("evaluate: empty dataset")
	}
	if batch < 1 {
		return Metrics{}, fmt.Errorf("evaluate: batch size %d", batch)
	}
	ls, err := layersOf(m, d.Dim, d.NumClasses)
	if err != nil {
		return Metrics{}, err
	}
	n := newNet(ls, min(batch, d.Len()))
	var lossSum float64
	correct := 0
	idx := make([]int32, 0, batch)
	for start := 0; start < d.Len(); start += batch {
		idx = idx[:0]
		for i := start; i < min(start+batch, d.Len()); i++ {
			idx = append(idx, int32(i))
		}
		n.gather(d, idx)
		logits, err := n.forward()
		if err != nil {
			return Metrics{}, fmt.Errorf("evaluate: %w", err)
		}
		loss, err := kernel.SoftmaxXent(logits, n.labels, kernel.Mat{})
		if err != nil {
			return Metrics{}, fmt.Errorf("evaluate: %w", err)
		}
		c, err := kernel.CountCorrect(logits, n.labels)
		if err != nil {
			return Metrics{}, fmt.Errorf("evaluate: %w", err)
		}
		lossSum += loss * float64(len(idx))
		correct += c
	}
	return Metrics{Loss: lossSum / float64(d.Len()), Accuracy: float64(correct) / float64(d.Len()), Examples: d.Len()}, nil
}
