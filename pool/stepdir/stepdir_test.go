package stepdir

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

func writeCheckpoint(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

func safetensorsBytes(t *testing.T, vals ...float32) []byte {
	t.Helper()
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{len(vals)}, Data: vals})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := model.WriteSafetensors(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestLatest(t *testing.T) {
	dir := t.TempDir()
	good := safetensorsBytes(t, 1, 2, 3)
	state := []byte(`{"step": 1, "rng": [3, [1, 2], null]}`)
	ok := map[string][]byte{ModelFile: good, StateFile: state}

	writeCheckpoint(t, filepath.Join(dir, "step-9"), ok)
	writeCheckpoint(t, filepath.Join(dir, "step-10"), map[string][]byte{ModelFile: good}) // the newest valid one
	// Everything below is newer but must not be chosen.
	writeCheckpoint(t, filepath.Join(dir, "step-20.tmp"), ok)                                           // not yet renamed
	writeCheckpoint(t, filepath.Join(dir, "step-30"), map[string][]byte{StateFile: state})              // no model
	writeCheckpoint(t, filepath.Join(dir, "step-40"), map[string][]byte{ModelFile: good[:len(good)-1]}) // torn
	writeCheckpoint(t, filepath.Join(dir, "step-050"), ok)                                              // non-canonical name
	writeCheckpoint(t, filepath.Join(dir, "step-80"), map[string][]byte{ModelFile: good, StateFile: []byte(`{"step":`)})
	writeCheckpoint(t, filepath.Join(dir, "step-90"), ok)
	if err := os.Mkdir(filepath.Join(dir, "step-90", OptimizerFile), 0o750); err != nil {
		t.Fatal(err)
	}
	writeCheckpoint(t, filepath.Join(dir, "step-100"), map[string][]byte{StateFile: state})
	if err := os.Symlink(filepath.Join(dir, "step-9", ModelFile), filepath.Join(dir, "step-100", ModelFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "step-9"), filepath.Join(dir, "step-60")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "step-70"), good, 0o640); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"step-", "step-+5", "step--5", "step-5a", "step-99999999999999999999"} {
		writeCheckpoint(t, filepath.Join(dir, name), ok)
	}

	step, path, err := Latest(dir)
	if err != nil || step != 10 || path != filepath.Join(dir, "step-10") {
		t.Fatalf("LatestCheckpoint = %d, %q, %v; want 10, step-10", step, path, err)
	}

	// With the valid ones gone, the damaged ones must not be offered.
	for _, n := range []string{"step-9", "step-10"} {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	if step, path, err := Latest(dir); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("only damaged checkpoints: got %d, %q, %v; want ErrNoCheckpoint", step, path, err)
	}
	if _, _, err := Latest(filepath.Join(dir, "absent")); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("missing dir: %v, want ErrNoCheckpoint", err)
	}
	if _, _, err := Latest(t.TempDir()); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty dir: %v, want ErrNoCheckpoint", err)
	}
}

func TestParseStepName(t *testing.T) {
	for name, want := range map[string]int64{"step-0": 0, "step-7": 7, "step-1200": 1200} {
		if n, ok := parseStepName(name); !ok || n != want {
			t.Errorf("parseStepName(%q) = %d, %v", name, n, ok)
		}
	}
	for _, name := range []string{"step-07", "step-7.tmp", "Step-7", "step-", "step-7 ", "checkpoint-7", "step-１"} {
		if n, ok := parseStepName(name); ok {
			t.Errorf("parseStepName(%q) = %d, want rejected", name, n)
		}
	}
}
