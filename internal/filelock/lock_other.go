//go:build !unix

package filelock

import "os"

// Lock only creates the lock file where advisory locks are unavailable.
func Lock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
