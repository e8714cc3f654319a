package seq

import "errors"

var (
	// ErrArch reports an architecture that does not parse or cannot be
	// built, and parameters or data that do not fit it.
	ErrArch = errors.New("seq: invalid architecture")
	// ErrDiverged reports a loss that is no longer finite: the weights
	// blew up (a learning rate too high, or a model swamped by noise).
	ErrDiverged = errors.New("seq: training diverged")
)
