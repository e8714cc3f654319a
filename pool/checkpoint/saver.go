package checkpoint

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fleetlearn/fleetlearn/model"
)

// Saver defaults and limits (SaverOptions).
const (
	// DefaultBuffers lets one snapshot wait while the one before it is
	// written, so that a write that is late but keeps pace on average
	// does not stall training.
	DefaultBuffers = 2
	// DefaultWorkers lets one chunk be encoded and hashed while another
	// is in the store's hands (a disk sync, an upload).
	DefaultWorkers = 2
	// MaxBuffers bounds SaverOptions.Buffers: each buffer is a whole
	// checkpoint's memory.
	MaxBuffers = 64
	// MaxWorkers bounds SaverOptions.Workers.
	MaxWorkers = 64
)

// SaverOptions tunes a Saver.
type SaverOptions struct {
	Options
	// Keep, when positive, runs GC(store, Keep) after each successful
	// save, in the background like the write. The store must then be a
	// Collector and no one else may write to it.
	Keep int
	// Buffers is how many snapshots the Saver holds at most: the one
	// being written and those waiting, in order, to be. Each is as large
	// as a checkpoint's tensors, files and RNG state, and is reused, so
	// they bound the Saver's memory. 0 means DefaultBuffers.
	Buffers int
	// Workers is how many goroutines encode, hash and store a
	// checkpoint's chunks at once, each with a buffer of one chunk: the
	// CPU the background work may take from training. 0 means
	// DefaultWorkers.
	Workers int
}

func (o SaverOptions) counts() (buffers, workers int, err error) {
	buffers, workers = o.Buffers, o.Workers
	if buffers == 0 {
		buffers = DefaultBuffers
	}
	if workers == 0 {
		workers = DefaultWorkers
	}
	if buffers < 1 || buffers > MaxBuffers || workers < 1 || workers > MaxWorkers {
		return 0, 0, fmt.Errorf("%d buffers and %d workers: want 1 to %d and 1 to %d: %w", buffers, workers, MaxBuffers, MaxWorkers, ErrInvalidCheckpoint)
	}
	return buffers, workers, nil
}

// Saver writes checkpoints in the background. Save copies the tensors, files
// and RNG state into one of the Saver's buffers and returns; encoding,
// hashing, writing and syncing happen on other goroutines (at most
// SaverOptions.Workers at once). Several saves may be in flight, one per
// buffer: they are written one after the other in the order they were
// taken, so each commits after the one before it, and LATEST and the chain
// of parents never go backwards. Its memory is that of SaverOptions.Buffers
// snapshots and Workers chunks, however many saves it takes.
//
// When every buffer holds a snapshot not yet written, the store is slower
// than the checkpoints come, and Save waits for the oldest write to finish
// before it copies. No snapshot is dropped or replaced by a newer one to
// keep up: a job's final checkpoint, or the one a scheduler stops it at,
// must never be lost, and the ranks of a pool job resume only from a step
// every rank has committed. The wait is part of the stall Save reports
// (SaverStats, StallRecorder), so a store that cannot keep up shows as
// stall, never as unbounded memory.
//
// An error from a background save is returned by the next Save, Wait or
// Close, once, joined with any others since; the failed checkpoint is not
// retried, and the next one names the last checkpoint committed as its
// parent. A Saver is safe for concurrent use; its Saves are serialized.
type Saver struct {
	store  Store
	stalls StallRecorder // store, when it records stalls
	keep   int
	w      *chunkWriter
	// free holds the buffers not in use; a write returns its buffer
	// before it counts as settled.
	free chan *snapshot

	// mu serializes Save, Prepare, Wait and Close, so that snapshots are
	// written in the order they were taken.
	mu     sync.Mutex
	closed bool
	// tail is closed when the last snapshot taken has been written (or has
	// failed); every write waits for the one before it.
	tail chan struct{}

	// res guards what writes report.
	res   sync.Mutex
	last  Digest
	errs  []error
	stats SaverStats
}

// SaverStats is what a Saver's checkpoints have cost its caller so far.
type SaverStats struct {
	// Saves counts the snapshots taken.
	Saves int64
	// Waits counts the Saves that found every buffer in use and waited
	// for a write to finish: the store did not keep pace.
	Waits int64
	// Stall is the time Saves blocked their callers in all, MaxStall the
	// longest one.
	Stall, MaxStall time.Duration
}

// snapshot is one buffer: a checkpoint whose tensors, files and RNG state
// the Saver owns, and what its Save cost.
type snapshot struct {
	ck          Checkpoint
	params, opt model.Model
	files       []File
	rng         []byte
	stall       time.Duration
}

// NewSaver returns a Saver writing to s. Its buffers are allocated by
// Prepare, or as the first saves need them.
func NewSaver(s Store, opts SaverOptions) (*Saver, error) {
	cs, err := opts.chunkSize()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: new saver: %w", err)
	}
	buffers, workers, err := opts.counts()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: new saver: %w", err)
	}
	if opts.Keep > 0 {
		if _, ok := s.(Collector); !ok {
			return nil, fmt.Errorf("checkpoint: new saver: keep %d needs a store that can delete: %w", opts.Keep, ErrInvalidCheckpoint)
		}
	}
	sv := &Saver{store: s, keep: opts.Keep, w: newChunkWriter(cs, workers), free: make(chan *snapshot, buffers), tail: make(chan struct{})}
	sv.stalls, _ = s.(StallRecorder)
	for range buffers {
		sv.free <- &snapshot{}
	}
	close(sv.tail)
	return sv, nil
}

// Save snapshots ck and queues it for writing. ck may be changed as soon as
// Save returns. A zero ck.Parent is filled in, when the write starts, with
// the id of the last checkpoint this Saver committed, so lineage follows
// without bookkeeping. The error, if any, is from this call's checks or
// from an earlier background save; in either case nothing was snapshotted.
//
// The time from Save's call to its return is the checkpoint's stall: the
// copy, and the wait for a buffer when none was free.
func (s *Saver) Save(ck *Checkpoint) error {
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("checkpoint: save: %w", ErrClosed)
	}
	if err := s.takeErr(); err != nil {
		return err
	}
	if err := checkShapes(ck); err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	var b *snapshot
	waited := false
	select {
	case b = <-s.free:
	default:
		waited = true
		b = <-s.free
		// The write that freed the buffer may have failed; it is
		// reported before anything is taken past it.
		if err := s.takeErr(); err != nil {
			s.free <- b
			return err
		}
	}
	b.take(ck)
	prev, done := s.tail, make(chan struct{})
	s.tail = done
	b.stall = time.Since(start)
	s.res.Lock()
	s.stats.Saves++
	if waited {
		s.stats.Waits++
	}
	s.stats.Stall += b.stall
	s.stats.MaxStall = max(s.stats.MaxStall, b.stall)
	s.res.Unlock()
	go s.write(b, prev, done)
	return nil
}

// Prepare sizes the Saver's free buffers for checkpoints shaped like ck,
// copying ck into each, so that the first Saves copy into memory already
// allocated and mapped rather than pay for that in the training loop. It
// is optional; a job calls it once, before it trains. A buffer in use is
// left as it is.
func (s *Saver) Prepare(ck *Checkpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("checkpoint: prepare: %w", ErrClosed)
	}
	if err := checkShapes(ck); err != nil {
		return fmt.Errorf("checkpoint: prepare: %w", err)
	}
	var bs []*snapshot
	for free := true; free; {
		select {
		case b := <-s.free:
			bs = append(bs, b)
		default:
			free = false
		}
	}
	for _, b := range bs {
		b.take(ck)
		s.free <- b
	}
	return nil
}

// take copies ck into b, reusing b's slices where they are big enough.
func (b *snapshot) take(ck *Checkpoint) {
	b.rng = append(b.rng[:0], ck.RNG...)
	b.ck = Checkpoint{
		Job:    ck.Job,
		Step:   ck.Step,
		Parent: ck.Parent,
		Cursor: ck.Cursor,
		RNG:    b.rng,
		Files:  copyFiles(&b.files, ck.Files),
	}
	if ck.RNG == nil {
		b.ck.RNG = nil
	}
	if ck.Params != nil {
		b.ck.Params = copyInto(&b.params, ck.Params)
	}
	if ck.Optimizer != nil {
		b.ck.Optimizer = copyInto(&b.opt, ck.Optimizer)
	}
}

// write writes b once the write before it (prev) has settled, then returns
// b to the free buffers and closes done.
func (s *Saver) write(b *snapshot, prev <-chan struct{}, done chan<- struct{}) {
	<-prev
	s.res.Lock()
	if b.ck.Parent.IsZero() {
		b.ck.Parent = s.last
	}
	s.res.Unlock()
	commit := s.store.Commit
	if s.stalls != nil {
		commit = func(m *Manifest) (Digest, error) { return s.stalls.CommitStall(m, b.stall) }
	}
	id, err := writeCheckpoint(s.store, &b.ck, s.w, commit)
	if err != nil {
		err = fmt.Errorf("checkpoint: save step %d: %w", b.ck.Step, err)
	} else if s.keep > 0 {
		if _, gerr := GC(s.store.(Collector), s.keep); gerr != nil {
			err = fmt.Errorf("checkpoint: save step %d: committed %s: %w", b.ck.Step, id, gerr)
		}
	}
	s.res.Lock()
	if !id.IsZero() {
		s.last = id
	}
	if err != nil {
		s.errs = append(s.errs, err)
	}
	s.res.Unlock()
	s.free <- b
	close(done)
}

// takeErr returns the background errors not yet returned, joined, and
// forgets them.
func (s *Saver) takeErr() error {
	s.res.Lock()
	defer s.res.Unlock()
	err := errors.Join(s.errs...)
	s.errs = nil
	return err
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

// Wait blocks until every save taken has been written and returns the id of
// the last checkpoint committed and the errors of saves not yet reported.
func (s *Saver) Wait() (Digest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	<-s.tail
	err := s.takeErr()
	s.res.Lock()
	defer s.res.Unlock()
	return s.last, err
}

// Stats returns what the Saver's checkpoints have cost its caller so far.
func (s *Saver) Stats() SaverStats {
	s.res.Lock()
	defer s.res.Unlock()
	return s.stats
}

// Close waits for the saves in flight; later Saves fail with ErrClosed.
func (s *Saver) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	<-s.tail
	return s.takeErr()
}
