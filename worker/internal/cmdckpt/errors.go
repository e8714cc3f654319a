package cmdckpt

import "errors"

// Sentinel errors; errors from this package wrap one of them, an error of
// package checkpoint or an I/O error.
var (
	// ErrInvalidStepDir reports a step directory that does not follow the
	// checkpoint contract: not a directory, model.safetensors missing, a
	// contract file that is a symlink or not a regular file, a file that
	// changed while it was read.
	ErrInvalidStepDir = errors.New("step directory does not follow the checkpoint contract")
	// ErrTooLarge reports a checkpoint file over its bound.
	ErrTooLarge = errors.New("checkpoint file too large")
	// ErrNotCommandCheckpoint reports a stored checkpoint that is not a
	// command job's: tensors, a file the contract does not name, or no
	// model.safetensors.
	ErrNotCommandCheckpoint = errors.New("not a command-job checkpoint")
)
