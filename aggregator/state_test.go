package aggregator_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

var allKinds = []aggregator.Kind{
	aggregator.FedAvg, aggregator.FedAvgM, aggregator.FedAdam, aggregator.FedYogi,
	aggregator.FedAdagrad, aggregator.Median, aggregator.TrimmedMean,
}

// TestStateRoundTrip restores a rule's state into a fresh rule, as after a
// server restart, and checks that both then take identical steps.
func TestStateRoundTrip(t *testing.T) {
	deltas := [][]float32{{0.5, -0.2, 0}, {0.1, 0.01, -3}, {-0.4, 0.2, 1}}
	for _, kind := range allKinds {
		t.Run(kind.String(), func(t *testing.T) {
			a := mustRule(t, kind, 3)
			ga := []float32{1, 2, 3}
			for _, d := range deltas[:2] {
				if err := a.Apply(ga, d); err != nil {
					t.Fatal(err)
				}
			}
			state, err := a.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if want := 18 + 12*len(stateVectors(t, a)); len(state) != want {
				t.Errorf("state is %d bytes, want %d", len(state), want)
			}
			b := mustRule(t, kind, 3)
			if err := b.UnmarshalBinary(state); err != nil {
				t.Fatal(err)
			}
			if again, _ := b.MarshalBinary(); !bytes.Equal(again, state) {
				t.Fatalf("re-encoded state differs:\n%x\n%x", again, state)
			}
			if b.Steps() != 2 {
				t.Errorf("restored Steps = %d, want 2", b.Steps())
			}
			gb := slices.Clone(ga)
			if err := a.Apply(ga, deltas[2]); err != nil {
				t.Fatal(err)
			}
			if err := b.Apply(gb, deltas[2]); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ga, gb) {
				t.Errorf("restored rule stepped to %v, original to %v", gb, ga)
			}
		})
	}
}

func TestUnmarshalRefusesBadState(t *testing.T) {
	r := mustRule(t, aggregator.FedYogi, 2)
	if err := r.Apply([]float32{0, 0}, []float32{0.5, -1}); err != nil {
		t.Fatal(err)
	}
	good, _ := r.MarshalBinary() // 18 + 2·2·4 bytes: m[0] at 18, v[0] at 26
	edit := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	putF32 := func(off int, x float32) []byte {
		return edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], math.Float32bits(x)); return b })
	}
	adam, _ := mustRule(t, aggregator.FedAdam, 2).MarshalBinary()
	wide, _ := mustRule(t, aggregator.FedYogi, 3).MarshalBinary()
	cases := []struct {
		name  string
		state []byte
	}{
		{"empty", nil},
		{"header only, cut", good[:17]},
		{"header only", good[:18]},
		{"one byte short", good[:len(good)-1]},
		{"one byte long", append(slices.Clone(good), 0)},
		{"version 0", edit(func(b []byte) []byte { b[0] = 0; return b })},
		{"version 2", edit(func(b []byte) []byte { b[0] = 2; return b })},
		{"other kind", adam},
		{"unknown kind", edit(func(b []byte) []byte { b[1] = 99; return b })},
		{"other dim", wide},
		{"dim overflowing int", edit(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[2:], 1<<63+2); return b })},
		{"NaN momentum", putF32(22, nan)},
		{"Inf momentum", putF32(18, ninf)},
		{"Inf second moment", putF32(26, pinf)},
		{"negative second moment", putF32(30, -1e-6)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := r.UnmarshalBinary(tc.state); !errors.Is(err, aggregator.ErrState) {
				t.Fatalf("UnmarshalBinary = %v, want ErrState", err)
			}
			if now, _ := r.MarshalBinary(); !bytes.Equal(now, good) {
				t.Error("refused state changed the rule")
			}
		})
	}
	// A zero second moment is valid (√0 + τ > 0); it is where v starts when
	// τ² underflows float32.
	if err := r.UnmarshalBinary(putF32(26, 0)); err != nil {
		t.Errorf("zero second moment refused: %v", err)
	}
}
