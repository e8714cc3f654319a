package coord

import (
	"context"
	"errors"
	"fmt"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// refusal is a refused report (ErrReport) with its class, one of
// metrics.RefusalReasons: the label it is counted under, never anything the
// device sent.
type refusal struct {
	reason string
	err    error
}

func (e *refusal) Error() string { return e.err.Error() }
func (e *refusal) Unwrap() error { return e.err }

// Classes used where a local variable named metrics hides the package.
const (
	refusedDecode    = metrics.RefusedDecode
	refusedAggregate = metrics.RefusedAggregate
	refusedSecAgg    = metrics.RefusedSecAgg
)

// refuseAs is refuse with the refusal's class.
func refuseAs(reason, format string, args ...any) error {
	return &refusal{reason: reason, err: refuse(format, args...)}
}

// classify gives *err the class reason unless it has one: deferred by a
// check whose refusals are all of one class, so that the innermost check
// names the class.
func classify(err *error, reason string) {
	var r *refusal
	if *err != nil && !errors.As(*err, &r) {
		*err = &refusal{reason: reason, err: *err}
	}
}

// refusalReason is the class err was refused for.
func refusalReason(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.reason
	}
	return metrics.RefusedOther
}

// observeStage records how long the secure round's current stage has been
// open and starts the next one's clock.
func (t *taskRun) observeStage(sec *secureRun, stage fmt.Stringer) {
	now := t.c.now()
	t.c.d.Metrics.SecAggStage.WithLabelValues(stage.String()).Observe(now.Sub(sec.stageStart).Seconds())
	sec.stageStart = now
}

// fleetCounts is the scrape-time source of fleetlearn_devices: online
// devices are those Fleet counts as seen.
func (c *Coordinator) fleetCounts(ctx context.Context) (metrics.FleetCounts, error) {
	enrolled, seen, revoked, err := c.d.Store.DeviceStates(ctx, c.now().Add(-SeenWindow), c.d.RequireEnrollment)
	if err != nil {
		return metrics.FleetCounts{}, fmt.Errorf("coord: device metrics: %w", err)
	}
	return metrics.FleetCounts{Enrolled: enrolled, Online: seen, Revoked: revoked}, nil
}

// taskCounts is the scrape-time source of the task series: every state's
// count, and the progress of running tasks, then paused ones, at most
// metrics.MaxTaskSeries of them (by id), so that finished tasks, which
// accumulate, export no series.
func (c *Coordinator) taskCounts(ctx context.Context) (metrics.TaskCounts, error) {
	byState, err := c.d.Store.TaskStates(ctx)
	if err != nil {
		return metrics.TaskCounts{}, fmt.Errorf("coord: task metrics: %w", err)
	}
	out := metrics.TaskCounts{ByState: map[string]int{}}
	for st, n := range byState {
		out.ByState[store.StateName(st)] = n
	}
	for _, st := range []pb.TaskState{pb.TaskState_TASK_STATE_RUNNING, pb.TaskState_TASK_STATE_PAUSED} {
		left := metrics.MaxTaskSeries - len(out.Progress)
		if left <= 0 {
			break
		}
		rows, err := c.d.Store.Tasks(ctx, st, "", left)
		if err != nil {
			return metrics.TaskCounts{}, fmt.Errorf("coord: task metrics: %w", err)
		}
		for _, r := range rows {
			out.Progress = append(out.Progress, metrics.TaskProgress{ID: r.Spec.GetId(), Round: r.CurrentRound,
				TrainRounds: r.TrainRounds, RoundsTarget: r.Spec.GetRoundsTotal(), EpsilonBudget: r.Spec.GetDp().GetTargetEpsilon()})
		}
	}
	return out, nil
}
