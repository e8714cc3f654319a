package coord

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// Defaults for task fields left zero.
const (
	DefaultSelectionTimeout = 30 * time.Second
	DefaultReportTimeout    = 2 * time.Minute
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

	// Loaded once per run.
	spec    *pb.Task
	global  *model.Model // current model
	rule    aggregator.Rule
	module  *wasm.Module // for server-side evaluation
	evalSet *data.Dataset
	dp      *dpRun         // nil without differential privacy
	parts   map[string]int // committed rounds per device, when DP caps participation
}

func (t *taskRun) isOpen(round uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.loading || (t.round != nil && t.round.row.Round == round)
}

// roundRun is the in-memory state of the open round.
type roundRun struct {
	row       *store.RoundRow
	plan      *pb.RoundPlan // template; participant id filled per device
	wanted    int           // devices to select (target × over-selection)
	assigned  map[string]store.Assignment
	reported  map[string]bool
	selecting bool
	selEnd    time.Time
	kick      chan struct{} // wakes the round loop after a check-in changed the cohort
	secure    *secureRun    // secure aggregation state; nil for plaintext rounds
	// keys are the enrolled keys of the cohort's devices, looked up when
	// they are selected (nil for devices not enrolled where that is allowed).
	keys map[string]ed25519.PublicKey
	// capped are the devices turned away by the task's participation cap
	// while this round selected, named in the reason if it is abandoned.
	capped map[string]bool
	// decoded holds the report being checked: collectors copy what they
	// keep, so one buffer serves the round's reports (handled one at a time).
	decoded []float32
}

func (r *roundRun) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (t *taskRun) log() *slog.Logger { return t.c.d.Log.With("task", t.id) }

func (t *taskRun) run(ctx context.Context) {
	t.mu.Lock()
	t.loading = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.loading, t.round = false, nil
		t.mu.Unlock()
	}()
	if err := t.load(ctx); err != nil {
		if ctx.Err() == nil {
			t.fail(err)
		}
		return
	}
	backoff := time.Second
	for ctx.Err() == nil {
		done, err := t.step(ctx)
		if done || ctx.Err() != nil {
			return
		}
		if err != nil {
			// Transient trouble (NATS reconnecting, blob store busy): retry the step.
			t.log().Warn("round step failed; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
	}
}

func (t *taskRun) fail(err error) {
	t.log().Error("task failed", "err", err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.c.d.Store.SetTaskState(ctx, t.id, pb.TaskState_TASK_STATE_FAILED, err.Error(), t.c.d.Now()); err != nil {
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
	agg := t.spec.GetAggregation()
	var opts []aggregator.Option
	if agg.GetServerLearningRate() != 0 {
		opts = append(opts, aggregator.WithServerLR(agg.GetServerLearningRate()))
	}
	if agg.GetMomentum() != 0 {
		opts = append(opts, aggregator.WithMomentum(agg.GetMomentum()))
	}
	if agg.GetBeta1() != 0 {
		opts = append(opts, aggregator.WithBeta1(agg.GetBeta1()))
	}
	if agg.GetBeta2() != 0 {
		opts = append(opts, aggregator.WithBeta2(agg.GetBeta2()))
	}
	if agg.GetTau() != 0 {
		opts = append(opts, aggregator.WithTau(agg.GetTau()))
	}
	if agg.GetTrimFraction() != 0 {
		opts = append(opts, aggregator.WithTrimFraction(agg.GetTrimFraction()))
	}
	if t.rule, err = aggregator.NewRule(aggregator.Kind(agg.GetRule()), len(t.global.Flatten()), opts...); err != nil {
		return fmt.Errorf("task %s: aggregation: %w", t.id, err)
	}
	if cfg := ResolveDP(t.spec); cfg != nil {
		if t.dp, err = newDPRun(t.spec, cfg, t.global.Layout().Size()); err != nil {
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
		if row.TrainRounds >= t.spec.GetRoundsTotal() && !t.evalPending(ctx, row) {
			return true, t.finish(ctx)
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
		if rr, err = t.open(ctx, row.CurrentRound+1, kind); err != nil {
			return false, err
		}
	}
	return false, t.runRound(ctx, rr)
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
	if err := t.c.d.Store.SetTaskState(ctx, t.id, pb.TaskState_TASK_STATE_COMPLETED, reason, t.c.d.Now()); err != nil {
		return err
	}
	t.recordStopped(ctx, audit.TaskCompleted, reason)
	return nil
}

func (t *taskRun) selectionTimeout() time.Duration {
	if d := t.spec.GetSelectionTimeout().AsDuration(); d > 0 {
		return d
	}
	return DefaultSelectionTimeout
}

func (t *taskRun) reportTimeout() time.Duration {
	if d := t.spec.GetReportTimeout().AsDuration(); d > 0 {
		return d
	}
	return DefaultReportTimeout
}

func (t *taskRun) wanted() int {
	return int(math.Ceil(float64(t.spec.GetCohortTarget()) * (1 + t.spec.GetOverSelection())))
}

func (t *taskRun) open(ctx context.Context, round uint64, kind pb.RoundKind) (*store.RoundRow, error) {
	now := t.c.d.Now()
	rr := &store.RoundRow{TaskID: t.id, Round: round, Kind: kind, State: pb.RoundState_ROUND_STATE_OPEN,
		Seed: t.c.seed(), BaseModel: t.global.Lineage.Version, Open: now,
		Deadline: now.Add(t.selectionTimeout() + t.reportTimeout())}
	if t.secure(kind) {
		// Key advertisement and sharing before the masked input, consistency
		// and unmasking after it.
		rr.Deadline = rr.Deadline.Add(4 * secureStageTimeout(t.spec.GetSecagg()))
	}
	if err := t.c.d.Store.OpenRound(ctx, rr, now); err != nil {
		return nil, err
	}
	t.log().Info("round opened", "round", round, "kind", kind)
	ev := audit.RoundOpened{Task: t.id, Round: round, Model: rr.BaseModel, Module: t.spec.GetModule().GetSha256(),
		CohortSize: uint64(t.wanted()), Eligibility: eligibilityText(kind, t.spec.GetEligibility())}
	if t.secure(kind) {
		// The parameters every participant derives, as the plans carry them.
		if _, cfg, err := t.secureConfig(round, t.wanted(), rr.Seed); err == nil {
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(cfg)
			ev.SecAggSHA256 = wire.SHA256(b)
		}
	}
	t.c.record(ev)
	return rr, nil
}

// eligibilityText states the round's kind and who could join it, for the audit log.
func eligibilityText(kind pb.RoundKind, e *pb.Eligibility) string {
	parts := []string{"kind=" + strings.ToLower(strings.TrimPrefix(kind.String(), "ROUND_KIND_")),
		fmt.Sprintf("min_examples=%d", max(e.GetMinExamples(), 1)), fmt.Sprintf("abi=%d", wasm.ABIVersion)}
	for _, c := range []struct {
		on   bool
		name string
	}{{e.GetRequireCharging(), "charging"}, {e.GetRequireIdle(), "idle"}, {e.GetRequireUnmetered(), "unmetered"}} {
		if c.on {
			parts = append(parts, c.name)
		}
	}
	if cls := e.GetDeviceClasses(); len(cls) > 0 {
		parts = append(parts, "device_classes="+strings.Join(cls, "|"))
	}
	return strings.Join(parts, " ")
}

// normBound is the L2 norm bound the server holds plaintext updates to.
func (t *taskRun) normBound() float64 {
	if t.dp == nil {
		return t.spec.GetAggregation().GetMaxUpdateNorm()
	}
	switch t.dp.cfg.GetMechanism() {
	case pb.DPMechanism_DP_MECHANISM_LOCAL:
		return 0 // the devices' own noise makes updates longer than the clip norm
	default:
		// Devices clip to C; the slack covers their float32 rounding.
		return t.dp.cfg.GetClipNorm() * (1 + 1e-5)
	}
}

// weight is how much a report counts in the average: its example count, or
// 1 under DP, where the clip norm bounds every device's influence only if
// weights do not scale it.
func (t *taskRun) weight(examples uint64) float64 {
	if t.dp != nil {
		return 1
	}
	return float64(examples)
}

// secure reports whether rounds of kind run through secure aggregation:
// training rounds of a task with SecAgg settings. Evaluation rounds report
// plaintext metrics only.
func (t *taskRun) secure(kind pb.RoundKind) bool {
	return kind == pb.RoundKind_ROUND_KIND_TRAIN && t.spec.GetSecagg() != nil
}

func (t *taskRun) plan(rr *store.RoundRow) *pb.RoundPlan {
	m, err := t.c.d.Store.Model(context.Background(), rr.BaseModel)
	size := uint64(0)
	if err == nil {
		size = uint64(m.Size)
	}
	p := &pb.RoundPlan{
		TaskId: t.id, Round: rr.Round, Kind: rr.Kind,
		Model:           &pb.ModelRef{Sha256: rr.BaseModel, Version: rr.BaseModel, SizeBytes: size},
		Module:          t.spec.GetModule(),
		Hyperparameters: t.spec.GetHyperparameters(),
		Seed:            rr.Seed,
		ReportDeadline:  timestamppb.New(rr.Deadline),
		Limits:          t.spec.GetLimits(),
		Secagg:          t.spec.GetSecagg(),
		MaxUpdateNorm:   t.spec.GetAggregation().GetMaxUpdateNorm(),
	}
	if t.dp != nil && rr.Kind == pb.RoundKind_ROUND_KIND_TRAIN {
		// Devices clip to the DP bound; evaluation rounds release metrics only.
		p.Dp, p.MaxUpdateNorm = t.dp.cfg, t.dp.cfg.GetClipNorm()
	}
	return p
}

// runRound selects the cohort, consumes reports until a close condition, and
// commits or abandons. It returns nil once the round is closed in the store.
func (t *taskRun) runRound(ctx context.Context, row *store.RoundRow) error {
	if t.global.Lineage.Version != row.BaseModel {
		m, err := t.loadModel(ctx, row.BaseModel)
		if err != nil {
			return err
		}
		t.global = m
	}
	assigned, err := t.c.d.Store.Assignments(ctx, t.id, row.Round)
	if err != nil {
		return err
	}
	now := t.c.d.Now()
	keys := map[string]ed25519.PublicKey{}
	for d := range assigned {
		// A cohort resumed after a restart: its devices were vouched for
		// when selected; one revoked since is refused now.
		if k, _ := t.c.deviceKey(ctx, d); k != nil {
			keys[d] = k
		}
	}
	r := &roundRun{row: row, plan: t.plan(row), wanted: t.wanted(), assigned: assigned, reported: map[string]bool{}, capped: map[string]bool{},
		keys:   keys,
		selEnd: row.Open.Add(t.selectionTimeout()), kick: make(chan struct{}, 1)}
	r.selecting = len(assigned) < r.wanted && now.Before(r.selEnd)

	var col aggregator.Collector
	if row.Kind == pb.RoundKind_ROUND_KIND_TRAIN {
		if col, err = t.rule.NewCollector(t.normBound()); err != nil {
			return fmt.Errorf("round %d: %w", row.Round, err)
		}
	}
	if t.secure(row.Kind) {
		// Devices clip to the norm bound before masking; the server sees only
		// the sum, whose bound the quantization error could nudge past.
		if col, err = t.rule.NewCollector(0); err != nil {
			return fmt.Errorf("round %d: %w", row.Round, err)
		}
		if len(assigned) > 0 {
			return t.abandon(ctx, r, errSecureResume.Error())
		}
		if r.secure, err = t.newSecureRun(row.Round, row.Seed, r.wanted, t.global.Layout().Size()); err != nil {
			return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
		}
		r.plan.Secagg = r.secure.cfg
	}
	metrics := newMetricMean()

	// Reports: replay the round's subjects from the start of the stream, so a
	// restart sees every report it had before plus the new ones.
	msgs := make(chan jetstream.Msg, 256)
	cons, err := t.c.d.JS.OrderedConsumer(ctx, wire.StreamReports, jetstream.OrderedConsumerConfig{
		FilterSubjects: wire.RoundFilters(t.id, row.Round), DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("round %d: consumer: %w", row.Round, err)
	}
	// Bound what is in flight: reports are ~400 KB each, and the default
	// (500 messages) overruns the connection's pending limit at large cohorts.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxBytes(8<<20))
	if err != nil {
		return fmt.Errorf("round %d: consume: %w", row.Round, err)
	}
	defer cc.Stop()

	var parts map[string]int
	if t.dp.maxRounds() > 0 {
		if parts, err = t.c.d.Store.Participations(ctx, t.id); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.round, t.loading, t.parts = r, false, parts
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.round = nil
		t.mu.Unlock()
	}()
	t.c.d.Metrics.OpenRounds.Inc()
	defer t.c.d.Metrics.OpenRounds.Dec()
	t.c.emit(&pb.RoundEvent{TaskId: t.id, Round: row.Round, Type: pb.RoundEventType_ROUND_EVENT_TYPE_OPENED, Kind: row.Kind,
		Time: timestamppb.New(now), Assigned: uint32(len(assigned))})
	t.announce(r)
	if r.secure != nil {
		return t.runSecure(ctx, r, col, msgs)
	}

	target := int(t.spec.GetCohortTarget())
	selTimer := time.NewTimer(max(0, r.selEnd.Sub(now)))
	defer selTimer.Stop()
	deadline := time.NewTimer(max(0, row.Deadline.Sub(now)))
	defer deadline.Stop()
	reason := ""
	for reason == "" {
		select {
		case <-ctx.Done():
			return ctx.Err() // the round stays open, to be resumed
		case m := <-msgs:
			t.handleReport(r, col, metrics, m)
		case <-r.kick:
		case <-selTimer.C:
			t.mu.Lock()
			r.selecting = false
			n := len(r.assigned)
			t.mu.Unlock()
			if goal := int(t.spec.GetReportGoal()); n < goal {
				reason = fmt.Sprintf("selection closed with %d devices, below the report goal %d", n, goal)
				t.mu.Lock()
				if k := len(r.capped); k > 0 {
					reason += fmt.Sprintf("; %d devices checked in but had reached the task's cap of %d rounds each", k, t.dp.maxRounds())
				}
				t.mu.Unlock()
				return t.abandon(ctx, r, reason)
			}
		case <-deadline.C:
			reason = "report deadline passed"
			// Reports already delivered arrived in time; count them.
			for drained := false; !drained; {
				select {
				case m := <-msgs:
					t.handleReport(r, col, metrics, m)
				default:
					drained = true
				}
			}
		}
		t.mu.Lock()
		full := len(r.assigned) >= r.wanted
		if full {
			r.selecting = false
		}
		everyone := !r.selecting && len(r.reported) == len(r.assigned)
		t.mu.Unlock()
		switch {
		case reason != "":
		case len(r.reported) >= target && target > 0:
			reason = fmt.Sprintf("cohort target %d reached", target)
		case everyone && len(r.reported) > 0:
			reason = "every selected device reported"
		}
	}
	if n := len(r.reported); n < int(t.spec.GetReportGoal()) || n == 0 {
		return t.abandon(ctx, r, fmt.Sprintf("%s with %d reports, below the report goal %d", reason, n, t.spec.GetReportGoal()))
	}
	return t.commit(ctx, r, col, metrics, reason)
}

// announce wakes idle devices: a round wants members.
func (t *taskRun) announce(r *roundRun) {
	if !r.selecting {
		return
	}
	b, _ := proto.Marshal(&pb.RoundAnnouncement{TaskId: t.id, Round: r.row.Round, Kind: r.row.Kind,
		Wanted: uint32(r.wanted - len(r.assigned)), CheckInSpread: durationpb.New(t.c.d.PaceWindow)})
	t.c.d.NC.Publish(wire.SubjectAnnounce, b)
}

// handleReport validates one report and counts it, or refuses it with a receipt.
func (t *taskRun) handleReport(r *roundRun, col aggregator.Collector, mm *metricMean, m jetstream.Msg) {
	kind := "update"
	if wire.IsEvalSubject(m.Subject()) {
		kind = "evaluation"
	}
	t.settle(r, m, kind, func() (string, error) { return t.acceptReport(r, col, mm, m, kind) })
}

// settle counts a report's bytes, runs accept, and answers the device with a
// receipt: accepted, or refused with accept's reason.
func (t *taskRun) settle(r *roundRun, m jetstream.Msg, kind string, accept func() (string, error)) {
	t.c.d.Metrics.ReportBytes.Add(float64(len(m.Data())))
	device, err := accept()
	if err != nil {
		t.c.d.Metrics.Reports.WithLabelValues(kind, "refused").Inc()
		t.log().Info("report refused", "round", r.row.Round, "device", device, "err", err)
		t.c.receipt(t.id, r.row.Round, device, err.Error())
		return
	}
	t.c.d.Metrics.Reports.WithLabelValues(kind, "accepted").Inc()
	t.c.receipt(t.id, r.row.Round, device, "")
}

// ErrReport marks a refused report.
var ErrReport = errors.New("report refused")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrReport, fmt.Sprintf(format, args...))
}

// sender checks that a report's subject names this round and a device of
// its cohort that has not reported yet, and returns the device, its seat and
// its enrolled key (nil when not enrolled).
func (t *taskRun) sender(r *roundRun, subject string) (string, store.Assignment, ed25519.PublicKey, error) {
	task, round, device, err := wire.ParseReportSubject(subject)
	if err != nil {
		return "", store.Assignment{}, nil, refuse("%v", err)
	}
	if task != t.id || round != r.row.Round {
		return device, store.Assignment{}, nil, refuse("subject is for %s/%d, round is %s/%d", task, round, t.id, r.row.Round)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	seat, inCohort := r.assigned[device]
	switch {
	case !inCohort:
		return device, seat, nil, refuse("device %q is not in the cohort of round %d", device, round)
	case r.reported[device]:
		return device, seat, nil, refuse("device %q already reported for round %d", device, round)
	}
	return device, seat, r.keys[device], nil
}

func (t *taskRun) acceptReport(r *roundRun, col aggregator.Collector, mm *metricMean, m jetstream.Msg, kind string) (string, error) {
	device, seat, key, err := t.sender(r, m.Subject())
	if err != nil {
		return device, err
	}
	wantKind := map[pb.RoundKind]string{pb.RoundKind_ROUND_KIND_TRAIN: "update", pb.RoundKind_ROUND_KIND_EVALUATE: "evaluation"}[r.row.Kind]
	if kind != wantKind {
		return device, refuse("%s report in a round that wants %s reports", kind, wantKind)
	}
	var (
		examples uint64
		metrics  *pb.Metrics
	)
	checkMetrics := func(m *pb.Metrics) error {
		for k, v := range m.GetValues() {
			if math.IsNaN(v) || math.IsInf(v, 0) || len(k) > 64 || len(m.GetValues()) > 64 {
				return refuse("metric %q is %v (metrics must be finite, at most 64 with names up to 64 bytes)", k, v)
			}
		}
		return nil
	}
	if kind == "evaluation" {
		var rep pb.EvaluationReport
		if err := proto.Unmarshal(m.Data(), &rep); err != nil {
			return device, refuse("decode evaluation report: %v", err)
		}
		if err := t.checkHeader(r, device, rep.TaskId, rep.Round, rep.DeviceId, rep.ModelVersion, rep.ModuleSha256); err != nil {
			return device, err
		}
		if err := t.checkSignature(key, rep.Signature, rep.KeyId, identity.EvalStatement(&rep)); err != nil {
			return device, err
		}
		if err := checkMetrics(rep.Metrics); err != nil {
			return device, err
		}
		examples, metrics = rep.NumExamples, rep.Metrics
	} else {
		var rep pb.UpdateReport
		if err := proto.Unmarshal(m.Data(), &rep); err != nil {
			return device, refuse("decode update report: %v", err)
		}
		if err := t.checkHeader(r, device, rep.TaskId, rep.Round, rep.DeviceId, rep.ModelVersion, rep.ModuleSha256); err != nil {
			return device, err
		}
		if err := t.checkSignature(key, rep.Signature, rep.KeyId, identity.UpdateStatement(&rep)); err != nil {
			return device, err
		}
		delta, err := t.checkDense(r, &rep)
		if err != nil {
			return device, err
		}
		if err := checkMetrics(rep.Metrics); err != nil {
			return device, err
		}
		if rep.NumExamples == 0 || rep.NumExamples > seat.Examples {
			// The example count weights the update: a device may not claim
			// more than it said it had when it was selected.
			return device, refuse("num_examples %d not in [1, %d] (examples available at check-in)", rep.NumExamples, seat.Examples)
		}
		// Last: a refused report must not have touched the aggregate.
		if err := col.Add(delta, t.weight(rep.NumExamples)); err != nil {
			return device, refuse("%v", err)
		}
		examples, metrics = rep.NumExamples, rep.Metrics
	}
	if examples == 0 {
		return device, refuse("num_examples is 0")
	}
	mm.add(metrics.GetValues(), float64(examples))
	t.mu.Lock()
	r.reported[device] = true
	t.mu.Unlock()
	return device, nil
}

// checkSignature checks a report's device signature against the key the
// device enrolled. The statement covers task, round, device, model, module,
// payload digest and example count, so none can be altered in transit.
func (t *taskRun) checkSignature(key ed25519.PublicKey, sig []byte, keyID string, s identity.ReportStatement) error {
	if key == nil {
		if t.c.d.RequireEnrollment {
			return refuse("device %q is not enrolled", s.Device)
		}
		return nil // an open deployment: devices are not enrolled
	}
	if len(sig) == 0 {
		return refuse("report is not signed")
	}
	if err := identity.VerifyReport(key, s, sig); err != nil {
		return refuse("signature does not verify with the key device %q enrolled (report names key %q): %v", s.Device, keyID, err)
	}
	return nil
}

func (t *taskRun) checkHeader(r *roundRun, device, task string, round uint64, bodyDevice, modelVersion, module string) error {
	switch {
	case task != t.id || round != r.row.Round:
		return refuse("report body is for %s/%d, not %s/%d", task, round, t.id, r.row.Round)
	case bodyDevice != device:
		return refuse("report body names device %q, subject %q", bodyDevice, device)
	case modelVersion != r.row.BaseModel:
		return refuse("trained on model %q, round %d serves %q", modelVersion, r.row.Round, r.row.BaseModel)
	case module != t.spec.GetModule().GetSha256():
		return refuse("ran module %q, task uses %q", module, t.spec.GetModule().GetSha256())
	}
	return nil
}

// checkDense decodes a dense update and checks it against the model layout.
func (t *taskRun) checkDense(r *roundRun, rep *pb.UpdateReport) ([]float32, error) {
	d := rep.GetDense()
	if d == nil {
		return nil, refuse("update has no dense payload")
	}
	if got := wire.SHA256(d.Values); got != rep.PayloadSha256 {
		return nil, refuse("payload sha256 %s does not match the declared %q", got, rep.PayloadSha256)
	}
	layout := t.global.Layout()
	if len(d.Layout) != len(layout.Entries) {
		return nil, refuse("update has %d tensors, model has %d", len(d.Layout), len(layout.Entries))
	}
	for i, e := range layout.Entries {
		s := d.Layout[i]
		if s.Name != e.Name || len(s.Shape) != len(e.Shape) {
			return nil, refuse("tensor %d is %s%v, model has %s%v", i, s.Name, s.Shape, e.Name, e.Shape)
		}
		for j := range e.Shape {
			if s.Shape[j] != uint64(e.Shape[j]) {
				return nil, refuse("tensor %s has shape %v, model has %v", e.Name, s.Shape, e.Shape)
			}
		}
	}
	v, err := wire.DecodeDenseInto(r.decoded, d.Values, layout.Size())
	if err != nil {
		return nil, refuse("%v", err)
	}
	r.decoded = v
	return v, nil
}

func (t *taskRun) event(r *roundRun, typ pb.RoundEventType, metrics map[string]float64, reason string) *pb.RoundEvent {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := &pb.RoundEvent{TaskId: t.id, Round: r.row.Round, Type: typ, Kind: r.row.Kind, Time: timestamppb.New(t.c.d.Now()),
		Assigned: uint32(len(r.assigned)), Reported: uint32(len(r.reported)),
		Dropped: uint32(len(r.assigned) - len(r.reported)), Metrics: &pb.Metrics{Values: metrics}, Reason: reason}
	return ev
}

func (t *taskRun) closeRow(r *roundRun, state pb.RoundState, metrics map[string]float64, reason string) *store.RoundRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	row := *r.row
	row.State, row.Close, row.Metrics, row.Reason = state, t.c.d.Now(), metrics, reason
	row.Assigned, row.Reported = uint32(len(r.assigned)), uint32(len(r.reported))
	row.Dropped = row.Assigned - row.Reported
	return &row
}

func (t *taskRun) abandon(ctx context.Context, r *roundRun, reason string) error {
	row := t.closeRow(r, pb.RoundState_ROUND_STATE_ABANDONED, nil, reason)
	if err := t.c.d.Store.CloseRound(ctx, row, nil, nil, t.c.d.Now()); err != nil {
		return err
	}
	t.log().Warn("round abandoned", "round", row.Round, "reason", reason)
	t.c.record(audit.RoundClosed{Task: t.id, Round: row.Round, Outcome: audit.RoundAbandoned, Reports: uint64(row.Reported),
		Dropouts: uint64(row.Dropped), AggregationRule: t.spec.GetAggregation().GetRule().String(), Reason: reason})
	t.finishRound(row, "abandoned")
	t.c.emit(t.event(r, pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED, nil, reason))
	return nil
}

func (t *taskRun) finishRound(row *store.RoundRow, outcome string) {
	kind := map[pb.RoundKind]string{pb.RoundKind_ROUND_KIND_TRAIN: "train", pb.RoundKind_ROUND_KIND_EVALUATE: "evaluate"}[row.Kind]
	t.c.d.Metrics.Rounds.WithLabelValues(kind, outcome).Inc()
	t.c.d.Metrics.RoundDuration.WithLabelValues(kind).Observe(row.Close.Sub(row.Open).Seconds())
	t.c.d.Metrics.Dropouts.Add(float64(row.Dropped))
	t.c.purgeRound(t.id, row.Round)
}

func (t *taskRun) commit(ctx context.Context, r *roundRun, col aggregator.Collector, mm *metricMean, reason string) error {
	committed := false
	prefix := "train_"
	if r.row.Kind == pb.RoundKind_ROUND_KIND_EVALUATE {
		prefix = "eval_"
	}
	metrics := mm.mean(prefix)
	var newRow *store.ModelRow
	var optState []byte
	next := t.global
	if r.row.Kind == pb.RoundKind_ROUND_KIND_TRAIN {
		delta, err := col.Aggregate()
		if err != nil {
			return t.abandon(ctx, r, fmt.Sprintf("aggregation: %v", err))
		}
		if r.secure == nil && t.dp != nil && t.dp.cfg.GetMechanism() == pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN {
			// DP-FedAvg: noise of std zC on the sum is zC/n on the mean.
			noise := make([]float64, len(delta))
			if err := t.addCentralNoise(noise); err != nil {
				return t.abandon(ctx, r, fmt.Sprintf("central DP: %v", err))
			}
			n := float64(col.Count())
			for i := range delta {
				delta[i] += float32(noise[i] / n)
			}
		}
		flat := t.global.Flatten()
		// Apply advances the optimizer state; keep the old state so that a
		// commit that fails half-way can be retried without stepping twice.
		before, err := t.rule.MarshalBinary()
		if err != nil {
			return err
		}
		defer func() {
			if !committed {
				t.rule.UnmarshalBinary(before)
			}
		}()
		if err := t.rule.Apply(flat, delta); err != nil {
			return t.abandon(ctx, r, fmt.Sprintf("aggregation: %v", err))
		}
		if optState, err = t.rule.MarshalBinary(); err != nil {
			return err
		}
		next, err = t.global.Layout().Unflatten(flat)
		if err != nil {
			return err
		}
		next.Lineage = model.Lineage{Parent: t.global.Lineage.Version, Task: t.id, Round: int64(r.row.Round), Source: "federated"}
		var buf bytes.Buffer
		if err := model.WriteSafetensors(&buf, next); err != nil {
			return err
		}
		version, err := t.c.d.Blobs.Put(ctx, buf.Bytes())
		if err != nil {
			return err
		}
		next.Lineage.Version = version
		newRow = &store.ModelRow{Version: version, Name: t.spec.GetName(), Parent: t.global.Lineage.Version,
			TaskID: t.id, Round: r.row.Round, Source: pb.ModelSource_MODEL_SOURCE_FEDERATED,
			Tensors: len(next.Tensors), Params: len(flat), Size: int64(buf.Len()), Created: t.c.d.Now()}
		if t.evalSet != nil {
			for k, v := range t.serverEval(ctx, next) {
				metrics[k] = v
			}
		}
	}
	row := t.closeRow(r, pb.RoundState_ROUND_STATE_COMMITTED, metrics, reason)
	if newRow != nil {
		row.Model = newRow.Version
	}
	t.mu.Lock()
	for d := range r.reported {
		row.Participants = append(row.Participants, d)
	}
	t.mu.Unlock()
	var epsBefore float64
	if t.dp != nil {
		task, err := t.c.d.Store.Task(ctx, t.id)
		if err != nil {
			return err
		}
		if epsBefore, err = t.dp.epsilonAfter(int(task.TrainRounds)); err != nil {
			return err
		}
		row.Epsilon = epsBefore
		if newRow != nil {
			if row.Epsilon, err = t.dp.epsilonAfter(int(task.TrainRounds) + 1); err != nil {
				return err
			}
		}
	}
	if err := t.c.d.Store.CloseRound(ctx, row, newRow, optState, t.c.d.Now()); err != nil {
		return err
	}
	committed = true
	t.global = next
	t.log().Info("round committed", "round", row.Round, "kind", row.Kind, "reports", row.Reported, "dropped", row.Dropped,
		"model", row.Model, "metrics", metrics, "reason", reason)
	t.recordCommit(row, newRow, mm, metrics)
	if t.dp != nil && newRow != nil {
		t.recordSpent(row.Round, epsBefore, row.Epsilon)
	}
	t.finishRound(row, "committed")
	ev := t.event(r, pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED, metrics, reason)
	ev.EpsilonSpent = row.Epsilon
	if newRow != nil {
		ev.Model = &pb.ModelRef{Sha256: newRow.Version, Version: newRow.Version, SizeBytes: uint64(newRow.Size), ParentVersion: newRow.Parent}
	}
	t.c.emit(ev)
	return nil
}

// recordCommit records a committed round: its close, the model version it
// produced, and the metrics it measured (federated ones from the devices'
// reports, server_ ones on the server's held-out set).
func (t *taskRun) recordCommit(row *store.RoundRow, newRow *store.ModelRow, mm *metricMean, metrics map[string]float64) {
	t.c.record(audit.RoundClosed{Task: t.id, Round: row.Round, Outcome: audit.RoundCommitted, Reports: uint64(row.Reported),
		Dropouts: uint64(row.Dropped), AggregationRule: t.spec.GetAggregation().GetRule().String(), Reason: row.Reason})
	evaluated := row.BaseModel
	if newRow != nil {
		t.c.record(audit.ModelCommitted{Task: t.id, Round: row.Round, Model: newRow.Version, SHA256: newRow.Version,
			Parent: newRow.Parent})
		evaluated = newRow.Version
	}
	fed, srv := map[string]float64{}, map[string]float64{}
	for k, v := range metrics {
		if strings.HasPrefix(k, "server_") {
			srv[strings.TrimPrefix(k, "server_")] = v
		} else {
			fed[k] = v
		}
	}
	// Training metrics describe the base model as the devices trained it;
	// evaluation rounds measure the base model itself.
	if len(fed) > 0 {
		dataset := "federated:train"
		if row.Kind == pb.RoundKind_ROUND_KIND_EVALUATE {
			dataset = "federated:evaluate"
		}
		t.c.record(audit.ModelEvaluated{Task: t.id, Round: row.Round, Model: row.BaseModel, Dataset: dataset,
			Samples: uint64(mm.examples), Metrics: fed})
	}
	if len(srv) > 0 {
		t.c.record(audit.ModelEvaluated{Task: t.id, Round: row.Round, Model: evaluated, Dataset: "server:" + filepath.Base(t.spec.GetServerEvalDataset()),
			Samples: uint64(t.evalSet.Len()), Metrics: srv})
	}
}

func (t *taskRun) serverEval(ctx context.Context, m *model.Model) map[string]float64 {
	res, err := t.module.Evaluate(ctx, wasm.Call{Model: m, Data: t.evalSet, Hyper: t.spec.GetHyperparameters(),
		Limits: limitsOf(t.spec.GetLimits())})
	if err != nil {
		t.log().Warn("server-side evaluation failed", "err", err)
		return nil
	}
	out := map[string]float64{}
	for k, v := range res.Metrics {
		out["server_"+k] = v
	}
	return out
}

func limitsOf(l *pb.Limits) wasm.Limits {
	return wasm.Limits{MemoryPages: l.GetMemoryPages(), Timeout: l.GetTimeout().AsDuration(),
		MaxWork: int64(min(l.GetMaxFlops(), math.MaxInt64)), MaxTensorBytes: int64(min(l.GetMaxTensorBytes(), math.MaxInt64))}
}

// metricMean is the example-weighted mean of reported metrics.
type metricMean struct {
	sum      map[string]float64
	weight   map[string]float64
	examples float64 // over all reports, with or without metrics
}

func newMetricMean() *metricMean {
	return &metricMean{sum: map[string]float64{}, weight: map[string]float64{}}
}

func (m *metricMean) add(vals map[string]float64, w float64) {
	m.examples += w
	for k, v := range vals {
		m.sum[k] += v * w
		m.weight[k] += w
	}
}

func (m *metricMean) mean(prefix string) map[string]float64 {
	out := map[string]float64{}
	for k, s := range m.sum {
		out[prefix+k] = s / m.weight[k]
	}
	return out
}
