package coord

import (
	"context"
	"crypto/ed25519"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// runRound sets a round up (cohort, collector, report consumer), then runs
// its plaintext or secure loop. It returns nil once the round is closed in
// the store; an error leaves it open, to be resumed.
func (t *taskRun) runRound(ctx context.Context, row *store.RoundRow) error {
	if done, err := t.resumePending(ctx, row.Round); done || err != nil {
		return err
	}
	if t.global.Lineage.Version != row.BaseModel {
		m, err := t.loadModel(ctx, row.BaseModel)
		if err != nil {
			return err
		}
		t.global = m
		t.holdModel()
	}
	if t.async != nil && !t.secure(row.Kind) {
		return t.runAsync(ctx, row)
	}
	if t.async != nil {
		// A secure buffer runs as a secure round whose cohort is the
		// devices holding trained updates (joinSecure); the engine steps
		// with its commit.
		if lost := t.beginBuffer(row.Round); lost {
			r := &roundRun{row: row, kick: make(chan struct{}, 1)}
			r.cohort = round.NewCohort(round.CohortConfig{Round: row.Round, Wanted: t.wanted(), Pace: t.c.d.PaceWindow}, t.c.now(), nil)
			return t.abandon(ctx, r, errBufferLost)
		}
		defer t.endBuffer(ctx, row.Round)
	}
	assigned, err := t.c.d.Store.Assignments(ctx, t.id, row.Round)
	if err != nil {
		return err
	}
	now := t.c.now()
	keys := map[string]ed25519.PublicKey{}
	seats := make(map[string]round.Seat, len(assigned))
	for d, a := range assigned {
		seats[d] = round.Seat{Participant: a.Participant, Examples: a.Examples}
		// A cohort resumed after a restart: its devices were vouched for
		// when selected; one revoked since is refused now.
		if k, _ := t.c.deviceKey(ctx, d); k != nil {
			keys[d] = k
		}
	}
	r := &roundRun{row: row, plan: t.plan(row), keys: keys,
		selEnd: row.Open.Add(t.selectionTimeout()), kick: make(chan struct{}, 1)}
	if t.async != nil {
		// The group forms from devices that train first.
		r.selEnd = r.selEnd.Add(t.reportTimeout())
	}
	r.cohort = round.NewCohort(round.CohortConfig{Round: row.Round, Wanted: t.wanted(), SelectionEnd: r.selEnd,
		Deadline: row.Deadline, Pace: t.c.d.PaceWindow}, now, seats)

	var col aggregator.Collector
	if row.Kind == pb.RoundKind_ROUND_KIND_TRAIN {
		bound := t.normBound()
		if t.secure(row.Kind) {
			// Devices clip before masking; the sum's bound is checked at
			// commit, past the quantization error.
			bound = 0
		}
		if col, err = t.rule.NewCollector(bound); err != nil {
			return fmt.Errorf("round %d: %w", row.Round, err)
		}
		// The sum: float64s, or for the robust rules a float32 row per report.
		dim := int64(t.ulayout.Size())
		n := 8 * dim
		if !t.rule.Kind().Streaming() {
			n = 4 * dim * int64(r.cohort.Wanted())
		}
		if t.secure(row.Kind) {
			n += 4 * dim * int64(t.secureGroupCount(r.cohort.Wanted())) // each group's masked sum
		}
		t.hold("round", n)
		defer t.hold("round", 0)
	}
	if t.secure(row.Kind) {
		if len(assigned) > 0 {
			return t.abandon(ctx, r, errSecureResume.Error())
		}
		if r.secure, err = t.newSecureRun(row.Round, row.Seed, r.cohort.Wanted(), t.ulayout.Size()); err != nil {
			return t.abandon(ctx, r, fmt.Sprintf("secure aggregation: %v", err))
		}
		r.plan.Secagg = r.secure.cfg
	}

	msgs := make(chan jetstream.Msg, 256)
	if t.sharded(r) {
		r.shard = newShardRun()
	}
	cons, drop, err := t.reportConsumer(ctx, row.Round, r.shard != nil)
	if err != nil {
		return err
	}
	defer drop()
	stop, err := t.pull(ctx, cons, row.Round, msgs)
	if err != nil {
		return err
	}
	defer stop()

	var parts map[string]store.Participation
	if t.dp.limitsParticipation() {
		if parts, err = t.c.d.Store.Participations(ctx, t.id); err != nil {
			return err
		}
		task, err := t.c.d.Store.Task(ctx, t.id)
		if err != nil {
			return err
		}
		r.step = uint64(task.TrainRounds) + 1
	}
	// The spans exist before check-ins can see the round.
	t.traceRound(ctx, r)
	defer t.endSpans(r)
	defer t.openForCheckIns(r, parts, uint32(len(assigned)))()
	if t.async != nil {
		t.announceAsync()
	} else {
		t.announce(r)
	}
	if r.secure != nil {
		return t.runSecure(ctx, r, col, msgs)
	}
	return t.runPlain(ctx, r, col, msgs)
}

// openForCheckIns makes r the open round, the one check-ins see, and tells
// watchers it opened with assigned seats; the returned func ends that.
func (t *taskRun) openForCheckIns(r *roundRun, parts map[string]store.Participation, assigned uint32) (closed func()) {
	t.mu.Lock()
	t.round, t.loading, t.parts = r, false, parts
	t.mu.Unlock()
	t.c.d.Metrics.OpenRounds.Inc()
	t.c.emit(&pb.RoundEvent{TaskId: t.id, Round: r.row.Round, Type: pb.RoundEventType_ROUND_EVENT_TYPE_OPENED, Kind: r.row.Kind,
		Time: timestamppb.New(t.c.now()), Assigned: assigned})
	return func() {
		t.c.d.Metrics.OpenRounds.Dec()
		t.mu.Lock()
		t.closeRun(r)
		t.mu.Unlock()
	}
}

// runPlain consumes a plaintext round's reports until a close condition,
// then commits or abandons.
func (t *taskRun) runPlain(ctx context.Context, r *roundRun, col aggregator.Collector, msgs <-chan jetstream.Msg) error {
	now := t.c.now()
	selTimer := t.clock().NewTimer(max(0, r.selEnd.Sub(now)))
	defer selTimer.Stop()
	deadline := t.clock().NewTimer(max(0, r.row.Deadline.Sub(now)))
	defer deadline.Stop()
	mm := newMetricMean()
	deadlinePassed := false
	var answers chan shardReply
	if r.shard != nil {
		answers = r.shard.answers
		defer t.releaseShard(r.shard)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err() // the round stays open, to be resumed
		case m := <-r.shard.room(msgs):
			t.handleReport(ctx, r, col, mm, m)
		case a := <-answers:
			t.settleShard(ctx, r, col, mm, a)
		case <-r.kick:
		case <-selTimer.C():
			if why := t.endSelection(r, 0); why != "" {
				return t.abandonShort(ctx, r, why)
			}
		case <-deadline.C():
			deadlinePassed = true
			t.mu.Lock()
			r.waitedOut = true
			t.mu.Unlock()
			// Reports already delivered arrived in time; count them.
			for drained := false; !drained; {
				select {
				case m := <-r.shard.room(msgs):
					t.handleReport(ctx, r, col, mm, m)
				case a := <-answers:
					t.settleShard(ctx, r, col, mm, a)
				default:
					drained = r.shard == nil || len(r.shard.pending) == 0
					if !drained {
						if err := t.awaitShards(ctx, r, col, mm); err != nil {
							return err
						}
					}
				}
			}
		}
		if r.lost != "" {
			return t.abandon(ctx, r, r.lost)
		}
		t.mu.Lock()
		// A device whose plan failed or whose report was refused is not
		// waited for: only its silence could hold the round to its deadline.
		p := r.cohort.Plain(int(t.spec.GetCohortTarget()), int(t.spec.GetReportGoal()), deadlinePassed)
		if !p.Selecting {
			r.selectionDone(p.Assigned)
		}
		t.mu.Unlock()
		switch outcome, reason, short := p.Decide(); outcome {
		case round.Commit:
			if r.shard != nil {
				// Reports out with workers may count yet.
				if len(r.shard.pending) > 0 {
					continue
				}
				if err := t.gatherShards(ctx, r, col); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					return t.abandon(ctx, r, fmt.Sprintf("the sum lacks reports its aggregation workers added: %v", err))
				}
			}
			return t.commit(ctx, r, col, mm, reason, 0)
		case round.Abandon:
			return t.abandonAs(ctx, r, reason, short)
		}
	}
}

// endSelection closes selection when its timeout fires. It returns why the
// round must be abandoned: fewer devices than the report goal (or, for
// secure rounds, than minCohort) took a seat.
func (t *taskRun) endSelection(r *roundRun, minCohort int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	why := r.cohort.CloseSelection(int(t.spec.GetReportGoal()), minCohort, t.dp.maxRounds())
	r.selectionDone(r.cohort.Assigned())
	return why
}

// announce wakes idle devices: a round wants members.
func (t *taskRun) announce(r *roundRun) {
	// Check-ins may fill the cohort from the moment the round is open.
	t.mu.Lock()
	selecting, left := r.cohort.Selecting(), r.cohort.Wanted()-r.cohort.Assigned()
	t.mu.Unlock()
	if !selecting || left <= 0 {
		return
	}
	b, _ := proto.Marshal(&pb.RoundAnnouncement{TaskId: t.id, Round: r.row.Round, Kind: r.row.Kind,
		Wanted: uint32(left), CheckInSpread: durationpb.New(t.c.announceSpread())})
	t.c.d.NC.Publish(wire.SubjectAnnounce, b)
}

// handleReport validates one report and counts it, or refuses it with a
// receipt; in a sharded round an update goes to the workers.
func (t *taskRun) handleReport(ctx context.Context, r *roundRun, col aggregator.Collector, mm *metricMean, m jetstream.Msg) {
	if wire.IsEvalSubject(m.Subject()) {
		if r.shard != nil {
			full, err := t.fullMsg(m)
			if err != nil {
				t.settle(r, m, "evaluation", func() (string, error) { return "", err })
				return
			}
			m = full
		}
		t.settleChunked(r, m, "evaluation", func(m jetstream.Msg) (string, error) { return t.acceptReport(r, mm, m) })
		return
	}
	if r.shard != nil {
		t.dispatch(ctx, r, col, mm, m)
		return
	}
	t.settle(r, m, "update", func() (string, error) { return t.acceptUpdate(r, col, mm, m) })
}

// settle counts a report's bytes, runs accept, and answers the device with a
// receipt: accepted, or refused with accept's reason, which the round keeps
// as the device's failure (its first).
func (t *taskRun) settle(r *roundRun, m jetstream.Msg, kind string, accept func() (string, error)) {
	t.settleAt(r, m, kind, r.row.Round, accept)
}

// settleAt is settle for a report of round rnd: an asynchronous buffer
// takes reports of the earlier rounds whose plans their devices trained.
func (t *taskRun) settleAt(r *roundRun, m jetstream.Msg, kind string, rnd uint64, accept func() (string, error)) {
	defer t.c.d.Memory.Refresh() // what else is live moves as reports stream through
	t.c.d.Metrics.ReportBytes.Add(float64(storedSize(m)))
	span := t.validation(r, kind, m.Headers())
	device, err := accept()
	endValidation(span, device, err)
	if md, merr := m.Metadata(); merr == nil && md.Sequence.Stream > r.answeredSeq {
		r.answeredSeq = md.Sequence.Stream
	}
	if err != nil {
		t.c.d.Metrics.Reports.WithLabelValues(kind, "refused").Inc()
		t.c.d.Metrics.Refused(refusalReason(err))
		t.log().Info("report refused", "round", rnd, "device", device, "err", err)
		t.c.receipt(t.id, rnd, device, err.Error())
		t.noteFailure(r, device, "report refused: "+err.Error())
		return
	}
	t.c.d.Metrics.Reports.WithLabelValues(kind, "accepted").Inc()
	t.c.receipt(t.id, rnd, device, "")
}
