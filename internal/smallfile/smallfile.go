// Package smallfile reads a file that is small by contract (a key, a pin,
// a checkpoint, a state file) with a bound, so that a file replaced by
// something huge, or a device, fails instead of filling memory.
package smallfile

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrTooLarge reports a file over the bound.
var ErrTooLarge = errors.New("file too large")

// Read returns the contents of path if it holds at most limit bytes. The
// error from opening it is returned as it is (errors.Is(err,
// fs.ErrNotExist) works); one over the bound wraps ErrTooLarge.
func Read(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes: %w", path, limit, ErrTooLarge)
	}
	return b, nil
}
