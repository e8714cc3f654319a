package pld

import "errors"

// Sentinel errors. Every error from this package wraps one of them.
var (
	// ErrTooWide reports a composition whose loss range cannot be held at
	// any usable discretization.
	ErrTooWide = errors.New("privacy loss range too wide to discretize")
	// ErrInvalid reports an unusable argument: δ outside (0, 1), q outside
	// (0, 1], a noise multiplier that is not finite and positive, a count
	// below 1, or no events.
	ErrInvalid = errors.New("invalid argument")
)
