package coord

import (
	"math"
	"strings"
	"testing"
	"time"

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
func (h *harness) modelMoved(task string, delta float64) {
	h.t.Helper()
	got := h.current(task).Flatten()
	base := h.model.Flatten()
	for i := range got {
		if want := float64(base[i]) + delta; math.Abs(float64(got[i])-want) > 1e-6 {
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
		{func(t *pb.Task) { t.Secagg = &pb.SecAggConfig{} }, "secure aggregation"},
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
