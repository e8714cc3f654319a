package dp

import "errors"

// Sentinel errors. Every error from this package wraps at least one of them.
var (
	// ErrInvalid reports an unusable argument: NaN or infinite values,
	// out-of-range parameters, mismatched lengths.
	ErrInvalid = errors.New("invalid argument")
	// ErrBudgetExceeded reports a round that would push ε past the budget's
	// target; the budget is left unchanged.
	ErrBudgetExceeded = errors.New("privacy budget exceeded")
	// ErrUnreachable reports a target that no noise multiplier in the
	// searched range meets.
	ErrUnreachable = errors.New("target epsilon unreachable")
	// ErrMalformed reports a serialised budget state that does not decode
	// or fails validation.
	ErrMalformed = errors.New("malformed budget state")
	// ErrRounding reports that conditional randomized rounding kept
	// exceeding its norm bound, which points at a bad β.
	ErrRounding = errors.New("conditional rounding did not converge")
)
