package wasm_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

func head(d *data.Dataset, n int) *data.Dataset {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return d.Subset(idx)
}

func load(t testing.TB, s *wasm.Sandbox, pkg string) *wasm.Module {
	t.Helper()
	code := wasmtest.Build(t, pkg)
	m, err := s.Load(context.Background(), code, wasm.Hash(code))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newSandbox(t testing.TB, opts ...wasm.Option) *wasm.Sandbox {
	t.Helper()
	s, err := wasm.New(append([]wasm.Option{wasm.WithCacheDir(cacheDir(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func maxAbsDiff(t *testing.T, a, b *model.Model) float64 {
	t.Helper()
	if !a.Layout().Equal(b.Layout()) {
		t.Fatalf("layouts differ: %v vs %v", a.Layout(), b.Layout())
	}
	var d float64
	fa, fb := a.Flatten(), b.Flatten()
	for i := range fa {
		d = max(d, math.Abs(float64(fa[i])-float64(fb[i])))
	}
	return d
}

// TestMatchesNative checks the WASM path against the native reference trainer:
// the same weights, data, seed and hyper-parameters must give the same weights
// (to 1e-4) and metrics after an epoch.
func TestMatchesNative(t *testing.T) {
	tr, _ := datatest.MNIST(t)
	d := head(tr, 3000)
	s := newSandbox(t)
	for _, tc := range []struct {
		name  string
		pkg   string
		sizes []int
		hyper sgd.Hyper
	}{
		{"mlp", wasmtest.MLP, []int{784, 128, 10}, sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 512}},
		{"mlp-fedprox", wasmtest.MLP, []int{784, 128, 10}, sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, Mu: 0.01, EvalBatchSize: 512}},
		{"mlp-deep-odd-batch", wasmtest.MLP, []int{784, 64, 32, 10}, sgd.Hyper{Epochs: 2, BatchSize: 37, LearningRate: 0.05, EvalBatchSize: 100}},
		{"softmax", wasmtest.Softmax, []int{784, 10}, sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 512}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			init, err := train.InitMLP(tc.sizes, 3)
			if err != nil {
				t.Fatal(err)
			}
			hyper, _ := json.Marshal(tc.hyper)
			mod := load(t, s, tc.pkg)
			res, err := mod.Train(context.Background(), wasm.Call{Model: init, Data: d, Hyper: hyper, Seed: 11})
			if err != nil {
				t.Fatal(err)
			}
			want, met, err := train.Train(init, d, tc.hyper, 11)
			if err != nil {
				t.Fatal(err)
			}
			if diff := maxAbsDiff(t, res.Model, want); diff > 1e-4 {
				t.Fatalf("max abs weight difference %g > 1e-4", diff)
			}
			if res.NumExamples != d.Len() {
				t.Fatalf("num_examples %d, want %d", res.NumExamples, d.Len())
			}
			if got := res.Metrics["loss"]; math.Abs(got-met.Loss) > 1e-6 {
				t.Fatalf("loss %v, native %v", got, met.Loss)
			}
			if maxAbsDiff(t, res.Model, init) == 0 {
				t.Fatal("training did not change the weights")
			}
			if res.Model.Lineage.Parent != init.Lineage.Version {
				t.Fatalf("lineage parent %q", res.Model.Lineage.Parent)
			}
		})
	}
}

// TestMNISTThroughWASM trains 784-128-10 on all of MNIST through the module and
// natively and requires the same test accuracy within half a point (and ≥ 95%).
func TestMNISTThroughWASM(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on all of MNIST twice")
	}
	tr, te := datatest.MNIST(t)
	s := newSandbox(t)
	mod := load(t, s, wasmtest.MLP)
	init, _ := train.InitMLP([]int{784, 128, 10}, 1)
	h := sgd.Hyper{Epochs: 2, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 1000}
	hyper, _ := json.Marshal(h)
	ctx := context.Background()
	res, err := mod.Train(ctx, wasm.Call{Model: init, Data: tr, Hyper: hyper, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := mod.Evaluate(ctx, wasm.Call{Model: res.Model, Data: te, Hyper: hyper})
	if err != nil {
		t.Fatal(err)
	}
	native, _, err := train.Train(init, tr, h, 42)
	if err != nil {
		t.Fatal(err)
	}
	nev, err := train.Evaluate(native, te, 1000)
	if err != nil {
		t.Fatal(err)
	}
	acc := ev.Metrics["accuracy"]
	t.Logf("wasm test accuracy %.4f (train %v, %d work), native %.4f; weight diff %g",
		acc, res.Duration, res.Work, nev.Accuracy, maxAbsDiff(t, res.Model, native))
	if acc < 0.95 || math.Abs(acc-nev.Accuracy) > 0.005 {
		t.Fatalf("wasm accuracy %.4f, native %.4f: want ≥ 0.95 and within 0.005", acc, nev.Accuracy)
	}
	if math.Abs(ev.Metrics["loss"]-nev.Loss) > 1e-4 {
		t.Fatalf("wasm eval loss %v, native %v", ev.Metrics["loss"], nev.Loss)
	}
}
