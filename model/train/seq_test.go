package train

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// TestSeqLearns: the LEAF-shaped CNN, scaled down, learns a task a linear
// model cannot (the class is where a patch lies, whatever its brightness),
// and LoRA by layer position adapts only dense layers.
func TestSeqLearns(t *testing.T) {
	const side, n = 8, 90
	d := &data.Dataset{Dim: side * side, NumClasses: 3, Features: make([]float32, n*side*side), Labels: make([]uint8, n)}
	for i := 0; i < n; i++ {
		cl := i % 3
		d.Labels[i] = uint8(cl)
		v := float32(1 + i%5)
		for r := 2 * cl; r < 2*cl+3; r++ {
			for c := 2; c < 5; c++ {
				d.Features[i*side*side+r*side+c] = v
			}
		}
	}
	a, err := seq.Parse("seq:input(1,8,8),conv(6,3,pad=1),relu,maxpool(2),dense(16),relu,dense(3)")
	if err != nil {
		t.Fatal(err)
	}
	m, err := InitSeq(a, 1)
	if err != nil {
		t.Fatal(err)
	}
	before, err := EvaluateSeq(m, d, 32)
	if err != nil {
		t.Fatal(err)
	}
	trained, met, err := TrainSeq(m, d, sgd.Hyper{Epochs: 15, BatchSize: 10, EvalBatchSize: 32, LearningRate: 0.05}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	after, err := EvaluateSeq(trained, d, 32)
	if err != nil {
		t.Fatal(err)
	}
	if after.Accuracy < 0.95 || after.Loss >= before.Loss {
		t.Errorf("accuracy %.3f → %.3f, loss %.3f → %.3f (last epoch %+v)", before.Accuracy, after.Accuracy, before.Loss, after.Loss, met)
	}
	if trained.Arch != m.Arch {
		t.Error("training dropped the architecture")
	}
	lora, err := AddLoRA(m, 2, []string{"3", "5"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(LoRAParams(lora)); got != 4 {
		t.Errorf("%d adapter tensors, want 4", got)
	}
	if _, err := AddLoRA(m, 2, []string{"0"}, 1); err == nil {
		t.Error("an adapter on a convolution was accepted")
	}
	if _, err := AddLoRA(m, 2, []string{"attn.q"}, 1); err == nil {
		t.Error("a transformer target on a layer list was accepted")
	}
	merged, err := MergeLoRA(lora)
	if err != nil {
		t.Fatal(err)
	}
	if merged.HashHex() != m.HashHex() {
		t.Error("merging untrained adapters changed the model (or lost its architecture)")
	}
}
