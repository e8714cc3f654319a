package model_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

// TestArchTravels: a model's architecture survives the file, the streaming
// rewrite a server's import makes, Clone and Select, and is part of its
// hash whichever way the hash is computed.
func TestArchTravels(t *testing.T) {
	m, err := model.New(model.Tensor{Name: "0.weight", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}})
	if err != nil {
		t.Fatal(err)
	}
	plain := m.HashHex()
	m.Arch = "seq:input(3),dense(2)"
	if m.HashHex() == plain {
		t.Fatal("the architecture does not change the hash")
	}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	back, err := model.DecodeSafetensors(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if back.Arch != m.Arch || back.HashHex() != m.HashHex() {
		t.Errorf("read back arch %q hash %s, want %q %s", back.Arch, back.HashHex(), m.Arch, m.HashHex())
	}
	sum, err := model.HashSafetensors(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Hash(); sum != got {
		t.Error("HashSafetensors differs from Hash for a model with an architecture")
	}
	r, err := model.NewSafetensorsReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if r.Arch() != m.Arch {
		t.Errorf("reader Arch %q", r.Arch())
	}
	var out bytes.Buffer
	if _, err := r.WriteCanonical(&out, model.Lineage{Source: "imported"}); err != nil {
		t.Fatal(err)
	}
	imp, err := model.DecodeSafetensors(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if imp.Arch != m.Arch || imp.Lineage.Source != "imported" {
		t.Errorf("rewritten: arch %q, lineage %+v", imp.Arch, imp.Lineage)
	}
	if m.Clone().Arch != m.Arch {
		t.Error("Clone drops the architecture")
	}
	if s, _ := m.Select([]int{0}); s.Arch != m.Arch {
		t.Error("Select drops the architecture")
	}

	m.Arch = strings.Repeat("x", model.MaxArchBytes+1)
	if err := m.Validate(); !errors.Is(err, model.ErrInvalidArch) {
		t.Errorf("oversized architecture: %v", err)
	}
	m.Arch = "\xff"
	if err := model.WriteSafetensors(&bytes.Buffer{}, m); !errors.Is(err, model.ErrInvalidArch) {
		t.Errorf("non-UTF-8 architecture: %v", err)
	}
}
