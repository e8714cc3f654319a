package pool

import "errors"

// Sentinel errors. Every error from this package wraps one of them, so the
// server can map failures to API status codes with errors.Is.
var (
	// ErrInvalidSpec reports a job spec that breaks a bound: a count, size,
	// name or time out of range. API clients are untrusted; nothing past
	// Validate sees an unchecked value.
	ErrInvalidSpec = errors.New("invalid job spec")
	// ErrInvalidConfig reports a scheduler or worker configuration out of
	// range.
	ErrInvalidConfig = errors.New("invalid pool config")
	// ErrBadTransition reports a state change the job state machine forbids.
	ErrBadTransition = errors.New("forbidden job state transition")
	// ErrUnknownJob reports a job id the scheduler does not hold.
	ErrUnknownJob = errors.New("unknown job")
	// ErrUnknownWorker reports a worker id the scheduler does not hold.
	ErrUnknownWorker = errors.New("unknown worker")
	// ErrUnknownTenant reports a tenant without a configured queue.
	ErrUnknownTenant = errors.New("unknown tenant")
	// ErrDuplicate reports a job or worker id already in use.
	ErrDuplicate = errors.New("duplicate id")
	// ErrNotBoundary reports a checkpoint at a step that is not a checkpoint
	// boundary of the job, or that goes backwards.
	ErrNotBoundary = errors.New("not a checkpoint boundary")
	// ErrBadReading reports a meter reading that is negative, non-finite or
	// undated, or a progress report outside the job's steps.
	ErrBadReading = errors.New("invalid meter reading")
)
