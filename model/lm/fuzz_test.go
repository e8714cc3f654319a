package lm_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/fleetlearn/fleetlearn/model/lm"
)

// FuzzParseHyper: task hyper-parameters come from an API client; whatever
// they hold, ParseHyper either refuses them with ErrHyper or returns values
// inside every limit.
func FuzzParseHyper(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"epochs": 2, "batch_size": 8, "learning_rate": 0.003, "warmup": 5}`,
		`{"heads": 4, "grad_clip": 0, "weight_decay": 0.1}`, `{"epochs": 0}`, `{"learning_rate": 1e309}`,
		`{"nope": 1}`, `{} {}`, `[1]`, `{"max_steps": -1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := lm.ParseHyper(b)
		if err != nil {
			if !errors.Is(err, lm.ErrHyper) {
				t.Fatalf("error %v does not wrap ErrHyper", err)
			}
			return
		}
		if h.Validate() != nil || h.BatchSize < 1 || h.BatchSize > lm.MaxBatchSize || h.Epochs < 1 || h.Epochs > lm.MaxEpochs ||
			!(h.LearningRate > 0 && h.LearningRate <= 1) || h.MaxSteps < 0 || h.MaxSteps > lm.MaxSteps {
			t.Fatalf("accepted out-of-range %+v", h)
		}
	})
}

// FuzzParse: parameter names and shapes come from a model an API client
// uploaded; Parse refuses anything but the architecture, within its bounds,
// and never panics.
func FuzzParse(f *testing.F) {
	good := []lm.Param{{"tok_emb.weight", []int{5, 4}}, {"pos_emb.weight", []int{3, 4}},
		{"blocks.0.ln1.weight", []int{4}}, {"blocks.0.ln1.bias", []int{4}},
		{"blocks.0.attn.q.weight", []int{4, 4}}, {"blocks.0.attn.k.weight", []int{4, 4}}, {"blocks.0.attn.v.weight", []int{4, 4}},
		{"blocks.0.attn.proj.weight", []int{4, 4}}, {"blocks.0.ln2.weight", []int{4}}, {"blocks.0.ln2.bias", []int{4}},
		{"blocks.0.mlp.fc.weight", []int{8, 4}}, {"blocks.0.mlp.fc.bias", []int{8}},
		{"blocks.0.mlp.proj.weight", []int{4, 8}}, {"blocks.0.mlp.proj.bias", []int{4}},
		{"ln_f.weight", []int{4}}, {"ln_f.bias", []int{4}}, {"lm_head.weight", []int{5, 4}}}
	b, _ := json.Marshal(good)
	f.Add(b, 2)
	withLoRA := append(append([]lm.Param{}, good...), lm.Param{"lm_head.lora_a", []int{2, 4}}, lm.Param{"lm_head.lora_b", []int{5, 2}})
	b, _ = json.Marshal(withLoRA)
	f.Add(b, 0)
	f.Add([]byte(`[{"Name":"tok_emb.weight","Shape":[-1,4]}]`), 1)
	f.Fuzz(func(t *testing.T, b []byte, heads int) {
		var ps []lm.Param
		if json.Unmarshal(b, &ps) != nil || len(ps) > 512 {
			return
		}
		a, err := lm.Parse(ps, heads)
		if err != nil {
			if !errors.Is(err, lm.ErrArch) {
				t.Fatalf("error %v does not wrap ErrArch", err)
			}
			return
		}
		if a.Dim%a.Heads != 0 || a.Vocab < 1 || a.Vocab > lm.MaxVocab || a.Context < 1 || a.Context > lm.MaxContext ||
			len(a.Blocks) < 1 || len(a.Blocks) > lm.MaxLayers {
			t.Fatalf("accepted %+v", a)
		}
		for _, l := range a.Linears() {
			if l.A >= 0 && (l.Rank < 1 || l.Rank > lm.MaxRank) {
				t.Fatalf("accepted adapter rank %d", l.Rank)
			}
		}
	})
}
