package wasm_test

import (
	"context"
	"encoding/json"
	"path"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// BenchmarkEpoch is one MLP (784-128-10) epoch over 6,000 MNIST examples with
// batch 32, natively, through the shipped module (assembled without a
// runtime, "wasm") and through the same MLP written in Go ("go-wasm"). The
// sandbox always runs with deadline enforcement (WithCloseOnContextDone) on.
func BenchmarkEpoch(b *testing.B) {
	tr, _ := datatest.MNIST(b)
	d := head(tr, 6000)
	init, _ := train.InitMLP([]int{784, 128, 10}, 1)
	h := sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 512}
	b.Run("native", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := train.Train(init, d, h, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	hyper, _ := json.Marshal(h)
	c := wasm.Call{Model: init, Data: d, Hyper: hyper, Seed: 1}
	benchEngines(b, "", wasmtest.MLPAsm, c)
	benchEngines(b, "go-", wasmtest.MLP, c)
}

// BenchmarkLoad is loading a module, per engine: compiling it to machine
// code cold, with a warm on-disk compilation cache as a restarted agent sees
// it, and preparing it for wazero's interpreter. Loading runs the module's
// initialisation once (to read its ABI version), as an agent's first
// selection does.
func BenchmarkLoad(b *testing.B) {
	ctx := context.Background()
	for _, pkg := range []string{wasmtest.MLPAsm, wasmtest.MLP, wasmtest.LM} {
		code := wasmtest.Build(b, pkg)
		hash := wasm.Hash(code)
		run := func(b *testing.B, opts ...wasm.Option) {
			s, err := wasm.New(opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			if _, err := s.Load(ctx, code, hash); err != nil {
				b.Fatal(err)
			}
		}
		name := path.Base(pkg)
		b.Run(name+"/compiler/cold", func(b *testing.B) {
			b.ReportMetric(float64(len(code))/1e6, "module-MB")
			start := cpuTime()
			for b.Loop() {
				run(b, wasm.WithEngine(wasm.EngineCompiler))
			}
			reportCPU(b, start)
		})
		b.Run(name+"/compiler/cached", func(b *testing.B) {
			dir := b.TempDir()
			run(b, wasm.WithEngine(wasm.EngineCompiler), wasm.WithCacheDir(dir))
			start := cpuTime()
			for b.Loop() {
				run(b, wasm.WithEngine(wasm.EngineCompiler), wasm.WithCacheDir(dir))
			}
			reportCPU(b, start)
		})
		b.Run(name+"/interpreter", func(b *testing.B) {
			start := cpuTime()
			for b.Loop() {
				run(b, wasm.WithEngine(wasm.EngineInterpreter))
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkTrivialTrain is one training call of the hand-assembled trivial
// module on a 100k-parameter model: the sandbox's own per-call cost (copying
// parameters in and out, one host tensor, two kernels) as every device pays it
// each round in the round benchmarks.
func BenchmarkTrivialTrain(b *testing.B) {
	s := newSandbox(b)
	ctx := context.Background()
	code := wasmtest.Trivial()
	mod, err := s.Load(ctx, code, wasm.Hash(code))
	if err != nil {
		b.Fatal(err)
	}
	w := make([]float32, 100_000)
	for i := range w {
		w[i] = float32(i%97) / 97
	}
	m, err := model.New(model.Tensor{Name: "fc1.weight", Shape: []int{10, 10_000}, Data: w})
	if err != nil {
		b.Fatal(err)
	}
	d := tinyData()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := mod.Train(ctx, wasm.Call{Model: m, Data: d, Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLMEpoch is one epoch of the example language model (d = 128, 4
// blocks of 4 heads, context 64, 98-token vocabulary: 0.83M parameters)
// over 64 windows with batch 16, AdamW: natively and through the lm module,
// whose step makes the same kernel calls. Deadline enforcement is on, as
// always in the sandbox.
func BenchmarkLMEpoch(b *testing.B) {
	d := goText(b, 64, 64)
	init, err := train.InitLM(train.LMConfig{Vocab: 98, Context: 64, Dim: 128, Layers: 4}, 1)
	if err != nil {
		b.Fatal(err)
	}
	hyper := []byte(`{"batch_size": 16}`)
	b.Run("native", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := train.TrainLM(init, d, hyper, 1, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	benchEngines(b, "", wasmtest.LM, wasm.Call{Model: init, Data: d, Hyper: hyper, Seed: 1})
}

// benchEngines runs one training call of pkg's module per iteration:
// prefix+"wasm" with the best engine of this machine (the compiler, where wazero
// compiles: what a device runs once the module has been compiled),
// prefix+"wasm-interpreter" with wazero's interpreter (what it runs before). Each
// call instantiates the module afresh, as every round does.
func benchEngines(b *testing.B, prefix, pkg string, c wasm.Call) {
	for _, e := range []struct{ name, engine string }{{"wasm", wasm.Engine()}, {"wasm-interpreter", wasm.EngineInterpreter}} {
		b.Run(prefix+e.name, func(b *testing.B) {
			mod := load(b, newSandbox(b, wasm.WithEngine(e.engine)), pkg)
			start := cpuTime()
			for b.Loop() {
				if _, err := mod.Train(context.Background(), c); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkCall is one training call of the MLP module on a model and a
// dataset too small to cost anything (a 4-3 layer, six examples): what a
// round costs a device besides its training, per engine, for the shipped
// module ("wasm") and the one written in Go ("go-wasm"). Each call
// instantiates the module afresh and runs its initialisation (the Go
// runtime's, for the Go module).
func BenchmarkCall(b *testing.B) {
	d, _ := mnistLike(b)
	init, err := train.InitMLP([]int{4, 3}, 1)
	if err != nil {
		b.Fatal(err)
	}
	c := wasm.Call{Model: init, Data: d, Hyper: []byte(`{"batch_size": 2}`), Seed: 1}
	benchEngines(b, "", wasmtest.MLPAsm, c)
	benchEngines(b, "go-", wasmtest.MLP, c)
}

// BenchmarkWASMOverNative runs an epoch natively and through the module in
// turn, one of each per iteration (which goes first alternates), and
// reports the ratio of their total times, "wasm/native". On a shared VM
// whose speed drifts by a third within minutes, separate benchmarks of the
// two sides turn the drift into noise in their ratio; paired epochs see the
// same machine. mlp is BenchmarkEpoch's epoch through the shipped module,
// lm BenchmarkLMEpoch's through the lm module.
func BenchmarkWASMOverNative(b *testing.B) {
	tr, _ := datatest.MNIST(b)
	mlp, err := train.InitMLP([]int{784, 128, 10}, 1)
	if err != nil {
		b.Fatal(err)
	}
	h := sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 512}
	mlpHyper, _ := json.Marshal(h)
	mlpData := head(tr, 6000)
	lmData := goText(b, 64, 64)
	lm, err := train.InitLM(train.LMConfig{Vocab: 98, Context: 64, Dim: 128, Layers: 4}, 1)
	if err != nil {
		b.Fatal(err)
	}
	lmHyper := []byte(`{"batch_size": 16}`)
	for _, tc := range []struct {
		name   string
		pkg    string
		call   wasm.Call
		native func() error
	}{
		{"mlp", wasmtest.MLPAsm, wasm.Call{Model: mlp, Data: mlpData, Hyper: mlpHyper, Seed: 1}, func() error {
			_, _, err := train.Train(mlp, mlpData, h, 1)
			return err
		}},
		{"lm", wasmtest.LM, wasm.Call{Model: lm, Data: lmData, Hyper: lmHyper, Seed: 1}, func() error {
			_, _, err := train.TrainLM(lm, lmData, lmHyper, 1, nil)
			return err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			mod := load(b, newSandbox(b), tc.pkg)
			var native, module time.Duration
			side := func(d *time.Duration, f func() error) {
				start := time.Now()
				if err := f(); err != nil {
					b.Fatal(err)
				}
				*d += time.Since(start)
			}
			runModule := func() error { _, err := mod.Train(context.Background(), tc.call); return err }
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					side(&native, tc.native)
					side(&module, runModule)
				} else {
					side(&module, runModule)
					side(&native, tc.native)
				}
				i++
			}
			b.ReportMetric(float64(module)/float64(native), "wasm/native")
			b.ReportMetric(float64(native.Milliseconds())/float64(i), "native-ms")
			b.ReportMetric(float64(module.Milliseconds())/float64(i), "wasm-ms")
		})
	}
}
