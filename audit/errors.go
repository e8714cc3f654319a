package audit

import (
	"errors"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
)

// Sentinel errors. Every error from this package wraps one of them (proof
// and export failures may wrap a second, more specific one), so callers can
// tell failures apart with errors.Is; I/O and database errors are passed
// through wrapped.
var (
	// ErrClosed reports use of a closed Log.
	ErrClosed = errors.New("log closed")
	// ErrLocked reports a log another process has open for writing (an
	// SQLite log: its folder lock is held).
	ErrLocked = errors.New("log locked")
	// ErrFenced reports a write by a Log that another writer has deposed
	// by opening the same PostgreSQL database (WithDatabase) after it:
	// nothing of the write was stored, and the Log refuses every later
	// append, checkpoint and cosignature with it. Close it; open the log
	// again if this process is to write it once more.
	ErrFenced = errors.New("log writer fenced: another writer has opened the log")
	// ErrInvalidDatabase reports a WithDatabase that is not a PostgreSQL
	// URL.
	ErrInvalidDatabase = errors.New("invalid database")
	// ErrReadOnly reports a write to a Log opened with OpenReadOnly.
	ErrReadOnly = errors.New("log is read-only")
	// ErrNotFound reports an entry index beyond the log, or a checkpoint
	// that does not exist yet.
	ErrNotFound = errors.New("not found")
	// ErrInvalidEvent reports an event or payload that breaks the event
	// schema: missing or malformed fields, bad UTF-8, non-finite numbers.
	ErrInvalidEvent = errors.New("invalid event")
	// ErrNotPseudonym reports a device identifier where a pseudonym (see
	// PseudonymizeDevice) is required: raw device ids never enter the log.
	ErrNotPseudonym = errors.New("device id is not a pseudonym")
	// ErrNotCanonical reports event JSON that is not in canonical form.
	ErrNotCanonical = errors.New("event JSON is not canonical")
	// ErrMalformedEntry reports entry bytes that are not a compact JWS of
	// the expected shape.
	ErrMalformedEntry = errors.New("malformed entry")
	// ErrBadSignature reports an entry whose signature does not verify with
	// the pinned algorithm and key.
	ErrBadSignature = errors.New("bad entry signature")
	// ErrBadCheckpoint reports a checkpoint note that is malformed, for
	// another log, or not signed by the expected key.
	ErrBadCheckpoint = errors.New("bad checkpoint")
	// ErrInconsistent reports a tree that does not match a checkpoint the
	// log signed, or two checkpoints that contradict each other. The log
	// refuses to sign on top of it.
	ErrInconsistent = errors.New("log inconsistent with its checkpoints")
	// ErrCorrupt reports a store whose rows break the log's invariants.
	ErrCorrupt = errors.New("corrupt log store")
	// ErrKeyMismatch reports keys other than those the log was created with
	// or the auditor pinned.
	ErrKeyMismatch = errors.New("key mismatch")
	// ErrInvalidKeys reports a malformed key file or key.
	ErrInvalidKeys = errors.New("invalid keys")
	// ErrInvalidFilter reports a query filter that cannot be parsed or used.
	ErrInvalidFilter = errors.New("invalid filter")
	// ErrInvalidProof reports a proof that does not verify; it is wrapped
	// together with one of ErrHashSize, ErrIndexRange, ErrTreeSize,
	// ErrProofLength or ErrRootMismatch.
	ErrInvalidProof = errors.New("invalid proof")
	// ErrExportFormat reports an export file that breaks the format.
	ErrExportFormat = errors.New("malformed export")
	// ErrTampered reports an export whose contents do not verify; the
	// *VerifyError that wraps it names where and why.
	ErrTampered = errors.New("export does not verify")
	// ErrUncovered reports entries that no checkpoint in an export commits
	// to: nothing signed vouches for them.
	ErrUncovered = errors.New("entries not covered by a checkpoint")
	// ErrTooLarge reports input over a size limit.
	ErrTooLarge = errors.New("too large")
)

// Proof failure details, wrapped together with ErrInvalidProof.
var (
	// ErrHashSize reports a hash that is not 32 bytes.
	ErrHashSize = merkle.ErrHashSize
	// ErrIndexRange reports a leaf index at or beyond the tree size.
	ErrIndexRange = merkle.ErrIndex
	// ErrTreeSize reports tree sizes a proof cannot relate (the first
	// larger than the second, or the first zero).
	ErrTreeSize = merkle.ErrSize
	// ErrProofLength reports a proof with too few or too many hashes.
	ErrProofLength = merkle.ErrProofLength
	// ErrRootMismatch reports a proof or tree whose root is not the
	// expected one.
	ErrRootMismatch = merkle.ErrRootMismatch
)

// Completeness and the query index.
var (
	// ErrIncomplete reports a committed round whose record misses an event
	// the server writes with every such round (its close, the model it
	// committed, its evaluation, its privacy cost), or an event of a round
	// that has no close: the *VerifyError names the round's entry.
	ErrIncomplete = errors.New("round record incomplete")
	// ErrIndexMismatch reports a row of the query index (the type, time,
	// actor, task or round columns) that differs from its signed entry.
	ErrIndexMismatch = errors.New("query index differs from the signed entries")
)

// Witnesses and their cosignatures.
var (
	// ErrNotCosigned reports a checkpoint note without a cosignature of the
	// expected witness.
	ErrNotCosigned = errors.New("checkpoint not cosigned by the witness")
	// ErrBadCosignature reports a witness's cosignature that does not
	// verify, or whose time the log cannot accept.
	ErrBadCosignature = errors.New("bad cosignature")
	// ErrUnknownWitness reports a cosignature from no witness the log is
	// configured to accept (WithWitnesses).
	ErrUnknownWitness = errors.New("unknown witness")
	// ErrNoWitnessCheckpoint reports a verification that requires a
	// witness but lacks the witness's own newest checkpoint
	// (WithWitnessCheckpoint) and is not offline (WithWitnessOffline), or
	// a witness checkpoint of no required witness.
	ErrNoWitnessCheckpoint = errors.New("no checkpoint from the witness itself")
)
