package pool

import (
	"fmt"
	"time"
)

// State is where a job is in its life. It maps one-to-one onto the audit
// log's pool job states (see AuditState); finer phases (held for budget,
// waiting for a reservation, stopping at a checkpoint) live in Job.Reason.
type State uint8

const (
	Queued State = iota
	Running
	Succeeded
	Failed
	Cancelled
)

var stateNames = [...]string{"queued", "running", "succeeded", "failed", "cancelled"}

// auditStates are the audit log's state strings, in State order.
var auditStates = [...]string{"submitted", "running", "succeeded", "failed", "cancelled"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// AuditState is the state's name in audit.PoolJob.State.
func (s State) AuditState() string {
	if int(s) < len(auditStates) {
		return auditStates[s]
	}
	return ""
}

// Terminal reports whether no transition leaves s.
func (s State) Terminal() bool { return s == Succeeded || s == Failed || s == Cancelled }

// Transition checks one step of the state machine:
//
//	queued  → running | failed (deadline) | cancelled
//	running → queued (preempted, worker lost, crashed) | succeeded | failed | cancelled
//
// Terminal states are final, and a state never moves to itself: every
// change the server records is a real change.
func Transition(from, to State) error {
	ok := false
	switch from {
	case Queued:
		ok = to == Running || to == Failed || to == Cancelled
	case Running:
		ok = to == Queued || to == Succeeded || to == Failed || to == Cancelled
	}
	if !ok {
		return fmt.Errorf("pool: %s → %s: %w", from, to, ErrBadTransition)
	}
	return nil
}

// Assignment is a share of a gang on one worker: Ranks ranks there. A
// placement lists assignments in rank order, so the server numbers ranks
// by walking it.
type Assignment struct {
	Worker string
	Ranks  int
}

// Job is a snapshot of one job as the scheduler sees it.
type Job struct {
	Spec      Spec
	State     State
	Reason    string // why it is in State, or what it waits for
	Submitted time.Time
	Restarts  int   // restarts charged against Spec.MaxRestarts
	Committed int64 // last committed checkpoint step; a restart resumes here
	Step      int64 // latest step reported; Step-Committed is work at risk
	Placement []Assignment
	// Stopping is set once the job has been asked to stop at its next
	// checkpoint (preemption or budget).
	Stopping bool
}

// SinceCheckpoint is the work a stop now would lose: steps since the last
// committed checkpoint.
func (j Job) SinceCheckpoint() int64 { return j.Step - j.Committed }

// nextBoundary is the first checkpoint step after committed.
func (j Job) nextBoundary() int64 {
	n := (j.Committed/j.Spec.CheckpointInterval + 1) * j.Spec.CheckpointInterval
	return min(n, j.Spec.TotalSteps)
}

func (j *Job) move(to State, reason string) error {
	if err := Transition(j.State, to); err != nil {
		return fmt.Errorf("pool: job %s: %w", j.Spec.ID, err)
	}
	j.State, j.Reason = to, reason
	if to != Running {
		j.Placement, j.Stopping = nil, false
	}
	return nil
}
