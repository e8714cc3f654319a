package checkpoint

import "errors"

// Sentinel errors; errors from this package wrap one of them or an I/O error.
var (
	// ErrNotFound reports a blob or manifest the store does not hold.
	ErrNotFound = errors.New("not found")
	// ErrCorrupt reports stored bytes whose digest or size does not match
	// the name they are stored under or the manifest that refers to them.
	ErrCorrupt = errors.New("corrupt checkpoint data")
	// ErrInvalidManifest reports manifest bytes that are not a canonical,
	// well-formed manifest within the size limits.
	ErrInvalidManifest = errors.New("invalid manifest")
	// ErrInvalidCheckpoint reports a checkpoint that cannot be saved: a
	// missing model, a bad tensor, a negative step.
	ErrInvalidCheckpoint = errors.New("invalid checkpoint")
	// ErrNoCheckpoint reports a store with no committed checkpoint that
	// verifies.
	ErrNoCheckpoint = errors.New("no checkpoint")
	// ErrClosed reports a call on a closed Saver.
	ErrClosed = errors.New("saver closed")
)
