package model_test

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

// TestHashCanonicalBytes pins the documented encoding with bytes written out
// by hand.
func TestHashCanonicalBytes(t *testing.T) {
	m, err := model.New(
		model.Tensor{Name: "w", Shape: []int{2, 200}, Data: make([]float32, 400)},
		model.Tensor{Name: "s", Data: []float32{1}},
		model.Tensor{Name: "z", Shape: []int{0}},
	)
	if err != nil {
		t.Fatal(err)
	}
	m.Tensors[0].Data[0] = -2
	m.Tensors[0].Data[399] = 0.5

	var want []byte
	want = append(want, "fleetlearn-model-v1\n"...)
	want = append(want, 3) // tensors
	// "w": name, rank 2, dims 2 and 200 (uvarint 0xc8 0x01), 400 values.
	want = append(want, 1, 'w', 2, 2, 0xc8, 0x01)
	want = append(want, 0x00, 0x00, 0x00, 0xc0) // -2
	for range 398 {
		want = append(want, 0, 0, 0, 0)
	}
	want = append(want, 0x00, 0x00, 0x00, 0x3f) // 0.5
	// "s": scalar, rank 0, value 1.
	want = append(want, 1, 's', 0, 0x00, 0x00, 0x80, 0x3f)
	// "z": rank 1, dim 0, no values.
	want = append(want, 1, 'z', 1, 0)

	sum := sha256.Sum256(want)
	if got := m.Hash(); got != sum {
		t.Errorf("Hash = %x, want sha256 of the canonical bytes %x", got, sum)
	}
	if got := m.HashHex(); got != hex.EncodeToString(sum[:]) {
		t.Errorf("HashHex = %s, want %x", got, sum)
	}
}

func TestHashEmpty(t *testing.T) {
	want := sha256.Sum256([]byte("fleetlearn-model-v1\n\x00"))
	empty, err := model.New()
	if err != nil {
		t.Fatal(err)
	}
	var nilModel *model.Model
	if empty.Hash() != want || nilModel.Hash() != want {
		t.Errorf("empty model hashes %x, nil %x, want %x", empty.Hash(), nilModel.Hash(), want)
	}
}

// TestHashDistinguishes checks that every change to names, shapes, order or
// values changes the hash, while lineage does not.
func TestHashDistinguishes(t *testing.T) {
	base := func() *model.Model {
		m, err := model.New(
			model.Tensor{Name: "a", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
			model.Tensor{Name: "b", Shape: []int{1}, Data: []float32{0}},
		)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ref := base().Hash()
	for _, tc := range []struct {
		name   string
		change func(m *model.Model)
		same   bool
	}{
		{"nothing", func(*model.Model) {}, true},
		{"lineage", func(m *model.Model) {
			m.Lineage = model.Lineage{Version: "x", Parent: "y", Task: "t", Round: 9, Job: "j", Source: "s"}
		}, true},
		{"value", func(m *model.Model) { m.Tensors[0].Data[3] = math.Nextafter32(4, 5) }, false},
		{"negative zero", func(m *model.Model) { m.Tensors[1].Data[0] = float32(math.Copysign(0, -1)) }, false},
		{"name", func(m *model.Model) { m.Tensors[1].Name = "c" }, false},
		{"shape with same data", func(m *model.Model) { m.Tensors[0].Shape = []int{4} }, false},
		{"transposed shape", func(m *model.Model) { m.Tensors[0].Shape = []int{1, 4} }, false},
		{"order", func(m *model.Model) { m.Tensors[0], m.Tensors[1] = m.Tensors[1], m.Tensors[0] }, false},
		{"boundary moved", func(m *model.Model) {
			// Same names and values overall, split differently.
			m.Tensors[0] = model.Tensor{Name: "a", Shape: []int{3}, Data: []float32{1, 2, 3}}
			m.Tensors[1] = model.Tensor{Name: "b", Shape: []int{2}, Data: []float32{4, 0}}
		}, false},
		{"name absorbs shape byte", func(m *model.Model) {
			m.Tensors[1] = model.Tensor{Name: "b\x01", Data: []float32{0}}
		}, false},
		{"extra empty tensor", func(m *model.Model) {
			m.Tensors = append(m.Tensors, model.Tensor{Name: "e", Shape: []int{0}})
		}, false},
	} {
		m := base()
		tc.change(m)
		if err := m.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := m.Hash() == ref; got != tc.same {
			t.Errorf("%s: hash unchanged = %v, want %v", tc.name, got, tc.same)
		}
	}
}
