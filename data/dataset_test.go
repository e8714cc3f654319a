package data

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(-1))
	tests := []struct {
		name string
		d    *Dataset
		ok   bool
	}{
		{"valid", &Dataset{Features: []float32{0, 1, 2, 3}, Labels: []uint8{0, 2}, Dim: 2, NumClasses: 3}, true},
		{"empty", &Dataset{Dim: 4, NumClasses: 10}, true},
		{"256 classes", &Dataset{Features: []float32{1}, Labels: []uint8{255}, Dim: 1, NumClasses: 256}, true},
		{"nil", nil, false},
		{"dim 0", &Dataset{Dim: 0, NumClasses: 1}, false},
		{"negative dim", &Dataset{Dim: -1, NumClasses: 1}, false},
		{"0 classes", &Dataset{Dim: 1, NumClasses: 0}, false},
		{"257 classes", &Dataset{Dim: 1, NumClasses: 257}, false},
		{"features not multiple of dim", &Dataset{Features: []float32{1, 2, 3}, Labels: []uint8{0}, Dim: 2, NumClasses: 1}, false},
		{"too few labels", &Dataset{Features: []float32{1, 2, 3, 4}, Labels: []uint8{0}, Dim: 2, NumClasses: 1}, false},
		{"too many labels", &Dataset{Features: []float32{1, 2}, Labels: []uint8{0, 0}, Dim: 2, NumClasses: 1}, false},
		{"label out of range", &Dataset{Features: []float32{1, 2}, Labels: []uint8{3}, Dim: 2, NumClasses: 3}, false},
		{"NaN", &Dataset{Features: []float32{1, nan}, Labels: []uint8{0}, Dim: 2, NumClasses: 1}, false},
		{"Inf", &Dataset{Features: []float32{inf, 1}, Labels: []uint8{0}, Dim: 2, NumClasses: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.d.Validate()
			if tt.ok && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrInvalidDataset) {
				t.Fatalf("Validate error = %v, want ErrInvalidDataset", err)
			}
		})
	}
}

func TestSubset(t *testing.T) {
	d := &Dataset{
		Features:   []float32{0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5},
		Labels:     []uint8{0, 1, 2, 1},
		Dim:        2,
		NumClasses: 3,
	}
	s := d.Subset([]int{3, 0, 3})
	if s.Dim != 2 || s.NumClasses != 3 || s.Len() != 3 {
		t.Fatalf("Subset shape = dim %d, classes %d, len %d", s.Dim, s.NumClasses, s.Len())
	}
	if want := []float32{3, 3.5, 0, 0.5, 3, 3.5}; !slices.Equal(s.Features, want) {
		t.Errorf("Subset features = %v, want %v", s.Features, want)
	}
	if want := []uint8{1, 0, 1}; !slices.Equal(s.Labels, want) {
		t.Errorf("Subset labels = %v, want %v", s.Labels, want)
	}
	if err := s.Validate(); err != nil {
		t.Error(err)
	}

	// The subset owns its memory.
	s.Features[0], s.Labels[0] = 99, 2
	if d.Features[6] != 3 || d.Labels[3] != 1 {
		t.Error("Subset shares memory with its source")
	}

	if e := d.Subset(nil); e.Len() != 0 || len(e.Features) != 0 || e.Dim != 2 {
		t.Errorf("empty Subset = %+v", e)
	}
}

func TestSubsetOutOfRangePanics(t *testing.T) {
	d := &Dataset{Features: []float32{1}, Labels: []uint8{0}, Dim: 1, NumClasses: 1}
	for _, idx := range []int{-1, 1} {
		func() {
			defer func() {
				r := recover()
				if msg, ok := r.(string); !ok || !strings.Contains(msg, "out of range") {
					t.Errorf("Subset([%d]) recovered %v, want an out of range panic", idx, r)
				}
			}()
			d.Subset([]int{idx})
		}()
	}
}
