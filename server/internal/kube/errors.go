package kube

import "errors"

var (
	// ErrInvalidConfig reports an executor Config that cannot render jobs.
	ErrInvalidConfig = errors.New("invalid kubernetes executor config")
	// ErrInvalidJob reports a pool job that cannot be rendered as a JobSet.
	ErrInvalidJob = errors.New("pool job cannot run on kubernetes")
	// ErrUnsupportedProgram reports a job whose program only a
	// fleetlearn-worker agent can run.
	ErrUnsupportedProgram = errors.New("program not supported by the kubernetes executor")
	// ErrNotJobSet reports an object that is not a JobSet.
	ErrNotJobSet = errors.New("not a JobSet")
)
