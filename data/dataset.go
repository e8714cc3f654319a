package data

import (
	"fmt"

	"github.com/fleetlearn/fleetlearn/internal/floats"
)

// MaxClasses is the largest class count a Dataset can hold: labels are uint8.
const MaxClasses = 256

// Dataset is a labelled classification dataset held in memory, row-major features.
type Dataset struct {
	Features   []float32 // N x Dim, row-major
	Labels     []uint8   // N class indices
	Dim        int
	NumClasses int
}

// Len returns the number of examples.
func (d *Dataset) Len() int { return len(d.Labels) }

// Validate checks that the lengths are consistent, every label is below
// NumClasses and every feature is finite. Errors wrap [ErrInvalidDataset].
func (d *Dataset) Validate() error {
	if d == nil {
		return fmt.Errorf("data: validate: nil dataset: %w", ErrInvalidDataset)
	}
	if d.Dim < 1 {
		return fmt.Errorf("data: validate: dim %d < 1: %w", d.Dim, ErrInvalidDataset)
	}
	if d.NumClasses < 1 || d.NumClasses > MaxClasses {
		return fmt.Errorf("data: validate: num_classes %d outside [1, %d]: %w", d.NumClasses, MaxClasses, ErrInvalidDataset)
	}
	// Division rather than multiplication so huge lengths cannot overflow.
	if len(d.Features)%d.Dim != 0 || len(d.Features)/d.Dim != len(d.Labels) {
		return fmt.Errorf("data: validate: %d features is not %d labels x dim %d: %w",
			len(d.Features), len(d.Labels), d.Dim, ErrInvalidDataset)
	}
	if err := checkLabels(d.Labels, d.NumClasses); err != nil {
		return fmt.Errorf("data: validate: %w: %w", err, ErrInvalidDataset)
	}
	// Every sandbox call validates its dataset, so the scan is on each
	// device's round path.
	if i := floats.FirstNonFinite(d.Features); i >= 0 {
		return fmt.Errorf("data: validate: feature %d of example %d is %v: %w", i%d.Dim, i/d.Dim, d.Features[i], ErrInvalidDataset)
	}
	return nil
}

// Subset returns a new Dataset holding copies of the examples at idx, in
// that order; an index may repeat. Like a slice expression it panics if an
// index is out of range, since indices come from the caller's own partition.
func (d *Dataset) Subset(idx []int) *Dataset {
	n := d.Len()
	out := &Dataset{
		Features:   make([]float32, len(idx)*d.Dim),
		Labels:     make([]uint8, len(idx)),
		Dim:        d.Dim,
		NumClasses: d.NumClasses,
	}
	for j, i := range idx {
		if i < 0 || i >= n {
			panic(fmt.Sprintf("data: subset: index %d out of range [0, %d)", i, n))
		}
		out.Labels[j] = d.Labels[i]
		copy(out.Features[j*d.Dim:(j+1)*d.Dim], d.Features[i*d.Dim:(i+1)*d.Dim])
	}
	return out
}

// checkLabels reports the first label that is not below numClasses.
func checkLabels(labels []uint8, numClasses int) error {
	for i, l := range labels {
		if int(l) >= numClasses {
			return fmt.Errorf("label %d of example %d >= num_classes %d", l, i, numClasses)
		}
	}
	return nil
}
