package quant

import "errors"

// Sentinel errors. Every error from this package wraps exactly one of them.
var (
	// ErrConfig reports a block size out of range or a missing random
	// source.
	ErrConfig = errors.New("invalid configuration")
	// ErrShape reports an empty vector, one over MaxLen, or a decoded
	// vector whose length is not the one expected.
	ErrShape = errors.New("wrong length")
	// ErrRange reports a NaN, an infinity or a value beyond MaxAbs.
	ErrRange = errors.New("value out of range")
	// ErrFormat reports an encoding that cannot be decoded.
	ErrFormat = errors.New("invalid encoding")
)
