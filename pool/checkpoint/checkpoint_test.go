package checkpoint

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

// testCheckpoint builds a checkpoint with n values in w, a scalar, an empty
// tensor and a momentum buffer; the values depend on step only through the
// bias, so consecutive steps share most chunks.
func testCheckpoint(step int64, n int) *Checkpoint {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(i)*0.25 - 3
	}
	// Values that a float round trip through text would not keep.
	w[1] = math.Float32frombits(1) // smallest subnormal
	w[2] = float32(math.Copysign(0, -1))
	w[3] = math.MaxFloat32
	mom := make([]float32, n)
	for i := range mom {
		mom[i] = float32(i) * 1e-3
	}
	params, err := model.New(
		model.Tensor{Name: "w", Shape: []int{n / 4, 4}, Data: w},
		model.Tensor{Name: "b", Shape: []int{}, Data: []float32{float32(step)}},
		model.Tensor{Name: "empty", Shape: []int{0, 3}, Data: []float32{}},
	)
	if err != nil {
		panic(err)
	}
	opt, err := model.New(model.Tensor{Name: "w.momentum", Shape: []int{n}, Data: mom})
	if err != nil {
		panic(err)
	}
	return &Checkpoint{
		Job: "job-7", Step: step, Params: params, Optimizer: opt,
		Cursor: Cursor{Epoch: 2, Offset: 1000 + step, Shard: "shard-003"},
		RNG:    []byte{0, 1, 2, 0xff, byte(step)},
	}
}

// assertSame compares everything that is saved, values bit for bit.
func assertSame(t *testing.T, got, want *Checkpoint) {
	t.Helper()
	if got.Job != want.Job || got.Step != want.Step || got.Cursor != want.Cursor || !slices.Equal(got.RNG, want.RNG) {
		t.Fatalf("state: got job %q step %d cursor %+v rng %v; want %q %d %+v %v",
			got.Job, got.Step, got.Cursor, got.RNG, want.Job, want.Step, want.Cursor, want.RNG)
	}
	if !want.Parent.IsZero() && got.Parent != want.Parent {
		t.Fatalf("parent %s, want %s", got.Parent, want.Parent)
	}
	for _, p := range []struct{ g, w *model.Model }{{got.Params, want.Params}, {got.Optimizer, want.Optimizer}} {
		if (p.g == nil) != (p.w == nil) {
			t.Fatalf("model presence differs: got %v want %v", p.g != nil, p.w != nil)
		}
		if p.w == nil {
			continue
		}
		if len(p.g.Tensors) != len(p.w.Tensors) {
			t.Fatalf("%d tensors, want %d", len(p.g.Tensors), len(p.w.Tensors))
		}
		for i, wt := range p.w.Tensors {
			gt := p.g.Tensors[i]
			if gt.Name != wt.Name || !slices.Equal(gt.Shape, wt.Shape) || len(gt.Data) != len(wt.Data) {
				t.Fatalf("tensor %d: got %q %v len %d; want %q %v len %d", i, gt.Name, gt.Shape, len(gt.Data), wt.Name, wt.Shape, len(wt.Data))
			}
			for j := range wt.Data {
				if math.Float32bits(gt.Data[j]) != math.Float32bits(wt.Data[j]) {
					t.Fatalf("tensor %q[%d]: bits %#x, want %#x", wt.Name, j, math.Float32bits(gt.Data[j]), math.Float32bits(wt.Data[j]))
				}
			}
		}
	}
	// Files come back in name order, whatever order they were saved in.
	wantFiles := slices.SortedFunc(slices.Values(want.Files), compareFiles)
	if len(got.Files) != len(wantFiles) {
		t.Fatalf("%d files, want %d", len(got.Files), len(wantFiles))
	}
	for i, wf := range wantFiles {
		if gf := got.Files[i]; gf.Name != wf.Name || !bytes.Equal(gf.Data, wf.Data) {
			t.Fatalf("file %d: got %q (%d bytes), want %q (%d bytes), or the bytes differ", i, gf.Name, len(gf.Data), wf.Name, len(wf.Data))
		}
	}
}

func openTest(t *testing.T) (*Dir, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func countBlobs(t *testing.T, s *Dir) int {
	t.Helper()
	bs, err := s.ListBlobs()
	if err != nil {
		t.Fatal(err)
	}
	return len(bs)
}

func TestRoundTrip(t *testing.T) {
	s, dir := openTest(t)
	ck := testCheckpoint(5, 4000)
	id, err := Write(s, ck, Options{ChunkSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	// A fresh handle on the directory, as after a restart.
	r, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Load(r, id)
	if err != nil {
		t.Fatal(err)
	}
	assertSame(t, got, ck)
	if got.ID != id || got.Params.Lineage.Version != id.String() || got.Params.Lineage.Job != "job-7" {
		t.Fatalf("id %s lineage %+v, want id %s", got.ID, got.Params.Lineage, id)
	}
	latest, err := LoadLatest(r)
	if err != nil || latest.ID != id {
		t.Fatalf("LoadLatest = %v, %v; want %s", latest, err, id)
	}
	// Same content, same id: the manifest is canonical.
	again, err := Write(s, ck, Options{ChunkSize: 1024})
	if err != nil || again != id {
		t.Fatalf("rewrite gave %s, %v; want %s", again, err, id)
	}
}

func TestDedupeUnchangedChunks(t *testing.T) {
	s, _ := openTest(t)
	opts := Options{ChunkSize: 1024} // 256 values per chunk
	a := testCheckpoint(1, 4096)     // w: 16 chunks, momentum: 16, b: 1
	idA, err := Write(s, a, opts)
	if err != nil {
		t.Fatal(err)
	}
	before := countBlobs(t, s)
	if before != 33 {
		t.Fatalf("%d blobs after first checkpoint, want 33", before)
	}
	b := testCheckpoint(2, 4096)
	b.Parent = idA
	b.Params.Tensors[0].Data[300] = 42 // inside w's second chunk
	idB, err := Write(s, b, opts)
	if err != nil {
		t.Fatal(err)
	}
	// New: w's second chunk and the bias; everything else is shared.
	if got := countBlobs(t, s) - before; got != 2 {
		t.Fatalf("second checkpoint added %d blobs, want 2", got)
	}
	mA, _ := s.Manifest(idA)
	mB, _ := s.Manifest(idB)
	if mB.Parent != idA {
		t.Fatalf("parent %s, want %s", mB.Parent, idA)
	}
	wa, wb := mA.Params[0].Chunks, mB.Params[0].Chunks
	for i := range wa {
		if (wa[i].Digest == wb[i].Digest) != (i != 1) {
			t.Fatalf("chunk %d of w: shared=%v", i, wa[i].Digest == wb[i].Digest)
		}
	}
	for _, id := range []Digest{idA, idB} {
		if _, err := Load(s, id); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCorruptBlobRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string) error
		want   error
	}{
		{"truncated", func(p string) error { return os.Truncate(p, 10) }, ErrCorrupt},
		{"flipped", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0x40
			return os.WriteFile(p, b, 0o644)
		}, ErrCorrupt},
		{"missing", os.Remove, ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openTest(t)
			opts := Options{ChunkSize: 256}
			a := testCheckpoint(1, 400)
			idA, err := Write(s, a, opts)
			if err != nil {
				t.Fatal(err)
			}
			b := testCheckpoint(2, 400)
			b.Optimizer.Tensors[0].Data[399] = 7 // last momentum chunk is new in b
			idB, err := Write(s, b, opts)
			if err != nil {
				t.Fatal(err)
			}
			mB, _ := s.Manifest(idB)
			last := mB.Optimizer[0].Chunks[len(mB.Optimizer[0].Chunks)-1]
			if err := tc.damage(s.blobPath(last.Digest)); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(s, idB); !errors.Is(err, tc.want) {
				t.Fatalf("Load of damaged checkpoint: %v, want %v", err, tc.want)
			}
			if _, err := s.GetBlob(last.Digest); !errors.Is(err, tc.want) {
				t.Fatalf("GetBlob: %v, want %v", err, tc.want)
			}
			// The restart path falls back to the older, intact checkpoint.
			got, err := LoadLatest(s)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != idA {
				t.Fatalf("LoadLatest fell back to %s, want %s", got.ID, idA)
			}
			assertSame(t, got, a)
			// Saving again repairs the damaged blob instead of deduping
			// against it (except for a flipped bit of the right size,
			// which only a read can find; Load keeps refusing that one).
			if _, err := Write(s, b, opts); err != nil {
				t.Fatal(err)
			}
			_, err = Load(s, idB)
			if tc.name == "flipped" {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Load after rewrite: %v, want ErrCorrupt", err)
				}
			} else if err != nil {
				t.Fatalf("Load after rewrite: %v", err)
			}
		})
	}
}

func TestLatestPointerDamage(t *testing.T) {
	s, dir := openTest(t)
	opts := Options{ChunkSize: 256}
	var ids []Digest
	for step := int64(1); step <= 3; step++ {
		id, err := Write(s, testCheckpoint(step, 100), opts)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// A pointer that names an older checkpoint is followed: it is what was
	// last committed.
	if err := os.WriteFile(filepath.Join(dir, "LATEST"), []byte(ids[1].String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if id, _, err := s.Latest(); err != nil || id != ids[1] {
		t.Fatalf("Latest = %s, %v; want %s", id, err, ids[1])
	}
	for _, bad := range []string{"", "garbage", ids[2].String()[:10], "ABCDEF"} {
		if err := os.WriteFile(filepath.Join(dir, "LATEST"), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if id, m, err := s.Latest(); err != nil || id != ids[2] || m.Step != 3 {
			t.Fatalf("pointer %q: Latest = %s, %v; want the scan to find %s", bad, id, err, ids[2])
		}
	}
	// A corrupt newest manifest is skipped by the scan.
	if err := os.Remove(filepath.Join(dir, "LATEST")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.manifestPath(ids[2]), []byte(`{"format":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Manifest(ids[2]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Manifest of overwritten file: %v, want ErrCorrupt", err)
	}
	if id, _, err := s.Latest(); err != nil || id != ids[1] {
		t.Fatalf("Latest = %s, %v; want %s", id, err, ids[1])
	}
	empty, _ := openTest(t)
	if _, _, err := empty.Latest(); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty store: %v, want ErrNoCheckpoint", err)
	}
	if _, err := LoadLatest(empty); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty store: %v, want ErrNoCheckpoint", err)
	}
}

func TestCommitRefusesMissingBlobs(t *testing.T) {
	s, _ := openTest(t)
	m := &Manifest{Format: 1, Params: []TensorEntry{{
		Name: "w", Shape: []int{2}, Chunks: []Chunk{{Digest: Sum([]byte("12345678")), Size: 8}},
	}}}
	if _, err := s.Commit(m); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Commit without blob: %v, want ErrNotFound", err)
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Fatalf("manifest written anyway: %v", ids)
	}
	if err := s.PutBlob(Sum([]byte("other")), []byte("12345678")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("PutBlob under the wrong digest: %v, want ErrCorrupt", err)
	}
}

func TestWriteRejectsBadInput(t *testing.T) {
	s, _ := openTest(t)
	nan := testCheckpoint(1, 8)
	nan.Optimizer.Tensors[0].Data[3] = float32(math.NaN())
	short := testCheckpoint(1, 8)
	short.Params.Tensors[0].Data = short.Params.Tensors[0].Data[:5]
	neg := testCheckpoint(-1, 8)
	for name, ck := range map[string]*Checkpoint{"nil": nil, "nan": nan, "short": short, "negative step": neg, "no params": {Job: "j"}} {
		if _, err := Write(s, ck, Options{}); !errors.Is(err, ErrInvalidCheckpoint) {
			t.Errorf("%s: %v, want ErrInvalidCheckpoint", name, err)
		}
	}
	if _, err := Write(s, testCheckpoint(1, 8), Options{ChunkSize: 6}); !errors.Is(err, ErrInvalidCheckpoint) {
		t.Errorf("chunk size 6: %v, want ErrInvalidCheckpoint", err)
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Fatalf("a bad checkpoint was committed: %v", ids)
	}
}

func TestGCKeepsLastK(t *testing.T) {
	s, _ := openTest(t)
	opts := Options{ChunkSize: 256}
	var ids []Digest
	for step := int64(1); step <= 5; step++ {
		ck := testCheckpoint(step, 256)
		ck.Params.Tensors[0].Data[0] = float32(step)
		id, err := Write(s, ck, opts)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	before := countBlobs(t, s)
	removed, err := GC(s, 2)
	if err != nil {
		t.Fatal(err)
	}
	left, _ := s.List()
	slices.SortFunc(left, func(a, b Digest) int { return slices.Compare(a[:], b[:]) })
	want := []Digest{ids[3], ids[4]}
	slices.SortFunc(want, func(a, b Digest) int { return slices.Compare(a[:], b[:]) })
	if !slices.Equal(left, want) {
		t.Fatalf("manifests after GC(2): %v, want %v", left, want)
	}
	// Steps 1..3 each had their own w chunk and bias; those 6 go.
	if removed != 6 || countBlobs(t, s) != before-6 {
		t.Fatalf("removed %d blobs (%d -> %d), want 6", removed, before, countBlobs(t, s))
	}
	for _, id := range want {
		if _, err := Load(s, id); err != nil {
			t.Fatalf("kept checkpoint %s: %v", id, err)
		}
	}
	if _, err := GC(s, 0); !errors.Is(err, ErrInvalidCheckpoint) {
		t.Fatalf("GC(0): %v", err)
	}
}

func TestSaver(t *testing.T) {
	s, _ := openTest(t)
	sv, err := NewSaver(s, SaverOptions{Options: Options{ChunkSize: 512}, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	ck := testCheckpoint(1, 1024)
	var saved []*Checkpoint
	var ids []Digest
	for step := int64(1); step <= 4; step++ {
		ck.Step = step
		ck.Params.Tensors[0].Data[7] = float32(step)
		if err := sv.Save(ck); err != nil {
			t.Fatal(err)
		}
		// Training goes on at once: this must not reach the saved copy.
		want := cloneCheckpoint(ck)
		ck.Params.Tensors[0].Data[7] = -1
		ck.Optimizer.Tensors[0].Data[0] = -1
		ck.RNG[0] = 0xee
		id, err := sv.Wait()
		if err != nil {
			t.Fatal(err)
		}
		ck.RNG[0] = 0
		ck.Optimizer.Tensors[0].Data[0] = 0
		saved = append(saved, want)
		ids = append(ids, id)
	}
	for i, id := range ids {
		got, err := Load(s, id)
		if i < 2 {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("checkpoint %d should be collected (keep 2): %v", i+1, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		assertSame(t, got, saved[i])
		if got.Parent != ids[i-1] {
			t.Fatalf("checkpoint %d parent %s, want %s", i+1, got.Parent, ids[i-1])
		}
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sv.Save(ck); !errors.Is(err, ErrClosed) {
		t.Fatalf("Save after Close: %v", err)
	}
}

func TestSaverBackToBack(t *testing.T) {
	s, _ := openTest(t)
	sv, err := NewSaver(s, SaverOptions{Options: Options{ChunkSize: 512}})
	if err != nil {
		t.Fatal(err)
	}
	ck := testCheckpoint(0, 2048)
	for step := int64(1); step <= 20; step++ {
		ck.Step = step
		ck.Params.Tensors[1].Data[0] = float32(step)
		if err := sv.Save(ck); err != nil { // waits for a buffer when all are in flight
			t.Fatal(err)
		}
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := LoadLatest(s)
	if err != nil {
		t.Fatal(err)
	}
	assertSame(t, got, ck)
	// The chain of parents reaches step 1.
	n := 1
	for m := got; !m.Parent.IsZero(); n++ {
		if m, err = Load(s, m.Parent); err != nil {
			t.Fatal(err)
		}
	}
	if n != 20 {
		t.Fatalf("lineage has %d checkpoints, want 20", n)
	}
}

// failStore fails the commit, as a full disk would, on a real directory.
type failStore struct {
	*Dir
	fail atomic.Bool
}

var errDiskFull = errors.New("disk full")

func (f *failStore) Commit(m *Manifest) (Digest, error) {
	if f.fail.Load() {
		return Digest{}, errDiskFull
	}
	return f.Dir.Commit(m)
}

func TestSaverSurfacesErrors(t *testing.T) {
	d, _ := openTest(t)
	fs := &failStore{Dir: d}
	fs.fail.Store(true)
	sv, err := NewSaver(fs, SaverOptions{Options: Options{ChunkSize: 512}})
	if err != nil {
		t.Fatal(err)
	}
	ck := testCheckpoint(1, 256)
	if err := sv.Save(ck); err != nil {
		t.Fatal(err)
	}
	// The background failure comes back from Wait, once.
	if _, err := sv.Wait(); !errors.Is(err, errDiskFull) {
		t.Fatalf("Wait: %v, want the commit error", err)
	}
	if _, err := sv.Wait(); err != nil {
		t.Fatalf("second Wait: %v, want the error reported once", err)
	}
	fs.fail.Store(false)
	if err := sv.Save(ck); err != nil {
		t.Fatal(err)
	}
	id, err := sv.Wait()
	if err != nil || id.IsZero() {
		t.Fatalf("Wait = %s, %v", id, err)
	}
	got, err := Load(fs, id)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Parent.IsZero() {
		t.Fatalf("parent %s of the first successful save, want none", got.Parent)
	}
	if _, err := NewSaver(fs, SaverOptions{Keep: 1}); err != nil {
		t.Fatalf("failStore embeds a Dir and can collect: %v", err)
	}
}

func cloneCheckpoint(ck *Checkpoint) *Checkpoint {
	c := *ck
	c.Params = ck.Params.Clone()
	c.Optimizer = ck.Optimizer.Clone()
	c.RNG = slices.Clone(ck.RNG)
	c.Files = nil
	for _, f := range ck.Files {
		c.Files = append(c.Files, File{Name: f.Name, Data: slices.Clone(f.Data)})
	}
	return &c
}

func TestBlobSize(t *testing.T) {
	s, _ := openTest(t)
	data := []byte("twelve bytes")
	d := Sum(data)
	if _, err := s.BlobSize(d); !errors.Is(err, ErrNotFound) {
		t.Fatalf("size of a missing blob: %v, want ErrNotFound", err)
	}
	if err := s.PutBlob(d, data); err != nil {
		t.Fatal(err)
	}
	if n, err := s.BlobSize(d); err != nil || n != int64(len(data)) {
		t.Fatalf("BlobSize = %d, %v; want %d", n, err, len(data))
	}
}
