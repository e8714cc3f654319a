//go:build unix

package filelock

import (
	"errors"
	"os"
	"syscall"
)

// Lock creates path if needed and locks it without waiting; it fails with
// ErrLocked when another process holds the lock. Closing the file releases
// it.
func Lock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, err
	}
	return f, nil
}
