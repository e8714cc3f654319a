package witness

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/filelock"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
)

// Files in a witness's state folder.
const (
	// LogKeyFile holds the verifier key of the log the state follows,
	// written on first use: a state is never applied to another log.
	LogKeyFile = "log.vkey"
	// CheckpointFile holds the last checkpoint the witness cosigned, as
	// the log signed it.
	CheckpointFile = "checkpoint"
	// CosignedFile holds the note the witness cosigned last, with its
	// cosignature: what it has seen, as of when, under its own key. An
	// auditor holds a log to it (fleetlearn audit verify
	// --witness-checkpoint), which is what a rolled-back log cannot pass.
	CosignedFile = "cosigned"
	// LockFile is locked by the one process using the state.
	LockFile = "witness.lock"
	// Evidence files are named conflict-<unix seconds>.txt (with -2, -3,
	// ... for more in the same second).
	evidencePrefix = "conflict-"
)

// maxStateFile bounds the files New reads.
const maxStateFile = audit.MaxNoteBytes

// Errors besides audit.ErrInconsistent (a conflict, see ConflictError) and
// the audit package's errors for bad notes and keys.
var (
	// ErrLocked reports a state folder another process is using.
	ErrLocked = errors.New("witness state locked")
	// ErrState reports a state folder that belongs to another log or whose
	// files are damaged.
	ErrState = errors.New("bad witness state")
	// ErrClosed reports use of a closed Witness.
	ErrClosed = errors.New("witness closed")
)

// Option configures New.
type Option func(*config)

type config struct {
	clock clock.Clock
	log   *slog.Logger
}

// WithClock sets the clock that dates cosignatures and evidence (default:
// the system clock).
func WithClock(c clock.Clock) Option { return func(o *config) { o.clock = c } }

// WithLogger sets where the witness reports what it does (default:
// nowhere).
func WithLogger(l *slog.Logger) Option { return func(o *config) { o.log = l } }

// Witness follows one log. Its methods are safe for concurrent use; Update
// calls are serialized.
type Witness struct {
	key     audit.WitnessKey
	logVKey string
	dir     string
	cfg     config
	lock    *os.File

	mu     sync.Mutex // guards the fields below and serializes Update
	last   *audit.Checkpoint
	closed bool
}

// New opens, or starts, the state in stateDir of a witness with key that
// follows the log whose checkpoints verify with logVKey. It locks the
// folder (ErrLocked if another process holds it) and refuses a state kept
// for another log or one that does not verify (ErrState).
func New(key audit.WitnessKey, logVKey, stateDir string, opts ...Option) (*Witness, error) {
	cfg := config{}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	cfg.clock = clock.Or(cfg.clock)
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	if key.Name() == "" {
		return nil, fmt.Errorf("witness: empty key: %w", audit.ErrInvalidKeys)
	}
	// ParseCheckpoint checks the key before the note.
	if _, err := audit.ParseCheckpoint(nil, logVKey); errors.Is(err, audit.ErrInvalidKeys) {
		return nil, fmt.Errorf("witness: log key: %w", err)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("witness: state: %w", err)
	}
	lock, err := filelock.Lock(filepath.Join(stateDir, LockFile))
	if errors.Is(err, filelock.ErrLocked) {
		// Two witnesses on one state would each check against a state the
		// other may have replaced.
		return nil, fmt.Errorf("witness: state %s: another witness uses it: %w", stateDir, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("witness: state %s: %w", stateDir, err)
	}
	w := &Witness{key: key, logVKey: logVKey, dir: stateDir, cfg: cfg, lock: lock}
	if err := w.load(); err != nil {
		lock.Close()
		return nil, err
	}
	return w, nil
}

// PinnedLogKey returns the log verifier key a state folder follows, or ""
// when the folder holds no state yet.
func PinnedLogKey(stateDir string) (string, error) {
	b, err := readSmall(filepath.Join(stateDir, LogKeyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

func (w *Witness) load() error {
	pinned, err := PinnedLogKey(w.dir)
	if err != nil {
		return fmt.Errorf("witness: state: %w: %w", ErrState, err)
	}
	switch pinned {
	case "":
		if err := atomicfile.WriteNew(filepath.Join(w.dir, LogKeyFile), []byte(w.logVKey+"\n"), 0o600); err != nil {
			return fmt.Errorf("witness: state: %w", err)
		}
	case w.logVKey:
	default:
		return fmt.Errorf("witness: state in %s follows the log with key %s, not %s: %w", w.dir, pinned, w.logVKey, ErrState)
	}
	b, err := readSmall(filepath.Join(w.dir, CheckpointFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("witness: state: %w: %w", ErrState, err)
	}
	cp, err := audit.ParseCheckpoint(b, w.logVKey)
	if err != nil {
		return fmt.Errorf("witness: state %s: %w: %w", filepath.Join(w.dir, CheckpointFile), ErrState, err)
	}
	w.last = &cp
	w.cfg.log.Info("witness state loaded", "dir", w.dir, "origin", cp.Origin, "size", cp.Size)
	return nil
}

func readSmall(path string) ([]byte, error) {
	b, err := smallfile.Read(path, maxStateFile)
	if errors.Is(err, smallfile.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %w", err, audit.ErrTooLarge)
	}
	return b, err
}

// Close releases the state folder.
func (w *Witness) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	return w.lock.Close()
}

// Last returns the last checkpoint the witness cosigned; false before the
// first.
func (w *Witness) Last() (audit.Checkpoint, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		return audit.Checkpoint{}, false
	}
	return *w.last, true
}

// Prover fetches the RFC 9162 consistency proof from the tree of size1
// entries to the tree of size2 entries from the log.
type Prover func(ctx context.Context, size1, size2 uint64) ([][]byte, error)

// Update checks the log's checkpoint note against the last one the witness
// cosigned and returns the note cosigned at the clock's current time. A
// larger checkpoint needs a consistency proof, which it asks prove for; an
// unchanged one is cosigned again. It records a larger checkpoint as the
// new state, synced to disk, before cosigning it.
//
// A checkpoint that rolls back, forks (another root at the same size) or
// fails its proof is refused with a *ConflictError wrapping
// audit.ErrInconsistent, after the witness wrote the evidence file; the
// state is kept. A note that does not verify with the log's key fails
// with audit.ErrBadCheckpoint, and an error from prove is returned as it
// is: neither tells anything about the log's consistency.
func (w *Witness) Update(ctx context.Context, note []byte, prove Prover) ([]byte, error) {
	cp, err := audit.ParseCheckpoint(note, w.logVKey)
	if err != nil {
		return nil, fmt.Errorf("witness: %w", err)
	}
	if cp.Size == 0 && cp.Root != sha256.Sum256(nil) {
		return nil, fmt.Errorf("witness: checkpoint of size 0 with a root other than the empty tree's: %w", audit.ErrBadCheckpoint)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, fmt.Errorf("witness: %w", ErrClosed)
	}
	if last := w.last; last != nil {
		switch {
		case cp.Size < last.Size:
			return nil, w.conflict("rollback", *last, cp, nil, nil)
		case cp.Size == last.Size:
			if cp.Root != last.Root {
				return nil, w.conflict("split view", *last, cp, nil, nil)
			}
		case last.Size > 0: // every tree extends the empty one
			if prove == nil {
				return nil, errors.New("witness: no way to fetch a consistency proof")
			}
			proof, err := prove(ctx, last.Size, cp.Size)
			if err != nil {
				return nil, fmt.Errorf("witness: consistency proof from size %d to %d: %w", last.Size, cp.Size, err)
			}
			if err := audit.VerifyConsistency(last.Size, cp.Size, proof, last.Root[:], cp.Root[:]); err != nil {
				return nil, w.conflict("consistency proof", *last, cp, proof, err)
			}
		}
	}
	if w.last == nil || cp.Size > w.last.Size {
		// The state goes to disk first: a witness that crashed after
		// cosigning must not come back knowing less than it vouched for.
		if err := atomicfile.WriteFile(filepath.Join(w.dir, CheckpointFile), cp.Note, 0o600); err != nil {
			return nil, fmt.Errorf("witness: state: %w", err)
		}
		prev := uint64(0)
		if w.last != nil {
			prev = w.last.Size
		}
		w.last = &cp
		w.cfg.log.Info("witness advanced", "origin", cp.Origin, "size", cp.Size, "previous", prev)
	}
	cosigned, err := w.key.Cosign(cp, w.cfg.clock.Now())
	if err != nil {
		return nil, fmt.Errorf("witness: %w", err)
	}
	// Kept before it is handed out, so that what auditors read from the
	// state is never older than a cosignature the log may hold.
	if err := atomicfile.WriteFile(filepath.Join(w.dir, CosignedFile), cosigned, 0o600); err != nil {
		return nil, fmt.Errorf("witness: state: %w", err)
	}
	return cosigned, nil
}

// ReadCosigned returns the note a witness with its state in stateDir
// cosigned last (CosignedFile); fs.ErrNotExist before its first
// cosignature. The caller verifies it (audit.VerifyCosignature): the file
// proves what the witness saw only through the witness's signature.
func ReadCosigned(stateDir string) ([]byte, error) {
	b, err := readSmall(filepath.Join(stateDir, CosignedFile))
	if err != nil {
		return nil, fmt.Errorf("witness: state %s: %w", stateDir, err)
	}
	return b, nil
}

// ConflictError is a checkpoint the witness refused because it contradicts
// the last one it cosigned. It wraps audit.ErrInconsistent.
type ConflictError struct {
	// Reason is "rollback" (a smaller tree), "split view" (another root
	// at the same size) or "consistency proof" (a larger tree that was
	// not proven to extend the last one).
	Reason string
	// Last is the checkpoint the witness cosigned last, Offered the one it
	// refused.
	Last, Offered audit.Checkpoint
	// Evidence is the file holding both notes (and the proof), "" if it
	// could not be written.
	Evidence string
	// Err is the proof's failure, or why the evidence was not written.
	Err error
}

func (e *ConflictError) Error() string {
	root := func(cp audit.Checkpoint) string { return base64.StdEncoding.EncodeToString(cp.Root[:]) }
	var b strings.Builder
	fmt.Fprintf(&b, "witness: %s: the log offered a checkpoint of size %d (root %s) inconsistent with the one this witness cosigned at size %d (root %s)",
		e.Reason, e.Offered.Size, root(e.Offered), e.Last.Size, root(e.Last))
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	if e.Evidence != "" {
		fmt.Fprintf(&b, "; evidence in %s", e.Evidence)
	}
	fmt.Fprintf(&b, ": %v", audit.ErrInconsistent)
	return b.String()
}

// Unwrap returns audit.ErrInconsistent and Err.
func (e *ConflictError) Unwrap() []error {
	if e.Err == nil {
		return []error{audit.ErrInconsistent}
	}
	return []error{audit.ErrInconsistent, e.Err}
}

// conflict writes the evidence of a refused checkpoint and returns the
// error that reports it.
func (w *Witness) conflict(reason string, last, offered audit.Checkpoint, proof [][]byte, cause error) error {
	e := &ConflictError{Reason: reason, Last: last, Offered: offered, Err: cause}
	now := w.cfg.clock.Now().UTC()
	var b bytes.Buffer
	fmt.Fprintf(&b, "fleetlearn audit witness conflict\ntime: %s\nwitness: %s\nlog: %s\nreason: %s\n",
		now.Format(time.RFC3339), w.key.VerifierKey(), w.logVKey, reason)
	if cause != nil {
		fmt.Fprintf(&b, "detail: %v\n", cause)
	}
	section := func(title string, body []byte) {
		fmt.Fprintf(&b, "\n-----BEGIN %s-----\n", title)
		b.Write(body)
		fmt.Fprintf(&b, "-----END %s-----\n", title)
	}
	section(fmt.Sprintf("LAST COSIGNED CHECKPOINT (SIZE %d)", last.Size), last.Note)
	section(fmt.Sprintf("OFFERED CHECKPOINT (SIZE %d)", offered.Size), offered.Note)
	if proof != nil {
		var p bytes.Buffer
		for _, h := range proof {
			p.WriteString(base64.StdEncoding.EncodeToString(h))
			p.WriteByte('\n')
		}
		section(fmt.Sprintf("CONSISTENCY PROOF (%d TO %d)", last.Size, offered.Size), p.Bytes())
	}
	var err error
	for i := 1; i <= 100; i++ {
		name := fmt.Sprintf("%s%d.txt", evidencePrefix, now.Unix())
		if i > 1 {
			name = fmt.Sprintf("%s%d-%d.txt", evidencePrefix, now.Unix(), i)
		}
		path := filepath.Join(w.dir, name)
		if err = atomicfile.WriteNew(path, b.Bytes(), 0o600); err == nil {
			e.Evidence = path
			break
		}
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if e.Evidence == "" {
		e.Err = errors.Join(cause, fmt.Errorf("evidence not written: %w", err))
	}
	w.cfg.log.Error("witness refused an inconsistent checkpoint", "reason", reason, "last_size", last.Size,
		"offered_size", offered.Size, "evidence", e.Evidence, "err", cause)
	return e
}
