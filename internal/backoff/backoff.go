// Package backoff computes capped exponential waits with jitter, the one
// retry schedule the agent, the simulated fleet and the coordinator share.
package backoff

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Backoff doubles a wait from Initial up to Max. It is not safe for
// concurrent use; each retry loop owns one.
type Backoff struct {
	Initial, Max time.Duration
	// Jitter returns a uniform duration in [0, d); nil adds none.
	Jitter func(d time.Duration) time.Duration

	cur      time.Duration
	attempts int
}

// New returns a back-off from initial, doubling to max, with jitter.
func New(initial, max time.Duration, jitter func(time.Duration) time.Duration) *Backoff {
	return &Backoff{Initial: initial, Max: max, Jitter: jitter}
}

// Next is the wait before the next attempt: the current step plus jitter in
// [0, step). Each call doubles the step, up to Max.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Initial
	}
	d := b.cur
	b.cur = min(2*b.cur, b.Max)
	b.attempts++
	if b.Jitter != nil {
		d += b.Jitter(d)
	}
	return d
}

// Attempts counts the waits handed out since the last Reset.
func (b *Backoff) Attempts() int { return b.attempts }

// Reset starts over from Initial, after a success.
func (b *Backoff) Reset() { b.cur, b.attempts = 0, 0 }

// Jitter returns a jitter function for Backoff.Jitter drawing from r, safe
// for concurrent use: uniform in [0, d), 0 for d <= 0.
func Jitter(r *rand.Rand) func(time.Duration) time.Duration {
	var mu sync.Mutex
	return func(d time.Duration) time.Duration {
		if d <= 0 {
			return 0
		}
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(r.Int64N(int64(d)))
	}
}
