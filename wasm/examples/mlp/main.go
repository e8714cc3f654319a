//go:build wasip1

// Command mlp is Fleetlearn's example multi-layer perceptron update module: a
// stack of Linear layers (fc1, fc2, … with PyTorch's [out, in] weight layout) and
// ReLU between them, trained by mini-batch SGD with an optional FedProx term.
// It mirrors the native reference trainer (package train) call for call, so both
// produce the same weights from the same inputs.
//
// fleetlearn ships it built (`fleetlearn module example mlp`, from
// wasm/examples/embedded); to build it yourself:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o mlp.wasm ./wasm/examples/mlp
package main

import (
	"fmt"

	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/wasm/sdk"
)

func init() { sdk.Handle(train, evaluate) }

func main() {}

type layer struct{ w, b sdk.Tensor }

// net holds batch-sized scratch tensors; see package train for the same layout.
type net struct {
	layers        []layer
	acts, grads   []sdk.Tensor
	dw, db        []sdk.Tensor
	labels        sdk.Tensor
	widths        []int
	rows, classes int
}

func layers(req *sdk.Request) ([]layer, []int, error) {
	p := req.Params
	if len(p) == 0 || len(p)%2 != 0 {
		return nil, nil, fmt.Errorf("mlp: want weight/bias pairs, got %d parameters", len(p))
	}
	widths := []int{req.Data.Dim}
	var ls []layer
	for i := 0; i < len(p); i += 2 {
		w, b := p[i], p[i+1]
		n := i/2 + 1
		if w.Name != fmt.Sprintf("fc%d.weight", n) || b.Name != fmt.Sprintf("fc%d.bias", n) ||
			len(w.Shape) != 2 || len(b.Shape) != 1 || w.Shape[1] != widths[len(widths)-1] || b.Shape[0] != w.Shape[0] {
			return nil, nil, fmt.Errorf("mlp: layer %d: %s%v %s%v does not continue width %d", n, w.Name, w.Shape, b.Name, b.Shape, widths[len(widths)-1])
		}
		ls = append(ls, layer{sdk.Param(i), sdk.Param(i + 1)})
		widths = append(widths, w.Shape[0])
	}
	if widths[len(widths)-1] != req.Data.Classes {
		return nil, nil, fmt.Errorf("mlp: output width %d, dataset has %d classes", widths[len(widths)-1], req.Data.Classes)
	}
	return ls, widths, nil
}

func newNet(ls []layer, widths []int, rows int) *net {
	n := &net{layers: ls, widths: widths, rows: rows}
	n.acts = append(n.acts, sdk.NewTensor(rows, widths[0]))
	for i := range ls {
		n.acts = append(n.acts, sdk.NewTensor(rows, widths[i+1]))
		n.grads = append(n.grads, sdk.NewTensor(rows, widths[i+1]))
		n.dw = append(n.dw, sdk.NewTensor(widths[i+1], widths[i]))
		n.db = append(n.db, sdk.NewTensor(1, widths[i+1]))
	}
	n.labels = sdk.NewTensor(rows, 1)
	return n
}

func (n *net) gather(idx []int32) {
	if len(idx) != n.rows {
		n.rows = len(idx)
		for i, t := range n.acts {
			t.Resize(n.rows, n.widths[i])
		}
		for i, t := range n.grads {
			t.Resize(n.rows, n.widths[i+1])
		}
		n.labels.Resize(n.rows, 1)
	}
	sdk.Gather(n.acts[0], n.labels, idx)
}

func (n *net) forward() sdk.Tensor {
	for i, l := range n.layers {
		out := n.acts[i+1]
		sdk.Gemm(false, true, 1, n.acts[i], l.w, 0, out)
		sdk.BiasAdd(out, l.b)
		if i < len(n.layers)-1 {
			sdk.ReLU(out, out)
		}
	}
	return n.acts[len(n.layers)]
}

func (n *net) backward() {
	for i := len(n.layers) - 1; i >= 0; i-- {
		g := n.grads[i]
		sdk.Gemm(true, false, 1, g, n.acts[i], 0, n.dw[i])
		sdk.ColSum(g, n.db[i])
		if i == 0 {
			break
		}
		prev := n.grads[i-1]
		sdk.Gemm(false, false, 1, g, n.layers[i].w, 0, prev)
		sdk.ReLUGrad(prev, n.acts[i], prev)
	}
}

func train(req *sdk.Request) (*sdk.Result, error) {
	h, err := sgd.ParseHyper(req.Hyper)
	if err != nil {
		return nil, err
	}
	ls, widths, err := layers(req)
	if err != nil {
		return nil, err
	}
	examples := req.Data.Examples
	if examples == 0 {
		return nil, fmt.Errorf("mlp: no local examples")
	}
	var anchor []layer // FedProx pulls towards the weights the round started from
	if h.Mu > 0 {
		for _, l := range ls {
			a := layer{sdk.NewTensor(l.w.Rows(), l.w.Cols()), sdk.NewTensor(1, l.b.Cols())}
			a.w.CopyFrom(l.w)
			a.b.CopyFrom(l.b)
			anchor = append(anchor, a)
		}
	}
	n := newNet(ls, widths, min(h.BatchSize, examples))
	var lossSum float64
	correct := 0
	for epoch := 0; epoch < h.Epochs; epoch++ {
		lossSum, correct = 0, 0
		for _, batch := range sgd.Batches(sgd.Order(examples, req.Seed, epoch), h.BatchSize) {
			n.gather(batch)
			logits := n.forward()
			loss := sdk.SoftmaxXent(logits, n.labels, n.grads[len(ls)-1])
			c := sdk.CountCorrect(logits, n.labels)
			n.backward()
			for i, l := range ls {
				if h.Mu > 0 {
					sdk.Axpy(h.Mu, l.w, n.dw[i])
					sdk.Axpy(-h.Mu, anchor[i].w, n.dw[i])
					sdk.Axpy(h.Mu, l.b, n.db[i])
					sdk.Axpy(-h.Mu, anchor[i].b, n.db[i])
				}
				sdk.Axpy(-h.LearningRate, n.dw[i], l.w)
				sdk.Axpy(-h.LearningRate, n.db[i], l.b)
			}
			lossSum += loss * float64(len(batch))
			correct += c
		}
	}
	return &sdk.Result{NumExamples: examples, Metrics: map[string]float64{
		"loss":     lossSum / float64(examples),
		"accuracy": float64(correct) / float64(examples),
	}}, nil
}

func evaluate(req *sdk.Request) (*sdk.Result, error) {
	h, err := sgd.ParseHyper(req.Hyper)
	if err != nil {
		return nil, err
	}
	ls, widths, err := layers(req)
	if err != nil {
		return nil, err
	}
	examples := req.Data.Examples
	if examples == 0 {
		return nil, fmt.Errorf("mlp: no local examples")
	}
	n := newNet(ls, widths, min(h.EvalBatchSize, examples))
	var lossSum float64
	correct := 0
	idx := make([]int32, 0, h.EvalBatchSize)
	for start := 0; start < examples; start += h.EvalBatchSize {
		idx = idx[:0]
		for i := start; i < min(start+h.EvalBatchSize, examples); i++ {
			idx = append(idx, int32(i))
		}
		n.gather(idx)
		logits := n.forward()
		lossSum += sdk.SoftmaxXent(logits, n.labels, sdk.None) * float64(len(idx))
		correct += sdk.CountCorrect(logits, n.labels)
	}
	return &sdk.Result{NumExamples: examples, Metrics: map[string]float64{
		"loss":     lossSum / float64(examples),
		"accuracy": float64(correct) / float64(examples),
	}}, nil
}
