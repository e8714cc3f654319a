package aggregator

import "errors"

// Sentinel errors. Every error from this package wraps exactly one of them, so
// the server can tell a refused report apart from its own mistakes with
// errors.Is and tell the device why.
var (
	// ErrShape reports a vector whose length is not the rule's dimension.
	ErrShape = errors.New("wrong length")
	// ErrNonFinite reports a NaN or infinite value, in an update or in a
	// result that would overflow float32.
	ErrNonFinite = errors.New("non-finite value")
	// ErrNormBound reports an update whose L2 norm exceeds the bound.
	ErrNormBound = errors.New("norm over bound")
	// ErrWeight reports a weight or report count that is not positive and
	// finite, or a total weight beyond MaxWeight.
	ErrWeight = errors.New("invalid weight")
	// ErrEmpty reports a round with no reports to aggregate.
	ErrEmpty = errors.New("no reports")
	// ErrUnsupported reports an operation the rule cannot do, such as adding
	// a pre-summed update to a rule that needs every update.
	ErrUnsupported = errors.New("unsupported by rule")
	// ErrConfig reports an unknown rule, a bad dimension or an option out of
	// range.
	ErrConfig = errors.New("invalid configuration")
	// ErrIncomplete reports an update added in pieces (Part) that was not
	// finished: the sum holds part of it, so the round cannot aggregate.
	ErrIncomplete = errors.New("update added in part")
	// ErrState reports serialized optimizer state that cannot be restored.
	ErrState = errors.New("invalid state")
)
