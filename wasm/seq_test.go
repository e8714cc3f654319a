package wasm_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// tinyImages is n 2×8×8 examples of 3 classes whose class decides where a
// bright patch is, so a small CNN learns them.
func tinyImages(n int, seed uint64) *data.Dataset {
	const c, h, w = 2, 8, 8
	d := &data.Dataset{Dim: c * h * w, NumClasses: 3, Features: make([]float32, n*c*h*w), Labels: make([]uint8, n)}
	s := seed
	next := func() float32 {
		s = s*6364136223846793005 + 1442695040888963407
		return float32(s>>40) / float32(1<<24)
	}
	for i := 0; i < n; i++ {
		cl := i % 3
		d.Labels[i] = uint8(cl)
		x := d.Features[i*c*h*w : (i+1)*c*h*w]
		for j := range x {
			x[j] = 0.3 * next()
		}
		for ch := 0; ch < c; ch++ {
			for r := 2 * cl; r < 2*cl+2; r++ {
				for col := 2; col < 6; col++ {
					x[ch*h*w+r*w+col] += 1
				}
			}
		}
	}
	return d
}

// seqArchs are layer lists covering every layer kind.
var seqArchs = map[string]string{
	"cnn":  "seq:input(2,8,8),conv(4,3,pad=1),relu,maxpool(2),conv(6,3,stride=1,pad=1),groupnorm(2),relu,avgpool(2),flatten,dense(16),relu,dropout(0.25),dense(3)",
	"norm": "seq:input(2,8,8),conv(4,3,stride=2,pad=1),layernorm,relu,dense(8),layernorm,relu,dense(3)",
}

// TestSeqMatchesNative is the layer-list crosscheck: one training call of
// the seq module in the sandbox and the native trainer give the same
// weights bit for bit (full, frozen-first-layer and LoRA fine-tuning), and
// the same evaluation metrics.
func TestSeqMatchesNative(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling the seq module under the race detector takes minutes on 2 cores; the plain run crosschecks")
	}
	d := tinyImages(30, 3)
	hyper := []byte(`{"epochs": 2, "batch_size": 7, "learning_rate": 0.05, "mu": 0.01}`)
	s := newSandbox(t)
	mod := load(t, s, wasmtest.Seq)
	if mod.ABIVersion() != 4 {
		t.Fatalf("seq module declares ABI %d", mod.ABIVersion())
	}
	for name, arch := range seqArchs {
		a, err := seq.Parse(arch)
		if err != nil {
			t.Fatal(err)
		}
		base, err := train.InitSeq(a, 5)
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name      string
			m         *model.Model
			trainable []int
		}{{"full", base, nil}, {"frozen first layer", base, []int{2, 3, 4, 5, 6, 7}}}
		if name == "cnn" {
			lora, err := train.AddSeqLoRA(base, 2, 7)
			if err != nil {
				t.Fatal(err)
			}
			cases = append(cases, struct {
				name      string
				m         *model.Model
				trainable []int
			}{"lora", lora, train.LoRAParams(lora)})
		}
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				h, err := sgd.ParseHyper(hyper)
				if err != nil {
					t.Fatal(err)
				}
				want, wantMet, err := train.TrainSeq(tc.m, d, h, 9, tc.trainable)
				if err != nil {
					t.Fatal(err)
				}
				res, err := mod.Train(context.Background(), wasm.Call{Model: tc.m, Data: d, Hyper: hyper, Seed: 9, Trainable: tc.trainable})
				if err != nil {
					t.Fatal(err)
				}
				if res.Model.HashHex() != want.HashHex() {
					for i := range want.Tensors {
						w, g := want.Tensors[i].Data, res.Model.Tensors[i].Data
						for j := range w {
							if math.Float32bits(w[j]) != math.Float32bits(g[j]) {
								t.Fatalf("%s[%d]: wasm %v, native %v", want.Tensors[i].Name, j, g[j], w[j])
							}
						}
					}
					t.Fatal("same values, different hashes: the architecture was lost")
				}
				changed := 0
				for i := range want.Tensors {
					for j, v := range want.Tensors[i].Data {
						if v != tc.m.Tensors[i].Data[j] {
							changed++
							break
						}
					}
				}
				if changed == 0 {
					t.Fatal("training changed nothing")
				}
				if res.Metrics["loss"] != wantMet.Loss || res.Metrics["accuracy"] != wantMet.Accuracy || res.NumExamples != wantMet.Examples {
					t.Fatalf("metrics %v (%d examples), native %+v", res.Metrics, res.NumExamples, wantMet)
				}
				ev, err := mod.Evaluate(context.Background(), wasm.Call{Model: res.Model, Data: d, Hyper: hyper})
				if err != nil {
					t.Fatal(err)
				}
				nat, err := train.EvaluateSeq(want, d, h.EvalBatchSize)
				if err != nil {
					t.Fatal(err)
				}
				if ev.Metrics["loss"] != nat.Loss || ev.Metrics["accuracy"] != nat.Accuracy {
					t.Fatalf("evaluation %v, native %+v", ev.Metrics, nat)
				}
				t.Logf("loss %.4f, accuracy %.3f, %d tensors changed, %d flops", wantMet.Loss, wantMet.Accuracy, changed, res.Work)
			})
		}
	}
}

// TestSeqLEAFMatchesNative: the LEAF CNN itself (6.5 million parameters)
// trains to the same bits in the sandbox and natively, on a few
// Fashion-MNIST-shaped examples.
func TestSeqLEAFMatchesNative(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling the seq module under the race detector takes minutes on 2 cores; the plain run crosschecks")
	}
	const n = 6
	d := &data.Dataset{Dim: 784, NumClasses: 10, Features: make([]float32, n*784), Labels: make([]uint8, n)}
	for i := range d.Features {
		d.Features[i] = float32((i*7919)%255) / 255
	}
	for i := range d.Labels {
		d.Labels[i] = uint8(i % 10)
	}
	a, err := seq.Parse("seq:input(1,28,28),conv(32,5,pad=2),relu,maxpool(2),conv(64,5,pad=2),relu,maxpool(2),dense(2048),relu,dense(10)")
	if err != nil {
		t.Fatal(err)
	}
	m, err := train.InitSeq(a, 1)
	if err != nil {
		t.Fatal(err)
	}
	hyper := []byte(`{"epochs": 1, "batch_size": 4, "learning_rate": 0.05}`)
	h, err := sgd.ParseHyper(hyper)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := train.TrainSeq(m, d, h, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := load(t, newSandbox(t), wasmtest.Seq).Train(context.Background(), wasm.Call{Model: m, Data: d, Hyper: hyper, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Model.HashHex() != want.HashHex() {
		t.Fatal("the LEAF CNN trained in the sandbox differs from the native trainer's")
	}
	if res.Model.HashHex() == m.HashHex() {
		t.Fatal("training changed nothing")
	}
	t.Logf("%d flops charged", res.Work)
}

// TestSeqRefuses: a model without an architecture, one whose tensors do
// not match it, and data of another shape fail with the module's message.
func TestSeqRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling the seq module under the race detector takes minutes on 2 cores")
	}
	s := newSandbox(t)
	mod := load(t, s, wasmtest.Seq)
	d := tinyImages(6, 1)
	a, err := seq.Parse(seqArchs["cnn"])
	if err != nil {
		t.Fatal(err)
	}
	good, err := train.InitSeq(a, 1)
	if err != nil {
		t.Fatal(err)
	}
	noArch := good.Clone()
	noArch.Arch = ""
	other := good.Clone()
	other.Arch = "seq:input(2,8,8),flatten,dense(3)"
	wrongData := &data.Dataset{Dim: 10, NumClasses: 3, Features: make([]float32, 10), Labels: []uint8{1}}
	for name, c := range map[string]wasm.Call{
		"no arch":    {Model: noArch, Data: d},
		"other arch": {Model: other, Data: d},
		"data shape": {Model: good, Data: wrongData},
	} {
		_, err := mod.Train(context.Background(), c)
		if !errors.Is(err, wasm.ErrModuleFailed) {
			t.Errorf("%s: %v, want ErrModuleFailed", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
