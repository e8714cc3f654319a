package edge

import (
	"errors"
	"math"
	"testing"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// TestHeldInput: a group's plan masks the held update of the training
// round it names, clipped to the plan's bound and then scaled by its
// staleness weight, once; a plan naming another round, or a weight outside
// (0, 1], encodes nothing.
func TestHeldInput(t *testing.T) {
	var got []float32
	var gotExamples int
	encode := func(delta []float32, examples int) ([]uint32, func(), error) {
		got, gotExamples = append([]float32(nil), delta...), examples
		return make([]uint32, len(delta)), func() {}, nil
	}
	plan := &pb.RoundPlan{TaskId: "t", Round: 9, TrainedRound: 7, StalenessWeight: 0.5, MaxUpdateNorm: 1}
	a := &Agent{held: &heldUpdate{task: "t", round: 7, delta: []float32{3, 4}, examples: 12}}
	if _, _, err := a.heldInput(t.Context(), plan, nil, wasm.Call{}, encode); err != nil {
		t.Fatal(err)
	}
	// (3, 4) has norm 5: clipped to (0.6, 0.8), then halved.
	if len(got) != 2 || math.Abs(float64(got[0])-0.3) > 1e-6 || math.Abs(float64(got[1])-0.4) > 1e-6 || gotExamples != 12 {
		t.Fatalf("encoded %v with %d examples", got, gotExamples)
	}
	if _, _, err := a.heldInput(t.Context(), plan, nil, wasm.Call{}, encode); !errors.Is(err, ErrNoHeldUpdate) {
		t.Fatalf("a second use of the held update: %v", err)
	}
	for _, tc := range []struct {
		name  string
		round uint64
		w     float64
	}{{"another round", 6, 0.5}, {"weight 0", 7, 0}, {"weight above 1", 7, 1.5}, {"NaN weight", 7, math.NaN()}} {
		a.held = &heldUpdate{task: "t", round: 7, delta: []float32{1, 1}, examples: 1}
		got = nil
		p := &pb.RoundPlan{TaskId: "t", TrainedRound: tc.round, StalenessWeight: tc.w}
		if _, _, err := a.heldInput(t.Context(), p, nil, wasm.Call{}, encode); err == nil || got != nil {
			t.Errorf("%s: err %v, encoded %v", tc.name, err, got)
		}
	}
}
