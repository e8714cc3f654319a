package round

import (
	"time"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
)

// The device's side of the protocol: what an agent does with each check-in
// answer and each attempt at a plan. Devices owns the decisions; the agent
// (internal/devproto) checks in, runs the work, publishes and sleeps.

// Waits a device keeps to, whatever the server says.
const (
	// MinRetryAfter and MaxRetryAfter bound the wait a server's answer asks
	// for: a hostile or broken server cannot make a device spin or sleep
	// for ever.
	MinRetryAfter = 50 * time.Millisecond
	MaxRetryAfter = 10 * time.Minute
	// MaxIdleWait bounds how long a device done with a round waits for the
	// next round's announcement before checking in anyway.
	MaxIdleWait = 30 * time.Second
	// DefaultMaxAttempts is how many times a device tries a plan before it
	// gives up on the round.
	DefaultMaxAttempts = 4
	// MaxDeviceTasks bounds the tasks a device remembers rounds of; beyond
	// it the memory starts afresh (a plan for a forgotten round is just
	// tried again).
	MaxDeviceTasks = 64
)

const (
	attemptBackoff, attemptBackoffMax = time.Second, 30 * time.Second
	repeatBackoff, repeatBackoffMax   = 250 * time.Millisecond, 30 * time.Second
)

// RetryWait is how long a device waits when the server says to retry after
// d: d, within [MinRetryAfter, MaxRetryAfter].
func RetryWait(d time.Duration) time.Duration { return min(max(d, MinRetryAfter), MaxRetryAfter) }

// Plan is what a device's state machine needs of a plan.
type Plan struct {
	Task     string
	Round    uint64
	Deadline time.Time // the report deadline
}

// Result is how an attempt at a plan ended.
type Result int

// The results.
const (
	Done       Result = iota // the work finished: its report is stored (or it had none to send)
	Superseded               // a later round of the task was announced: this one closed
	Left                     // the work left the round on purpose (it declined to report)
	Stopped                  // the agent is stopping
	Failed                   // a failure worth retrying before the deadline
	Fatal                    // a failure retrying cannot mend (Permanent)
)

// Step is what a device does next.
type Step struct {
	// Work: carry out the plan now, as attempt number Attempt (from 1);
	// report how it went with Devices.Attempted.
	Work    bool
	Attempt int
	// Wait: otherwise, check in again after Wait.
	Wait time.Duration
	// GiveUp: the device gives up on the round after Attempt attempts and
	// tells the server why, once.
	GiveUp bool
}

// Devices is one device's memory of the latest round of each task it was
// handed a plan for. It has no lock: the caller serializes its use.
type Devices struct {
	maxAttempts int
	jitter      func(time.Duration) time.Duration
	tasks       map[string]*taskMemory
}

type taskMemory struct {
	round    uint64
	reported bool // a report was stored
	done     bool // no further attempts this round
	attempts int
	retry    *backoff.Backoff // between failed attempts
	again    *backoff.Backoff // between plans of a round already done
}

// NewDevices returns a device's protocol memory: maxAttempts tries per
// round (0: DefaultMaxAttempts), jitter(d) a random wait in [0, d) that
// spreads a fleet's retries.
func NewDevices(maxAttempts int, jitter func(time.Duration) time.Duration) *Devices {
	if maxAttempts <= 0 {
		maxAttempts = DefaultMaxAttempts
	}
	return &Devices{maxAttempts: maxAttempts, jitter: jitter, tasks: map[string]*taskMemory{}}
}

// memory returns the task's memory for p's round, fresh for a new round;
// stale says the plan is for a round older than one already seen.
func (d *Devices) memory(p Plan) (m *taskMemory, stale bool) {
	m = d.tasks[p.Task]
	if m != nil && p.Round < m.round {
		return m, true
	}
	if m == nil || p.Round > m.round {
		if m == nil && len(d.tasks) >= MaxDeviceTasks {
			clear(d.tasks)
		}
		m = &taskMemory{round: p.Round, retry: backoff.New(attemptBackoff, attemptBackoffMax, d.jitter),
			again: backoff.New(repeatBackoff, repeatBackoffMax, d.jitter)}
		d.tasks[p.Task] = m
	}
	return m, false
}

// Planned decides what a device handed plan p at now does. A plan for a
// round older than one seen, or for one whose report is stored, is served
// already: reporting and the server counting the report are not atomic, so
// a device checking in right after publishing may get the same plan again
// (and again, if its report was refused); it backs off. A round the device
// is done with is waited out. Otherwise it works.
func (d *Devices) Planned(p Plan, now time.Time) Step {
	m, stale := d.memory(p)
	switch {
	case stale || m.reported:
		return Step{Wait: m.again.Next()}
	case m.done:
		return Step{Wait: d.idle(p, now)}
	}
	m.attempts++
	return Step{Work: true, Attempt: m.attempts}
}

// Reported records that the report for task's round was stored.
func (d *Devices) Reported(task string, round uint64) {
	if m := d.tasks[task]; m != nil && m.round == round {
		m.reported = true
	}
}

// Attempted decides what follows an attempt at p that ended at now with o.
// A failed attempt is retried after a growing back-off while attempts are
// left and the retry comes before the deadline; otherwise the device gives
// up on the round, once.
func (d *Devices) Attempted(p Plan, now time.Time, o Result) Step {
	m, stale := d.memory(p)
	if stale {
		return Step{Wait: m.again.Next()}
	}
	switch o {
	case Done, Left:
		m.done = true
		return Step{Wait: d.idle(p, now)}
	case Stopped, Superseded:
		// Check in again at once: the next round wants devices.
		return Step{}
	}
	retry := m.retry.Next()
	if o == Failed && m.attempts < d.maxAttempts && now.Add(retry).Before(p.Deadline) {
		return Step{Wait: retry, Attempt: m.attempts}
	}
	m.done = true
	return Step{Wait: d.idle(p, now), Attempt: m.attempts, GiveUp: true}
}

// idle is how long a device done with a round waits for the next round's
// announcement before checking in anyway.
func (d *Devices) idle(p Plan, now time.Time) time.Duration {
	left := p.Deadline.Sub(now)
	return min(max(left, time.Second), MaxIdleWait) + d.jitter(time.Second)
}
