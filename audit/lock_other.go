//go:build !unix

package audit

import "os"

// lockDir only creates the lock file where advisory locks are unavailable.
func lockDir(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
