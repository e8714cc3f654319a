package coord

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/countio"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/internal/sandboxlimits"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// A round closes in two durable steps, audit log first: the round's events
// go into the log in one batch, then the round (and its model) into the
// store in one transaction. A close the log cannot record does not happen;
// either step failing is retried in place (the round's state is in memory,
// and a secure round's cannot be rebuilt) with back-off, logged as an error
// and counted, until it succeeds or the runner stops.

func (t *taskRun) event(r *roundRun, typ pb.RoundEventType, metrics map[string]float64, reason string) *pb.RoundEvent {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := &pb.RoundEvent{TaskId: t.id, Round: r.row.Round, Type: typ, Kind: r.row.Kind, Time: timestamppb.New(t.c.now()),
		Assigned: uint32(r.cohort.Assigned()), Reported: uint32(r.cohort.Reported()),
		Dropped: uint32(r.cohort.Assigned() - r.cohort.Reported()), Metrics: &pb.Metrics{Values: metrics}, Reason: reason}
	return ev
}

func (t *taskRun) closeRow(r *roundRun, state pb.RoundState, metrics map[string]float64, reason string) *store.RoundRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	row := *r.row
	row.State, row.Close, row.Metrics, row.Reason = state, t.c.now(), metrics, reason
	row.Assigned, row.Reported = uint32(r.cohort.Assigned()), uint32(r.cohort.Reported())
	row.Dropped = row.Assigned - row.Reported
	row.Failures = r.cohort.Failures()
	return &row
}

// durably runs a durable step until it succeeds, retrying with back-off.
// An event the audit log refuses as invalid is not retried: errInvalidAudit.
func (t *taskRun) durably(ctx context.Context, what string, step func() error) error {
	retry := backoff.New(100*time.Millisecond, 10*time.Second, nil)
	for {
		err := step()
		if err == nil {
			return nil
		}
		if errors.Is(err, audit.ErrInvalidEvent) {
			return fmt.Errorf("%w: %w", errInvalidAudit, err)
		}
		if errors.Is(err, store.ErrRoundClosed) {
			return err // closed already: nothing to retry
		}
		t.c.d.Metrics.CommitFailures.WithLabelValues(what).Inc()
		wait := retry.Next()
		t.log().Error("closing the round failed; retrying", "step", what, "err", err, "in", wait)
		if !clock.Sleep(t.clock(), wait, ctx.Done()) {
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		}
	}
}

var errInvalidAudit = errors.New("audit log refused the round's events")

// closeDurably closes a round: it prepares the close in the store, records
// events, then commits the close; see durably. The prepared close lets a
// coordinator restarted between the last two steps finish what the log
// already says happened (resumePending).
func (t *taskRun) closeDurably(ctx context.Context, events []audit.Payload, row *store.RoundRow, newRow *store.ModelRow, optState []byte) error {
	pending := &store.PendingClose{Row: row, Model: newRow, OptState: optState}
	if err := t.durably(ctx, "store", func() error { return t.c.d.Store.PrepareClose(ctx, pending) }); err != nil {
		return err
	}
	_, span := t.auditSpan(ctx, events)
	err := t.durably(ctx, "audit", func() error { return t.c.record(events...) })
	endSpan(span, err)
	if err != nil {
		if errors.Is(err, errInvalidAudit) {
			t.c.d.Store.DropPending(ctx, t.id, row.Round)
		}
		return err
	}
	return t.durably(ctx, "store", func() error { return t.c.d.Store.CloseRound(ctx, row, newRow, optState, t.c.now()) })
}

// resumePending finishes or forgets a round's close that was prepared but
// not committed when the coordinator stopped. done reports that the round
// is now closed.
func (t *taskRun) resumePending(ctx context.Context, round uint64) (done bool, err error) {
	p, err := t.c.d.Store.Pending(ctx, t.id, round)
	if err != nil || p == nil {
		return false, err
	}
	recorded := false
	if t.c.d.Audited != nil {
		if recorded, err = t.c.d.Audited(ctx, t.id, round); err != nil {
			return false, fmt.Errorf("round %d: audit lookup: %w", round, err)
		}
	}
	if !recorded {
		// The log never showed the close: it did not happen. Replay.
		return false, t.c.d.Store.DropPending(ctx, t.id, round)
	}
	var next *model.Model
	if p.Model != nil {
		if next, err = t.loadModel(ctx, p.Model.Version); err != nil {
			return false, err
		}
		if err := t.rule.UnmarshalBinary(p.OptState); err != nil {
			return false, fmt.Errorf("round %d: prepared optimizer state: %w", round, err)
		}
	}
	if err := t.durably(ctx, "store", func() error { return t.c.d.Store.CloseRound(ctx, p.Row, p.Model, p.OptState, t.c.now()) }); err != nil {
		return false, err
	}
	if next != nil {
		t.global = next
		t.holdModel()
		t.committedNoise(p.Row.NoiseState)
		t.committedClip(p.Row.ClipNorm)
	}
	t.log().Info("round close recorded before a restart committed", "round", round, "state", p.Row.State)
	outcome := "committed"
	if p.Row.State == pb.RoundState_ROUND_STATE_ABANDONED {
		outcome = "abandoned"
	}
	t.finishRound(p.Row, outcome)
	typ := map[string]pb.RoundEventType{"committed": pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED,
		"abandoned": pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED}[outcome]
	ev := &pb.RoundEvent{TaskId: t.id, Round: round, Type: typ, Kind: p.Row.Kind, Time: timestamppb.New(p.Row.Close),
		Assigned: p.Row.Assigned, Reported: p.Row.Reported, Dropped: p.Row.Dropped, Metrics: &pb.Metrics{Values: p.Row.Metrics},
		Reason: p.Row.Reason, EpsilonSpent: p.Row.Epsilon}
	if p.Model != nil {
		ev.Model = &pb.ModelRef{Sha256: p.Model.Version, Version: p.Model.Version, SizeBytes: uint64(p.Model.Size), ParentVersion: p.Model.Parent}
	}
	t.c.emit(ev)
	return true, nil
}

func (t *taskRun) abandon(ctx context.Context, r *roundRun, reason string) error {
	return t.abandonAs(ctx, r, reason, false)
}

// abandonShort abandons a round for want of devices: too few took a seat.
// Such rounds in a row pause the task (pause.go).
func (t *taskRun) abandonShort(ctx context.Context, r *roundRun, reason string) error {
	return t.abandonAs(ctx, r, reason, true)
}

func (t *taskRun) abandonAs(ctx context.Context, r *roundRun, reason string, short bool) error {
	row := t.closeRow(r, pb.RoundState_ROUND_STATE_ABANDONED, nil, reason)
	row.Short = short
	ev := audit.RoundClosed{Task: t.id, Round: row.Round, Outcome: audit.RoundAbandoned, Reports: uint64(row.Reported),
		Dropouts: uint64(row.Dropped), AggregationRule: t.spec.GetAggregation().GetRule().String(), Reason: reason}
	evs := []audit.Payload{ev}
	if ev := t.refusedEvent(r); ev != nil {
		evs = append(evs, ev)
	}
	if err := t.closeDurably(ctx, evs, row, nil, nil); err != nil {
		return err
	}
	t.log().Warn("round abandoned", "round", row.Round, "reason", reason)
	t.finishRound(row, "abandoned")
	t.c.emit(t.event(r, pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED, nil, reason))
	return nil
}

func (t *taskRun) finishRound(row *store.RoundRow, outcome string) {
	// The round stops being open here, before anyone hears it closed: a
	// report stored from now on is refused with a receipt by handleStored,
	// instead of being left to a runner that has stopped reading.
	t.mu.Lock()
	if t.round != nil && t.round.row.Round == row.Round {
		t.benchNoShows(t.round)
		t.closeRun(t.round)
	}
	t.mu.Unlock()
	kind := kindName(row.Kind)
	if t.span != nil {
		t.span.SetAttributes(attrOutcome.String(outcome), attribute.Int("fleetlearn.round.reported", int(row.Reported)),
			attribute.Int("fleetlearn.round.dropped", int(row.Dropped)))
	}
	t.c.d.Metrics.Rounds.WithLabelValues(kind, outcome).Inc()
	t.c.d.Metrics.RoundDuration.WithLabelValues(kind).Observe(row.Close.Sub(row.Open).Seconds())
	t.c.d.Metrics.Dropouts.Add(float64(row.Dropped))
	if t.async == nil {
		// An async round's subject holds the reports of plans still
		// training: its buffers purge each report they answer (async.go).
		t.c.purgeRound(t.id, row.Round)
	}
}

// commit turns a round's aggregation result into its close. col holds the
// result either way — plaintext rounds added each update, secure rounds
// the unmasked sum — and slack is how far the decoded mean may exceed the
// norm bound through quantization (0 for plaintext rounds, +Inf where
// device noise is part of the sum). The mean is checked against the bound,
// noised once for central DP (std zC on the sum, so zC/W on the mean),
// applied, and the new model checked before anything is written.
// aggregate is what a commit needs of a round's sum: a collector's, or an
// async buffer's (aggregator.Staleness).
type aggregate interface {
	Aggregate() ([]float32, error)
	TotalWeight() float64
}

func (t *taskRun) commit(ctx context.Context, r *roundRun, col aggregate, mm *metricMean, reason string, slack float64) error {
	prefix := "train_"
	if r.row.Kind == pb.RoundKind_ROUND_KIND_EVALUATE {
		prefix = "eval_"
	}
	metrics := mm.means(prefix)
	var newRow *store.ModelRow
	var srvMetrics map[string]float64 // the server's held-out measures of the new model
	var optState, noiseState []byte
	next := t.global
	// Apply advances the optimizer state; until the round is durably
	// closed, restore holds the state to go back to.
	var restore []byte
	stale := false
	defer func() {
		if restore != nil && stale {
			// The step is in the model; the round did not close. The
			// next round reloads its base model from the store.
			t.global.Lineage.Version = ""
		}
		if restore != nil {
			t.rule.UnmarshalBinary(restore)
		}
	}()
	// The commit span follows the aggregation span: it covers writing the
	// model and closing the round.
	var span trace.Span
	startCommit := func() {
		if span == nil {
			ctx, span = t.c.tracer.Start(ctx, "commit")
		}
	}
	defer func() {
		if span != nil {
			span.End()
		}
	}()
	if r.row.Kind == pb.RoundKind_ROUND_KIND_TRAIN {
		t.aggregation(r)
		delta, err := col.Aggregate()
		if err != nil {
			return t.abandon(ctx, r, fmt.Sprintf("aggregation: %v", err))
		}
		if why := t.checkAggregate(delta, slack); why != "" {
			return t.abandon(ctx, r, why)
		}
		if noiseState, err = t.addCentralNoise(delta, col.TotalWeight()); err != nil {
			return t.abandon(ctx, r, fmt.Sprintf("central DP: %v", err))
		}
		// The step goes into the current model's trained tensors in place:
		// the server holds one model, not a copy per commit. Until the
		// round is durably closed, stale marks it for a reload from the
		// store should the close fail.
		trained, err := t.global.Select(t.train)
		if err != nil {
			return err
		}
		parts := make([][]float32, len(trained.Tensors))
		for i := range trained.Tensors {
			parts[i] = trained.Tensors[i].Data
		}
		if restore, err = t.rule.MarshalBinary(); err != nil {
			return err
		}
		if err := t.rule.ApplyParts(parts, delta); err != nil {
			return t.abandon(ctx, r, fmt.Sprintf("aggregation: %v", err))
		}
		stale = true
		r.aggregationDone()
		startCommit()
		if optState, err = t.rule.MarshalBinary(); err != nil {
			return err
		}
		parent := t.global.Lineage.Version
		next.Lineage = model.Lineage{Parent: parent, Task: t.id, Round: int64(r.row.Round), Source: "federated"}
		version, size, err := t.putModel(ctx, next)
		if err != nil {
			return err
		}
		next.Lineage.Version = version
		newRow = &store.ModelRow{Version: version, Name: t.spec.GetName(), Parent: parent,
			TaskID: t.id, Round: r.row.Round, Source: pb.ModelSource_MODEL_SOURCE_FEDERATED,
			Tensors: len(next.Tensors), Params: next.Layout().Size(), Size: size, Created: t.c.now()}
		if t.evalSet != nil {
			srvMetrics = t.serverEval(ctx, next)
		}
	}
	fedMetrics := metrics
	metrics = withServerMetrics(fedMetrics, srvMetrics)
	for k, v := range r.extraMetrics {
		if metrics == nil {
			metrics = map[string]float64{}
		}
		metrics[k] = v
	}
	startCommit()
	row := t.closeRow(r, pb.RoundState_ROUND_STATE_COMMITTED, metrics, reason)
	if newRow != nil {
		row.Model, row.NoiseState = newRow.Version, noiseState
	}
	t.mu.Lock()
	row.Participants = r.cohort.ReportedDevices()
	t.mu.Unlock()
	var clip clipStep
	if newRow != nil {
		var err error
		if clip, err = t.clipStep(r, row.Participants); err != nil {
			return t.abandon(ctx, r, err.Error())
		}
		row.ClipNorm = clip.next
	}
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
	events := t.commitEvents(row, newRow, mm, fedMetrics, srvMetrics, epsBefore, clip)
	if ev := t.refusedEvent(r); ev != nil {
		events = append(events, ev)
	}
	if err := t.closeDurably(ctx, events, row, newRow, optState); err != nil {
		if errors.Is(err, errInvalidAudit) {
			return t.abandon(ctx, r, err.Error())
		}
		return err
	}
	t.global, restore = next, nil
	t.committedNoise(row.NoiseState)
	t.committedClip(row.ClipNorm)
	t.log().Info("round committed", "round", row.Round, "kind", row.Kind, "reports", row.Reported, "dropped", row.Dropped,
		"model", row.Model, "metrics", metrics, "reason", reason)
	if t.dp != nil && newRow != nil {
		t.c.d.Metrics.Epsilon.WithLabelValues(t.id).Set(row.Epsilon)
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

// checkAggregate refuses a combined update that no honest round produces:
// a non-finite value, or (for the mean rules) a norm over the bound every
// update was held to, plus slack. It returns why, or "".
func (t *taskRun) checkAggregate(delta []float32, slack float64) string {
	if i := floats.FirstNonFinite(delta); i >= 0 {
		return fmt.Sprintf("aggregate update has a non-finite value at %d; the current model stays", i)
	}
	bound := t.normBound()
	if bound == 0 || math.IsInf(slack, 1) || !t.rule.Kind().Streaming() {
		// Local and distributed DP noise are part of the updates; the
		// coordinate-wise rules can exceed a norm bound each input met.
		return ""
	}
	var ss float64
	for _, x := range delta {
		ss += float64(x) * float64(x)
	}
	if norm, limit := math.Sqrt(ss), bound*(1+aggregator.NormTolerance)+slack; norm > limit {
		return fmt.Sprintf("aggregate update norm %.6g exceeds the bound %.6g every update was held to; the current model stays", norm, limit)
	}
	return ""
}

// commitEvents are the audit events of a committed round, recorded in one
// batch: its close, the model version it produced, the metrics it measured
// (federated ones from the devices' reports, server_ ones on the server's
// held-out set) and its privacy cost.
func (t *taskRun) commitEvents(row *store.RoundRow, newRow *store.ModelRow, mm *metricMean, fed, srv map[string]float64, epsBefore float64, clip clipStep) []audit.Payload {
	evs := []audit.Payload{audit.RoundClosed{Task: t.id, Round: row.Round, Outcome: audit.RoundCommitted, Reports: uint64(row.Reported),
		Dropouts: uint64(row.Dropped), AggregationRule: t.spec.GetAggregation().GetRule().String(), Reason: row.Reason}}
	evaluated := row.BaseModel
	if newRow != nil {
		evs = append(evs, audit.ModelCommitted{Task: t.id, Round: row.Round, Model: newRow.Version, SHA256: newRow.Version,
			Parent: newRow.Parent})
		evaluated = newRow.Version
	}
	// Training metrics describe the base model as the devices trained it;
	// evaluation rounds measure the base model itself. An evaluation round
	// and a server evaluation are recorded even when no metric survived
	// the checks: the verifier holds every committed round to the
	// evaluation its task asks for.
	if len(fed) > 0 || row.Kind == pb.RoundKind_ROUND_KIND_EVALUATE {
		dataset := "federated:train"
		if row.Kind == pb.RoundKind_ROUND_KIND_EVALUATE {
			dataset = "federated:evaluate"
		}
		evs = append(evs, audit.ModelEvaluated{Task: t.id, Round: row.Round, Model: row.BaseModel, Dataset: dataset,
			Samples: uint64(mm.examples), Metrics: fed})
	}
	if t.evalSet != nil && newRow != nil {
		evs = append(evs, audit.ModelEvaluated{Task: t.id, Round: row.Round, Model: evaluated,
			Dataset: "server:" + filepath.Base(t.spec.GetServerEvalDataset()), Samples: uint64(t.evalSet.Len()), Metrics: srv})
	}
	if t.dp != nil && newRow != nil {
		evs = append(evs, t.spentEvent(row.Round, epsBefore, row.Epsilon, row.NoiseState, clip))
	}
	return evs
}

// evaluateBase measures the task's base model on the server's held-out set
// before round 1 opens, so that every committed model compares with where
// the task began. Like round.opened, it is recorded in the audit log
// (model.evaluated, round 0) before the store keeps it; a failure of either
// is returned for the step to retry, and a task whose store has the measure
// is not evaluated again, by a restarted coordinator either.
func (t *taskRun) evaluateBase(ctx context.Context) error {
	m := t.baseRecorded
	if m == nil {
		m = t.serverEval(ctx, t.global)
		if err := ctx.Err(); err != nil {
			return err // stopped, not measured
		}
		if m == nil {
			m = map[string]float64{} // evaluated; nothing passed the checks
		}
		ev := audit.ModelEvaluated{Task: t.id, Round: 0, Model: t.global.Lineage.Version,
			Dataset: "server:" + filepath.Base(t.spec.GetServerEvalDataset()), Samples: uint64(t.evalSet.Len()), Metrics: m}
		if err := t.c.record(ev); err != nil {
			return fmt.Errorf("evaluate the base model: audit: %w", err)
		}
		t.baseRecorded = m
	}
	if err := t.c.d.Store.SetBaseMetrics(ctx, t.id, withServerMetrics(nil, m), t.c.now()); err != nil {
		return fmt.Errorf("evaluate the base model: %w", err)
	}
	t.baseRecorded = nil
	t.log().Info("base model evaluated", "model", t.global.Lineage.Version, "metrics", m)
	return nil
}

// serverMetricPrefix marks the server's held-out measures among a round's
// metrics as the store, the API and the dashboard keep them; the audit log
// records them in an event of their own, under their module's names.
const serverMetricPrefix = "server_"

// withServerMetrics is a round's metrics: the devices' fed and the
// server's srv, prefixed.
func withServerMetrics(fed, srv map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(fed)+len(srv))
	for k, v := range fed {
		out[k] = v
	}
	for k, v := range srv {
		out[serverMetricPrefix+k] = v
	}
	return out
}

// serverEval runs the task's module on the server's held-out set; metrics
// that are not finite and in range are dropped (the module is the task's,
// but its output is still checked before it is recorded).
func (t *taskRun) serverEval(ctx context.Context, m *model.Model) map[string]float64 {
	lim, err := sandboxlimits.FromProto(t.spec.GetLimits())
	if err != nil {
		t.log().Warn("server-side evaluation skipped", "err", err)
		return nil
	}
	res, err := t.module.Evaluate(ctx, wasm.Call{Model: m, Data: t.evalSet, Hyper: t.spec.GetHyperparameters(), Limits: lim})
	if err != nil {
		t.log().Warn("server-side evaluation failed", "err", err)
		return nil
	}
	out := map[string]float64{}
	for k, v := range res.Metrics {
		if err := checkMetrics(map[string]float64{k: v}); err != nil {
			t.log().Warn("server-side evaluation metric dropped", "err", err)
			continue
		}
		out[k] = v
	}
	return out
}

// metricMean is the weighted mean of reported metrics, kept as running
// means: each stays within the range of the values it averages, so no
// weight or value that passed checkMetrics can overflow it.
type metricMean struct {
	mean     map[string]float64
	weight   map[string]float64
	examples float64 // total weight over all reports, with or without metrics
}

func newMetricMean() *metricMean {
	return &metricMean{mean: map[string]float64{}, weight: map[string]float64{}}
}

func (m *metricMean) add(vals map[string]float64, w float64) {
	m.examples += w
	for k, v := range vals {
		total := m.weight[k] + w
		m.mean[k] += (v - m.mean[k]) * (w / total)
		m.weight[k] = total
	}
}

func (m *metricMean) means(prefix string) map[string]float64 {
	out := make(map[string]float64, len(m.mean))
	for k, v := range m.mean {
		out[prefix+k] = v
	}
	return out
}

// putModel writes m to the blob store as safetensors without holding the
// file: once to learn its sha256 (the blob's name) and size, once into the
// store.
func (t *taskRun) putModel(ctx context.Context, m *model.Model) (string, int64, error) {
	h := sha256.New()
	cw := &countio.Writer{W: h}
	if err := model.WriteSafetensors(cw, m); err != nil {
		return "", 0, err
	}
	name := hex.EncodeToString(h.Sum(nil))
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(model.WriteSafetensors(pw, m)) }()
	err := t.c.d.Blobs.PutReader(ctx, name, pr)
	pr.CloseWithError(err) // stops the writer if the store gave up
	if err != nil {
		return "", 0, err
	}
	return name, cw.N, nil
}
