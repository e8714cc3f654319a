// Package testwait bounds a test's waits for hangs only. A fixed wall-clock
// bound such as a minute is a deadline that a loaded CI machine can miss
// while the code under test is merely slow; the test binary's own deadline
// (go test -timeout) is the only wall-clock limit that means "hung". A wait
// bounded by Limit fails with its own message shortly before that deadline,
// so the report names what it waited for instead of a goroutine dump.
package testwait

import (
	"testing"
	"time"
)

// NoDeadline is the bound when the test binary runs without a timeout
// (go test -timeout 0).
const NoDeadline = 30 * time.Minute

// margin is left before the binary's deadline for the failure to be
// reported and the test's cleanups to run.
const margin = 20 * time.Second

// Limit is how long a wait may last before it counts as a hang: until
// shortly before the test binary's deadline.
func Limit(t testing.TB) time.Duration {
	d, ok := deadline(t)
	if !ok {
		return NoDeadline
	}
	left := time.Until(d) - margin
	if left < time.Second {
		left = time.Second
	}
	return left
}

// After is a channel that fires when Limit has passed.
func After(t testing.TB) <-chan time.Time { return time.After(Limit(t)) }

func deadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}
