package model

import (
	"fmt"
	"math"
	"slices"
)

// Layout describes where each tensor of a model lives in its flat vector
// (see Model.Flatten).
type Layout struct {
	Entries []LayoutEntry
}

// LayoutEntry is one tensor's place in the flat vector.
type LayoutEntry struct {
	Name   string
	Shape  []int
	Offset int // index of the tensor's first value
	Size   int // number of values
}

// Layout returns the names, shapes and offsets of m's tensors in the vector
// Flatten produces. The shapes are copied.
func (m *Model) Layout() Layout {
	if m == nil {
		return Layout{}
	}
	l := Layout{Entries: make([]LayoutEntry, len(m.Tensors))}
	off := 0
	for i, t := range m.Tensors {
		// len(Data) rather than the shape's size keeps Layout and Flatten
		// in step even for an invalid model; Unflatten then refuses it.
		l.Entries[i] = LayoutEntry{Name: t.Name, Shape: slices.Clone(t.Shape), Offset: off, Size: len(t.Data)}
		off += len(t.Data)
	}
	return l
}

// Flatten returns the concatenation of m's tensor data in tensor order.
func (m *Model) Flatten() []float32 {
	if m == nil {
		return nil
	}
	n := 0
	for _, t := range m.Tensors {
		n += len(t.Data)
	}
	v := make([]float32, 0, n)
	for _, t := range m.Tensors {
		v = append(v, t.Data...)
	}
	return v
}

// Size returns the length of the flat vector l describes.
func (l Layout) Size() int {
	n := 0
	for _, e := range l.Entries {
		n += e.Size
	}
	return n
}

// Equal reports whether l and o describe the same tensors at the same places.
func (l Layout) Equal(o Layout) bool {
	return slices.EqualFunc(l.Entries, o.Entries, func(a, b LayoutEntry) bool {
		return a.Name == b.Name && a.Offset == b.Offset && a.Size == b.Size && slices.Equal(a.Shape, b.Shape)
	})
}

// Unflatten splits v into a model with l's tensors. v is copied, and the
// result is validated (so a NaN in v is ErrNonFinite); its Lineage is empty.
// The layout itself must be consistent: contiguous offsets from 0 and sizes
// matching the shapes.
func (l Layout) Unflatten(v []float32) (*Model, error) {
	off := 0
	for _, e := range l.Entries {
		if e.Offset != off {
			return nil, fmt.Errorf("model: unflatten: tensor %q at offset %d, want %d: %w", e.Name, e.Offset, off, ErrInvalidOffsets)
		}
		n, err := shapeSize(e.Shape)
		if err != nil {
			return nil, fmt.Errorf("model: unflatten: tensor %q: %w", e.Name, err)
		}
		if e.Size != n {
			return nil, fmt.Errorf("model: unflatten: tensor %q: size %d, shape %v holds %d: %w", e.Name, e.Size, e.Shape, n, ErrShapeMismatch)
		}
		if off > math.MaxInt-n {
			return nil, fmt.Errorf("model: unflatten: layout size overflows: %w", ErrTooLarge)
		}
		off += n
	}
	if len(v) != off {
		return nil, fmt.Errorf("model: unflatten: vector has %d values, layout needs %d: %w", len(v), off, ErrShapeMismatch)
	}
	data := slices.Clone(v)
	m := &Model{Tensors: make([]Tensor, len(l.Entries))}
	for i, e := range l.Entries {
		end := e.Offset + e.Size
		// Capped capacity: appending to one tensor must not clobber the next.
		m.Tensors[i] = Tensor{Name: e.Name, Shape: slices.Clone(e.Shape), Data: data[e.Offset:end:end]}
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("model: unflatten: %w", err)
	}
	return m, nil
}
