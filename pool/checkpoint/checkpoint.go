package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/fleetlearn/fleetlearn/model"
)

// DefaultChunkSize is the blob size tensors are cut into: large enough that
// per-blob overhead is small, small enough that a tensor changed in one
// region rewrites little.
const DefaultChunkSize = 4 << 20

// Checkpoint is the state of a training job at one step.
type Checkpoint struct {
	// ID is the checkpoint's id; Load sets it, saving ignores it.
	ID  Digest
	Job string
	// Step is the training step the state is after.
	Step int64
	// Parent is the checkpoint this one continues from (zero for none).
	Parent Digest
	Params *model.Model
	// Optimizer holds optimizer state as named tensors (momentum buffers,
	// second moments); nil when the optimizer keeps none.
	Optimizer *model.Model
	Cursor    Cursor
	RNG       []byte
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
	id, err := writeCheckpoint(s, ck, cs, nil)
	if err != nil {
		return Digest{}, fmt.Errorf("checkpoint: write: %w", err)
	}
	return id, nil
}

// checkShapes is the cheap part of validation, done before a snapshot so
// that a malformed checkpoint is refused at once; NaN scans wait for the
// background.
func checkShapes(ck *Checkpoint) error {
	if ck == nil || ck.Params == nil {
		return fmt.Errorf("no params: %w", ErrInvalidCheckpoint)
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
	return nil
}

// writeCheckpoint validates ck fully, stores every chunk the store lacks and
// commits the manifest. scratch, if big enough, is reused for encoding.
func writeCheckpoint(s Store, ck *Checkpoint, chunkSize int, scratch []byte) (Digest, error) {
	for _, m := range []*model.Model{ck.Params, ck.Optimizer} {
		if m == nil {
			continue
		}
		if err := m.Validate(); err != nil {
			return Digest{}, fmt.Errorf("%w: %w", ErrInvalidCheckpoint, err)
		}
	}
	if cap(scratch) < chunkSize {
		scratch = make([]byte, chunkSize)
	}
	scratch = scratch[:chunkSize]
	man := &Manifest{
		Format: manifestFormat,
		Job:    ck.Job,
		Step:   ck.Step,
		Parent: ck.Parent,
		Cursor: ck.Cursor,
		RNG:    ck.RNG,
	}
	var err error
	if man.Params, err = writeTensors(s, ck.Params, chunkSize, scratch); err != nil {
		return Digest{}, err
	}
	if ck.Optimizer != nil {
		if man.Optimizer, err = writeTensors(s, ck.Optimizer, chunkSize, scratch); err != nil {
			return Digest{}, err
		}
	}
	if err := man.validate(); err != nil {
		return Digest{}, fmt.Errorf("%w: %w", ErrInvalidCheckpoint, err)
	}
	return s.Commit(man)
}

func writeTensors(s Store, m *model.Model, chunkSize int, scratch []byte) ([]TensorEntry, error) {
	out := make([]TensorEntry, 0, len(m.Tensors))
	per := chunkSize / 4
	for _, t := range m.Tensors {
		e := TensorEntry{Name: t.Name, Shape: append([]int{}, t.Shape...), Chunks: []Chunk{}}
		for data := t.Data; len(data) > 0; {
			n := min(len(data), per)
			b := scratch[:4*n]
			for i, v := range data[:n] {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
			}
			data = data[n:]
			d := Sum(b)
			// PutBlob, not HasBlob: a store can tell a damaged copy
			// from a good one and repair it.
			if err := s.PutBlob(d, b); err != nil {
				return nil, err
			}
			e.Chunks = append(e.Chunks, Chunk{Digest: d, Size: int64(len(b))})
		}
		out = append(out, e)
	}
	return out, nil
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
	if ck.Params, err = loadTensors(s, m.Params, lin); err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: params: %w", id, err)
	}
	if m.Optimizer != nil {
		if ck.Optimizer, err = loadTensors(s, m.Optimizer, model.Lineage{}); err != nil {
			return nil, fmt.Errorf("checkpoint: load %s: optimizer: %w", id, err)
		}
	}
	return ck, nil
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
