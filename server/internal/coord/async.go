package coord

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// Asynchronous buffered training (docs/ROUND.md, Asynchronous buffers).
// An async task's rounds are its buffers: round r opens on the current
// model, and commits the next version once the task's buffer of reports is
// in. Seats are the task's, not a round's (round.Async): a device checking
// in gets the plan of the open round and trains on its model while later
// rounds open and commit; it reports on its plan's round, and the open
// buffer takes the report, weighted by its staleness, unless it is more
// than max_staleness versions behind. No buffer waits for a device: a
// silent one holds one seat of the concurrency until its report deadline.
//
// A buffer's consumer reads the reports of every round of the task from
// the first stream sequence the previous buffer left unanswered; a report
// is purged once answered (refused) or once its buffer closed (taken).
// The buffer's sum lives in memory: a buffer that a restart or a failed
// commit interrupts is abandoned, and the devices whose reports it held
// train again.

// asyncRun is an async task's state across its rounds; guarded by the
// task's mu.
type asyncRun struct {
	eng *round.Async
	// plans are the plans of the devices holding seats, by device.
	plans map[string]asyncPlan
	// rounds maps each round whose plans may still be reported to the
	// version its plans train: reports of others are not open.
	rounds map[uint64]uint64
	// opened is the round this runner opened last: a round found open
	// otherwise was left by a restart, with its buffer's sum lost.
	opened uint64
	// from is the stream sequence the next buffer's consumer starts at.
	from uint64
	// quotas are the storage quotas of the rounds in rounds.
	quotas map[uint64]*storeQuota
	// participant numbers the plans handed.
	participant uint32
	// swept is when seats past their deadline were last freed.
	swept time.Time
	// announced is when a round of the task was last announced; later is
	// set while an announcement waits for the pace window to pass.
	announced time.Time
	later     bool
	// joined are the group plans of the devices the open secure buffer
	// seated, by device, handed again to a device that asks again.
	joined map[string]*pb.RoundPlan
}

// asyncPlan is the plan a seated device trains.
type asyncPlan struct {
	round   uint64
	version uint64
	plan    *pb.RoundPlan
	key     ed25519.PublicKey
	// stale: the version moved more than max_staleness past the plan's,
	// and the seat was given up. The plan is kept until its deadline, for
	// its report to be refused as stale rather than as seatless.
	stale bool
}

// asyncBuffer is the open buffer's bookkeeping beside its collector.
type asyncBuffer struct {
	// taken are the subjects of the reports the buffer took, purged when
	// it closes.
	taken []takenReport
}

type takenReport struct {
	round  uint64
	device string
	seq    uint64 // the report's stream sequence
}

// newAsyncRun starts an async task's state at version, its committed
// training rounds.
func newAsyncRun(spec *pb.Task, version uint64) (*asyncRun, error) {
	eng, err := round.NewAsync(AsyncConfig(spec.GetAsync()), version)
	if err != nil {
		return nil, err
	}
	return &asyncRun{eng: eng, plans: map[string]asyncPlan{}, rounds: map[uint64]uint64{}, quotas: map[uint64]*storeQuota{},
		joined: map[string]*pb.RoundPlan{}}, nil
}

// AsyncConfig is the round engine's view of a task's async settings.
func AsyncConfig(c *pb.AsyncConfig) round.AsyncConfig {
	return round.AsyncConfig{Concurrency: int(c.GetConcurrency()), Buffer: int(c.GetBuffer()), MaxStaleness: uint64(c.GetMaxStaleness())}
}

// CheckAsync refuses async settings the service cannot honour: the
// engine's bounds, and what needs a round's whole cohort in one place.
// It makes the cohort the buffer, which is what DP accounting and the
// participation rules count per step.
func CheckAsync(t *pb.Task) error {
	a := t.GetAsync()
	if a == nil {
		return nil
	}
	if err := AsyncConfig(a).Validate(); err != nil {
		return err
	}
	switch {
	case t.GetEvalEvery() > 0:
		return errors.New("async: an async task has no federated evaluation rounds: drop --eval-every, and measure on the server with --server-eval-dataset")
	case !aggregator.Kind(t.GetAggregation().GetRule()).Streaming() && t.GetAggregation().GetRule() != pb.AggregationRule_AGGREGATION_RULE_UNSPECIFIED:
		return fmt.Errorf("async: the %v rule needs every update of a step at once; async buffers take the streaming rules (fedavg, fedavgm, fedadam, fedyogi, fedadagrad)", t.GetAggregation().GetRule())
	case privacyconf.Adaptive(t.GetDp()):
		return errors.New("async: adaptive clipping moves the clip bound every step, and a stale report was clipped to an older one: set --dp-clip without --dp-target-unclipped-quantile")
	}
	t.CohortTarget, t.ReportGoal, t.OverSelection = a.GetBuffer(), a.GetBuffer(), 0
	return nil
}

// isAsync reports whether the task trains asynchronously.
func (t *taskRun) isAsync() bool { return t.async != nil }

// open reports whether reports of round are still taken; t.mu is held.
func (a *asyncRun) open(round uint64) bool {
	_, ok := a.rounds[round]
	return ok
}

// quota is the storage quota of round; t.mu is held.
func (a *asyncRun) quota(rnd uint64) *storeQuota {
	q := a.quotas[rnd]
	if q == nil {
		q = &storeQuota{round: rnd, devices: map[string]*round.Storage{}}
		a.quotas[rnd] = q
	}
	return q
}

// prune forgets, once a buffer closed, the rounds whose plans can no
// longer be reported: those no device holds a plan of (a stale seat's
// plan counts until its deadline, for its report to be refused as
// stale). t.mu is held.
func (a *asyncRun) prune() {
	live := map[uint64]bool{}
	for _, p := range a.plans {
		live[p.round] = true
	}
	for r := range a.rounds {
		if !live[r] {
			delete(a.rounds, r)
			delete(a.quotas, r)
		}
	}
}

// offerAsync answers a check-in to an async task whose round r is open:
// a seat on r's plan while fewer than the concurrency train, or a wait.
func (t *taskRun) offerAsync(ci *pb.CheckIn, now time.Time, r *roundRun) (*pb.RoundPlan, nats.Header, time.Duration, pb.RetryReason, string) {
	pace := t.c.d.PaceWindow
	device := ci.DeviceId
	examples := ci.GetAttributes().GetExamplesAvailable()
	a := t.async
	t.mu.Lock()
	if now.Sub(a.swept) >= time.Second {
		// A secure buffer's runner waits on its stages, not on seats: the
		// check-ins that want a seat free the expired ones.
		a.sweep(now, t.reportTimeout())
	}
	e := t.eligibility()
	e.Step = a.eng.Version() + 1
	part := t.parts[device]
	if why, reason, _ := e.Admit(round.Candidate{Device: device, Attributes: attributes(ci.Attributes),
		Rounds: part.Rounds, LastStep: part.LastStep}); why != "" {
		t.mu.Unlock()
		return nil, nil, 10 * pace, retryReasons[reason], why
	}
	if r.secure != nil {
		if p, ok := a.joined[device]; ok {
			t.mu.Unlock()
			return p, r.tr.header, 0, 0, ""
		}
		if ready := ci.GetReady(); ready != nil && ready.GetTaskId() == t.id {
			if p, ok := a.plans[device]; ok && p.round == ready.GetRound() {
				t.mu.Unlock()
				return t.joinSecure(ci, now, r, p)
			}
		}
	}
	o := a.eng.Offer(device, examples, now)
	switch o.Action {
	case round.Defer:
		t.mu.Unlock()
		return nil, nil, pace, retryReasons[o.Reason], o.Detail
	case round.Replan:
		p := a.plans[device].plan
		t.mu.Unlock()
		return p, r.tr.header, 0, 0, ""
	}
	t.mu.Unlock()
	key, why := t.c.seatKey(device)
	if why != "" {
		t.mu.Lock()
		a.eng.Release(device)
		t.mu.Unlock()
		return nil, nil, 10 * pace, pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, why
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.round != r {
		// The round closed while the key was looked up: its plan trains a
		// version that may be gone by the time the device reports.
		a.eng.Release(device)
		return nil, nil, pace, pb.RetryReason_RETRY_REASON_ROUND_FULL, "between rounds"
	}
	a.participant++
	plan := withParticipant(r.plan, a.participant)
	// The seat, not the round, bounds the device's time: it holds one of
	// the concurrency's seats until this deadline at most.
	plan.ReportDeadline = timestamppb.New(now.Add(t.reportTimeout()))
	if r.secure != nil {
		// Train now, aggregate later: the device holds its update until
		// a buffer's group takes it (joinSecure).
		plan.Secagg, plan.AsyncStage = nil, pb.AsyncStage_ASYNC_STAGE_TRAIN
	}
	a.plans[device] = asyncPlan{round: r.row.Round, version: o.Seat.Version, plan: plan, key: key}
	t.c.d.Metrics.AsyncTraining.Set(float64(a.eng.Training()))
	r.planHanded(device, a.participant)
	r.poke()
	return plan, r.tr.header, 0, 0, ""
}

// joinSecure seats a device that holds the update of its plan p in the
// open secure buffer's group: a seat of the round's cohort, as in a
// synchronous secure round, with a plan that names the held update and its
// staleness weight. A stale update frees the seat, with a receipt on the
// plan's round, and the device may train again.
func (t *taskRun) joinSecure(ci *pb.CheckIn, now time.Time, r *roundRun, p asyncPlan) (*pb.RoundPlan, nats.Header, time.Duration, pb.RetryReason, string) {
	device, a := ci.DeviceId, t.async
	t.mu.Lock()
	var b round.Buffered
	err := a.eng.Stale(p.version)
	if err == nil && !p.stale {
		b, err = a.eng.Check(device, p.version)
	}
	if err != nil {
		a.eng.Release(device)
		delete(a.plans, device)
		t.mu.Unlock()
		err = fromRound(err)
		t.c.d.Metrics.Refused(refusalReason(err))
		t.log().Info("held update refused", "round", p.round, "device", device, "err", err)
		t.c.receipt(t.id, p.round, device, err.Error())
		// The device may train again, on the current version.
		fresh := proto.Clone(ci).(*pb.CheckIn)
		fresh.Ready = nil
		return t.offerAsync(fresh, now, r)
	}
	t.mu.Unlock()
	plan, h, wait, reason, _ := t.offerCohort(ci, now, r)
	if plan == nil {
		// The group is full or forming no more: the device keeps its seat
		// and its update for the next buffer.
		return nil, nil, wait, reason, "the buffer's secure aggregation group is full; it takes held updates again after the step"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := a.eng.Report(device, p.version); err != nil {
		// Nothing between the Check and here moves the version: the
		// buffer's step needs this very group.
		t.log().Error("async: a device seated in the secure group was refused by the buffer", "device", device, "err", err)
	}
	delete(a.plans, device)
	plan = proto.Clone(plan).(*pb.RoundPlan)
	plan.AsyncStage, plan.StalenessWeight, plan.TrainedRound = pb.AsyncStage_ASYNC_STAGE_AGGREGATE, b.Weight, p.round
	a.joined[device] = plan
	t.noteTaken(r, b.Staleness, len(a.joined))
	return plan, h, 0, 0, ""
}

// noteTaken adds the n-th report a buffer took, s versions stale, to the
// round's async metrics: the staleness's running mean and maximum, and the
// seats held as it came in. t.mu is held.
func (t *taskRun) noteTaken(r *roundRun, s uint64, n int) {
	m := r.extraMetrics
	if m == nil {
		m = map[string]float64{}
		r.extraMetrics = m
	}
	m["async_staleness_mean"] += (float64(s) - m["async_staleness_mean"]) / float64(n)
	m["async_staleness_max"] = max(m["async_staleness_max"], float64(s))
	m["async_training"] = float64(t.async.eng.Training())
	t.c.d.Metrics.AsyncTraining.Set(m["async_training"])
}

// asyncFailure releases the seat of a device that says it cannot carry out
// its plan of round rnd; it reports whether the device held that seat.
func (t *taskRun) asyncFailure(rnd uint64, device string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.async
	if p, ok := a.plans[device]; !ok || p.round != rnd {
		return false
	}
	a.eng.Release(device)
	delete(a.plans, device)
	return true
}

// runAsync runs one buffer of an async task: it takes reports until the
// buffer is full, then commits the step.
func (t *taskRun) runAsync(ctx context.Context, row *store.RoundRow) error {
	a := t.async
	r := &roundRun{row: row, plan: t.plan(row), keys: map[string]ed25519.PublicKey{}, kick: make(chan struct{}, 1)}
	r.cohort = round.NewCohort(round.CohortConfig{Round: row.Round, Wanted: a.eng.Config().Buffer, SelectionEnd: row.Open,
		Deadline: row.Deadline, Pace: t.c.d.PaceWindow}, t.c.now(), nil)
	r.cohort.EndSelection()
	if t.beginBuffer(row.Round) {
		return t.abandon(ctx, r, errBufferLost)
	}
	col, err := t.rule.NewCollector(t.normBound())
	if err != nil {
		return fmt.Errorf("round %d: %w", row.Round, err)
	}
	t.hold("round", 8*int64(t.ulayout.Size()))
	defer t.hold("round", 0)
	parts := t.parts
	if t.dp.limitsParticipation() {
		if parts, err = t.c.d.Store.Participations(ctx, t.id); err != nil {
			return err
		}
	}
	t.mu.Lock()
	from := a.from
	t.mu.Unlock()
	cons, drop, err := t.consumeReports(ctx, row.Round, []string{wire.TaskReportFilter(t.id)}, from, false)
	if err != nil {
		return err
	}
	defer drop()
	msgs := make(chan jetstream.Msg, 64)
	stop, err := t.pull(ctx, cons, row.Round, msgs)
	if err != nil {
		return err
	}
	defer stop()

	t.traceRound(ctx, r)
	defer t.endSpans(r)
	r.selectionDone(0)
	defer t.openForCheckIns(r, parts, 0)()
	t.announceAsync()

	buf := &asyncBuffer{}
	sc := aggregator.NewStaleness(col)
	mm := newMetricMean()
	expiry := t.clock().NewTimer(time.Hour)
	defer expiry.Stop()
	for {
		t.mu.Lock()
		a.sweep(t.c.now(), t.reportTimeout())
		next := a.eng.NextExpiry(t.reportTimeout())
		full := a.eng.Full()
		t.c.d.Metrics.AsyncTraining.Set(float64(a.eng.Training()))
		t.mu.Unlock()
		if r.lost != "" {
			t.mu.Lock()
			a.eng.Abandon()
			t.mu.Unlock()
			t.purgeTaken(buf)
			return t.abandon(ctx, r, r.lost)
		}
		if full {
			return t.stepAsync(ctx, r, sc, mm, buf)
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(0, next.Sub(t.c.now())) + time.Millisecond
		}
		expiry.Reset(wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-msgs:
			t.handleAsync(r, sc, mm, buf, m)
		case <-r.kick:
		case <-expiry.C():
		}
	}
}

// errBufferLost is why a buffer found open by its runner is abandoned.
const errBufferLost = "the server restarted or failed while the buffer was open; the reports it held are lost and their devices train again"

// beginBuffer readies the engine for buffer round rnd and takes reports of
// it from now. lost says the round was left open by a restart or a failed
// step, with the sum of the reports it took, or the secure group's
// updates: it can only be abandoned, and their devices train again.
func (t *taskRun) beginBuffer(rnd uint64) (lost bool) {
	a := t.async
	t.mu.Lock()
	defer t.mu.Unlock()
	lost = a.opened != rnd || len(a.eng.Buffer()) > 0
	if lost {
		a.eng.Abandon()
	}
	clear(a.joined)
	a.rounds[rnd] = a.eng.Version()
	return lost
}

// endBuffer steps the engine once buffer round rnd committed, or empties
// its buffer if the round ended otherwise; the devices of an abandoned
// buffer train again.
func (t *taskRun) endBuffer(ctx context.Context, rnd uint64) {
	a := t.async
	row, err := t.c.d.Store.Round(context.WithoutCancel(ctx), t.id, rnd)
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(a.joined)
	switch {
	case err == nil && row.State == pb.RoundState_ROUND_STATE_OPEN:
		// Left open (the runner stops, or the step is retried): resumed,
		// it is abandoned.
		return
	case err == nil && row.State == pb.RoundState_ROUND_STATE_COMMITTED && a.eng.Full():
		stale, _ := a.eng.Step()
		for _, d := range stale {
			p := a.plans[d]
			p.stale = true
			a.plans[d] = p
		}
	default:
		a.eng.Abandon()
	}
	a.prune()
}

// handleAsync takes one report into the open buffer, or refuses it with a
// receipt on its own round.
func (t *taskRun) handleAsync(r *roundRun, sc *aggregator.Staleness, mm *metricMean, buf *asyncBuffer, m jetstream.Msg) {
	a := t.async
	if md, err := m.Metadata(); err == nil {
		t.mu.Lock()
		a.from = max(a.from, md.Sequence.Stream+1)
		t.mu.Unlock()
	}
	_, rnd, device, err := wire.ParseReportSubject(m.Subject())
	if err != nil {
		t.c.purgeStored(m.Subject(), 0)
		return
	}
	taken := false
	t.settleAt(r, m, "update", rnd, func() (string, error) {
		var err error
		taken, err = t.acceptAsync(r, sc, mm, buf, rnd, device, m)
		return device, err
	})
	if !taken {
		t.afterRead(device, func() { t.c.purgeDevice(t.id, rnd, device) })
	}
}

// acceptAsync checks a report of device on its plan of round rnd and folds
// it into the buffer with its staleness weight. taken is false when the
// report was refused.
func (t *taskRun) acceptAsync(r *roundRun, sc *aggregator.Staleness, mm *metricMean, buf *asyncBuffer, rnd uint64, device string, m jetstream.Msg) (taken bool, err error) {
	a := t.async
	t.mu.Lock()
	p, seated := a.plans[device]
	examples := a.seatExamples(device)
	var b round.Buffered
	switch {
	case !a.open(rnd):
		// The buffer's consumer may still read a round its step has just
		// pruned: answer as the coordinator does for any closed round.
		err = refuseAs(metrics.RefusedNotOpen, "round %d of task %q is not open", rnd, t.id)
	case !seated || p.round != rnd:
		err = refuseAs(metrics.RefusedCohort, "%s holds no seat on round %d of this async task: check in for a plan", device, rnd)
	case p.stale:
		err = fromRound(a.eng.Stale(p.version))
		delete(a.plans, device)
	case a.quota(rnd).over(rnd, device):
		err = refuseAs(metrics.RefusedQuota, "%s stored more than round %d admits per device", device, rnd)
	default:
		if b, err = a.eng.Check(device, p.version); err != nil {
			err = fromRound(err)
			if errors.Is(err, ErrReport) && refusalReason(err) == metrics.RefusedStale {
				a.eng.Release(device)
				delete(a.plans, device)
			}
		}
	}
	t.mu.Unlock()
	if err != nil {
		return false, err
	}
	t.startReading(device)
	defer t.stopReading(device)
	in := t.intake(r)
	in.spec.Round, in.spec.Model = rnd, p.plan.GetModel().GetVersion()
	seat := round.Seat{Participant: p.plan.GetParticipantId(), Examples: examples}
	got, err := in.fold(device, seat, p.key, m, func(w float64) (aggregator.Part, error) { return sc.Begin(w, b.Weight) })
	t.c.chargeChunkedBytes(m, got.chunked)
	t.mu.Lock()
	defer t.mu.Unlock()
	// Taken or refused, the seat is spent: the device checks in again.
	delete(a.plans, device)
	if err != nil {
		a.eng.Release(device)
		if errors.Is(err, errPartlyAdded) {
			r.lost = fmt.Sprintf("the sum holds part of the update of %s: %v", device, err)
		}
		return false, err
	}
	if _, err := a.eng.Report(device, p.version); err != nil {
		// Check passed under the same state a moment ago; only a bug lands here.
		r.lost = fmt.Sprintf("the buffer took the update of %s that its engine then refused: %v", device, err)
		return true, err
	}
	mm.add(got.metrics, got.weight)
	r.cohort.Join(device, seat)
	r.cohort.Report(device)
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	buf.taken = append(buf.taken, takenReport{round: rnd, device: device, seq: seq})
	t.noteTaken(r, b.Staleness, len(buf.taken))
	return true, nil
}

// sweep frees the seats held past their deadline at now, and forgets the
// plans of stale seats past theirs; t.mu is held.
func (a *asyncRun) sweep(now time.Time, timeout time.Duration) {
	a.swept = now
	for _, d := range a.eng.Expired(now, timeout) {
		a.eng.Release(d)
		delete(a.plans, d)
	}
	for d, p := range a.plans {
		if p.stale && now.After(p.plan.GetReportDeadline().AsTime()) {
			delete(a.plans, d)
		}
	}
}

// seatExamples is what device said it had when it took its seat; t.mu is held.
func (a *asyncRun) seatExamples(device string) uint64 {
	s, _ := a.eng.Seat(device)
	return s.Examples
}

// stepAsync commits the full buffer as the task's next version, then
// advances the engine (or empties the buffer, if the step was abandoned)
// and purges the reports the buffer took.
func (t *taskRun) stepAsync(ctx context.Context, r *roundRun, sc *aggregator.Staleness, mm *metricMean, buf *asyncBuffer) error {
	err := t.commit(ctx, r, sc, mm, fmt.Sprintf("buffer of %d reports full", len(buf.taken)), 0)
	if err != nil {
		// Left open: resumed, it is abandoned (runAsync), its sum being lost.
		return err
	}
	t.endBuffer(ctx, r.row.Round)
	t.purgeTaken(buf)
	return nil
}

// purgeTaken removes the reports a closed buffer took from the stream.
func (t *taskRun) purgeTaken(buf *asyncBuffer) {
	for _, tr := range buf.taken {
		// The report itself, not its subject: the subject may hold a later
		// message of the device, which the next buffer answers.
		t.afterRead(tr.device, func() {
			t.c.deleteStored(tr.seq)
			t.c.purgeStored(wire.ChunkSubject(t.id, tr.round, tr.device), 0)
		})
	}
}

// announceAsync wakes idle devices while seats are free: an async task
// wants devices whenever fewer than its concurrency train. Buffers may
// commit many times a second, and every announcement wakes every idle
// device listening: at most one goes out a pace window (which is also how
// soon a deferred device checks in again), for the round open then.
func (t *taskRun) announceAsync() {
	now := t.c.now()
	t.mu.Lock()
	a, r := t.async, t.round
	left := a.eng.Config().Concurrency - a.eng.Training()
	if r == nil || left <= 0 || a.later {
		t.mu.Unlock()
		return
	}
	if wait := a.announced.Add(t.c.d.PaceWindow).Sub(now); wait > 0 {
		a.later = true
		t.mu.Unlock()
		t.clock().AfterFunc(wait, func() {
			t.mu.Lock()
			a.later = false
			t.mu.Unlock()
			if t.c.ctx.Err() == nil {
				t.announceAsync()
			}
		})
		return
	}
	a.announced = now
	t.mu.Unlock()
	b, _ := proto.Marshal(&pb.RoundAnnouncement{TaskId: t.id, Round: r.row.Round, Kind: r.row.Kind,
		Wanted: uint32(left), CheckInSpread: durationpb.New(t.c.announceSpread()), Async: true})
	t.c.d.NC.Publish(wire.SubjectAnnounce, b)
}
