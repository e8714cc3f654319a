package worker

import "errors"

// Sentinel errors; the agent's and a rank's errors wrap one of them, a
// package error they pass on, or a context error.
var (
	// ErrConfig reports a Config the agent cannot run with.
	ErrConfig = errors.New("worker: invalid config")
	// ErrLease reports a lease, or a lease file, that cannot be run: a
	// spec the worker does not support, a dataset it does not hold, a
	// topology that does not add up.
	ErrLease = errors.New("worker: unusable lease")
	// ErrData reports a dataset that does not match the spec's digest or
	// slice.
	ErrData = errors.New("worker: data does not match the job")
	// ErrRankStopped reports a rank that stopped because it was asked to:
	// by the server in a commit's answer, or by the agent (SIGUSR1 at a
	// checkpoint, SIGTERM at once). The process should exit with
	// RankExitStopped.
	ErrRankStopped = errors.New("worker: rank stopped as asked")
	// ErrRefused reports the server refusing the worker: its token, or
	// its registration.
	ErrRefused = errors.New("worker: refused by the server")
)
