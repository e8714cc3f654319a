package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// filesCheckpoint is what a command job keeps: opaque files and no tensors.
// The sizes are not multiples of 4 and one file spans several chunks of
// the tests' 64-byte chunk size. The files are given out of name order.
func filesCheckpoint(step int64) *Checkpoint {
	model := make([]byte, 203)
	for i := range model {
		model[i] = byte(i * 7)
	}
	return &Checkpoint{
		Job: "job-cmd", Step: step,
		Files: []File{
			{Name: "state.json", Data: []byte(fmt.Sprintf(`{"step":%d}`, step))},
			{Name: "model.safetensors", Data: model},
			{Name: "empty", Data: []byte{}},
		},
	}
}

func TestFilesRoundTrip(t *testing.T) {
	s, dir := openTest(t)
	opts := Options{ChunkSize: 64}
	ck := filesCheckpoint(3)
	id, err := Write(s, ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Load(r, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Params != nil || got.Optimizer != nil {
		t.Fatalf("files-only checkpoint loaded with params %v optimizer %v", got.Params, got.Optimizer)
	}
	assertSame(t, got, ck)
	if ck.Files[0].Name != "state.json" {
		t.Fatalf("Write reordered the caller's files: %q first", ck.Files[0].Name)
	}
	m, err := r.Manifest(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 3 || m.Files[1].Name != "model.safetensors" || m.Files[1].Size != 203 || len(m.Files[1].Chunks) != 4 || len(m.Files[0].Chunks) != 0 {
		t.Fatalf("manifest files %+v", m.Files)
	}
	// The id does not depend on the order the files were given in.
	rev := cloneCheckpoint(ck)
	rev.Files[0], rev.Files[2] = rev.Files[2], rev.Files[0]
	if again, err := Write(s, rev, opts); err != nil || again != id {
		t.Fatalf("reordered files gave %s, %v; want %s", again, err, id)
	}

	// Tensors and files together.
	both := testCheckpoint(4, 100)
	both.Files = filesCheckpoint(4).Files
	idBoth, err := Write(s, both, opts)
	if err != nil {
		t.Fatal(err)
	}
	got, err = Load(r, idBoth)
	if err != nil {
		t.Fatal(err)
	}
	assertSame(t, got, both)
	if got.Params.Lineage.Version != idBoth.String() {
		t.Fatalf("lineage %+v", got.Params.Lineage)
	}
}

func TestFilesDedupe(t *testing.T) {
	s, _ := openTest(t)
	opts := Options{ChunkSize: 64}
	a := filesCheckpoint(1)
	if _, err := Write(s, a, opts); err != nil {
		t.Fatal(err)
	}
	before := countBlobs(t, s) // 4 model chunks and the state
	if before != 5 {
		t.Fatalf("%d blobs, want 5", before)
	}
	b := filesCheckpoint(2)
	b.Files[1].Data[70] ^= 1 // inside the model's second chunk
	if _, err := Write(s, b, opts); err != nil {
		t.Fatal(err)
	}
	// New: that chunk and the state; the other three model chunks are shared.
	if got := countBlobs(t, s) - before; got != 2 {
		t.Fatalf("second checkpoint added %d blobs, want 2", got)
	}
}

func TestFilesGC(t *testing.T) {
	s, _ := openTest(t)
	opts := Options{ChunkSize: 64}
	var ids []Digest
	var cks []*Checkpoint
	for step := int64(1); step <= 3; step++ {
		ck := filesCheckpoint(step)
		ck.Files[1].Data[0] = byte(step)
		id, err := Write(s, ck, opts)
		if err != nil {
			t.Fatal(err)
		}
		ids, cks = append(ids, id), append(cks, ck)
	}
	before := countBlobs(t, s)
	removed, err := GC(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Steps 1 and 2 each had their own first model chunk and state.
	if removed != 4 || countBlobs(t, s) != before-4 {
		t.Fatalf("GC removed %d blobs (%d -> %d), want 4", removed, before, countBlobs(t, s))
	}
	got, err := Load(s, ids[2])
	if err != nil {
		t.Fatalf("kept checkpoint does not load: %v", err)
	}
	assertSame(t, got, cks[2])
}

func TestFilesCorruptBlobRefused(t *testing.T) {
	s, _ := openTest(t)
	id, err := Write(s, filesCheckpoint(1), Options{ChunkSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Manifest(id)
	p := s.blobPath(m.Files[1].Chunks[2].Digest)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[5] ^= 0x80
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(s, id); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Load with a damaged file chunk: %v, want ErrCorrupt", err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Latest(); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("Latest with a file chunk missing: %v, want ErrNoCheckpoint", err)
	}
}

func TestWriteRejectsBadFiles(t *testing.T) {
	s, _ := openTest(t)
	for name, files := range map[string][]File{
		"empty name": {{Name: ""}},
		"dot":        {{Name: "."}},
		"dot dot":    {{Name: ".."}},
		"slash":      {{Name: "a/b"}},
		"parent":     {{Name: "../x"}},
		"nul":        {{Name: "a\x00b"}},
		"long":       {{Name: strings.Repeat("n", MaxFileNameBytes+1)}},
		"not utf-8":  {{Name: "a\xffb"}},
		"duplicate":  {{Name: "a", Data: []byte{1}}, {Name: "a", Data: []byte{2}}},
		"too many":   make([]File, MaxFiles+1),
	} {
		if name == "too many" {
			for i := range files {
				files[i].Name = fmt.Sprintf("f%d", i)
			}
		}
		ck := &Checkpoint{Job: "j", Step: 1, Files: files}
		if _, err := Write(s, ck, Options{}); !errors.Is(err, ErrInvalidCheckpoint) {
			t.Errorf("%s: %v, want ErrInvalidCheckpoint", name, err)
		}
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Fatalf("a bad checkpoint was committed: %v", ids)
	}
	// A name of exactly the limit is fine.
	ok := &Checkpoint{Files: []File{{Name: strings.Repeat("n", MaxFileNameBytes), Data: []byte("x")}}}
	if _, err := Write(s, ok, Options{}); err != nil {
		t.Fatalf("name of %d bytes: %v", MaxFileNameBytes, err)
	}
}

func TestSaverFiles(t *testing.T) {
	s, _ := openTest(t)
	sv, err := NewSaver(s, SaverOptions{Options: Options{ChunkSize: 64}, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	ck := filesCheckpoint(1)
	var ids []Digest
	var saved []*Checkpoint
	for step := int64(1); step <= 3; step++ {
		ck.Step = step
		ck.Files[1].Data[100] = byte(step)
		if err := sv.Save(ck); err != nil {
			t.Fatal(err)
		}
		want := cloneCheckpoint(ck)
		// The job overwrites its buffers at once: the saved copy must not see it.
		ck.Files[1].Data[100] = 0xee
		ck.Files[0].Data[0] = 'X'
		id, err := sv.Wait()
		if err != nil {
			t.Fatal(err)
		}
		ck.Files[0].Data[0] = '{'
		ids, saved = append(ids, id), append(saved, want)
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		got, err := Load(s, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		assertSame(t, got, saved[i])
		if got.Parent != ids[i-1] {
			t.Fatalf("checkpoint %d parent %s, want %s", i+1, got.Parent, ids[i-1])
		}
	}
	if _, err := Load(s, ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("checkpoint 1 should be collected (keep 2): %v", err)
	}
}

// TestManifestWithoutFilesUnchanged: a manifest without files has no files
// key, so the ids of checkpoints written before files existed still hold.
func TestManifestWithoutFilesUnchanged(t *testing.T) {
	b := validManifestBytes(t)
	if bytes.Contains(b, []byte(`"files"`)) {
		t.Fatalf("manifest without files encodes a files key: %s", b)
	}
	seed, err := os.ReadFile("testdata/fuzz/FuzzDecodeManifest/valid")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(seed, bytes.ReplaceAll(b, []byte(`"`), []byte(`\"`))) {
		t.Fatalf("the stored valid manifest no longer matches what Encode writes")
	}
}
