//go:build wasip1

// Command lm is Fleetlearn's example language-model update module: the
// small decoder-only transformer of package lm, trained with AdamW on
// next-token windows (see `fleetlearn data gosrc`). The model code is package
// lm's, run here on the sandbox's ABI v2 host kernels and natively by
// package train on the same kernels, so both produce the same weights from
// the same inputs. It trains only the parameters the request lists as
// trainable (partial and LoRA fine-tuning).
//
// fleetlearn ships it built (`fleetlearn module example lm`, from
// wasm/examples/embedded); to build it yourself:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o lm.wasm ./wasm/examples/lm
package main

import (
	"fmt"

	"github.com/fleetlearn/fleetlearn/model/lm"
	sdk "github.com/fleetlearn/fleetlearn/wasm/sdk/v2"
)

func init() { sdk.Handle(train, evaluate) }

func main() {}

// ops is package lm's tensor machine on the host functions; a misuse aborts
// the call on the host side.
type ops struct{}

func (ops) New(rows, cols int) sdk.Tensor              { return sdk.NewTensor(rows, cols) }
func (ops) Free(t sdk.Tensor)                          { t.Free() }
func (ops) Resize(t sdk.Tensor, rows, cols int)        { t.Resize(rows, cols) }
func (ops) Write(t sdk.Tensor, v []float32)            { t.Write(v) }
func (ops) Read(t sdk.Tensor, v []float32)             { t.Read(v) }
func (ops) Fill(t sdk.Tensor, v float32)               { t.Fill(v) }
func (ops) Copy(dst, src sdk.Tensor)                   { dst.CopyFrom(src) }
func (ops) Gather(x, labels sdk.Tensor, idx []int32)   { sdk.Gather(x, labels, idx) }
func (ops) BiasAdd(x, b sdk.Tensor)                    { sdk.BiasAdd(x, b) }
func (ops) ColSum(x, out sdk.Tensor)                   { sdk.ColSum(x, out) }
func (ops) Axpy(alpha float32, x, y sdk.Tensor)        { sdk.Axpy(alpha, x, y) }
func (ops) Scale(alpha float32, x sdk.Tensor)          { sdk.Scale(alpha, x) }
func (ops) Norm2(x sdk.Tensor) float64                 { return sdk.Norm2(x) }
func (ops) Embedding(table, ids, out sdk.Tensor)       { sdk.Embedding(table, ids, out) }
func (ops) EmbeddingGrad(dout, ids, dtable sdk.Tensor) { sdk.EmbeddingGrad(dout, ids, dtable) }
func (ops) GELU(x, y sdk.Tensor)                       { sdk.GELU(x, y) }
func (ops) GELUGrad(dy, x, dx sdk.Tensor)              { sdk.GELUGrad(dy, x, dx) }
func (ops) Softmax(x, y sdk.Tensor, causal int)        { sdk.Softmax(x, y, causal) }
func (ops) SoftmaxGrad(dy, y, dx sdk.Tensor)           { sdk.SoftmaxGrad(dy, y, dx) }
func (ops) SplitHeads(x, y sdk.Tensor, seq, heads int) { sdk.SplitHeads(x, y, seq, heads) }
func (ops) MergeHeads(y, x sdk.Tensor, seq, heads int) { sdk.MergeHeads(y, x, seq, heads) }
func (ops) SoftmaxXent(logits, labels, grad sdk.Tensor) float64 {
	return sdk.SoftmaxXent(logits, labels, grad)
}
func (ops) CountCorrect(logits, labels sdk.Tensor) int { return sdk.CountCorrect(logits, labels) }
func (ops) Gemm(ta, tb bool, alpha float32, a, b sdk.Tensor, beta float32, c sdk.Tensor) {
	sdk.Gemm(ta, tb, alpha, a, b, beta, c)
}
func (ops) BatchedGemm(ta, tb bool, alpha float32, a, b sdk.Tensor, beta float32, c sdk.Tensor, batch int) {
	sdk.BatchedGemm(ta, tb, alpha, a, b, beta, c, batch)
}
func (ops) LayerNorm(x, gamma, beta, y, mean, rstd sdk.Tensor, eps float32) {
	sdk.LayerNorm(x, gamma, beta, y, mean, rstd, eps)
}
func (ops) LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta sdk.Tensor) {
	sdk.LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta)
}
func (ops) AdamW(p, g, m, v sdk.Tensor, lr, beta1, beta2, eps, wd float32, step int) {
	sdk.AdamW(p, g, m, v, lr, beta1, beta2, eps, wd, step)
}

// setup parses the request into the architecture and its parameters.
func setup(req *sdk.Request) (lm.Hyper, *lm.Arch, []sdk.Tensor, error) {
	h, err := lm.ParseHyper(req.Hyper)
	if err != nil {
		return h, nil, nil, err
	}
	ps := make([]lm.Param, len(req.Params))
	ts := make([]sdk.Tensor, len(req.Params))
	for i, p := range req.Params {
		ps[i] = lm.Param{Name: p.Name, Shape: p.Shape}
		ts[i] = sdk.Param(i)
	}
	a, err := lm.Parse(ps, h.Heads)
	if err != nil {
		return h, nil, nil, err
	}
	if err := a.CheckData(req.Data.Dim, req.Data.Classes); err != nil {
		return h, nil, nil, err
	}
	if req.Data.Examples == 0 {
		return h, nil, nil, fmt.Errorf("lm: no local examples")
	}
	return h, a, ts, nil
}

func result(m lm.Metrics, train bool) *sdk.Result {
	r := &sdk.Result{NumExamples: m.Examples, Metrics: map[string]float64{
		"loss": m.Loss, "accuracy": m.Accuracy, "perplexity": m.Perplexity()}}
	if train {
		r.Metrics["steps"] = float64(m.Steps)
	}
	return r
}

func train(req *sdk.Request) (*sdk.Result, error) {
	h, a, ts, err := setup(req)
	if err != nil {
		return nil, err
	}
	tr, err := lm.Trainable(len(ts), req.Trainable)
	if err != nil {
		return nil, err
	}
	m, err := lm.Train[sdk.Tensor](ops{}, a, ts, tr, req.Data.Examples, h, req.Seed)
	if err != nil {
		return nil, err
	}
	return result(m, true), nil
}

func evaluate(req *sdk.Request) (*sdk.Result, error) {
	h, a, ts, err := setup(req)
	if err != nil {
		return nil, err
	}
	m, err := lm.Evaluate[sdk.Tensor](ops{}, a, ts, req.Data.Examples, h)
	if err != nil {
		return nil, err
	}
	return result(m, false), nil
}
