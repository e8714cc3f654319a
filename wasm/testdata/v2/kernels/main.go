//go:build wasip1

// Command kernels is an ABI v2 test module for the sandbox's crosscheck. It
// runs every kernel v2 adds on the first examples of the local data and
// leaves each result in a model parameter, so the host returns them as the
// trained weights and a test can compare them with the native kernels bit
// for bit. The parameters, in order (n examples of width d, a table of v
// rows; the test builds the model):
//
//	inputs   gamma 1×d, beta 1×d, table v×d
//	outputs  y, g, s, p, p2, emb, ds, dg, dx (each n×d), dtable v×d,
//	         mean, rstd (n×1), dgamma, dbeta (1×d), norm 1×1 (‖dx‖)
package main

import (
	"fmt"

	sdk "github.com/fleetlearn/fleetlearn/wasm/sdk/v2"
)

func init() { sdk.Handle(run, run) }

func main() {}

// Hyper-parameters of the sequence, fixed so the test can mirror them.
const (
	eps   = 1e-5
	batch = 2 // s holds batch blocks of g_i·g_iᵀ, so n/batch must equal d
)

func run(req *sdk.Request) (*sdk.Result, error) {
	if req.ABI != 2 {
		return nil, fmt.Errorf("kernels: request says ABI %d, want 2", req.ABI)
	}
	const nparams = 18
	if sdk.ParamCount() != nparams {
		return nil, fmt.Errorf("kernels: %d parameters, want %d", sdk.ParamCount(), nparams)
	}
	p := make([]sdk.Tensor, nparams)
	for i := range p {
		p[i] = sdk.Param(i)
	}
	gamma, beta, table := p[0], p[1], p[2]
	y, g, s, sm, sm2, emb, ds, dg, dx := p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]
	dtable, mean, rstd, dgamma, dbeta := p[12], p[13], p[14], p[15], p[16]
	n, d := y.Rows(), y.Cols()
	if d != sdk.Dim() || n > sdk.Examples() || n != batch*d || p[17].Rows() != 1 || p[17].Cols() != 1 {
		return nil, fmt.Errorf("kernels: outputs %dx%d for data of width %d, %d examples", n, d, sdk.Dim(), sdk.Examples())
	}
	x, ids := sdk.NewTensor(n, d), sdk.NewTensor(n, 1)
	idx := make([]int32, n)
	for i := range idx {
		idx[i] = int32(i)
	}
	sdk.Gather(x, ids, idx)

	sdk.LayerNorm(x, gamma, beta, y, mean, rstd, eps)
	sdk.GELU(y, g)
	sdk.BatchedGemm(false, true, 1, g, g, 0, s, batch)
	sdk.Softmax(s, sm, d)
	sdk.Softmax(g, sm2, 0)
	sdk.Embedding(table, ids, emb)
	sdk.EmbeddingGrad(g, ids, dtable)
	sdk.SoftmaxGrad(g, sm2, ds)
	sdk.GELUGrad(ds, y, dg)
	sdk.LayerNormGrad(dg, x, gamma, mean, rstd, dx, dgamma, dbeta)
	// v1's kernels are served under fleetlearn_v2 too.
	p[17].Fill(float32(sdk.Norm2(dx)))
	return &sdk.Result{NumExamples: n, Metrics: map[string]float64{}}, nil
}
