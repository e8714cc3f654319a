// Package keyfile reads and writes secret key files: written whole through
// package atomicfile, so a crash never leaves half a key, and refused on
// load when group or others may read them.
package keyfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
)

// ErrMode reports a secret file whose permissions let group or others in.
// It is identity.ErrKeyFileMode; the error wrapping it names the file.
var ErrMode = errors.New("key file permissions too open")

// MaxSize bounds what Read accepts; every key file here is far smaller.
const MaxSize = 64 << 10

// Read returns the contents of a secret file, or an error wrapping
// fs.ErrNotExist when there is none. Every error names path once.
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: %w: mode %04o, want 0600", path, ErrMode, st.Mode().Perm())
	}
	if st.Size() > MaxSize {
		return nil, fmt.Errorf("%s: %d bytes is too large for a key file", path, st.Size())
	}
	b := make([]byte, st.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, err
	}
	return b, nil
}

// Create writes b to path with the given mode unless path already exists,
// in which case it returns an error wrapping fs.ErrExist. The parent
// directory is created with mode 0700. Two processes creating the same key
// at once cannot overwrite each other's: one wins, the other loads the
// winner's key.
func Create(path string, b []byte, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteNew(path, b, mode)
}

// Replace writes b to path with the given mode, replacing any file there
// atomically. The parent directory is created with mode 0700.
func Replace(path string, b []byte, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, mode)
}
