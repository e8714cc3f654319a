package checkpoint

import (
	"fmt"
	"slices"
	"sync"

	"github.com/fleetlearn/fleetlearn/model"
)

// SaverOptions tunes a Saver.
type SaverOptions struct {
	Options
	// Keep, when positive, runs GC(store, Keep) after each successful
	// save, in the background like the write. The store must then be a
	// Collector and no one else may write to it.
	Keep int
}

// Saver writes checkpoints in the background. Save copies the tensors and
// files into buffers the Saver owns and reuses, then returns; the encoding, hashing,
// writing and syncing happen on another goroutine. At most one save is in
// flight: a Save that finds the previous one still writing waits for it
// before copying, so a job that checkpoints faster than the disk writes is
// slowed to the disk's pace rather than queueing snapshots in memory.
//
// An error from a background save is returned by the next Save, Wait or
// Close, once; the failed checkpoint is not retried. A Saver is safe for
// concurrent use, though saves are serialized.
type Saver struct {
	store Store
	opts  SaverOptions
	chunk int

	mu      sync.Mutex
	flight  *flight
	err     error
	last    Digest
	closed  bool
	params  model.Model
	opt     model.Model
	files   []File
	scratch []byte
}

type flight struct {
	done chan struct{}
	id   Digest
	err  error
}

// NewSaver returns a Saver writing to s.
func NewSaver(s Store, opts SaverOptions) (*Saver, error) {
	cs, err := opts.chunkSize()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: new saver: %w", err)
	}
	if opts.Keep > 0 {
		if _, ok := s.(Collector); !ok {
			return nil, fmt.Errorf("checkpoint: new saver: keep %d needs a store that can delete: %w", opts.Keep, ErrInvalidCheckpoint)
		}
	}
	return &Saver{store: s, opts: opts, chunk: cs}, nil
}

// Save snapshots ck and starts writing it. ck may be changed as soon as Save
// returns. A zero ck.Parent is filled in with the id of the last checkpoint
// this Saver committed, so lineage follows without bookkeeping. The error,
// if any, is from this call's checks or from the previous background save;
// in either case nothing was snapshotted.
func (s *Saver) Save(ck *Checkpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("checkpoint: save: %w", ErrClosed)
	}
	if err := s.settleLocked(); err != nil {
		return err
	}
	if err := checkShapes(ck); err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	snap := &Checkpoint{
		Job:    ck.Job,
		Step:   ck.Step,
		Parent: ck.Parent,
		Cursor: ck.Cursor,
		RNG:    slices.Clone(ck.RNG),
		Files:  copyFiles(&s.files, ck.Files),
	}
	if ck.Params != nil {
		snap.Params = copyInto(&s.params, ck.Params)
	}
	if snap.Parent.IsZero() {
		snap.Parent = s.last
	}
	if ck.Optimizer != nil {
		snap.Optimizer = copyInto(&s.opt, ck.Optimizer)
	}
	f := &flight{done: make(chan struct{})}
	s.flight = f
	go s.write(f, snap)
	return nil
}

func (s *Saver) write(f *flight, snap *Checkpoint) {
	defer close(f.done)
	if cap(s.scratch) < s.chunk {
		// Only this goroutine touches scratch, and only one runs at a time.
		s.scratch = make([]byte, s.chunk)
	}
	f.id, f.err = writeCheckpoint(s.store, snap, s.chunk, s.scratch)
	if f.err != nil {
		f.err = fmt.Errorf("checkpoint: save step %d: %w", snap.Step, f.err)
		return
	}
	if s.opts.Keep > 0 {
		if _, err := GC(s.store.(Collector), s.opts.Keep); err != nil {
			f.err = fmt.Errorf("checkpoint: save step %d: committed %s: %w", snap.Step, f.id, err)
		}
	}
}

// copyInto copies src into dst, reusing dst's slices where they are big
// enough, and returns dst.
func copyInto(dst *model.Model, src *model.Model) *model.Model {
	if cap(dst.Tensors) < len(src.Tensors) {
		dst.Tensors = append(dst.Tensors[:cap(dst.Tensors)], make([]model.Tensor, len(src.Tensors)-cap(dst.Tensors))...)
	}
	dst.Tensors = dst.Tensors[:len(src.Tensors)]
	dst.Lineage = src.Lineage
	for i, t := range src.Tensors {
		d := &dst.Tensors[i]
		d.Name = t.Name
		d.Shape = append(d.Shape[:0], t.Shape...)
		if cap(d.Data) < len(t.Data) {
			d.Data = make([]float32, len(t.Data))
		}
		d.Data = d.Data[:len(t.Data)]
		copy(d.Data, t.Data)
	}
	return dst
}

// copyFiles copies src into *dst, reusing its buffers where they are big
// enough, and returns the copy (nil for no files).
func copyFiles(dst *[]File, src []File) []File {
	if len(src) == 0 {
		return nil
	}
	fs := *dst
	if len(fs) < len(src) {
		fs = append(fs, make([]File, len(src)-len(fs))...)
	}
	for i, f := range src {
		d := &fs[i]
		d.Name = f.Name
		if cap(d.Data) < len(f.Data) {
			d.Data = make([]byte, len(f.Data))
		}
		d.Data = d.Data[:len(f.Data)]
		copy(d.Data, f.Data)
	}
	*dst = fs
	return fs[:len(src)]
}

// settleLocked waits for the save in flight and returns its error, or one
// that an earlier call has not returned yet.
func (s *Saver) settleLocked() error {
	if f := s.flight; f != nil {
		<-f.done
		s.flight = nil
		if f.err != nil {
			s.err = f.err
		}
		if !f.id.IsZero() {
			s.last = f.id
		}
	}
	err := s.err
	s.err = nil
	return err
}

// Wait blocks until no save is in flight and returns the id of the last
// checkpoint committed and the error of a save not yet reported.
func (s *Saver) Wait() (Digest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.settleLocked()
	return s.last, err
}

// Close waits for the save in flight; later Saves fail with ErrClosed.
func (s *Saver) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.settleLocked()
}
