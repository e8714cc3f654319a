package aggregator_test

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

// FuzzUnmarshalState feeds arbitrary bytes to every rule's decoder: it must
// refuse with ErrState and no change, or accept state that re-encodes to the
// same bytes and steps to a finite model.
func FuzzUnmarshalState(f *testing.F) {
	const dim = 3
	for _, kind := range allKinds {
		r := mustRule(f, kind, dim)
		for range 2 {
			if err := r.Apply([]float32{1, 2, 3}, []float32{0.5, -0.25, 0.125}); err != nil {
				f.Fatal(err)
			}
		}
		b, err := r.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte{1, 4, 3, 0, 0, 0, 0, 0, 0, 0})

	f.Fuzz(func(t *testing.T, b []byte) {
		for _, kind := range allKinds {
			r := mustRule(t, kind, dim)
			before, _ := r.MarshalBinary()
			err := r.UnmarshalBinary(b)
			after, _ := r.MarshalBinary()
			if err != nil {
				if !errors.Is(err, aggregator.ErrState) {
					t.Fatalf("%v: error %v does not wrap ErrState", kind, err)
				}
				if !bytes.Equal(before, after) {
					t.Fatalf("%v: refused state changed the rule", kind)
				}
				continue
			}
			if !bytes.Equal(after, b) {
				t.Fatalf("%v: accepted %x but re-encodes as %x", kind, b, after)
			}
			g := []float32{0, 0, 0}
			err = r.Apply(g, []float32{1e-3, -1e-3, 0})
			if err != nil && !errors.Is(err, aggregator.ErrNonFinite) {
				t.Fatalf("%v: Apply after restore: %v", kind, err)
			}
			for _, x := range g {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("%v: restored state stepped to %v", kind, g)
				}
			}
		}
	})
}
