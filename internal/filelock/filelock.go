// Package filelock takes the exclusive advisory lock that keeps a second
// process off state one process owns (an audit log's folder, a witness's
// state). The kernel drops the lock when the process dies, so a crash
// leaves nothing to clean up.
package filelock

import "errors"

// ErrLocked reports a lock another process holds.
var ErrLocked = errors.New("locked by another process")
