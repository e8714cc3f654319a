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

	// ErrCSV reports a CSV file that ReadCSV cannot read as a dataset: a
	// row that does not parse, a feature that is not a finite number, a bad
	// label, duplicate column names or no data rows.
	ErrCSV = errors.New("malformed CSV data")

	// ErrNoFeatures reports a CSV file read without CSVOptions.Features
	// whose first data row holds no number outside the label and key
	// columns, so the feature columns must be named.
	ErrNoFeatures = errors.New("no feature columns")

	// ErrImage reports a file in an image folder that does not decode as a
	// PNG, JPEG or GIF image, or decodes to other bounds than its header
	// declares.
	ErrImage = errors.New("malformed image")

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
