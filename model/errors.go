package model

import "errors"

// Sentinel errors. Every error from this package wraps exactly one of them, so
// callers can tell bad input apart with errors.Is; reader I/O errors other
// than an early end of input are passed through wrapped.
var (
	// ErrNilModel reports a nil *Model where a model is required.
	ErrNilModel = errors.New("nil model")
	// ErrInvalidName reports an empty, non-UTF-8 or reserved tensor name.
	ErrInvalidName = errors.New("invalid tensor name")
	// ErrDuplicateName reports two tensors with the same name.
	ErrDuplicateName = errors.New("duplicate tensor name")
	// ErrInvalidShape reports a negative or malformed dimension.
	ErrInvalidShape = errors.New("invalid shape")
	// ErrShapeMismatch reports data whose length does not match its shape
	// (or a vector that does not match its layout).
	ErrShapeMismatch = errors.New("shape mismatch")
	// ErrNonFinite reports a NaN or infinite value.
	ErrNonFinite = errors.New("non-finite value")
	// ErrInvalidLineage reports lineage that cannot be encoded or decoded.
	ErrInvalidLineage = errors.New("invalid lineage")
	// ErrInvalidArch reports an architecture (Model.Arch) that is not
	// UTF-8 or too long to keep in a header.
	ErrInvalidArch = errors.New("invalid architecture")
	// ErrInvalidHeader reports a malformed safetensors header.
	ErrInvalidHeader = errors.New("invalid safetensors header")
	// ErrTruncated reports input that ends before the data it announces.
	ErrTruncated = errors.New("truncated input")
	// ErrTooLarge reports input beyond a configured limit or a size that
	// overflows.
	ErrTooLarge = errors.New("too large")
	// ErrUnsupportedDType reports a tensor dtype this package cannot read.
	ErrUnsupportedDType = errors.New("unsupported dtype")
	// ErrInvalidOffsets reports data offsets that do not index the buffer
	// exactly: reversed, overlapping, leaving holes or trailing bytes.
	ErrInvalidOffsets = errors.New("invalid data offsets")
	// ErrInvalidSelection reports tensor indices that are not ascending
	// indices of the model's tensors.
	ErrInvalidSelection = errors.New("invalid tensor selection")
)
