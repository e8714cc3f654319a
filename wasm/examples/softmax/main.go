//go:build wasip1

// Command softmax is Fleetlearn's smallest example update module: multinomial
// logistic regression (one Linear layer "fc1", no hidden layer) trained by
// mini-batch SGD. It also reports the L2 norm of its weight change, computed
// host-side, as the metric "update_norm".
//
// fleetlearn ships it built (`fleetlearn module example softmax`, from
// wasm/examples/embedded); to build it yourself:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o softmax.wasm ./wasm/examples/softmax
package main

import (
	"fmt"

	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/wasm/sdk"
)

func init() { sdk.Handle(train, evaluate) }

func main() {}

func check(req *sdk.Request) error {
	p := req.Params
	if len(p) != 2 || p[0].Name != "fc1.weight" || p[1].Name != "fc1.bias" || len(p[0].Shape) != 2 ||
		p[0].Shape[0] != req.Data.Classes || p[0].Shape[1] != req.Data.Dim {
		return fmt.Errorf("softmax: want fc1.weight [%d %d] and fc1.bias", req.Data.Classes, req.Data.Dim)
	}
	if req.Data.Examples == 0 {
		return fmt.Errorf("softmax: no local examples")
	}
	return nil
}

func train(req *sdk.Request) (*sdk.Result, error) {
	h, err := sgd.ParseHyper(req.Hyper)
	if err != nil {
		return nil, err
	}
	if err := check(req); err != nil {
		return nil, err
	}
	w, b := sdk.Param(0), sdk.Param(1)
	start := sdk.NewTensor(w.Rows(), w.Cols())
	start.CopyFrom(w)
	n, dim, classes := req.Data.Examples, req.Data.Dim, req.Data.Classes
	rows := min(h.BatchSize, n)
	x, y := sdk.NewTensor(rows, dim), sdk.NewTensor(rows, 1)
	logits := sdk.NewTensor(rows, classes)
	dw, db := sdk.NewTensor(classes, dim), sdk.NewTensor(1, classes)
	var lossSum float64
	for epoch := 0; epoch < h.Epochs; epoch++ {
		lossSum = 0
		for _, batch := range sgd.Batches(sgd.Order(n, req.Seed, epoch), h.BatchSize) {
			if len(batch) != rows {
				rows = len(batch)
				x.Resize(rows, dim)
				y.Resize(rows, 1)
				logits.Resize(rows, classes)
			}
			sdk.Gather(x, y, batch)
			sdk.Gemm(false, true, 1, x, w, 0, logits)
			sdk.BiasAdd(logits, b)
			// The gradient overwrites the logits: they are not needed afterwards.
			lossSum += sdk.SoftmaxXent(logits, y, logits) * float64(len(batch))
			sdk.Gemm(true, false, 1, logits, x, 0, dw)
			sdk.ColSum(logits, db)
			sdk.Axpy(-h.LearningRate, dw, w)
			sdk.Axpy(-h.LearningRate, db, b)
		}
	}
	sdk.Axpy(-1, w, start) // start = w0 - w
	return &sdk.Result{NumExamples: n, Metrics: map[string]float64{
		"loss":        lossSum / float64(n),
		"update_norm": sdk.Norm2(start),
	}}, nil
}

func evaluate(req *sdk.Request) (*sdk.Result, error) {
	if err := check(req); err != nil {
		return nil, err
	}
	n, dim, classes := req.Data.Examples, req.Data.Dim, req.Data.Classes
	x, y, logits := sdk.NewTensor(n, dim), sdk.NewTensor(n, 1), sdk.NewTensor(n, classes)
	idx := make([]int32, n)
	for i := range idx {
		idx[i] = int32(i)
	}
	sdk.Gather(x, y, idx)
	sdk.Gemm(false, true, 1, x, sdk.Param(0), 0, logits)
	sdk.BiasAdd(logits, sdk.Param(1))
	loss := sdk.SoftmaxXent(logits, y, sdk.None)
	return &sdk.Result{NumExamples: n, Metrics: map[string]float64{
		"loss":     loss,
		"accuracy": float64(sdk.CountCorrect(logits, y)) / float64(n),
	}}, nil
}
