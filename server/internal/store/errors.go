package store

import "errors"

var (
	// ErrRoundClosed reports a close of a round that is not open.
	ErrRoundClosed = errors.New("round is not open")
	// ErrFenced reports a write by a leader whose lease another has taken
	// since (its epoch is not the lease's): the write did not happen, and
	// this process must stop acting as leader.
	ErrFenced = errors.New("fenced: another aggregator leads now")
)
