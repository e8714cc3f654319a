package coord

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// taskRun drives one task's rounds in a single goroutine; check-ins read the
// open round under mu.
type taskRun struct {
	c        *Coordinator
	id       string
	cancel   context.CancelFunc
	exited   chan struct{} // closed when the runner goroutine is gone
	stopping bool          // set (under c.mu) by StopTask

	mu      sync.Mutex
	loading bool // true until the open round (if any) has been resumed
	round   *roundRun
	// answered is what the last round to close answered: its runner sent
	// a receipt for each of its reports stored at stream sequences up to
	// seq. Their stored notices, which can come after the close, are not
	// answered again (handleStored).
	answered struct{ round, seq uint64 }
	quota    *storeQuota // what devices stored for the open round (quota.go)
	// noShows are the devices sitting rounds out for holding a seat in
	// silence (noshow.go).
	noShows map[string]round.NoShow

	// Loaded once per run.
	spec   *pb.Task
	global *model.Model // current model
	// reading counts the reads under way of each device's report, each
	// read twice (intake.go), by the runner or an aggregation worker
	// (shard.go); purges of its messages wait in deferred until no read
	// is left (quota.go). Guarded by mu.
	reading  map[string]int
	deferred map[string][]func()
	// holds are the task's bytes held in the memory limit, by what they
	// are: "model", "state" (the optimizer's), "round" (the round's sum).
	holds map[string]func()
	// train lists the tensors that train (nil: all), ulayout the update's
	// layout: those tensors of the model, in order.
	train   []int
	ulayout model.Layout
	trained []round.Tensor // ulayout as the round engine checks updates against it
	// kept holds the values of a one-message report between its check and
	// its add (intake.go), reused from report to report; the runner's alone.
	kept    []float32
	rule    aggregator.Rule
	module  *wasm.Module // for server-side evaluation
	evalSet *data.Dataset
	dp      *dpRun                         // nil without differential privacy
	parts   map[string]store.Participation // per device, when DP limits participation
	robust  Robustness                     // resolved bounds on what one device can do
	// baseRecorded is the base model's evaluation once the audit log has
	// it, so that a retried store write does not record it again.
	baseRecorded map[string]float64
	// span is the open round's root span (tracing.go); the runner's alone.
	span trace.Span
	// async is an async task's state across its rounds (async.go); nil for
	// a task in synchronous rounds.
	async *asyncRun
}

// closeRun ends r's being the open round, remembering what it answered;
// t.mu is held.
func (t *taskRun) closeRun(r *roundRun) {
	if r == nil || t.round != r {
		return
	}
	t.round = nil
	t.answered.round, t.answered.seq = r.row.Round, r.answeredSeq
}

// wasAnswered reports whether the report stored at seq for round was
// answered by that round's runner before it closed.
func (t *taskRun) wasAnswered(round, seq uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.answered.round == round && seq <= t.answered.seq
}

func (t *taskRun) isOpen(round uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.async != nil {
		return t.loading || t.async.open(round)
	}
	return t.loading || (t.round != nil && t.round.row.Round == round)
}

// roundRun is the in-memory state of the open round.
type roundRun struct {
	row  *store.RoundRow
	plan *pb.RoundPlan // template; participant id filled per device
	// cohort is the round engine's selection and membership state.
	cohort *round.Cohort
	selEnd time.Time
	kick   chan struct{} // wakes the round loop after a check-in changed the cohort
	// answeredSeq is the highest stream sequence of a report the runner
	// has answered with a receipt; only the runner's goroutine sets it.
	answeredSeq uint64
	// step is the training step the round's commit would be: the task's
	// committed training rounds plus one.
	step   uint64
	secure *secureRun // secure aggregation state; nil for plaintext rounds
	shard  *shardRun  // sharded intake (shard.go); nil when the runner reads reports
	// keys are the enrolled keys of the cohort's devices, looked up when
	// they are selected (nil for devices not enrolled where that is allowed).
	keys map[string]ed25519.PublicKey
	// chunked holds a chunked masked or evaluation report while it is
	// checked (chunks.go); plaintext updates are never held (intake.go).
	chunked []byte
	// lost is set when the sum holds part of an update that could not be
	// read again (intake.go): the round can only be abandoned.
	lost string
	// tr holds the round's spans (tracing.go).
	tr roundTrace
	// waitedOut is set when the round waited out a timer for devices that
	// held seats and stayed silent: its report deadline, or a secure stage's
	// timeout. Those devices then sit rounds out (noshow.go).
	waitedOut bool
	// With adaptive clipping (clip.go): the bits of accepted plaintext
	// reports by device, or a secure sum's decoded count.
	clipBits    map[string]bool
	clipCount   float64
	clipCounted bool
	// extraMetrics are the round's own measures that its commit adds to
	// the reports' (an async buffer's staleness).
	extraMetrics map[string]float64
}

func (r *roundRun) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (t *taskRun) log() *slog.Logger { return t.c.d.Log.With("task", t.id) }

func (t *taskRun) clock() clock.Clock { return t.c.d.Clock }

func (t *taskRun) run(ctx context.Context) {
	t.mu.Lock()
	t.loading = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.loading = false
		t.closeRun(t.round)
		t.mu.Unlock()
		for k := range t.holds {
			t.hold(k, 0)
		}
	}()
	if err := t.load(ctx); err != nil {
		if ctx.Err() == nil {
			t.fail(err)
		}
		return
	}
	retry := backoff.New(time.Second, 30*time.Second, nil)
	for ctx.Err() == nil {
		done, err := t.step(ctx)
		if done || ctx.Err() != nil {
			return
		}
		if err != nil {
			// Transient trouble (NATS reconnecting, blob store busy): retry the step.
			wait := retry.Next()
			t.log().Warn("round step failed; retrying", "err", err, "in", wait)
			if !clock.Sleep(t.clock(), wait, ctx.Done()) {
				return
			}
			continue
		}
		retry.Reset()
	}
}

func (t *taskRun) fail(err error) {
	t.log().Error("task failed", "err", err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.c.d.Store.SetTaskState(ctx, t.id, pb.TaskState_TASK_STATE_FAILED, err.Error(), t.c.now()); err != nil {
		t.log().Error("recording the task's failure", "err", err)
		return
	}
	t.recordStopped(ctx, audit.TaskFailed, err.Error())
}

// recordStopped records the end of the task with the rounds it committed.
func (t *taskRun) recordStopped(ctx context.Context, state, reason string) {
	var rounds uint64
	if row, err := t.c.d.Store.Task(ctx, t.id); err == nil {
		rounds = uint64(row.TrainRounds)
	}
	t.c.record(audit.TaskStopped{Task: t.id, State: state, Reason: reason, Rounds: rounds})
}

// load reads the task, its current model, the aggregation rule and its state.
func (t *taskRun) load(ctx context.Context) error {
	row, err := t.c.d.Store.Task(ctx, t.id)
	if err != nil {
		return err
	}
	t.spec = row.Spec
	if t.global, err = t.loadModel(ctx, row.CurrentModel); err != nil {
		return err
	}
	t.holdModel()
	if t.robust, err = ResolveRobustness(t.spec, nil); err != nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	var sub *model.Model
	if t.train, sub, err = Trainable(t.spec, t.global); err != nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	t.setLayout(sub.Layout())
	if t.rule, err = NewRule(t.spec.GetAggregation(), t.ulayout.Size()); err != nil {
		return fmt.Errorf("task %s: aggregation: %w", t.id, err)
	}
	t.hold("state", 4*int64(t.ulayout.Size())*int64(t.rule.Kind().StateVectors()))
	if t.dp, err = newDPRun(t.spec, t.ulayout.Size()); err != nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	if err := t.loadNoise(ctx); err != nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	if err := t.loadClip(ctx); err != nil {
		return fmt.Errorf("task %s: %w", t.id, err)
	}
	if t.spec.GetAsync() != nil {
		if t.async, err = newAsyncRun(t.spec, uint64(row.TrainRounds)); err != nil {
			return fmt.Errorf("task %s: %w", t.id, err)
		}
	}
	if len(row.OptState) > 0 {
		if err := t.rule.UnmarshalBinary(row.OptState); err != nil {
			return fmt.Errorf("task %s: optimizer state: %w", t.id, err)
		}
	}
	if dir := t.spec.GetServerEvalDataset(); dir != "" {
		if t.evalSet, err = data.ReadDir(dir); err != nil {
			return fmt.Errorf("task %s: server evaluation dataset: %w", t.id, err)
		}
		code, err := t.c.d.Blobs.Get(ctx, t.spec.GetModule().GetSha256())
		if err != nil {
			return fmt.Errorf("task %s: module: %w", t.id, err)
		}
		if t.module, err = t.c.d.Sandbox.Load(ctx, code, t.spec.GetModule().GetSha256()); err != nil {
			return fmt.Errorf("task %s: module: %w", t.id, err)
		}
	}
	return nil
}

// NewRule builds a task's aggregation rule for a model of dim parameters,
// as task creation checks it and the runner uses it.
func NewRule(agg *pb.AggregationConfig, dim int) (aggregator.Rule, error) {
	var opts []aggregator.Option
	for _, o := range []struct {
		v float64
		f func(float64) aggregator.Option
	}{{agg.GetServerLearningRate(), aggregator.WithServerLR}, {agg.GetMomentum(), aggregator.WithMomentum},
		{agg.GetBeta1(), aggregator.WithBeta1}, {agg.GetBeta2(), aggregator.WithBeta2}, {agg.GetTau(), aggregator.WithTau},
		{agg.GetTrimFraction(), aggregator.WithTrimFraction}} {
		if o.v != 0 {
			opts = append(opts, o.f(o.v))
		}
	}
	kind := aggregator.Kind(agg.GetRule())
	if agg.GetRule() == pb.AggregationRule_AGGREGATION_RULE_UNSPECIFIED {
		kind = aggregator.FedAvg
	}
	return aggregator.NewRule(kind, dim, opts...)
}

func (t *taskRun) loadModel(ctx context.Context, version string) (*model.Model, error) {
	b, err := t.c.d.Blobs.Get(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("task %s: model %s: %w", t.id, version, err)
	}
	m, err := model.DecodeSafetensors(b)
	if err != nil {
		return nil, fmt.Errorf("task %s: model %s: %w", t.id, version, err)
	}
	m.Lineage.Version = version
	return m, nil
}

// step runs (or resumes) one round to its end. done means the task is finished.
func (t *taskRun) step(ctx context.Context) (done bool, err error) {
	row, err := t.c.d.Store.Task(ctx, t.id)
	if err != nil {
		return false, err
	}
	if row.State != pb.TaskState_TASK_STATE_RUNNING {
		return true, nil
	}
	var rr *store.RoundRow
	if row.CurrentRound > 0 {
		last, err := t.c.d.Store.Round(ctx, t.id, row.CurrentRound)
		if err != nil {
			return false, err
		}
		if last.State == pb.RoundState_ROUND_STATE_OPEN {
			rr = last
		} else if last.State == pb.RoundState_ROUND_STATE_COMMITTED && last.Kind == pb.RoundKind_ROUND_KIND_TRAIN &&
			row.TrainRounds >= t.spec.GetRoundsTotal() && !t.wantsEval(row.TrainRounds) {
			return true, t.finish(ctx)
		}
	}
	if rr == nil {
		if row.ShortRounds >= ShortRoundsToPause {
			if err := t.pause(ctx, row); err != nil {
				return false, err // retried: no round opens until the pause is stored
			}
			return true, nil
		}
		if row.TrainRounds >= t.spec.GetRoundsTotal() && !t.evalPending(ctx, row) {
			return true, t.finish(ctx)
		}
		if row.CurrentRound == 0 && t.evalSet != nil && row.BaseMetrics == nil {
			if err := t.evaluateBase(ctx); errors.Is(err, audit.ErrInvalidEvent) {
				t.fail(err) // never recordable: retrying would only stall the task
				return true, nil
			} else if err != nil {
				return false, err // retried: round 1 opens once the base model's measure is kept
			}
		}
		kind := pb.RoundKind_ROUND_KIND_TRAIN
		if t.evalPending(ctx, row) {
			kind = pb.RoundKind_ROUND_KIND_EVALUATE
		}
		if kind == pb.RoundKind_ROUND_KIND_TRAIN {
			if done, err := t.checkBudget(ctx, row.TrainRounds, row.CurrentRound+1); done || err != nil {
				return done, err
			}
		}
		ctx = t.startRound(ctx, row.CurrentRound+1, kind, false)
		if rr, err = t.open(ctx, row.CurrentRound+1, kind); err != nil {
			t.endRound(err)
			return false, err
		}
		if t.async != nil {
			t.mu.Lock()
			t.async.opened = rr.Round
			t.mu.Unlock()
		}
	} else {
		ctx = t.startRound(ctx, rr.Round, rr.Kind, true)
	}
	err = t.runRound(ctx, rr)
	t.endRound(err)
	return false, err
}

func (t *taskRun) wantsEval(trainRounds uint32) bool {
	n := t.spec.GetEvalEvery()
	return n > 0 && trainRounds > 0 && trainRounds%n == 0
}

// evalPending: the last round committed training that completes an
// evaluation period, so a federated evaluation round comes next.
func (t *taskRun) evalPending(ctx context.Context, row *store.TaskRow) bool {
	if !t.wantsEval(row.TrainRounds) || row.CurrentRound == 0 {
		return false
	}
	last, err := t.c.d.Store.Round(ctx, t.id, row.CurrentRound)
	return err == nil && last.Kind == pb.RoundKind_ROUND_KIND_TRAIN && last.State == pb.RoundState_ROUND_STATE_COMMITTED
}

func (t *taskRun) finish(ctx context.Context) error {
	t.log().Info("task completed")
	const reason = "all rounds committed"
	if err := t.c.d.Store.SetTaskState(ctx, t.id, pb.TaskState_TASK_STATE_COMPLETED, reason, t.c.now()); err != nil {
		return err
	}
	t.recordStopped(ctx, audit.TaskCompleted, reason)
	if t.async != nil {
		// Reports that came after the last buffer filled wait for none.
		t.c.purgeTask(t.id)
	}
	return nil
}

// hold sets the bytes the task holds under key to n (0 releases them).
func (t *taskRun) hold(key string, n int64) {
	if release := t.holds[key]; release != nil {
		release()
		delete(t.holds, key)
	}
	if n <= 0 || t.c.d.Memory == nil {
		return
	}
	if t.holds == nil {
		t.holds = map[string]func(){}
	}
	t.holds[key] = t.c.d.Memory.Hold(n)
}

// holdModel holds the current model's float32 parameters.
func (t *taskRun) holdModel() { t.hold("model", 4*int64(t.global.Layout().Size())) }

// setLayout sets the update's layout, and the round engine's view of it.
func (t *taskRun) setLayout(l model.Layout) {
	t.ulayout = l
	t.trained = make([]round.Tensor, len(l.Entries))
	for i, e := range l.Entries {
		shape := make([]uint64, len(e.Shape))
		for j, d := range e.Shape {
			shape[j] = uint64(d)
		}
		t.trained[i] = round.Tensor{Name: e.Name, Shape: shape}
	}
}
