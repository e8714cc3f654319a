package wasm_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// goText is next-token windows over some Go source, enough for a few
// batches.
func goText(t testing.TB, window, n int) *data.Dataset {
	t.Helper()
	var sb strings.Builder
	for i := 0; sb.Len() < (n+1)*window; i++ {
		sb.WriteString("func (s *Server) Handle(ctx context.Context, req *Request) (*Response, error) {\n")
		sb.WriteString("\tif err := s.check(req); err != nil {\n\t\treturn nil, fmt.Errorf(\"handle: %w\", err)\n\t}\n}\n")
	}
	d, err := data.NextTokenExamples([]byte(sb.String())[:n*window+window], window, window)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestLMMatchesNative is the transformer's crosscheck: one training call of
// the lm module in the sandbox and the native trainer give the same weights
// bit for bit, for full, partial and LoRA fine-tuning, and the same
// evaluation metrics.
func TestLMMatchesNative(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling the lm module under the race detector takes minutes on 2 cores; the plain run crosschecks")
	}
	d := goText(t, 16, 20)
	base, err := train.InitLM(train.LMConfig{Vocab: data.VocabSize, Context: 16, Dim: 32, Layers: 2}, 5)
	if err != nil {
		t.Fatal(err)
	}
	lora, err := train.AddLoRA(base, 4, []string{"attn.q", "attn.v", "mlp.fc"}, 6)
	if err != nil {
		t.Fatal(err)
	}
	hyper := []byte(`{"epochs": 2, "batch_size": 6, "learning_rate": 0.003, "warmup": 2, "heads": 2}`)
	s := newSandbox(t)
	mod := load(t, s, wasmtest.LM)
	if mod.ABIVersion() != 2 {
		t.Fatalf("lm module declares ABI %d", mod.ABIVersion())
	}
	top := []int{}
	for i, tn := range base.Tensors {
		if strings.HasPrefix(tn.Name, "blocks.1.") || strings.HasPrefix(tn.Name, "ln_f.") || tn.Name == "lm_head.weight" {
			top = append(top, i)
		}
	}
	for _, tc := range []struct {
		name      string
		m         *model.Model
		trainable []int
	}{{"full", base, nil}, {"top block", base, top}, {"lora", lora, train.LoRAParams(lora)}} {
		t.Run(tc.name, func(t *testing.T) {
			want, wantMet, err := train.TrainLM(tc.m, d, hyper, 9, tc.trainable)
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
			}
			if res.Metrics["loss"] != wantMet.Loss || res.Metrics["accuracy"] != wantMet.Accuracy || res.NumExamples != wantMet.Examples {
				t.Fatalf("metrics %v (%d examples), native %+v", res.Metrics, res.NumExamples, wantMet)
			}
			ev, err := mod.Evaluate(context.Background(), wasm.Call{Model: res.Model, Data: d, Hyper: hyper})
			if err != nil {
				t.Fatal(err)
			}
			nat, err := train.EvaluateLM(want, d, hyper)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Metrics["loss"] != nat.Loss || ev.Metrics["accuracy"] != nat.Accuracy {
				t.Fatalf("evaluation %v, native %+v", ev.Metrics, nat)
			}
			t.Logf("loss %.4f, accuracy %.3f, %d steps, %d flops", wantMet.Loss, wantMet.Accuracy, wantMet.Steps, res.Work)
		})
	}
}

// TestTrainableRefusals: a v1 module cannot be told what to freeze, a bad
// list is refused, and a module that changes a frozen parameter fails.
func TestTrainableRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling the lm module under the race detector takes minutes on 2 cores")
	}
	s := newSandbox(t)
	d := goText(t, 16, 4)
	m, err := train.InitLM(train.LMConfig{Vocab: data.VocabSize, Context: 16, Dim: 32, Layers: 1}, 5)
	if err != nil {
		t.Fatal(err)
	}
	lmMod := load(t, s, wasmtest.LM)
	for _, bad := range [][]int{{-1}, {len(m.Tensors)}, {3, 1}, {2, 2}} {
		_, err := lmMod.Train(context.Background(), wasm.Call{Model: m, Data: d, Trainable: bad})
		if !errors.Is(err, wasm.ErrInvalidCall) {
			t.Errorf("trainable %v: %v, want ErrInvalidCall", bad, err)
		}
	}
	mlp := load(t, s, wasmtest.MLP)
	tr, _ := mnistLike(t)
	mm, _ := train.InitMLP([]int{tr.Dim, 4, tr.NumClasses}, 1)
	if _, err := mlp.Train(context.Background(), wasm.Call{Model: mm, Data: tr, Trainable: []int{0}}); !errors.Is(err, wasm.ErrInvalidCall) {
		t.Errorf("v1 module with a trainable list: %v, want ErrInvalidCall", err)
	}
	if _, err := lmMod.Train(context.Background(), wasm.Call{Model: m, Data: d, Trainable: []int{0}}); err != nil {
		t.Fatalf("training only the token embedding: %v", err)
	}
}

func mnistLike(t testing.TB) (*data.Dataset, error) {
	d := &data.Dataset{Dim: 4, NumClasses: 3, Features: make([]float32, 4*6), Labels: []uint8{0, 1, 2, 0, 1, 2}}
	for i := range d.Features {
		d.Features[i] = float32(i%5) / 5
	}
	return d, nil
}
