package train

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/model/lm"
)

// textData is next-token windows over a small repetitive text, so a model
// can learn it quickly.
func textData(t testing.TB, window, n int) *data.Dataset {
	t.Helper()
	text := []byte{}
	for len(text) < n*window+window+1 {
		text = append(text, "func (s *Server) Handle(ctx context.Context) error {\n\treturn nil\n}\n"...)
	}
	d, err := data.NextTokenExamples(text[:n*window+window], window, window)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestLMGradient(t *testing.T) {
	d := textData(t, 8, 6)
	m, err := InitLM(LMConfig{Vocab: data.VocabSize, Context: 8, Dim: 8, Layers: 2, Hidden: 12}, 3)
	if err != nil {
		t.Fatal(err)
	}
	m, err = AddLoRA(m, 2, []string{"attn.q", "mlp.fc"}, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Non-zero B so gradients flow through A too; larger weights so the
	// loss is not flat at the scale of a finite difference.
	r := rand.New(rand.NewPCG(1, 2))
	for i := range m.Tensors {
		for j := range m.Tensors[i].Data {
			m.Tensors[i].Data[j] += float32(r.NormFloat64() * 0.3)
		}
	}
	h, _ := lm.ParseHyper([]byte(`{"heads": 2}`))
	ps, ms := lmParams(m)
	a, err := lm.Parse(ps, h.Heads)
	if err != nil {
		t.Fatal(err)
	}
	train, _ := lm.Trainable(len(ms), nil)
	idx := []int32{0, 2, 3}
	k := &kops{d: d}
	loss := func() float64 {
		l, _, free, err := lm.Gradient[*kernel.Mat](k, a, ms, make([]bool, len(ms)), d.Len(), h, idx)
		if err != nil || k.err != nil {
			t.Fatal(err, k.err)
		}
		free()
		return l
	}
	_, grads, free, err := lm.Gradient[*kernel.Mat](k, a, ms, train, d.Len(), h, idx)
	if err != nil || k.err != nil {
		t.Fatal(err, k.err)
	}
	defer free()
	for i, p := range ms {
		g := grads[i]
		if kernel.Norm2(*g) == 0 {
			t.Errorf("%s: zero gradient", ps[i].Name)
			continue
		}
		// A few coordinates per tensor: central differences in float32.
		for _, j := range []int{0, p.Len() / 2, p.Len() - 1} {
			old := p.Data[j]
			const eps = 1e-2
			p.Data[j] = old + eps
			up := loss()
			p.Data[j] = old - eps
			down := loss()
			p.Data[j] = old
			num := (up - down) / (2 * eps)
			got := float64(g.Data[j])
			if math.Abs(num-got) > 2e-3+0.05*math.Abs(num) {
				t.Errorf("%s[%d]: gradient %.6f, finite difference %.6f", ps[i].Name, j, got, num)
			}
		}
	}
}

func TestTrainLMLearnsAndFreezes(t *testing.T) {
	d := textData(t, 16, 40)
	m, err := InitLM(LMConfig{Vocab: data.VocabSize, Context: 16, Dim: 32, Layers: 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	before, err := EvaluateLM(m, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	hyper := []byte(`{"epochs": 8, "batch_size": 8, "learning_rate": 0.003}`)
	out, met, err := TrainLM(m, d, hyper, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	after, err := EvaluateLM(out, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loss %.3f → %.3f (train %.3f), accuracy %.3f → %.3f, %d steps", before.Loss, after.Loss, met.Loss, before.Accuracy, after.Accuracy, met.Steps)
	if !(after.Loss < before.Loss-1) || met.Steps != 40 {
		t.Fatalf("loss %.3f → %.3f in %d steps", before.Loss, after.Loss, met.Steps)
	}
	// Same inputs, same bits.
	again, _, err := TrainLM(m, d, hyper, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.HashHex() != out.HashHex() {
		t.Fatal("two equal runs differ")
	}
	// LoRA: only adapters change; merging gives the adapted function.
	lora, err := AddLoRA(m, 4, []string{"attn.q", "attn.v"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	tuned, _, err := TrainLM(lora, d, hyper, 7, LoRAParams(lora))
	if err != nil {
		t.Fatal(err)
	}
	for i, tn := range tuned.Tensors {
		changed := !floats.SameBits(tn.Data, lora.Tensors[i].Data)
		if adapter := slices.Contains(LoRAParams(lora), i); adapter != changed {
			t.Errorf("%s: adapter %v, changed %v", tn.Name, adapter, changed)
		}
	}
	tunedMet, err := EvaluateLM(tuned, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := MergeLoRA(tuned)
	if err != nil {
		t.Fatal(err)
	}
	if len(merged.Tensors) != len(m.Tensors) {
		t.Fatalf("merged model has %d tensors, base %d", len(merged.Tensors), len(m.Tensors))
	}
	mergedMet, err := EvaluateLM(merged, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(mergedMet.Loss-tunedMet.Loss) > 1e-4 || !(tunedMet.Loss < before.Loss) {
		t.Fatalf("LoRA loss %.5f, merged %.5f, base %.5f", tunedMet.Loss, mergedMet.Loss, before.Loss)
	}
}

// TestLMStepperMatchesTrainAndResumes: steps equal TrainLM's epochs bit for
// bit, and a stepper rebuilt from parameters, cursor and optimizer state
// halfway continues to the same bits.
func TestLMStepperMatchesTrainAndResumes(t *testing.T) {
	d := textData(t, 16, 20)
	m, err := InitLM(LMConfig{Vocab: data.VocabSize, Context: 16, Dim: 16, Layers: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	hyper := []byte(`{"epochs": 2, "batch_size": 6, "warmup": 3}`)
	want, _, err := TrainLM(m, d, hyper, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := lm.ParseHyper(hyper)
	s, err := NewLMStepper(m, d, h, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := 2 * s.BatchesPerEpoch()
	for range steps / 2 {
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
	}
	params, opt := s.Model().Clone(), s.OptimizerState()
	ep, b := s.Cursor()
	r, err := NewLMStepper(m, d, h, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(r.SetModel(params), r.SetOptimizerState(opt), r.Seek(ep, b)); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*LMStepper{s, r} {
		for range steps - steps/2 {
			if _, err := st.Step(); err != nil {
				t.Fatal(err)
			}
		}
		if st.Model().HashHex() != want.HashHex() {
			t.Fatal("stepper differs from TrainLM")
		}
	}
	bad := r.OptimizerState()
	bad.Tensors[0].Data[0] = float32(math.NaN())
	if err := r.SetOptimizerState(bad); !errors.Is(err, ErrArch) {
		t.Fatalf("non-finite moment: %v", err)
	}
}
