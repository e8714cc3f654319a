package model_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

// sameModel reports how a and b differ (tensors bit for bit, and lineage), or
// "" when they do not. nil and empty slices count as equal.
func sameModel(a, b *model.Model) string {
	if len(a.Tensors) != len(b.Tensors) {
		return "tensor counts differ"
	}
	for i := range a.Tensors {
		x, y := a.Tensors[i], b.Tensors[i]
		if x.Name != y.Name || !slices.Equal(x.Shape, y.Shape) || len(x.Data) != len(y.Data) {
			return "tensor " + x.Name + " differs in name, shape or length from " + y.Name
		}
		for j := range x.Data {
			if math.Float32bits(x.Data[j]) != math.Float32bits(y.Data[j]) {
				return "tensor " + x.Name + " differs in data"
			}
		}
	}
	if a.Lineage != b.Lineage {
		return "lineage differs"
	}
	return ""
}

func TestTensorSize(t *testing.T) {
	for _, tc := range []struct {
		shape []int
		want  int
	}{
		{nil, 1},
		{[]int{}, 1},
		{[]int{0}, 0},
		{[]int{3}, 3},
		{[]int{784, 128}, 100352},
		{[]int{2, 0, 5}, 0},
		{[]int{2, -1}, -1},
		{[]int{math.MaxInt, 2}, -1},
		{[]int{1 << 40, 1 << 40, 0}, -1}, // the partial product overflows first
	} {
		if got := (model.Tensor{Shape: tc.shape}).Size(); got != tc.want {
			t.Errorf("Size(%v) = %d, want %d", tc.shape, got, tc.want)
		}
	}
}

func TestNew(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		name    string
		tensors []model.Tensor
		want    error  // nil: valid
		msg     string // substring the error must contain
	}{
		{name: "empty model"},
		{name: "scalar", tensors: []model.Tensor{{Name: "s", Data: []float32{2}}}},
		{name: "zero-size", tensors: []model.Tensor{{Name: "z", Shape: []int{0, 3}}}},
		{name: "matrix and bias", tensors: []model.Tensor{
			{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)},
			{Name: "b", Shape: []int{3}, Data: []float32{1, -0, 3}},
		}},
		{name: "unicode name", tensors: []model.Tensor{{Name: "poids.é", Shape: []int{1}, Data: []float32{1}}}},
		{name: "empty name", tensors: []model.Tensor{{Shape: []int{1}, Data: []float32{1}}}, want: model.ErrInvalidName},
		{name: "non-UTF-8 name", tensors: []model.Tensor{{Name: "w\xff", Shape: []int{1}, Data: []float32{1}}}, want: model.ErrInvalidName},
		{name: "reserved name", tensors: []model.Tensor{{Name: "__metadata__", Shape: []int{1}, Data: []float32{1}}}, want: model.ErrInvalidName},
		{name: "duplicate", tensors: []model.Tensor{
			{Name: "w", Shape: []int{1}, Data: []float32{1}},
			{Name: "w", Shape: []int{1}, Data: []float32{2}},
		}, want: model.ErrDuplicateName, msg: `"w"`},
		{name: "negative dimension", tensors: []model.Tensor{{Name: "w", Shape: []int{-1}}}, want: model.ErrInvalidShape},
		{name: "overflowing shape", tensors: []model.Tensor{{Name: "w", Shape: []int{math.MaxInt, 3}}}, want: model.ErrTooLarge},
		{name: "short data", tensors: []model.Tensor{{Name: "w", Shape: []int{2, 2}, Data: make([]float32, 3)}}, want: model.ErrShapeMismatch},
		{name: "long data", tensors: []model.Tensor{{Name: "w", Shape: []int{2}, Data: make([]float32, 3)}}, want: model.ErrShapeMismatch},
		{name: "scalar without data", tensors: []model.Tensor{{Name: "s"}}, want: model.ErrShapeMismatch},
		{name: "NaN", tensors: []model.Tensor{{Name: "w", Shape: []int{3}, Data: []float32{0, 1, nan}}}, want: model.ErrNonFinite, msg: `tensor "w" index 2`},
		{name: "+Inf", tensors: []model.Tensor{{Name: "b", Shape: []int{1}, Data: []float32{inf}}}, want: model.ErrNonFinite, msg: `tensor "b" index 0`},
		{name: "-Inf", tensors: []model.Tensor{{Name: "b", Shape: []int{2}, Data: []float32{1, -inf}}}, want: model.ErrNonFinite, msg: "index 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.New(tc.tensors...)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("New: err = %v, want %v", err, tc.want)
			}
			if err != nil {
				if !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("New: err = %q, want it to mention %q", err, tc.msg)
				}
				if m != nil {
					t.Errorf("New returned a model with error %v", err)
				}
				return
			}
			if len(m.Tensors) != len(tc.tensors) {
				t.Fatalf("New kept %d tensors, want %d", len(m.Tensors), len(tc.tensors))
			}
			if err := m.Validate(); err != nil {
				t.Errorf("Validate after New: %v", err)
			}
		})
	}
}

func TestNewCopiesTensorList(t *testing.T) {
	ts := []model.Tensor{{Name: "a", Shape: []int{1}, Data: []float32{1}}}
	m, err := model.New(ts...)
	if err != nil {
		t.Fatal(err)
	}
	ts[0].Name = "renamed"
	if m.Tensors[0].Name != "a" {
		t.Errorf("model follows the caller's slice: name %q", m.Tensors[0].Name)
	}
}

func TestValidate(t *testing.T) {
	var nilModel *model.Model
	if err := nilModel.Validate(); !errors.Is(err, model.ErrNilModel) {
		t.Errorf("nil Validate: %v, want ErrNilModel", err)
	}
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{2}, Data: []float32{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	m.Lineage.Parent = "v\xfe"
	if err := m.Validate(); !errors.Is(err, model.ErrInvalidLineage) {
		t.Errorf("non-UTF-8 lineage: %v, want ErrInvalidLineage", err)
	}
	m.Lineage.Parent = ""
	m.Tensors[0].Data[1] = float32(math.NaN())
	if err := m.Validate(); !errors.Is(err, model.ErrNonFinite) {
		t.Errorf("NaN after New: %v, want ErrNonFinite", err)
	}
}

func TestClone(t *testing.T) {
	m, err := model.New(
		model.Tensor{Name: "w", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
		model.Tensor{Name: "s", Data: []float32{5}},
	)
	if err != nil {
		t.Fatal(err)
	}
	m.Lineage = model.Lineage{Version: "v2", Parent: "v1", Round: 3}
	c := m.Clone()
	if d := sameModel(m, c); d != "" {
		t.Fatalf("clone differs: %s", d)
	}
	c.Tensors[0].Data[0] = 9
	c.Tensors[0].Shape[0] = 4
	c.Tensors[1].Name = "t"
	c.Lineage.Version = "v3"
	if m.Tensors[0].Data[0] != 1 || m.Tensors[0].Shape[0] != 2 || m.Tensors[1].Name != "s" || m.Lineage.Version != "v2" {
		t.Errorf("changing the clone changed the original: %+v", m)
	}
	var nilModel *model.Model
	if nilModel.Clone() != nil {
		t.Error("Clone of nil is not nil")
	}
}

func TestSelect(t *testing.T) {
	m, err := model.New(model.Tensor{Name: "a", Shape: []int{1}, Data: []float32{1}},
		model.Tensor{Name: "b", Shape: []int{2}, Data: []float32{2, 3}},
		model.Tensor{Name: "c", Shape: []int{1}, Data: []float32{4}})
	if err != nil {
		t.Fatal(err)
	}
	if all, err := m.Select(nil); err != nil || all != m {
		t.Fatalf("empty selection: %v, %v", all, err)
	}
	sub, err := m.Select([]int{0, 2})
	if err != nil || len(sub.Tensors) != 2 || sub.Tensors[1].Name != "c" {
		t.Fatalf("select [0 2]: %+v, %v", sub, err)
	}
	sub.Tensors[1].Data[0] = 9 // shares storage
	if m.Tensors[2].Data[0] != 9 {
		t.Fatal("the selection does not share the model's storage")
	}
	for _, bad := range [][]int{{3}, {-1}, {1, 0}, {1, 1}} {
		if _, err := m.Select(bad); !errors.Is(err, model.ErrInvalidSelection) {
			t.Errorf("select %v: %v, want ErrInvalidSelection", bad, err)
		}
	}
}
