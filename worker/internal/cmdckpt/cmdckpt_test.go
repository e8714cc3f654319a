package cmdckpt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
)

// safetensors builds a file by hand: an 8-byte little-endian header length,
// the JSON header, the data.
func safetensors(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// bf16Model is a model of two BF16 tensors, values a float32 round trip
// would not keep as bytes: -0, the smallest subnormal, a value that is not
// exact in F16.
func bf16Model() []byte {
	var data []byte
	for _, v := range []uint16{0x3f80, 0x8000, 0x0001, 0x4049, 0xc2f7, 0x7f7f} {
		data = binary.LittleEndian.AppendUint16(data, v)
	}
	return safetensors(`{"fc.weight":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"fc.bias":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}}`, data)
}

// optimizerFile holds dtypes the model reader refuses: an I64 step count
// beside BF16 moments. It is stored without being parsed.
func optimizerFile() []byte {
	data := binary.LittleEndian.AppendUint64(nil, 1234)
	data = binary.LittleEndian.AppendUint16(data, 0x3c00)
	return safetensors(`{"step":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"exp_avg":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}}`, data)
}

// writeStepDir writes a committed step directory the way a script does.
func writeStepDir(t *testing.T, parent string, step string, files map[string][]byte) string {
	t.Helper()
	dir := filepath.Join(parent, step)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func openStore(t *testing.T) *checkpoint.Dir {
	t.Helper()
	s, err := checkpoint.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRoundTrip(t *testing.T) {
	want := map[string][]byte{
		stepdir.ModelFile:     bf16Model(),
		stepdir.OptimizerFile: optimizerFile(),
		stepdir.StateFile:     []byte(`{"epoch": 3, "rng": "AAEC", "cursor": 17}` + "\n"),
	}
	src := t.TempDir()
	stepDir := writeStepDir(t, src, "step-40", want)
	// Not part of the contract: left out of the checkpoint.
	if err := os.WriteFile(filepath.Join(stepDir, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	// Small chunks, so the model is cut into several blobs.
	id, err := Upload(s, "job-9", 40, stepDir, checkpoint.Options{ChunkSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(id)
	if err != nil {
		t.Fatal(err)
	}
	if m.Job != "job-9" || m.Step != 40 || !m.Parent.IsZero() || len(m.Params) != 0 || m.Optimizer != nil || len(m.Files) != 3 {
		t.Fatalf("manifest %+v: want job, step and three files only", m)
	}

	// Another worker: an empty checkpoint directory.
	dst := t.TempDir()
	path, err := Materialize(s, id, dst)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dst, "step-40") {
		t.Fatalf("Materialize returned %s", path)
	}
	es, err := os.ReadDir(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != len(want) {
		t.Fatalf("%d files in %s, want %d", len(es), path, len(want))
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(path, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%s differs after the round trip:\n got %x\nwant %x", name, got, data)
		}
	}
	if _, err := os.Lstat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("step-40.tmp left behind: %v", err)
	}

	// The runner resumes from it, over an older checkpoint already there.
	writeStepDir(t, dst, "step-20", map[string][]byte{stepdir.ModelFile: bf16Model()})
	step, p, err := stepdir.Latest(dst)
	if err != nil || step != 40 || p != path {
		t.Fatalf("LatestCheckpoint = %d, %s, %v; want 40, %s", step, p, err, path)
	}
	f, err := os.Open(filepath.Join(p, stepdir.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mod, err := model.ReadSafetensors(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := mod.Tensors[0].Data; got[0] != 1 || got[1] != 0 || got[3] != 3.140625 {
		t.Fatalf("fc.weight reads as %v", got)
	}

	// Materializing again replaces the step directory and leaves it whole;
	// a stale .tmp from a killed attempt is no obstacle.
	if err := os.Mkdir(path+".tmp", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, stepdir.StateFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Materialize(s, id, dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(path, stepdir.StateFile)); !bytes.Equal(got, want[stepdir.StateFile]) {
		t.Fatalf("state.json after a second Materialize: %q", got)
	}
}

func TestUploadModelOnly(t *testing.T) {
	dir := writeStepDir(t, t.TempDir(), "step-1", map[string][]byte{stepdir.ModelFile: bf16Model()})
	s := openStore(t)
	id, err := Upload(s, "j", 1, dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ck, err := checkpoint.Load(s, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(ck.Files) != 1 || ck.Files[0].Name != stepdir.ModelFile {
		t.Fatalf("files %v", ck.Files)
	}
}

func TestUploadRefusesSymlinks(t *testing.T) {
	parent := t.TempDir()
	outside := filepath.Join(parent, "outside")
	if err := os.WriteFile(outside, bf16Model(), 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	for _, name := range []string{stepdir.ModelFile, stepdir.OptimizerFile, stepdir.StateFile} {
		t.Run(name, func(t *testing.T) {
			dir := writeStepDir(t, t.TempDir(), "step-2", map[string][]byte{stepdir.ModelFile: bf16Model()})
			os.Remove(filepath.Join(dir, name))
			if err := os.Symlink(outside, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			if _, err := Upload(s, "j", 2, dir, checkpoint.Options{}); !errors.Is(err, ErrInvalidStepDir) {
				t.Fatalf("symlinked %s: %v, want ErrInvalidStepDir", name, err)
			}
		})
	}
	// One that stays inside the directory is refused too: the contract
	// names regular files.
	inside := writeStepDir(t, t.TempDir(), "step-2", map[string][]byte{stepdir.ModelFile: bf16Model()})
	if err := os.Symlink(stepdir.ModelFile, filepath.Join(inside, stepdir.OptimizerFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Upload(s, "j", 2, inside, checkpoint.Options{}); !errors.Is(err, ErrInvalidStepDir) {
		t.Fatalf("symlink within the directory: %v, want ErrInvalidStepDir", err)
	}
	// A symlinked step directory is refused as well.
	real := writeStepDir(t, parent, "real", map[string][]byte{stepdir.ModelFile: bf16Model()})
	link := filepath.Join(parent, "step-3")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Upload(s, "j", 3, link, checkpoint.Options{}); !errors.Is(err, ErrInvalidStepDir) {
		t.Fatalf("symlinked directory: %v, want ErrInvalidStepDir", err)
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Fatalf("refused uploads committed %v", ids)
	}
}

func TestUploadRefusesBadDirs(t *testing.T) {
	s := openStore(t)
	parent := t.TempDir()
	noModel := writeStepDir(t, parent, "step-1", map[string][]byte{stepdir.StateFile: []byte("{}")})
	if _, err := Upload(s, "j", 1, noModel, checkpoint.Options{}); !errors.Is(err, ErrInvalidStepDir) {
		t.Fatalf("no model: %v, want ErrInvalidStepDir", err)
	}
	dirModel := writeStepDir(t, parent, "step-2", nil)
	if err := os.Mkdir(filepath.Join(dirModel, stepdir.ModelFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Upload(s, "j", 2, dirModel, checkpoint.Options{}); !errors.Is(err, ErrInvalidStepDir) {
		t.Fatalf("model is a directory: %v, want ErrInvalidStepDir", err)
	}
	ok := writeStepDir(t, parent, "step-3", map[string][]byte{stepdir.ModelFile: bf16Model()})
	if _, err := Upload(s, "j", -1, ok, checkpoint.Options{}); !errors.Is(err, ErrInvalidStepDir) {
		t.Fatalf("negative step: %v, want ErrInvalidStepDir", err)
	}
	if _, err := Upload(s, "j", 3, filepath.Join(ok, stepdir.ModelFile), checkpoint.Options{}); !errors.Is(err, ErrInvalidStepDir) {
		t.Fatalf("a file for a directory: %v, want ErrInvalidStepDir", err)
	}
}

func TestUploadRefusesOversized(t *testing.T) {
	s := openStore(t)
	parent := t.TempDir()
	// Sparse files: the bound is checked before anything is read.
	for _, c := range []struct {
		name string
		size int64
	}{
		{stepdir.StateFile, stepdir.MaxStateBytes + 1},
		{stepdir.ModelFile, checkpoint.MaxFilesBytes + 1},
		{stepdir.OptimizerFile, checkpoint.MaxFilesBytes - 10}, // with the model, over the total
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := writeStepDir(t, parent, "step-"+c.name, map[string][]byte{stepdir.ModelFile: bf16Model()})
			if err := os.Truncate(filepath.Join(dir, c.name), 0); errors.Is(err, os.ErrNotExist) {
				if err := os.WriteFile(filepath.Join(dir, c.name), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Truncate(filepath.Join(dir, c.name), c.size); err != nil {
				t.Skipf("this file system cannot hold a sparse file of %d bytes: %v", c.size, err)
			}
			if _, err := Upload(s, "j", 1, dir, checkpoint.Options{}); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%s of %d bytes: %v, want ErrTooLarge", c.name, c.size, err)
			}
		})
	}
}

func TestMaterializeRefusesOtherCheckpoints(t *testing.T) {
	s := openStore(t)
	params, err := model.New(model.Tensor{Name: "w", Shape: []int{1}, Data: []float32{1}})
	if err != nil {
		t.Fatal(err)
	}
	for name, ck := range map[string]*checkpoint.Checkpoint{
		"tensors": {Job: "j", Step: 1, Params: params},
		"tensors and files": {Job: "j", Step: 2, Params: params,
			Files: []checkpoint.File{{Name: stepdir.ModelFile, Data: bf16Model()}}},
		"other file": {Job: "j", Step: 3, Files: []checkpoint.File{
			{Name: stepdir.ModelFile, Data: bf16Model()}, {Name: "rng.pt", Data: []byte{1}}}},
		"no model": {Job: "j", Step: 4, Files: []checkpoint.File{{Name: stepdir.StateFile, Data: []byte("{}")}}},
	} {
		id, err := checkpoint.Write(s, ck, checkpoint.Options{})
		if err != nil {
			t.Fatal(err)
		}
		dst := t.TempDir()
		if _, err := Materialize(s, id, dst); !errors.Is(err, ErrNotCommandCheckpoint) {
			t.Errorf("%s: %v, want ErrNotCommandCheckpoint", name, err)
		}
		if es, _ := os.ReadDir(dst); len(es) != 0 {
			t.Errorf("%s: refused checkpoint wrote %v", name, es)
		}
	}
	var missing checkpoint.Digest
	missing[0] = 1
	if _, err := Materialize(s, missing, t.TempDir()); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("unknown id: %v, want checkpoint.ErrNotFound", err)
	}
}
