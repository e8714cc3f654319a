package wasm_test

import (
	"context"
	"encoding/json"
	"path"
	"runtime"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// onEveryKernel runs f once per GEMM kernel this CPU has and per thread
// bound (one, and four on four Go threads), giving each run's name.
func onEveryKernel(t *testing.T, f func(name string)) {
	t.Helper()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	for _, k := range kernel.Kernels() {
		prev, err := kernel.UseKernel(k)
		if err != nil {
			t.Fatal(err)
		}
		for _, th := range []int{1, 4} {
			old := kernel.SetThreads(th)
			f(k + "/threads=" + map[int]string{1: "1", 4: "4"}[th])
			kernel.SetThreads(old)
		}
		if _, err := kernel.UseKernel(prev); err != nil {
			t.Fatal(err)
		}
	}
}

// sameOnEveryKernel trains with train (natively and through the module) on
// every kernel and thread bound: every run must give the first one's weights.
func sameOnEveryKernel(t *testing.T, train func() (native, module *model.Model)) {
	t.Helper()
	var ref *model.Model
	onEveryKernel(t, func(name string) {
		nat, mod := train()
		sameBits(t, name+": wasm vs native", mod, nat)
		if ref == nil {
			ref = nat
		}
		sameBits(t, name+": vs "+kernel.Kernels()[0]+" on one thread", nat, ref)
	})
}

// sameBits fails unless got has exactly the weights of want.
func sameBits(t *testing.T, what string, got, want *model.Model) {
	t.Helper()
	if got.HashHex() != want.HashHex() {
		t.Fatalf("%s: weights differ (max abs difference %g)", what, maxAbsDiff(t, got, want))
	}
}

// TestEveryKernelSameWeights trains the MLP natively and through its modules
// (the shipped one, assembled without a runtime, and the one written in Go) on
// every GEMM kernel the CPU has (the SIMD ones and pure Go), on one thread and
// on four: every run must give the same weights, bit for bit.
func TestEveryKernelSameWeights(t *testing.T) {
	tr, _ := datatest.MNIST(t)
	d := head(tr, 256)
	init, err := train.InitMLP([]int{784, 128, 10}, 3)
	if err != nil {
		t.Fatal(err)
	}
	h := sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 512}
	hyper, _ := json.Marshal(h)
	s := newSandbox(t)
	for _, pkg := range []string{wasmtest.MLPAsm, wasmtest.MLP} {
		t.Run(path.Base(pkg), func(t *testing.T) {
			mod := load(t, s, pkg)
			sameOnEveryKernel(t, func() (*model.Model, *model.Model) {
				nat, _, err := train.Train(init, d, h, 11)
				if err != nil {
					t.Fatal(err)
				}
				res, err := mod.Train(context.Background(), wasm.Call{Model: init, Data: d, Hyper: hyper, Seed: 11})
				if err != nil {
					t.Fatal(err)
				}
				return nat, res.Model
			})
		})
	}
}

// TestEveryKernelSameLM is TestEveryKernelSameWeights for the language model
// (attention's batched products, layer norm, GELU, AdamW).
func TestEveryKernelSameLM(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling the lm module under the race detector takes minutes on 2 cores; the plain run checks")
	}
	d := goText(t, 16, 12)
	base, err := train.InitLM(train.LMConfig{Vocab: data.VocabSize, Context: 16, Dim: 32, Layers: 2}, 5)
	if err != nil {
		t.Fatal(err)
	}
	hyper := []byte(`{"epochs": 1, "batch_size": 4, "learning_rate": 0.003, "warmup": 2, "heads": 2}`)
	mod := load(t, newSandbox(t), wasmtest.LM)
	sameOnEveryKernel(t, func() (*model.Model, *model.Model) {
		nat, _, err := train.TrainLM(base, d, hyper, 9, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := mod.Train(context.Background(), wasm.Call{Model: base, Data: d, Hyper: hyper, Seed: 9})
		if err != nil {
			t.Fatal(err)
		}
		return nat, res.Model
	})
}
