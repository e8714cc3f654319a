package seq

import "errors"

var (
	// ErrArch reports an architecture that does not parse or cannot be
	// built, and parameters or data that do not fit it.
	ErrArch = errors.New("seq: invalid architecture")
)
