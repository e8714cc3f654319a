package poolsvc

import (
	"bytes"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
)

// A command job's final checkpoint holds its script's model.safetensors,
// not tensors: that file is the model handed over.
func TestFinalParamsOfACommandJob(t *testing.T) {
	m := &model.Model{Tensors: []model.Tensor{{Name: "w", Shape: []int{2}, Data: []float32{0.5, -1}}}}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	got, err := finalParams(&checkpoint.Checkpoint{Files: []checkpoint.File{{Name: "state.json", Data: []byte("{}")},
		{Name: modelFile, Data: buf.Bytes()}}})
	if err != nil {
		t.Fatal(err)
	}
	if f := got.Flatten(); len(f) != 2 || f[0] != 0.5 || f[1] != -1 {
		t.Fatalf("params %v", f)
	}
	for name, ck := range map[string]*checkpoint.Checkpoint{
		"no model file":   {Files: []checkpoint.File{{Name: "state.json", Data: []byte("{}")}}},
		"not safetensors": {Files: []checkpoint.File{{Name: modelFile, Data: []byte("garbage")}}},
	} {
		if _, err := finalParams(ck); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
