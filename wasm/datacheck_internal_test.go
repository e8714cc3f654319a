package wasm

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
)

// TestDataChecksOncePerDataset: a dataset's contents are scanned at its
// first validation only; another dataset, even of the same shape, or one
// whose storage changed, is scanned afresh; the fifth dataset evicts the
// first.
func TestDataChecksOncePerDataset(t *testing.T) {
	mk := func() *data.Dataset {
		return &data.Dataset{Features: []float32{0, 1, 2, 3}, Labels: []uint8{0, 1}, Dim: 2, NumClasses: 2}
	}
	var c dataChecks
	d := mk()
	if err := c.validate(d); err != nil {
		t.Fatal(err)
	}
	d.Features[1] = float32(math.NaN()) // what Call forbids: proves the scan is not repeated
	if err := c.validate(d); err != nil {
		t.Fatalf("second validation scanned again: %v", err)
	}
	bad := mk()
	bad.Features[1] = float32(math.NaN())
	if err := c.validate(bad); !errors.Is(err, data.ErrInvalidDataset) {
		t.Fatalf("a new dataset with a NaN: %v", err)
	}
	d.Labels = []uint8{0, 5} // new storage
	if err := c.validate(d); !errors.Is(err, data.ErrInvalidDataset) {
		t.Fatalf("new label storage with label 5 of 2 classes: %v", err)
	}
	d.Labels = []uint8{0, 1}
	first := mk()
	if err := c.validate(first); err != nil {
		t.Fatal(err)
	}
	first.Labels[0] = 9
	for range 4 {
		if err := c.validate(mk()); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.validate(first); !errors.Is(err, data.ErrInvalidDataset) {
		t.Fatalf("an evicted dataset was not scanned again: %v", err)
	}
	if err := c.validate(&data.Dataset{Dim: 2, NumClasses: 2}); err != nil {
		t.Fatalf("empty dataset: %v", err)
	}
}
