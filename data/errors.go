package data

import "errors"

var (
	// ErrInvalidDataset reports a Dataset whose shape or contents are
	// inconsistent: mismatched lengths, labels out of range, non-finite
	// features.
	ErrInvalidDataset = errors.New("invalid dataset")

	// ErrInvalidArgument reports a bad argument or option value, such as a
	// non-positive client count or a non-finite Dirichlet concentration.
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrMNISTNotFound reports that the MNIST IDX files could not be located.
	ErrMNISTNotFound = errors.New("MNIST files not found")

	// ErrIDX reports malformed IDX data: bad magic, unsupported element type
	// or dimensions that do not match what the caller expects.
	ErrIDX = errors.New("malformed IDX data")

	// ErrTruncated reports input that ended before its declared length.
	ErrTruncated = errors.New("truncated input")

	// ErrTooLarge reports input that exceeds a size limit.
	ErrTooLarge = errors.New("input exceeds size limit")

	// ErrPartition reports that no partition satisfying the constraints was
	// found within the allowed number of attempts.
	ErrPartition = errors.New("no valid partition found")

	// ErrManifest reports a malformed or inconsistent dataset manifest.
	ErrManifest = errors.New("malformed manifest")

	// ErrSize reports a dataset file whose size does not match its manifest.
	ErrSize = errors.New("file size does not match manifest")

	// ErrChecksum reports a dataset file whose SHA-256 digest does not match
	// its manifest.
	ErrChecksum = errors.New("checksum mismatch")
)
