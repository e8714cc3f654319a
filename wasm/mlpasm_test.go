package wasm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/examples/mlpasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestMLPAsmSameAsGoModule trains and evaluates through the MLP module
// assembled without a runtime, through the same MLP written in Go, and
// natively: every configuration must give the same weights bit for bit and
// the same metrics, exactly, from both modules. The configurations cover
// FedProx, several epochs, a short last batch, a single layer, eleven
// layers (two-digit names), hyper-parameters left to their defaults and a
// learning rate written as a decimal that float32 cannot hold exactly.
func TestMLPAsmSameAsGoModule(t *testing.T) {
	tr, _ := datatest.MNIST(t)
	d := head(tr, 700)
	s := newSandbox(t)
	asm, gomod := load(t, s, wasmtest.MLPAsm), load(t, s, wasmtest.MLP)
	if asm.ABIVersion() != mlpasm.ABIVersion {
		t.Fatalf("assembled module declares ABI v%d", asm.ABIVersion())
	}
	deep := []int{784}
	for range 10 {
		deep = append(deep, 12)
	}
	deep = append(deep, 10)
	for _, tc := range []struct {
		name  string
		sizes []int
		hyper string
	}{
		{"mlp", []int{784, 128, 10}, `{"epochs":1,"batch_size":32,"learning_rate":0.1,"eval_batch_size":512}`},
		{"fedprox", []int{784, 128, 10}, `{"epochs":1,"batch_size":32,"learning_rate":0.1,"mu":0.01}`},
		{"deep-odd-batch", []int{784, 64, 32, 10}, `{"epochs":2,"batch_size":37,"learning_rate":0.05,"eval_batch_size":100}`},
		{"one-layer", []int{784, 10}, `{"batch_size":64,"learning_rate":0.3,"eval_batch_size":333}`},
		{"eleven-layers", deep, `{"batch_size":50,"learning_rate":0.01}`},
		{"defaults", []int{784, 32, 10}, ``},
		{"inexact-lr", []int{784, 32, 10}, `{"learning_rate":0.07,"batch_size":1000}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			init, err := train.InitMLP(tc.sizes, 3)
			if err != nil {
				t.Fatal(err)
			}
			h, err := sgd.ParseHyper([]byte(tc.hyper))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			call := wasm.Call{Model: init, Data: d, Hyper: json.RawMessage(tc.hyper), Seed: 11}
			a, err := asm.Train(ctx, call)
			if err != nil {
				t.Fatal(err)
			}
			g, err := gomod.Train(ctx, call)
			if err != nil {
				t.Fatal(err)
			}
			nat, _, err := train.Train(init, d, h, 11)
			if err != nil {
				t.Fatal(err)
			}
			if !floats.SameBits(a.Model.Flatten(), g.Model.Flatten()) || !floats.SameBits(a.Model.Flatten(), nat.Flatten()) {
				t.Fatalf("weights differ: assembled vs Go module %g, vs native %g",
					maxAbsDiff(t, a.Model, g.Model), maxAbsDiff(t, a.Model, nat))
			}
			if maxAbsDiff(t, a.Model, init) == 0 {
				t.Fatal("training did not change the weights")
			}
			if a.NumExamples != g.NumExamples || !maps.Equal(a.Metrics, g.Metrics) {
				t.Fatalf("train result: assembled %d %v, Go module %d %v", a.NumExamples, a.Metrics, g.NumExamples, g.Metrics)
			}
			// The same kernels, plus what the host's services charge the
			// assembled module: the order, names and shapes it reads.
			extra := int64(h.Epochs * d.Len())
			for _, p := range init.Tensors {
				extra += int64(len(p.Name) + len(p.Shape))
			}
			if a.Work != g.Work+extra {
				t.Errorf("kernel work: assembled %d, Go module %d + host services %d", a.Work, g.Work, extra)
			}
			ev := wasm.Call{Model: a.Model, Data: d, Hyper: json.RawMessage(tc.hyper)}
			ae, err := asm.Evaluate(ctx, ev)
			if err != nil {
				t.Fatal(err)
			}
			ge, err := gomod.Evaluate(ctx, ev)
			if err != nil {
				t.Fatal(err)
			}
			if ae.NumExamples != ge.NumExamples || !maps.Equal(ae.Metrics, ge.Metrics) {
				t.Fatalf("evaluate result: assembled %d %v, Go module %d %v", ae.NumExamples, ae.Metrics, ge.NumExamples, ge.Metrics)
			}
		})
	}
}

// TestMLPAsmRefuses: a model that is not an MLP of the dataset's shape, an
// empty dataset, bad hyper-parameters and a memory limit too small for the
// example order each fail the call with a message naming the rule, as the
// Go module refuses them, and no call panics the host.
func TestMLPAsmRefuses(t *testing.T) {
	tr, _ := datatest.MNIST(t)
	d := head(tr, 300)
	s := newSandbox(t)
	asm, gomod := load(t, s, wasmtest.MLPAsm), load(t, s, wasmtest.MLP)
	mlp := func(sizes ...int) *model.Model {
		m, err := train.InitMLP(sizes, 1)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	edit := func(m *model.Model, f func([]model.Tensor) []model.Tensor) *model.Model {
		m.Tensors = f(m.Tensors)
		return m
	}
	for _, tc := range []struct {
		name   string
		model  *model.Model
		data   *data.Dataset
		hyper  string
		pages  uint32
		err    error
		asmMsg string
	}{
		{"odd parameter count", edit(mlp(784, 16, 10), func(ts []model.Tensor) []model.Tensor { return ts[:3] }),
			d, "", 0, wasm.ErrModuleFailed, "weight/bias pairs"},
		{"renamed layer", edit(mlp(784, 16, 10), func(ts []model.Tensor) []model.Tensor { ts[2].Name = "out.weight"; return ts }),
			d, "", 0, wasm.ErrModuleFailed, "fc1.weight, fc1.bias, fc2.weight"},
		{"name with a suffix", edit(mlp(784, 16, 10), func(ts []model.Tensor) []model.Tensor { ts[1].Name = "fc1.biasx"; return ts }),
			d, "", 0, wasm.ErrModuleFailed, "fc1.weight, fc1.bias, fc2.weight"},
		{"layers swapped", edit(mlp(784, 16, 10), func(ts []model.Tensor) []model.Tensor {
			ts[0], ts[1] = ts[1], ts[0]
			return ts
		}), d, "", 0, wasm.ErrModuleFailed, "fc1.weight, fc1.bias, fc2.weight"},
		{"width does not chain", edit(mlp(784, 16, 10), func(ts []model.Tensor) []model.Tensor {
			ts[2] = model.Tensor{Name: "fc2.weight", Shape: []int{10, 15}, Data: make([]float32, 150)}
			return ts
		}), d, "", 0, wasm.ErrModuleFailed, "does not continue the previous width"},
		{"bias of rank 2", edit(mlp(784, 16, 10), func(ts []model.Tensor) []model.Tensor {
			ts[1].Shape = []int{1, 16}
			return ts
		}), d, "", 0, wasm.ErrModuleFailed, "does not continue the previous width"},
		{"first layer not the data's dim", mlp(783, 16, 10), d, "", 0, wasm.ErrModuleFailed, "does not continue"},
		{"wrong number of classes", mlp(784, 16, 7), d, "", 0, wasm.ErrModuleFailed, "number of classes"},
		{"no examples", mlp(784, 16, 10), head(tr, 0), "", 0, wasm.ErrModuleFailed, "no local examples"},
		{"unknown hyper-parameter", mlp(784, 16, 10), d, `{"learning_rat":0.1}`, 0, wasm.ErrInvalidCall, "learning_rat"},
		{"negative learning rate", mlp(784, 16, 10), d, `{"learning_rate":-1}`, 0, wasm.ErrInvalidCall, "learning_rate"},
		{"order beyond the memory limit", mlp(784, 16, 10), tr, "", 2, wasm.ErrModuleFailed, "memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			call := wasm.Call{Model: tc.model, Data: tc.data, Hyper: json.RawMessage(tc.hyper), Seed: 1,
				Limits: wasm.Limits{MemoryPages: tc.pages}}
			_, err := asm.Train(context.Background(), call)
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.asmMsg) {
				t.Fatalf("assembled module: %v, want %v with %q", err, tc.err, tc.asmMsg)
			}
			if tc.pages == 0 {
				if _, gerr := gomod.Train(context.Background(), call); gerr == nil {
					t.Fatalf("the Go module accepts what the assembled one refuses (%v)", err)
				}
			}
			if _, eerr := asm.Evaluate(context.Background(), call); eerr == nil {
				t.Fatalf("evaluate accepted it: train said %v", err)
			}
		})
	}
}

// TestMLPAsmMetricsNames: the assembled module's result carries exactly the
// Go module's metric names, and both modules are listed in the embedded set.
func TestMLPAsmMetricsNames(t *testing.T) {
	tr, _ := datatest.MNIST(t)
	m, err := train.InitMLP([]int{784, 8, 10}, 1)
	if err != nil {
		t.Fatal(err)
	}
	res, err := load(t, newSandbox(t), wasmtest.MLPAsm).Evaluate(context.Background(), wasm.Call{Model: m, Data: head(tr, 50)})
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(res.Metrics)); fmt.Sprint(got) != "[accuracy loss]" {
		t.Fatalf("metrics %v", got)
	}
}
