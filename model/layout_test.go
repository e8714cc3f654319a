package model_test

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

func TestFlattenUnflatten(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tensors []model.Tensor
		flat    []float32
		layout  []model.LayoutEntry
	}{
		{name: "empty", flat: []float32{}},
		{
			name: "mlp",
			tensors: []model.Tensor{
				{Name: "w", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
				{Name: "b", Shape: []int{2}, Data: []float32{5, 6}},
			},
			flat: []float32{1, 2, 3, 4, 5, 6},
			layout: []model.LayoutEntry{
				{Name: "w", Shape: []int{2, 2}, Offset: 0, Size: 4},
				{Name: "b", Shape: []int{2}, Offset: 4, Size: 2},
			},
		},
		{
			name: "scalar and zero-size",
			tensors: []model.Tensor{
				{Name: "z", Shape: []int{0}},
				{Name: "s", Data: []float32{7}},
				{Name: "z2", Shape: []int{3, 0}},
			},
			flat: []float32{7},
			layout: []model.LayoutEntry{
				{Name: "z", Shape: []int{0}, Offset: 0, Size: 0},
				{Name: "s", Offset: 0, Size: 1},
				{Name: "z2", Shape: []int{3, 0}, Offset: 1, Size: 0},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.New(tc.tensors...)
			if err != nil {
				t.Fatal(err)
			}
			flat := m.Flatten()
			if !slices.Equal(flat, tc.flat) {
				t.Errorf("Flatten = %v, want %v", flat, tc.flat)
			}
			l := m.Layout()
			if !l.Equal(model.Layout{Entries: tc.layout}) {
				t.Errorf("Layout = %+v, want %+v", l, tc.layout)
			}
			if l.Size() != len(tc.flat) {
				t.Errorf("Layout.Size = %d, want %d", l.Size(), len(tc.flat))
			}
			back, err := l.Unflatten(flat)
			if err != nil {
				t.Fatalf("Unflatten: %v", err)
			}
			if d := sameModel(m, back); d != "" {
				t.Errorf("Unflatten(Flatten) differs: %s", d)
			}
			if back.Hash() != m.Hash() {
				t.Error("Unflatten(Flatten) hashes differently")
			}
		})
	}
}

func TestUnflattenOwnsItsData(t *testing.T) {
	m, err := model.New(
		model.Tensor{Name: "a", Shape: []int{2}, Data: []float32{1, 2}},
		model.Tensor{Name: "b", Shape: []int{1}, Data: []float32{3}},
	)
	if err != nil {
		t.Fatal(err)
	}
	v := m.Flatten()
	got, err := m.Layout().Unflatten(v)
	if err != nil {
		t.Fatal(err)
	}
	v[0] = 100
	got.Tensors[0].Data = append(got.Tensors[0].Data, 42)
	if got.Tensors[0].Data[0] != 1 {
		t.Error("Unflatten aliases its input vector")
	}
	if got.Tensors[1].Data[0] != 3 {
		t.Error("appending to one tensor overwrote the next")
	}
}

func TestUnflattenErrors(t *testing.T) {
	good := []model.LayoutEntry{
		{Name: "w", Shape: []int{2}, Offset: 0, Size: 2},
		{Name: "b", Shape: []int{1}, Offset: 2, Size: 1},
	}
	for _, tc := range []struct {
		name    string
		entries []model.LayoutEntry
		v       []float32
		want    error
	}{
		{"short vector", good, []float32{1, 2}, model.ErrShapeMismatch},
		{"long vector", good, []float32{1, 2, 3, 4}, model.ErrShapeMismatch},
		{"NaN", good, []float32{1, float32(math.NaN()), 3}, model.ErrNonFinite},
		{"gap", []model.LayoutEntry{{Name: "w", Shape: []int{1}, Offset: 1, Size: 1}}, []float32{1, 2}, model.ErrInvalidOffsets},
		{"size disagrees with shape", []model.LayoutEntry{{Name: "w", Shape: []int{2}, Offset: 0, Size: 3}}, []float32{1, 2, 3}, model.ErrShapeMismatch},
		{"negative dimension", []model.LayoutEntry{{Name: "w", Shape: []int{-2}, Offset: 0, Size: -2}}, nil, model.ErrInvalidShape},
		{"duplicate names", []model.LayoutEntry{
			{Name: "w", Shape: []int{1}, Offset: 0, Size: 1},
			{Name: "w", Shape: []int{1}, Offset: 1, Size: 1},
		}, []float32{1, 2}, model.ErrDuplicateName},
		{"overflowing total", []model.LayoutEntry{
			{Name: "a", Shape: []int{math.MaxInt}, Offset: 0, Size: math.MaxInt},
			{Name: "b", Shape: []int{1}, Offset: math.MaxInt, Size: 1},
		}, nil, model.ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.Layout{Entries: tc.entries}.Unflatten(tc.v)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Unflatten: err = %v, want %v", err, tc.want)
			}
			if m != nil {
				t.Error("Unflatten returned a model with an error")
			}
		})
	}
}

func TestLayoutEqual(t *testing.T) {
	base := model.Layout{Entries: []model.LayoutEntry{{Name: "w", Shape: []int{2, 2}, Offset: 0, Size: 4}}}
	for _, tc := range []struct {
		name string
		o    model.Layout
		want bool
	}{
		{"same", model.Layout{Entries: []model.LayoutEntry{{Name: "w", Shape: []int{2, 2}, Offset: 0, Size: 4}}}, true},
		{"other name", model.Layout{Entries: []model.LayoutEntry{{Name: "v", Shape: []int{2, 2}, Offset: 0, Size: 4}}}, false},
		{"other shape", model.Layout{Entries: []model.LayoutEntry{{Name: "w", Shape: []int{4}, Offset: 0, Size: 4}}}, false},
		{"other offset", model.Layout{Entries: []model.LayoutEntry{{Name: "w", Shape: []int{2, 2}, Offset: 1, Size: 4}}}, false},
		{"extra entry", model.Layout{Entries: []model.LayoutEntry{
			{Name: "w", Shape: []int{2, 2}, Offset: 0, Size: 4},
			{Name: "b", Shape: []int{2}, Offset: 4, Size: 2},
		}}, false},
		{"empty", model.Layout{}, false},
	} {
		if got := base.Equal(tc.o); got != tc.want {
			t.Errorf("%s: Equal = %v, want %v", tc.name, got, tc.want)
		}
		if got := tc.o.Equal(base); got != tc.want {
			t.Errorf("%s: reversed Equal = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !(model.Layout{}).Equal(model.Layout{Entries: []model.LayoutEntry{}}) {
		t.Error("nil and empty layouts differ")
	}
}
