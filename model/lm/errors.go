package lm

import "errors"

var (
	// ErrArch reports parameters that are not a model this package
	// understands, or one that does not fit the dataset.
	ErrArch = errors.New("lm: unsupported model architecture")
	// ErrHyper reports invalid hyper-parameters.
	ErrHyper = errors.New("lm: invalid hyper-parameters")
)
