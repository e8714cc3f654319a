package embedded

import "errors"

var (
	// ErrUnknown: no example module has that name.
	ErrUnknown = errors.New("no such example module")
	// ErrCorrupt: an embedded module does not decompress to the bytes whose
	// digest was recorded when it was generated.
	ErrCorrupt = errors.New("embedded module does not match its recorded digest")
)
