//go:build wasip1

// Command seq is Fleetlearn's generic layer-list update module: it trains
// whatever network the model's architecture lists (package seq: convolution,
// pooling, normalisation, dropout and dense layers, "seq:…", read from the
// request's arch, which the host takes from the model file), with
// mini-batch SGD and an optional FedProx term from the task's hyper
// (model/sgd). The network code is package seq's, run here on the sandbox's
// ABI v4 host kernels and natively by package train on the same kernels, so
// both produce the same weights from the same inputs. It trains only the
// parameters the request lists as trainable (partial and LoRA fine-tuning).
//
// fleetlearn ships it built (`fleetlearn module example seq`, from
// wasm/examples/embedded); to build it yourself:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o seq.wasm ./wasm/examples/seq
package main

import (
	"fmt"

	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	sdk "github.com/fleetlearn/fleetlearn/wasm/sdk/v4"
)

func init() { sdk.Handle(train, evaluate) }

func main() {}

// ops is package seq's tensor machine on the host functions; a misuse
// aborts the call on the host side.
type ops struct{}

func (ops) New(rows, cols int) sdk.Tensor            { return sdk.NewTensor(rows, cols) }
func (ops) Resize(t sdk.Tensor, rows, cols int)      { t.Resize(rows, cols) }
func (ops) Fill(t sdk.Tensor, v float32)             { t.Fill(v) }
func (ops) Copy(dst, src sdk.Tensor)                 { dst.CopyFrom(src) }
func (ops) Gather(x, labels sdk.Tensor, idx []int32) { sdk.Gather(x, labels, idx) }
func (ops) BiasAdd(x, b sdk.Tensor)                  { sdk.BiasAdd(x, b) }
func (ops) ColSum(x, out sdk.Tensor)                 { sdk.ColSum(x, out) }
func (ops) Axpy(alpha float32, x, y sdk.Tensor)      { sdk.Axpy(alpha, x, y) }
func (ops) ReLU(x, y sdk.Tensor)                     { sdk.ReLU(x, y) }
func (ops) ReLUGrad(dy, x, dx sdk.Tensor)            { sdk.ReLUGrad(dy, x, dx) }
func (ops) SoftmaxXent(logits, labels, grad sdk.Tensor) float64 {
	return sdk.SoftmaxXent(logits, labels, grad)
}
func (ops) CountCorrect(logits, labels sdk.Tensor) int { return sdk.CountCorrect(logits, labels) }
func (ops) Gemm(ta, tb bool, alpha float32, a, b sdk.Tensor, beta float32, c sdk.Tensor) {
	sdk.Gemm(ta, tb, alpha, a, b, beta, c)
}
func (ops) LayerNorm(x, gamma, beta, y, mean, rstd sdk.Tensor, eps float32) {
	sdk.LayerNorm(x, gamma, beta, y, mean, rstd, eps)
}
func (ops) LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta sdk.Tensor) {
	sdk.LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta)
}
func (ops) Conv2D(x, w, b, y sdk.Tensor, inC, inH, inW, k, stride, pad int) {
	sdk.Conv2D(x, w, b, y, inC, inH, inW, k, k, stride, pad)
}
func (ops) Conv2DGrad(dy, x, w, dx, dw, db sdk.Tensor, inC, inH, inW, k, stride, pad int) {
	sdk.Conv2DGrad(dy, x, w, dx, dw, db, inC, inH, inW, k, k, stride, pad)
}
func (ops) MaxPool2D(x, y sdk.Tensor, c, h, w, k, stride int) {
	sdk.MaxPool2D(x, y, c, h, w, k, stride)
}
func (ops) MaxPool2DGrad(dy, x, dx sdk.Tensor, c, h, w, k, stride int) {
	sdk.MaxPool2DGrad(dy, x, dx, c, h, w, k, stride)
}
func (ops) AvgPool2D(x, y sdk.Tensor, c, h, w, k, stride int) {
	sdk.AvgPool2D(x, y, c, h, w, k, stride)
}
func (ops) AvgPool2DGrad(dy, dx sdk.Tensor, c, h, w, k, stride int) {
	sdk.AvgPool2DGrad(dy, dx, c, h, w, k, stride)
}
func (ops) GroupNorm(x, gamma, beta, y, mean, rstd sdk.Tensor, groups, channels int, eps float32) {
	sdk.GroupNorm(x, gamma, beta, y, mean, rstd, groups, channels, eps)
}
func (ops) GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta sdk.Tensor, groups, channels int) {
	sdk.GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, groups, channels)
}
func (ops) Dropout(x, y sdk.Tensor, p float32, seed uint64)       { sdk.Dropout(x, y, p, seed) }
func (ops) DropoutGrad(dy, dx sdk.Tensor, p float32, seed uint64) { sdk.DropoutGrad(dy, dx, p, seed) }

// setup parses the request into the architecture and binds its parameters.
func setup(req *sdk.Request, trainable bool) (sgd.Hyper, *seq.Arch, *seq.Model[sdk.Tensor], error) {
	h, err := sgd.ParseHyper(req.Hyper)
	if err != nil {
		return h, nil, nil, err
	}
	if req.Arch == "" {
		return h, nil, nil, fmt.Errorf("seq: the model records no architecture; make it with fleetlearn model init --arch 'seq:…' or, for tensors trained elsewhere, fleetlearn model init --arch 'seq:…' --weights FILE")
	}
	a, err := seq.Parse(req.Arch)
	if err != nil {
		return h, nil, nil, err
	}
	if err := a.Check(req.Data.Dim, req.Data.Classes); err != nil {
		return h, nil, nil, err
	}
	m := &seq.Model[sdk.Tensor]{Params: make([]sdk.Tensor, len(req.Params)), Shapes: make([][]int, len(req.Params))}
	names := make([]string, len(req.Params))
	for i, p := range req.Params {
		names[i], m.Shapes[i] = p.Name, p.Shape
		m.Params[i] = sdk.Param(i)
	}
	if m.Bind, err = a.Bind(names, m.Shapes); err != nil {
		return h, nil, nil, err
	}
	if trainable && len(req.Trainable) > 0 {
		m.Trainable = make([]bool, len(req.Params))
		for _, i := range req.Trainable {
			if i < 0 || i >= len(req.Params) {
				return h, nil, nil, fmt.Errorf("seq: trainable parameter %d of %d", i, len(req.Params))
			}
			m.Trainable[i] = true
		}
	}
	return h, a, m, nil
}

func result(m seq.Metrics) *sdk.Result {
	return &sdk.Result{NumExamples: m.Examples, Metrics: map[string]float64{"loss": m.Loss, "accuracy": m.Accuracy}}
}

func train(req *sdk.Request) (*sdk.Result, error) {
	h, a, m, err := setup(req, true)
	if err != nil {
		return nil, err
	}
	met, err := seq.Train[sdk.Tensor](ops{}, a, m, h, req.Data.Examples, req.Seed)
	if err != nil {
		return nil, err
	}
	return result(met), nil
}

func evaluate(req *sdk.Request) (*sdk.Result, error) {
	h, a, m, err := setup(req, false)
	if err != nil {
		return nil, err
	}
	met, err := seq.Evaluate[sdk.Tensor](ops{}, a, m, h, req.Data.Examples)
	if err != nil {
		return nil, err
	}
	return result(met), nil
}
