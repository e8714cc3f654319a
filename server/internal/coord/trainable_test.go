package coord

import (
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestTrainable(t *testing.T) {
	var ts []model.Tensor
	for _, n := range []string{"tok_emb.weight", "blocks.0.attn.q.weight", "blocks.0.attn.q.lora_a", "blocks.0.attn.q.lora_b",
		"blocks.1.attn.q.weight", "lm_head.weight"} {
		ts = append(ts, model.Tensor{Name: n, Shape: []int{2}, Data: []float32{1, 2}})
	}
	base, err := model.New(ts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []string
		want    []int
	}{
		{nil, nil},
		{[]string{"lora"}, []int{2, 3}},
		{[]string{"blocks.1.*", "lm_head.weight"}, []int{4, 5}},
		{[]string{"lm_head.weight", "blocks.*.attn.q.weight"}, []int{1, 4, 5}},
		{[]string{"*"}, nil}, // everything is the same as nothing named
	} {
		idx, sub, err := Trainable(&pb.Task{Trainable: tc.entries}, base)
		if err != nil {
			t.Fatalf("%v: %v", tc.entries, err)
		}
		if len(idx) != len(tc.want) {
			t.Fatalf("%v: %v, want %v", tc.entries, idx, tc.want)
		}
		for k := range idx {
			if idx[k] != tc.want[k] || sub.Tensors[k].Name != base.Tensors[idx[k]].Name {
				t.Fatalf("%v: %v, want %v", tc.entries, idx, tc.want)
			}
		}
		if tc.want == nil && sub != base {
			t.Errorf("%v: training everything should use the model itself", tc.entries)
		}
		if got := planTrainable(idx); len(got) != len(idx) {
			t.Errorf("plan list %v for %v", got, idx)
		}
	}
	long := make([]string, maxTrainableEntries+1)
	for i := range long {
		long[i] = "lm_head.weight"
	}
	for _, tc := range []struct {
		entries []string
		want    string
	}{
		{[]string{"blocks.2.*"}, "matches no tensor"},
		{[]string{"lm_head.weight", "nope"}, `"nope" matches no tensor`},
		{[]string{"[a-"}, "not a valid pattern"},
		{[]string{""}, "must be 1 to"},
		{[]string{strings.Repeat("a", maxTrainableEntry+1)}, "must be 1 to"},
		{long, "at most"},
	} {
		if _, _, err := Trainable(&pb.Task{Trainable: tc.entries}, base); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.40v: %v, want an error containing %q", tc.entries, err, tc.want)
		}
	}
	noLoRA, _ := model.New(ts[0], ts[1])
	if _, _, err := Trainable(&pb.Task{Trainable: []string{"lora"}}, noLoRA); err == nil || !strings.Contains(err.Error(), "model lora add") {
		t.Errorf("lora without adapters: %v", err)
	}
}
