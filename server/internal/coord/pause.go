package coord

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// A task whose fleet cannot fill its rounds would otherwise open and
// abandon them forever. Task creation warns when the fleet is too small
// (CohortWarnings), and the runner pauses a task after ShortRoundsToPause
// rounds in a row were abandoned for want of devices, until an operator
// resumes it. Rounds abandoned for anything else (refused aggregates, too
// few reports from a full cohort) do not count, and break the run.

// ShortRoundsToPause is how many rounds in a row a task may lose for want
// of devices before the coordinator pauses it.
const ShortRoundsToPause = 3

// SeenWindow is how recently a device must have checked in to count as
// online in Fleet.
const SeenWindow = 10 * time.Minute

// Fleet is what the coordinator knows of the devices that could take a
// seat in a round.
type Fleet struct {
	// Registry is set when only enrolled devices are selected.
	Registry bool
	// Enrolled counts enrolled devices that are not revoked.
	Enrolled int
	// Seen counts the devices (enrolled ones, with Registry) not revoked
	// that checked in within SeenWindow of the coordinator's clock.
	Seen int
}

// Fleet counts the devices that could take a seat in a round now.
func (c *Coordinator) Fleet(ctx context.Context) (Fleet, error) {
	enrolled, seen, err := c.d.Store.FleetSize(ctx, c.now().Add(-SeenWindow), c.d.RequireEnrollment)
	if err != nil {
		return Fleet{}, fmt.Errorf("coord: fleet: %w", err)
	}
	return Fleet{Registry: c.d.RequireEnrollment, Enrolled: enrolled, Seen: seen}, nil
}

// Wanted is the number of devices a round of t selects: its cohort target
// plus over-selection.
func Wanted(t *pb.Task) int {
	return int(math.Ceil(float64(t.GetCohortTarget()) * (1 + t.GetOverSelection())))
}

// available is how many devices can take a seat: those seen recently (of
// the enrolled ones, with a registry).
func (f Fleet) available() int {
	if f.Registry {
		return min(f.Enrolled, f.Seen)
	}
	return f.Seen
}

// String says what the fleet is, in words: "3 devices are enrolled".
func (f Fleet) String() string {
	seen := fmt.Sprintf("%s checked in within the last %v", devices(f.Seen), SeenWindow)
	if !f.Registry {
		return seen
	}
	s := devices(f.Enrolled) + " " + plural(f.Enrolled, "is", "are") + " enrolled"
	if f.Seen < f.Enrolled {
		s += fmt.Sprintf(", %d of them checked in within the last %v", f.Seen, SeenWindow)
	}
	return s
}

// selects describes a task's cohort: "the task selects 26 per round
// (cohort 20 + 30% over-selection)".
func selects(t *pb.Task) string {
	s := fmt.Sprintf("the task selects %d per round", Wanted(t))
	if o := t.GetOverSelection(); o > 0 {
		s += fmt.Sprintf(" (cohort %d + %.4g%% over-selection)", t.GetCohortTarget(), o*100)
	}
	return s
}

// CohortWarnings says, for operators, what a task's rounds will run into
// with the fleet as it is: abandoned rounds when fewer devices can take a
// seat than its report goal, and rounds that wait out their selection
// timeout when fewer than it selects. None when the fleet is large enough.
func CohortWarnings(t *pb.Task, f Fleet) []string {
	n := f.available()
	goal := int(t.GetReportGoal())
	switch {
	case n < goal:
		more := "more devices check in"
		if f.Registry && f.Enrolled < goal {
			more = "more devices enroll"
		} else if f.Registry {
			more = "more of them check in"
		}
		return []string{fmt.Sprintf("%s; %s and needs %d reports: rounds will be abandoned until %s "+
			"(after %d such rounds in a row the task pauses)", f, selects(t), goal, more, ShortRoundsToPause)}
	case n < int(t.GetCohortTarget()):
		// Over-selection only adds spare seats: a round with the cohort
		// target closes selection at once; one below it waits.
		timeout := t.GetSelectionTimeout().AsDuration()
		if timeout <= 0 {
			timeout = DefaultSelectionTimeout
		}
		return []string{fmt.Sprintf("%s; %s: each round waits out its %v selection timeout and runs with at most %s",
			f, selects(t), timeout, devices(n))}
	}
	return nil
}

// pauseReason is why a task paused, for Task.state_reason.
func pauseReason(t *pb.Task, short uint32, last string, f Fleet) string {
	return fmt.Sprintf("paused after %d rounds in a row were abandoned for want of devices (%s); %s; %s and needs %d reports. "+
		"Resume the task (fleetlearn task resume %s) once more devices can take a seat",
		short, last, f, selects(t), t.GetReportGoal(), t.GetId())
}

// pause holds the task after too many short rounds: its state becomes
// PAUSED with the reason, recorded in the audit log and sent to watchers,
// and the runner stops. A task stopped meanwhile stays stopped.
func (t *taskRun) pause(ctx context.Context, row *store.TaskRow) error {
	last := "no round"
	if r, err := t.c.d.Store.Round(ctx, t.id, row.CurrentRound); err == nil {
		last = fmt.Sprintf("round %d: %s", r.Round, r.Reason)
	}
	fleet, err := t.c.Fleet(ctx)
	if err != nil {
		return err
	}
	reason := pauseReason(t.spec, row.ShortRounds, last, fleet)
	if err := t.c.d.Store.PauseTask(ctx, t.id, reason, t.c.now()); err != nil {
		if errors.Is(err, backend.ErrPrecondition) {
			return nil
		}
		return err
	}
	t.log().Warn("task paused", "reason", reason)
	t.c.record(audit.TaskChanged{Task: t.id, Changes: []audit.Change{
		{Field: "state", Old: store.StateName(pb.TaskState_TASK_STATE_RUNNING), New: store.StateName(pb.TaskState_TASK_STATE_PAUSED)},
		{Field: "state_reason", Old: row.Reason, New: reason}}})
	if paused, err := t.c.d.Store.Task(ctx, t.id); err == nil {
		t.c.deliver(t.id, &pb.WatchTaskResponse{Task: paused.Proto()})
	}
	return nil
}

// ResumeTask starts the runner of a task the caller has marked running
// again in the store, once the runner that paused it, which may still be on
// its way out, is gone.
func (c *Coordinator) ResumeTask(ctx context.Context, id string) error {
	c.mu.Lock()
	old := c.tasks[id]
	c.mu.Unlock()
	if old != nil {
		select {
		case <-old.exited:
		case <-ctx.Done():
			return fmt.Errorf("coord: resume task %s: %w", id, ctx.Err())
		}
	}
	c.StartTask(id)
	return nil
}

func devices(n int) string { return fmt.Sprintf("%d %s", n, plural(n, "device", "devices")) }

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
