package coord

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// asyncTask is the harness's task in async mode: concurrency 4, buffers of
// 2, reports at most one version stale.
func (h *harness) asyncTask(rounds uint32) *pb.Task {
	task := h.baseTask(func(t *pb.Task) {
		t.RoundsTotal = rounds
		t.Async = &pb.AsyncConfig{Concurrency: 4, Buffer: 2, MaxStaleness: 1}
	})
	if err := CheckAsync(task); err != nil {
		h.t.Fatal(err)
	}
	return task
}

// modelMoved checks that the current model is the harness's base model
// plus delta everywhere.
func (h *harness) modelMoved(task string, delta float64) { h.modelMovedWithin(task, delta, 1e-6) }

// modelMovedWithin is modelMoved up to tol (a secure sum's quantization).
func (h *harness) modelMovedWithin(task string, delta, tol float64) {
	h.t.Helper()
	got := h.current(task).Flatten()
	base := h.model.Flatten()
	for i := range got {
		if want := float64(base[i]) + delta; math.Abs(float64(got[i])-want) > tol {
			h.t.Fatalf("model[%d] = %v, want %v (base %v + %v)", i, got[i], want, base[i], delta)
		}
	}
}

// TestAsyncBuffers: an async task seats devices on the current version up
// to its concurrency, commits a version every buffer of reports, weights a
// stale report by 1/√(1+s) within FedBuff's step Σ sₖwₖuₖ / Σ wₖ, and
// refuses a report more than max_staleness versions behind with a receipt
// on the report's own round, as it does one from a device without a seat.
func TestAsyncBuffers(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.asyncTask(3))
	ev := h.watch(task.Id)
	a, b, c, d, e := h.enroll("dev-a", 10), h.enroll("dev-b", 10), h.enroll("dev-c", 10), h.enroll("dev-d", 10), h.enroll("dev-e", 10)
	pa, pb1, pc, pd := a.join(), b.join(), c.join(), d.join()
	for _, p := range []*pb.RoundPlan{pa, pb1, pc, pd} {
		if p.Round != 1 {
			t.Fatalf("plan of round %d, want 1", p.Round)
		}
	}
	if got := e.checkIn().GetRetryAfter(); got == nil || !strings.Contains(got.Detail, "concurrency") {
		t.Fatalf("a fifth device with four training: %v", got)
	}
	// Version 1: two fresh reports.
	a.update(pa, constant(8, 0.1), 10, map[string]float64{"loss": 1})
	b.update(pb1, constant(8, 0.2), 10, map[string]float64{"loss": 3})
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("buffer 1: %v", got)
	}
	if m := got.GetMetrics().GetValues(); m["async_staleness_mean"] != 0 || m["async_training"] != 2 || m["train_loss"] != 2 {
		t.Fatalf("buffer 1 metrics: %v", m)
	}
	h.modelMoved(task.Id, 0.15)
	for _, dev := range []*device{a, b} {
		if r := dev.receipt(); !r.Accepted || r.Round != 1 {
			t.Fatalf("%s: %v", dev.id, r)
		}
	}
	// a sends its report again (another message id, past the stream's
	// de-duplication): its seat is spent.
	a.publish(wire.ReportSubject(task.Id, 1, a.id), a.signedUpdate(pa, constant(8, 0.1), 10, nil), "again")
	if r := a.receipt(); r.Accepted || !strings.Contains(r.Reason, "holds no seat") {
		t.Fatalf("a second report on a spent seat: %v", r)
	}

	// Version 2: c's report on version 0 is one step stale; a trains again
	// on version 1.
	h.awaitOpen(task.Id, 2)
	c.update(pc, constant(8, 0.3), 10, nil)
	if r := c.receipt(); !r.Accepted || r.Round != 1 {
		t.Fatalf("c, one version stale: %v", r)
	}
	if got := c.checkIn().GetRetryAfter(); got == nil || !strings.Contains(got.Detail, "buffer") {
		t.Fatalf("c checked in with its report in the buffer: %v", got)
	}
	pa2 := a.join()
	if pa2.Round != 2 || pa2.GetModel().GetVersion() == pa.GetModel().GetVersion() {
		t.Fatalf("a's second plan: round %d on %s", pa2.Round, pa2.GetModel().GetVersion())
	}
	a.update(pa2, constant(8, 0.4), 10, nil)
	got = h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("buffer 2: %v", got)
	}
	if m := got.GetMetrics().GetValues(); m["async_staleness_mean"] != 0.5 || m["async_staleness_max"] != 1 {
		t.Fatalf("buffer 2 metrics: %v", m)
	}
	h.modelMoved(task.Id, 0.15+(0.3/math.Sqrt2+0.4)/2)
	a.receipt()

	// Version 3: d's report on version 0 is two versions behind.
	h.awaitOpen(task.Id, 3)
	d.update(pd, constant(8, 0.5), 10, nil)
	r := d.receipt()
	if r.Accepted || r.Round != 1 || !strings.Contains(r.Reason, "2 versions behind the current 2") || !strings.Contains(r.Reason, "at most 1 behind") {
		t.Fatalf("stale report: %v", r)
	}
	// f holds no seat: its report on the open round is refused; one on a
	// round whose plans are all in is not open.
	f := h.enroll("dev-f", 10)
	f.update(&pb.RoundPlan{TaskId: task.Id, Round: 3, Model: pa2.Model, Module: pa2.Module}, constant(8, 0.5), 10, nil)
	if r := f.receipt(); r.Accepted || !strings.Contains(r.Reason, "holds no seat") {
		t.Fatalf("a report without a seat: %v", r)
	}
	// Round 2 stops taking reports when its buffer's step has pruned it,
	// just after the commit the test saw: wait for that, not for luck.
	h.until("round 2 closed to reports", func() bool {
		h.c.mu.Lock()
		tr := h.c.tasks[task.Id]
		h.c.mu.Unlock()
		return tr != nil && !tr.isOpen(2)
	})
	f.update(&pb.RoundPlan{TaskId: task.Id, Round: 2, Model: pa2.Model, Module: pa2.Module}, constant(8, 0.5), 10, nil)
	if r := f.receipt(); r.Accepted || !strings.Contains(r.Reason, "round 2 of task \"t-test\" is not open") {
		t.Fatalf("a report on a round without plans: %v", r)
	}
	// d and e train version 2 and finish the task.
	pd2, pe := d.join(), e.join()
	d.update(pd2, constant(8, 0.1), 10, nil)
	e.update(pe, constant(8, 0.1), 10, nil)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 3 {
		t.Fatalf("buffer 3: %v", got)
	}
	h.modelMoved(task.Id, 0.15+(0.3/math.Sqrt2+0.4)/2+0.1)
	h.until("task completed", func() bool {
		row, err := h.st.Task(h.t.Context(), task.Id)
		return err == nil && row.State == pb.TaskState_TASK_STATE_COMPLETED
	})
}

// TestAsyncSeats: a device that says it cannot train frees its seat at
// once; one that stays silent frees it at its report deadline; neither
// holds up a buffer.
func TestAsyncSeats(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) {
		t.Async = &pb.AsyncConfig{Concurrency: 2, Buffer: 1, MaxStaleness: 3}
		t.RoundsTotal = 2
	}))
	ev := h.watch(task.Id)
	a, b, c := h.enroll("dev-a", 10), h.enroll("dev-b", 10), h.enroll("dev-c", 10)
	pa, _ := a.join(), b.join()
	if c.checkIn().GetPlan() != nil {
		t.Fatal("a third seat with concurrency 2")
	}
	if ack := a.fail(pa, "out of memory"); !ack.Accepted {
		t.Fatalf("failure: %v", ack)
	}
	c.join() // a's seat
	// b and c stay silent past their report deadline: their seats free.
	h.clk.Advance(21 * time.Second)
	h.until("the seats released", func() bool { return a.checkIn().GetPlan() != nil })
	pc := c.join()
	c.update(pc, constant(8, 0.1), 10, nil)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("buffer 1: %v", got)
	}
}

// TestCheckAsync: what an async task cannot have is refused with what to
// do, and its cohort becomes its buffer.
func TestCheckAsync(t *testing.T) {
	base := func(mod func(*pb.Task)) *pb.Task {
		t := &pb.Task{CohortTarget: 50, ReportGoal: 40, OverSelection: 0.3,
			Async: &pb.AsyncConfig{Concurrency: 20, Buffer: 5, MaxStaleness: 4}}
		if mod != nil {
			mod(t)
		}
		return t
	}
	ok := base(nil)
	if err := CheckAsync(ok); err != nil || ok.CohortTarget != 5 || ok.ReportGoal != 5 || ok.OverSelection != 0 {
		t.Fatalf("%v: cohort %d, goal %d, over-selection %v", err, ok.CohortTarget, ok.ReportGoal, ok.OverSelection)
	}
	for _, tc := range []struct {
		mod  func(*pb.Task)
		want string
	}{
		{func(t *pb.Task) { t.Async.Buffer = 30 }, "buffer of 30"},
		{func(t *pb.Task) { t.Async.MaxStaleness = 5000 }, "max staleness"},
		{func(t *pb.Task) { t.Async.Concurrency = 0 }, "concurrency 0"},
		{func(t *pb.Task) { t.EvalEvery = 2 }, "--server-eval-dataset"},
		{func(t *pb.Task) {
			t.Aggregation = &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_MEDIAN}
		}, "streaming rules"},
		{func(t *pb.Task) {
			t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, TargetUnclippedQuantile: 0.5}
		}, "--dp-clip"},
	} {
		if err := CheckAsync(base(tc.mod)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

// readyCheckIn checks d in saying it holds the update of its plan of round.
func (d *device) readyCheckIn(round uint64) *pb.CheckInResponse {
	return d.checkInRaw(d.id, &pb.CheckIn{DeviceId: d.id, Attributes: d.attrs(),
		Ready: &pb.AsyncReady{TaskId: "t-test", Round: round}})
}

// TestAsyncSecureBuffers: in a secure async task a device trains on a plan
// without SecAgg settings and holds its update; checking in with it, it
// joins the open buffer's SecAgg+ group (a seat of the round's cohort)
// with a plan naming its training round and its staleness weight; the
// buffer commits the group's unmasked sum. A full group turns a held
// update away to the next buffer, and one more than max_staleness versions
// old is refused with a receipt on its training round, its device handed a
// new training plan.
func TestAsyncSecureBuffers(t *testing.T) {
	h := newHarness(t)
	task := h.asyncTask(3)
	task.Secagg = &pb.SecAggConfig{ClipRange: 1, MaxWeight: 10, StageTimeout: durationpb.New(5 * time.Second)}
	task = h.start(task)
	ev := h.watch(task.Id)
	a, b, c, d := h.enroll("dev-a", 10), h.enroll("dev-b", 10), h.enroll("dev-c", 10), h.enroll("dev-d", 10)
	train := map[*device]*pb.RoundPlan{}
	for _, dev := range []*device{a, b, c, d} {
		p := dev.join()
		if p.GetAsyncStage() != pb.AsyncStage_ASYNC_STAGE_TRAIN || p.GetSecagg() != nil || p.Round != 1 {
			t.Fatalf("%s's training plan: stage %v, secagg %v, round %d", dev.id, p.GetAsyncStage(), p.GetSecagg(), p.Round)
		}
		train[dev] = p
	}
	join := func(dev *device, round uint64, weight float64) *pb.RoundPlan {
		t.Helper()
		p := dev.readyCheckIn(round).GetPlan()
		if p.GetAsyncStage() != pb.AsyncStage_ASYNC_STAGE_AGGREGATE || p.GetSecagg() == nil || p.GetTrainedRound() != round ||
			math.Abs(p.GetStalenessWeight()-weight) > 1e-12 {
			t.Fatalf("%s's group plan: %v", dev.id, p)
		}
		return p
	}
	acked := make(chan string, 64)
	// Version 1: a and b form the group; c finds it full.
	ga, gb := join(a, 1, 1), join(b, 1, 1)
	if r := c.readyCheckIn(1).GetRetryAfter(); r == nil || !strings.Contains(r.Detail, "group is full") {
		t.Fatalf("c with the group full: %v", r)
	}
	da, db := a.secure(ga, constant(8, 0.1), 1, "", acked), b.secure(gb, constant(8, 0.3), 1, "", acked)
	for _, done := range []<-chan error{da, db} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("buffer 1: %v", got)
	}
	h.modelMoved(task.Id, 0.2)

	// Version 2: c's update is one version stale and masked at 1/√2; a
	// trains again on version 1.
	h.awaitOpen(task.Id, 2)
	gc := join(c, 1, 1/math.Sqrt2)
	pa := a.join()
	if pa.Round != 2 || pa.GetAsyncStage() != pb.AsyncStage_ASYNC_STAGE_TRAIN {
		t.Fatalf("a's second training plan: %v", pa)
	}
	ga = join(a, 2, 1)
	// The device scales its clipped update by the weight before masking,
	// as the agent does (edge heldInput).
	dc, da := c.secure(gc, constant(8, float32(0.4/math.Sqrt2)), 1, "", acked), a.secure(ga, constant(8, 0.1), 1, "", acked)
	for _, done := range []<-chan error{dc, da} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.GetMetrics().GetValues()["async_staleness_max"] != 1 {
		t.Fatalf("buffer 2: %v", got)
	}
	h.modelMovedWithin(task.Id, 0.2+(0.4/math.Sqrt2+0.1)/2, 1e-3)

	// Version 3: d trained on version 0, two behind.
	h.awaitOpen(task.Id, 3)
	if p := d.readyCheckIn(1).GetPlan(); p.GetAsyncStage() != pb.AsyncStage_ASYNC_STAGE_TRAIN || p.Round != 3 {
		t.Fatalf("d's stale update: not a new training plan but %v", p)
	}
	if r := d.receipt(); r.Accepted || r.Round != 1 || !strings.Contains(r.Reason, "2 versions behind the current 2") {
		t.Fatalf("d's receipt: %v", r)
	}
}

// TestAsyncRestart: a restart loses the open buffer's sum: the buffer is
// abandoned with the reason, the seats are forgotten (a report of a plan
// handed before answers "check in"), and the next buffer commits from new
// check-ins on the same version.
func TestAsyncRestart(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.asyncTask(1))
	a, b, c := h.enroll("dev-a", 10), h.enroll("dev-b", 10), h.enroll("dev-c", 10)
	pa, pb1 := a.join(), b.join()
	a.update(pa, constant(8, 0.5), 10, nil)
	if r := a.receipt(); !r.Accepted {
		t.Fatalf("a: %v", r)
	}
	h.c.Shutdown()
	h.restart()
	h.awaitOpen(task.Id, 2)
	if r := h.round(task.Id, 1); r.State != pb.RoundState_ROUND_STATE_ABANDONED || !strings.Contains(r.Reason, "reports it held are lost") {
		t.Fatalf("round 1 after the restart: %v %q", r.State, r.Reason)
	}
	ev := h.watch(task.Id)
	b.update(pb1, constant(8, 0.5), 10, nil)
	if r := b.receipt(); r.Accepted {
		t.Fatalf("b's report on a plan from before the restart: %v", r)
	}
	p2, p3 := b.join(), c.join()
	if p2.Round != 2 || p2.GetModel().GetVersion() != pa.GetModel().GetVersion() {
		t.Fatalf("b's plan after the restart: round %d on %s", p2.Round, p2.GetModel().GetVersion())
	}
	b.update(p2, constant(8, 0.1), 10, nil)
	c.update(p3, constant(8, 0.3), 10, nil)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 2 {
		t.Fatalf("buffer 2: %v", got)
	}
	h.modelMoved(task.Id, 0.2)
}

// TestAsyncDPParticipation: an async task with central DP noises and
// accounts every step, and its participation cap holds across buffers: a
// device that contributed to its cap of steps gets no seat again.
func TestAsyncDPParticipation(t *testing.T) {
	h := newHarness(t)
	task := h.asyncTask(2)
	task.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
		TargetEpsilon: 1000, Delta: 1e-5, MaxRoundsPerDevice: 1}
	task = h.start(task)
	ev := h.watch(task.Id)
	a, b := h.enroll("dev-a", 5), h.enroll("dev-b", 5)
	for _, d := range []*device{a, b} {
		p := d.join()
		if p.GetDp() == nil || p.GetMaxUpdateNorm() != 1 {
			t.Fatalf("DP plan: %v", p)
		}
		d.update(p, constant(8, 0.1), 5, nil)
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.EpsilonSpent <= 0 {
		t.Fatalf("buffer 1: %v", got)
	}
	if n := len(h.events(audit.TypePrivacySpent)); n != 1 {
		t.Fatalf("%d dp.spent events after one step", n)
	}
	h.awaitOpen(task.Id, 2)
	for _, d := range []*device{a, b} {
		if r := d.checkIn().GetRetryAfter(); r == nil || r.Reason != pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE || !containsAll(r.Detail, "cap of 1 rounds") {
			t.Fatalf("%s at its cap: %v", d.id, r)
		}
	}
}

// TestAsyncStopPurgesBacklog: stopping an async task drops the reports
// of every round's plans from the stream, not only the open round's: here
// one that trained on round 1's plan and waits in round 2's buffer.
func TestAsyncStopPurgesBacklog(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.asyncTask(3))
	ev := h.watch(task.Id)
	a, b, c := h.enroll("dev-a", 10), h.enroll("dev-b", 10), h.enroll("dev-c", 10)
	pa, pb1, pc := a.join(), b.join(), c.join()
	a.update(pa, constant(8, 0.1), 10, nil)
	b.update(pb1, constant(8, 0.1), 10, nil)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("buffer 1: %v", got)
	}
	h.awaitOpen(task.Id, 2)
	c.update(pc, constant(8, 0.1), 10, nil)
	if r := c.receipt(); !r.Accepted || r.Round != 1 {
		t.Fatalf("c: %v", r)
	}
	stream, err := h.js.Stream(t.Context(), wire.StreamReports)
	if err != nil {
		t.Fatal(err)
	}
	count := func() uint64 {
		info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(wire.TaskReportFilter(task.Id)))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	h.until("buffer 1's reports purged", func() bool { return count() == 1 })
	if err := h.c.StopTask(t.Context(), task.Id, "test"); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d reports left after the stop", n)
	}
}

// TestAsyncCompletionPurgesBacklog: a report still waiting when the last
// buffer commits is dropped from the stream with the task's completion.
func TestAsyncCompletionPurgesBacklog(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.asyncTask(1))
	a, b, c := h.enroll("dev-a", 10), h.enroll("dev-b", 10), h.enroll("dev-c", 10)
	pa, pb1, pc := a.join(), b.join(), c.join()
	for _, d := range []struct {
		dev  *device
		plan *pb.RoundPlan
	}{{a, pa}, {b, pb1}, {c, pc}} {
		d.dev.update(d.plan, constant(8, 0.1), 10, nil)
	}
	h.until("task completed", func() bool {
		row, err := h.st.Task(h.t.Context(), task.Id)
		return err == nil && row.State == pb.TaskState_TASK_STATE_COMPLETED
	})
	stream, err := h.js.Stream(t.Context(), wire.StreamReports)
	if err != nil {
		t.Fatal(err)
	}
	h.until("the task's reports purged", func() bool {
		info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(wire.TaskReportFilter(task.Id)))
		return err == nil && info.State.Msgs == 0
	})
}
