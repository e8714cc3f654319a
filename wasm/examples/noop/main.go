//go:build wasip1

// Command noop is Fleetlearn's trivial update module, for measuring the system
// rather than training: train adds a small constant to every parameter (any
// model layout works) and reports the whole local dataset as trained on;
// evaluate reports an accuracy of 0. It still runs through the full ABI: the
// request handshake, host tensors and kernels, and the result document.
//
// fleetlearn ships it built (`fleetlearn module example noop`, from
// wasm/examples/embedded); to build it yourself:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o noop.wasm ./wasm/examples/noop
package main

import (
	"errors"

	"github.com/fleetlearn/fleetlearn/wasm/sdk"
)

// step is what train adds to every parameter value: small enough to leave a
// model usable, non-zero so that every round commits a new model version.
const step = 1e-3

func init() { sdk.Handle(train, evaluate) }

func main() {}

func train(req *sdk.Request) (*sdk.Result, error) {
	if req.Data.Examples == 0 {
		return nil, errors.New("noop: no local examples")
	}
	for i := range req.Params {
		p := sdk.Param(i)
		c := sdk.NewTensor(p.Rows(), p.Cols())
		c.Fill(step)
		sdk.Axpy(1, c, p)
		c.Free()
	}
	return &sdk.Result{NumExamples: req.Data.Examples, Metrics: map[string]float64{}}, nil
}

func evaluate(req *sdk.Request) (*sdk.Result, error) {
	if req.Data.Examples == 0 {
		return nil, errors.New("noop: no local examples")
	}
	return &sdk.Result{NumExamples: req.Data.Examples, Metrics: map[string]float64{"accuracy": 0}}, nil
}
