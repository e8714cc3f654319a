package wasmtest_test

import (
	"context"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

func TestTrivial(t *testing.T) {
	ctx := context.Background()
	sb, err := wasm.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(ctx) })
	code := wasmtest.Trivial()
	mod, err := sb.Load(ctx, code, wire.SHA256(code))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	m, err := model.New(
		model.Tensor{Name: "w", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		model.Tensor{Name: "b", Shape: []int{3}, Data: []float32{-1, 0, 1}},
	)
	if err != nil {
		t.Fatal(err)
	}
	ds := &data.Dataset{Features: make([]float32, 8), Labels: []uint8{0, 1}, Dim: 4, NumClasses: 2}
	res, err := mod.Train(ctx, wasm.Call{Model: m, Data: ds})
	if err != nil {
		t.Fatalf("train: %v", err)
	}
	if res.NumExamples != 1 {
		t.Errorf("num_examples = %d, want 1", res.NumExamples)
	}
	before, after := m.Flatten(), res.Model.Flatten()
	for i := range before {
		if got, want := after[i], before[i]+float32(wasmtest.TrivialStep); got != want {
			t.Errorf("value %d = %v, want %v", i, got, want)
		}
	}
	ev, err := mod.Evaluate(ctx, wasm.Call{Model: m, Data: ds})
	if err != nil {
		t.Fatalf("evaluate: %v", err)
	}
	if acc, ok := ev.Metrics["accuracy"]; !ok || acc != 0 {
		t.Errorf("evaluate metrics = %v, want accuracy 0", ev.Metrics)
	}
	if len(code) > 1024 {
		t.Errorf("module is %d bytes; it is meant to be tiny", len(code))
	}
}
