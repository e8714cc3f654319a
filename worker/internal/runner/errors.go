package runner

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors. Every error from Run, Start and Wait wraps exactly one of
// them, as does every error from LatestCheckpoint except a failure to read
// the directory itself, which is passed through wrapped; so the agent can decide with errors.Is whether a
// rank failed on its own (retry from the last checkpoint), was stopped by us,
// or could never have run (do not retry).
var (
	// ErrInvalidSpec reports a Spec that cannot be run: no command, relative
	// or missing directories, or an impossible rank topology.
	ErrInvalidSpec = errors.New("invalid run spec")
	// ErrInvalidEnv reports job-declared environment that is malformed, too
	// large, or tries to set a variable the runner owns.
	ErrInvalidEnv = errors.New("invalid job environment")
	// ErrStart reports a command that could not be started (not found, not
	// executable).
	ErrStart = errors.New("command did not start")
	// ErrExit reports a command that exited with a non-zero status.
	ErrExit = errors.New("command exited with non-zero status")
	// ErrSignaled reports a command killed by a signal the runner did not
	// send (OOM killer, a segfault, an operator's kill -9).
	ErrSignaled = errors.New("command killed by signal")
	// ErrStopped reports a command the runner stopped, because its context
	// was cancelled or Stop or Kill was called; it is not the job's fault.
	ErrStopped = errors.New("command stopped by runner")
)

// ExitError describes how a command ended when it did not exit cleanly. It
// matches ErrExit, ErrSignaled or ErrStopped under errors.Is.
type ExitError struct {
	Code    int            // exit status, -1 when killed by a signal
	Signal  syscall.Signal // the killing signal, 0 when it exited
	Stopped bool           // the runner stopped it
}

func (e *ExitError) Error() string {
	switch {
	case e.Stopped && e.Signal != 0:
		return fmt.Sprintf("stopped by runner (%v)", e.Signal)
	case e.Stopped:
		return fmt.Sprintf("stopped by runner (exit status %d)", e.Code)
	case e.Signal != 0:
		return fmt.Sprintf("killed by signal %v", e.Signal)
	default:
		return fmt.Sprintf("exit status %d", e.Code)
	}
}

// Is lets a single ExitError answer to the sentinel that fits it.
func (e *ExitError) Is(target error) bool {
	switch target {
	case ErrStopped:
		return e.Stopped
	case ErrSignaled:
		return !e.Stopped && e.Signal != 0
	case ErrExit:
		return !e.Stopped && e.Signal == 0
	}
	return false
}
