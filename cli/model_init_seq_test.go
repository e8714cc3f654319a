package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/train"
)

// TestModelInitSeq: a layer list given inline (with --input) or as a JSON
// file makes the same model, with the list in the file; --weights orders a
// PyTorch-named file's tensors as the list's and refuses one that does not
// fit.
func TestModelInitSeq(t *testing.T) {
	dir := t.TempDir()
	const layers = "conv(4,3,pad=1),relu,maxpool(2),flatten,dense(10)"
	inline := filepath.Join(dir, "inline.safetensors")
	out, err := modelInitCLI(t, "--arch", "seq:"+layers, "--input", "3x8x8", "-o", inline, "--seed", "2")
	if err != nil {
		t.Fatal(err)
	}
	const canonical = "seq:input(3,8,8),conv(4,3,stride=1,pad=1),relu,maxpool(2,stride=2),flatten,dense(10)"
	if !strings.Contains(out, "wrote "+inline+": "+canonical+", 762 parameters in 4 tensors") {
		t.Errorf("output %q", out)
	}
	m, _ := readModel(t, inline)
	if m.Arch != canonical {
		t.Errorf("arch %q, want %q", m.Arch, canonical)
	}
	a, err := seq.Parse(canonical)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := train.InitSeq(a, 2)
	if err != nil {
		t.Fatal(err)
	}
	if m.HashHex() != ref.HashHex() {
		t.Error("the file differs from train.InitSeq's model")
	}
	withoutArch := ref.Clone()
	withoutArch.Arch = ""
	if withoutArch.HashHex() == ref.HashHex() {
		t.Error("the layer list is not part of the content hash")
	}

	spec := filepath.Join(dir, "arch.json")
	if err := os.WriteFile(spec, []byte(`{"input": [3, 8, 8], "layers": ["conv(4,3,pad=1)", "relu", "maxpool(2)", "flatten", "dense(10)"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fromFile := filepath.Join(dir, "file.safetensors")
	if _, err := modelInitCLI(t, "--arch", "@"+spec, "-o", fromFile, "--seed", "2"); err != nil {
		t.Fatal(err)
	}
	if f, _ := readModel(t, fromFile); f.HashHex() != m.HashHex() {
		t.Error("the JSON file and the inline list made different models")
	}

	// Weights trained elsewhere, in another tensor order (PyTorch's writer
	// groups tensors by dtype, not by layer).
	torch := &model.Model{Tensors: []model.Tensor{ref.Tensors[3], ref.Tensors[1], ref.Tensors[0], ref.Tensors[2]}}
	torchFile := filepath.Join(dir, "torch.safetensors")
	f, err := os.Create(torchFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.WriteSafetensors(f, torch); err != nil {
		t.Fatal(err)
	}
	f.Close()
	loaded := filepath.Join(dir, "loaded.safetensors")
	if _, err := modelInitCLI(t, "--arch", "seq:"+layers, "--input", "3x8x8", "--weights", torchFile, "-o", loaded); err != nil {
		t.Fatal(err)
	}
	if l, _ := readModel(t, loaded); l.HashHex() != ref.HashHex() {
		t.Error("--weights did not give the model back in the list's order")
	}
	other := filepath.Join(dir, "other.safetensors")
	_, err = modelInitCLI(t, "--arch", "seq:conv(8,3,pad=1),relu,maxpool(2),flatten,dense(10)", "--input", "3x8x8", "--weights", torchFile, "-o", other)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), `tensor "0.weight" is [4 3 3 3], the architecture needs [8 3 3 3]`) {
		t.Errorf("weights of another list: %v", err)
	}

	for _, bad := range [][]string{
		{"--arch", "seq:conv(4,3),dense(10)", "--input", "3x8"},
		{"--arch", "seq:conv(4,3),dense(10)", "--input", "0x8x8"},
		{"--arch", "seq:conv(4,9),dense(10)", "--input", "3x8x8"},
		{"--arch", "seq:dense(65536),dense(65536),dense(10)", "--input", "1x64x64"},
		{"--arch", "@" + filepath.Join(dir, "missing.json")},
		{"--arch", "mlp:784,10", "--weights", torchFile},
	} {
		if _, err := modelInitCLI(t, append(bad, "-o", filepath.Join(dir, "bad.safetensors"))...); !errors.Is(err, ErrUsage) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
}
