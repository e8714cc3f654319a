package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fleetlearn/fleetlearn/model"
)

// DefaultChunkSize is the blob size tensors and files are cut into: large enough that
// per-blob overhead is small, small enough that a tensor changed in one
// region rewrites little.
const DefaultChunkSize = 4 << 20

// Checkpoint is the state of a training job at one step. A job trained by
// Fleetlearn's own trainer keeps tensors (Params, Optimizer); a job that
// runs its own command keeps opaque files (its safetensors and state, byte
// for byte) and may have no Params. A checkpoint needs at least one of the
// two.
type Checkpoint struct {
	// ID is the checkpoint's id; Load sets it, saving ignores it.
	ID  Digest
	Job string
	// Step is the training step the state is after.
	Step int64
	// Parent is the checkpoint this one continues from (zero for none).
	Parent Digest
	// Params is nil only in a checkpoint with files; Load leaves it nil
	// for a stored checkpoint with files and no parameter tensors.
	Params *model.Model
	// Optimizer holds optimizer state as named tensors (momentum buffers,
	// second moments); nil when the optimizer keeps none.
	Optimizer *model.Model
	Cursor    Cursor
	RNG       []byte
	// Files are opaque files, stored as they are. Saving accepts them in
	// any order; Load returns them sorted by name.
	Files []File
}

// File is one opaque file of a checkpoint. Name is a plain file name (no
// '/', not "." or "..", no NUL, at most MaxFileNameBytes of UTF-8), unique
// within the checkpoint.
type File struct {
	Name string
	Data []byte
}

// Options tunes writing.
type Options struct {
	// ChunkSize is the blob size in bytes, a positive multiple of 4 up to
	// MaxChunkBytes; 0 means DefaultChunkSize. Chunks dedupe only between
	// checkpoints written with the same size.
	ChunkSize int
}

func (o Options) chunkSize() (int, error) {
	cs := o.ChunkSize
	if cs == 0 {
		cs = DefaultChunkSize
	}
	if cs <= 0 || cs%4 != 0 || cs > MaxChunkBytes {
		return 0, fmt.Errorf("chunk size %d: want a positive multiple of 4 up to %d: %w", cs, MaxChunkBytes, ErrInvalidCheckpoint)
	}
	return cs, nil
}

// Write stores ck synchronously and returns its id. Saver does the same
// without blocking on the writes.
func Write(s Store, ck *Checkpoint, opts Options) (Digest, error) {
	cs, err := opts.chunkSize()
	if err != nil {
		return Digest{}, fmt.Errorf("checkpoint: write: %w", err)
	}
	if err := checkShapes(ck); err != nil {
		return Digest{}, fmt.Errorf("checkpoint: write: %w", err)
	}
	id, err := writeCheckpoint(s, ck, newChunkWriter(cs, 1), s.Commit)
	if err != nil {
		return Digest{}, fmt.Errorf("checkpoint: write: %w", err)
	}
	return id, nil
}

// checkShapes is the cheap part of validation, done before a snapshot so
// that a malformed checkpoint is refused at once; NaN scans wait for the
// background.
func checkShapes(ck *Checkpoint) error {
	if ck == nil || ck.Params == nil && len(ck.Files) == 0 {
		return fmt.Errorf("no params and no files: %w", ErrInvalidCheckpoint)
	}
	if ck.Step < 0 || ck.Cursor.Epoch < 0 || ck.Cursor.Offset < 0 {
		return fmt.Errorf("negative step, epoch or offset: %w", ErrInvalidCheckpoint)
	}
	for _, m := range []*model.Model{ck.Params, ck.Optimizer} {
		if m == nil {
			continue
		}
		if len(m.Tensors) > MaxTensors {
			return fmt.Errorf("%d tensors, limit %d: %w", len(m.Tensors), MaxTensors, ErrInvalidCheckpoint)
		}
		for _, t := range m.Tensors {
			if n := t.Size(); n < 0 || n != len(t.Data) {
				return fmt.Errorf("tensor %q: shape %v does not fit %d values: %w", t.Name, t.Shape, len(t.Data), ErrInvalidCheckpoint)
			}
		}
	}
	return checkFiles(ck.Files)
}

// checkFiles applies the manifest's limits on files to a checkpoint's, so
// that a bad one is refused before anything is written.
func checkFiles(files []File) error {
	if len(files) > MaxFiles {
		return fmt.Errorf("%d files, limit %d: %w", len(files), MaxFiles, ErrInvalidCheckpoint)
	}
	seen := make(map[string]struct{}, len(files))
	var total int64
	for _, f := range files {
		if err := checkFileName(f.Name); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidCheckpoint, err)
		}
		if _, dup := seen[f.Name]; dup {
			return fmt.Errorf("file %q: given twice: %w", f.Name, ErrInvalidCheckpoint)
		}
		seen[f.Name] = struct{}{}
		if total += int64(len(f.Data)); total > MaxFilesBytes {
			return fmt.Errorf("files hold more than %d bytes: %w", int64(MaxFilesBytes), ErrInvalidCheckpoint)
		}
	}
	return nil
}

// sortedFiles returns files sorted by name, the manifest's order, without
// reordering the caller's slice.
func sortedFiles(files []File) []File {
	if slices.IsSortedFunc(files, compareFiles) {
		return files
	}
	return slices.SortedFunc(slices.Values(files), compareFiles)
}

func compareFiles(a, b File) int { return strings.Compare(a.Name, b.Name) }

// writeCheckpoint validates ck fully, stores every chunk with w and commits
// the manifest with commit.
func writeCheckpoint(s Store, ck *Checkpoint, w *chunkWriter, commit func(*Manifest) (Digest, error)) (Digest, error) {
	for _, m := range []*model.Model{ck.Params, ck.Optimizer} {
		if m == nil {
			continue
		}
		if err := m.Validate(); err != nil {
			return Digest{}, fmt.Errorf("%w: %w", ErrInvalidCheckpoint, err)
		}
	}
	man := &Manifest{
		Format: manifestFormat,
		Job:    ck.Job,
		Step:   ck.Step,
		Parent: ck.Parent,
		Cursor: ck.Cursor,
		RNG:    ck.RNG,
	}
	// A checkpoint of files only still has a params list, empty: the
	// manifest format requires one.
	man.Params = []TensorEntry{}
	var pieces []piece
	if ck.Params != nil {
		man.Params = w.planTensors(&pieces, ck.Params)
	}
	if ck.Optimizer != nil {
		man.Optimizer = w.planTensors(&pieces, ck.Optimizer)
	}
	man.Files = w.planFiles(&pieces, sortedFiles(ck.Files))
	if err := w.store(s, pieces); err != nil {
		return Digest{}, err
	}
	if err := man.validate(); err != nil {
		return Digest{}, fmt.Errorf("%w: %w", ErrInvalidCheckpoint, err)
	}
	return commit(man)
}

// chunkWriter encodes, hashes and stores the chunks of one checkpoint at a
// time on at most len(scratch) goroutines: the CPU a Saver's background work
// takes is bounded by that count, whatever the model's size.
type chunkWriter struct {
	size int // chunk size in bytes
	// scratch holds one encoding buffer per goroutine, allocated on first
	// use and kept for the next checkpoint.
	scratch [][]byte
}

func newChunkWriter(size, workers int) *chunkWriter {
	return &chunkWriter{size: size, scratch: make([][]byte, workers)}
}

// piece is one chunk to store: float32 values to encode, or a file's bytes
// as they are; out is where its manifest entry goes.
type piece struct {
	vals []float32
	raw  []byte
	file string // the file raw is from, for errors
	out  *Chunk
}

// planTensors returns m's manifest entries, their chunks to be filled in
// by the pieces it appends to ps.
func (w *chunkWriter) planTensors(ps *[]piece, m *model.Model) []TensorEntry {
	per := w.size / 4
	out := make([]TensorEntry, 0, len(m.Tensors))
	for _, t := range m.Tensors {
		e := TensorEntry{Name: t.Name, Shape: append([]int{}, t.Shape...), Chunks: make([]Chunk, (len(t.Data)+per-1)/per)}
		for i := range e.Chunks {
			*ps = append(*ps, piece{vals: t.Data[i*per : min((i+1)*per, len(t.Data))], out: &e.Chunks[i]})
		}
		out = append(out, e)
	}
	return out
}

// planFiles is planTensors for files, already in name order. The chunks
// are slices of the files' data: PutBlob does not keep them.
func (w *chunkWriter) planFiles(ps *[]piece, files []File) []FileEntry {
	var out []FileEntry // nil when there are none, so the manifest omits the list
	for _, f := range files {
		e := FileEntry{Name: f.Name, Size: int64(len(f.Data)), Chunks: make([]Chunk, (len(f.Data)+w.size-1)/w.size)}
		for i := range e.Chunks {
			*ps = append(*ps, piece{raw: f.Data[i*w.size : min((i+1)*w.size, len(f.Data))], file: f.Name, out: &e.Chunks[i]})
		}
		out = append(out, e)
	}
	return out
}

// store puts every piece, on as many goroutines as w has buffers, and
// returns the first error; after one, no further piece is started.
func (w *chunkWriter) store(s Store, ps []piece) error {
	n := min(len(w.scratch), len(ps))
	if n <= 1 {
		for i := range ps {
			if err := w.put(s, &ps[i], 0); err != nil {
				return err
			}
		}
		return nil
	}
	var next atomic.Int64
	var failed atomic.Bool
	errs := make([]error, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= len(ps) {
					return
				}
				if err := w.put(s, &ps[i], g); err != nil {
					errs[g] = err
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// put encodes p (tensor values as little-endian float32) into the buffer
// of goroutine g, hashes it and stores it.
func (w *chunkWriter) put(s Store, p *piece, g int) error {
	b := p.raw
	if p.vals != nil {
		if cap(w.scratch[g]) < w.size {
			w.scratch[g] = make([]byte, w.size)
		}
		b = w.scratch[g][:4*len(p.vals)]
		for i, v := range p.vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}
	d := Sum(b)
	// PutBlob, not HasBlob: a store can tell a damaged copy from a good
	// one and repair it.
	if err := s.PutBlob(d, b); err != nil {
		if p.file != "" {
			return fmt.Errorf("file %q: %w", p.file, err)
		}
		return err
	}
	*p.out = Chunk{Digest: d, Size: int64(len(b))}
	return nil
}

// Load reads the checkpoint id, verifying the manifest and every blob.
// Damage is reported with ErrCorrupt, a missing piece with ErrNotFound.
func Load(s Store, id Digest) (*Checkpoint, error) {
	m, err := s.Manifest(id)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: %w", id, err)
	}
	ck := &Checkpoint{ID: id, Job: m.Job, Step: m.Step, Parent: m.Parent, Cursor: m.Cursor, RNG: m.RNG}
	lin := model.Lineage{Version: id.String(), Job: m.Job}
	if !m.Parent.IsZero() {
		lin.Parent = m.Parent.String()
	}
	if len(m.Params) > 0 || len(m.Files) == 0 {
		if ck.Params, err = loadTensors(s, m.Params, lin); err != nil {
			return nil, fmt.Errorf("checkpoint: load %s: params: %w", id, err)
		}
	}
	if m.Optimizer != nil {
		if ck.Optimizer, err = loadTensors(s, m.Optimizer, model.Lineage{}); err != nil {
			return nil, fmt.Errorf("checkpoint: load %s: optimizer: %w", id, err)
		}
	}
	if ck.Files, err = loadFiles(s, m.Files); err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: %w", id, err)
	}
	return ck, nil
}

func loadFiles(s Store, es []FileEntry) ([]File, error) {
	if len(es) == 0 {
		return nil, nil
	}
	out := make([]File, 0, len(es))
	for _, e := range es {
		// As for tensors: the size is untrusted until the blobs are read.
		data := make([]byte, 0, min(e.Size, MaxChunkBytes))
		for _, c := range e.Chunks {
			b, err := s.GetBlob(c.Digest)
			if err != nil {
				return nil, fmt.Errorf("file %q: %w", e.Name, err)
			}
			if int64(len(b)) != c.Size {
				return nil, fmt.Errorf("file %q: blob %s has %d bytes, manifest says %d: %w", e.Name, c.Digest, len(b), c.Size, ErrCorrupt)
			}
			data = append(data, b...)
		}
		out = append(out, File{Name: e.Name, Data: data})
	}
	return out, nil
}

func loadTensors(s Store, es []TensorEntry, lin model.Lineage) (*model.Model, error) {
	m := &model.Model{Tensors: make([]model.Tensor, 0, len(es)), Lineage: lin}
	for _, e := range es {
		var total int64
		for _, c := range e.Chunks {
			total += c.Size
		}
		// The manifest's sizes are untrusted: preallocate a bounded
		// amount and let data that is really there grow the slice.
		data := make([]float32, 0, min(total, MaxChunkBytes)/4)
		for _, c := range e.Chunks {
			b, err := s.GetBlob(c.Digest)
			if err != nil {
				return nil, fmt.Errorf("tensor %q: %w", e.Name, err)
			}
			if int64(len(b)) != c.Size {
				return nil, fmt.Errorf("tensor %q: blob %s has %d bytes, manifest says %d: %w", e.Name, c.Digest, len(b), c.Size, ErrCorrupt)
			}
			for i := 0; i < len(b); i += 4 {
				data = append(data, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
			}
		}
		m.Tensors = append(m.Tensors, model.Tensor{Name: e.Name, Shape: slices.Clone(e.Shape), Data: data})
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return m, nil
}

// LoadLatest loads the latest committed checkpoint that verifies in full.
// When the one Store.Latest names is damaged it tries the others, highest
// step first, and reports ErrNoCheckpoint if none loads; errors other than
// damage (an unreadable disk) are returned as they are.
func LoadLatest(s Store) (*Checkpoint, error) {
	id, _, err := s.Latest()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load latest: %w", err)
	}
	ck, err := Load(s, id)
	if err == nil {
		return ck, nil
	}
	if !damaged(err) {
		return nil, fmt.Errorf("checkpoint: load latest: %w", err)
	}
	ids, lerr := s.List()
	if lerr != nil {
		return nil, fmt.Errorf("checkpoint: load latest: %w", lerr)
	}
	var ms []idManifest
	for _, other := range ids {
		if other == id {
			continue
		}
		if m, err := s.Manifest(other); err == nil {
			ms = append(ms, idManifest{other, m})
		}
	}
	sortByStep(ms)
	for _, c := range ms {
		ck, err := Load(s, c.id)
		if err == nil {
			return ck, nil
		}
		if !damaged(err) {
			return nil, fmt.Errorf("checkpoint: load latest: %w", err)
		}
	}
	return nil, fmt.Errorf("checkpoint: load latest: %s is damaged (%w) and no other checkpoint loads: %w", id, err, ErrNoCheckpoint)
}

func damaged(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidManifest)
}
