package model

import (
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/fleetlearn/fleetlearn/internal/floats"
)

// metadataKey is the safetensors header key reserved for string metadata; a
// tensor of that name could not be written.
const metadataKey = "__metadata__"

// Tensor is one named float32 parameter tensor, row-major.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// Size returns the number of values Shape describes: the product of its
// dimensions, 1 for a scalar (empty Shape). It returns -1 when a dimension is
// negative or the product overflows int; Validate reports both.
func (t Tensor) Size() int {
	n, err := shapeSize(t.Shape)
	if err != nil {
		return -1
	}
	return n
}

// shapeSize multiplies the dimensions, refusing negatives and any partial
// product that overflows, even if a later dimension is zero.
func shapeSize(shape []int) (int, error) {
	n := 1
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %v: dimension %d is negative: %w", shape, i, ErrInvalidShape)
		}
		if d != 0 && n > math.MaxInt/d {
			return 0, fmt.Errorf("shape %v: element count overflows: %w", shape, ErrTooLarge)
		}
		n *= d
	}
	return n, nil
}

// Model is an ordered list of named tensors plus lineage. The order is
// canonical: see the package documentation.
type Model struct {
	Tensors []Tensor
	Lineage Lineage
	// Arch names the network the tensors parameterise when their names do
	// not (a layer list, "seq:conv(32,5,pad=2),relu,…", package model/seq);
	// empty for models whose tensor names say what they are. It travels in
	// the safetensors metadata (fleetlearn.arch) and is part of Hash: the
	// same tensors under another architecture are another model.
	Arch string
}

// MaxArchBytes bounds Model.Arch.
const MaxArchBytes = 8 << 10

// Lineage records where a model version came from.
type Lineage struct {
	Version string // e.g. a content hash or "task/round"
	Parent  string // parent version, "" for a base model
	Task    string // producing task id, if any
	Round   int64  // producing round, if any
	Job     string // producing pretraining job, if any
	Source  string // free text, e.g. "pytorch import"
}

// New returns a validated model holding tensors in the given order. The
// tensor list is copied but the Shape and Data slices are shared with the
// caller, so large parameter sets are not duplicated.
func New(tensors ...Tensor) (*Model, error) {
	m := &Model{Tensors: slices.Clone(tensors)}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// Validate reports the first problem found: a nil model, an empty, non-UTF-8
// or reserved ("__metadata__") name, a duplicate name, a negative or
// overflowing shape, data whose length differs from the shape's size, a NaN
// or infinite value (ErrNonFinite, naming the tensor and index), or lineage
// strings that are not UTF-8.
func (m *Model) Validate() error {
	if err := m.validate(); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// validate is Validate without the operation prefix, for callers that add
// their own.
func (m *Model) validate() error {
	if m == nil {
		return ErrNilModel
	}
	seen := make(map[string]struct{}, len(m.Tensors))
	for i := range m.Tensors {
		t := &m.Tensors[i]
		if err := validateName(t.Name); err != nil {
			return fmt.Errorf("tensor %d: %w", i, err)
		}
		if _, dup := seen[t.Name]; dup {
			return fmt.Errorf("tensor %q: %w", t.Name, ErrDuplicateName)
		}
		seen[t.Name] = struct{}{}
		n, err := shapeSize(t.Shape)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if len(t.Data) != n {
			return fmt.Errorf("tensor %q: shape %v holds %d values, data has %d: %w",
				t.Name, t.Shape, n, len(t.Data), ErrShapeMismatch)
		}
		if j := floats.FirstNonFinite(t.Data); j >= 0 {
			return fmt.Errorf("tensor %q index %d: value %v: %w", t.Name, j, t.Data[j], ErrNonFinite)
		}
	}
	if err := validateArch(m.Arch); err != nil {
		return err
	}
	return m.Lineage.validate()
}

func validateArch(a string) error {
	if len(a) > MaxArchBytes || !utf8.ValidString(a) {
		return fmt.Errorf("architecture of %d bytes: %w: want UTF-8 of at most %d bytes", len(a), ErrInvalidArch, MaxArchBytes)
	}
	return nil
}

func validateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty name: %w", ErrInvalidName)
	case !utf8.ValidString(name):
		return fmt.Errorf("name %q is not UTF-8: %w", name, ErrInvalidName)
	case name == metadataKey:
		return fmt.Errorf("name %q is reserved by safetensors: %w", name, ErrInvalidName)
	}
	return nil
}

func (l Lineage) validate() error {
	for _, f := range [...]struct{ name, v string }{
		{"version", l.Version}, {"parent", l.Parent}, {"task", l.Task},
		{"job", l.Job}, {"source", l.Source},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("lineage %s %q is not UTF-8: %w", f.name, f.v, ErrInvalidLineage)
		}
	}
	return nil
}

// Clone returns a deep copy of m; nil for nil.
func (m *Model) Clone() *Model {
	if m == nil {
		return nil
	}
	c := &Model{Lineage: m.Lineage, Arch: m.Arch}
	if m.Tensors != nil {
		c.Tensors = make([]Tensor, len(m.Tensors))
		for i, t := range m.Tensors {
			c.Tensors[i] = Tensor{Name: t.Name, Shape: slices.Clone(t.Shape), Data: slices.Clone(t.Data)}
		}
	}
	return c
}

// Select returns the model of m's tensors idx, in that order, sharing their
// storage with m and with m's lineage: the part of a model a partial
// fine-tuning trains and sends. Empty idx selects every tensor and returns
// m itself. idx must be ascending indices of m's tensors
// (ErrInvalidSelection otherwise).
func (m *Model) Select(idx []int) (*Model, error) {
	if len(idx) == 0 {
		return m, nil
	}
	if m == nil {
		return nil, ErrNilModel
	}
	sub := &Model{Lineage: m.Lineage, Arch: m.Arch, Tensors: make([]Tensor, len(idx))}
	for k, i := range idx {
		if i < 0 || i >= len(m.Tensors) || k > 0 && i <= idx[k-1] {
			return nil, fmt.Errorf("model: select %v: %w: want ascending indices below %d", idx, ErrInvalidSelection, len(m.Tensors))
		}
		sub.Tensors[k] = m.Tensors[i]
	}
	return sub, nil
}
