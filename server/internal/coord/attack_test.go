package coord

import (
	"math"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// One enrolled device turned hostile, against honest ones: each attack of
// docs/SECURITY.md ("A malicious enrolled device") at the coordinator.

func TestImpersonatedCheckInGetsNothing(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	mallory := h.enroll("mallory", 5)
	honest := []*device{h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5)}
	// Mallory's check-ins name other devices (offline ones, and an honest
	// one claiming one example) on her own subject: NATS lets her publish
	// on no other device's check-in subject.
	for _, victim := range []string{"offline-1", "offline-2", "dev-a"} {
		resp := mallory.checkInRaw("mallory", &pb.CheckIn{DeviceId: victim,
			Attributes: &pb.DeviceAttributes{ExamplesAvailable: 1, SupportedAbiVersions: mallory.attrs().SupportedAbiVersions}})
		r := resp.GetRetryAfter()
		if resp.GetPlan() != nil || r == nil || !containsAll(r.Detail, "a device checks in only as itself") {
			t.Fatalf("impersonating %s: %v", victim, resp)
		}
	}
	for _, d := range honest {
		plan := d.join()
		d.update(plan, constant(8, 0.1), 5, nil) // the victim reports its real count
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 3 {
		t.Fatalf("honest round: %v", got)
	}
}

func TestPoisonedUpdateRefusedByDefaultBound(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil)) // the CLI's defaults: no bound given
	ev := h.watch(task.Id)
	mallory, a, b := h.enroll("mallory", 5), h.enroll("dev-a", 5), h.enroll("dev-b", 5)
	plan := mallory.join()
	mallory.update(plan, constant(8, 1e30), 5, nil)
	if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, "norm") {
		t.Fatalf("1e30 update: %v", r)
	}
	for _, d := range []*device{a, b} {
		d.update(d.join(), constant(8, 0.1), 5, nil)
		d.receipt()
	}
	h.clk.Advance(30 * time.Second)
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("round: %v", got)
	}
	m := h.current(task.Id).Flatten()
	if i := floats.FirstNonFinite(m); i >= 0 || math.Abs(float64(m[0]-1.1)) > 1e-6 {
		t.Fatalf("model after the attack: %v", m)
	}
	row := h.round(task.Id, 1)
	if !containsAll(row.Failures["mallory"], "report refused", "norm") {
		t.Fatalf("round failures: %v", row.Failures)
	}
}

func TestExampleClaimIsCapped(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) {
		t.Aggregation.MaxExamplesPerReport = 100
	}))
	ev := h.watch(task.Id)
	mallory, a, b := h.enroll("mallory", 1<<40), h.enroll("dev-a", 10), h.enroll("dev-b", 10)
	mallory.update(mallory.join(), constant(8, 1), 1<<40, nil)
	for _, d := range []*device{a, b} {
		d.update(d.join(), constant(8, 0), 10, nil)
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("round: %v", got)
	}
	// Weighed as 100 examples, not 2^40: 100·1 / (100 + 10 + 10).
	if got, want := h.current(task.Id).Flatten()[0], float32(1+100.0/120); math.Abs(float64(got-want)) > 1e-6 {
		t.Fatalf("model[0] = %v, want %v", got, want)
	}
}

func TestOutOfRangeMetricRefusedWithReceipt(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	mallory, a, b := h.enroll("mallory", 5), h.enroll("dev-a", 5), h.enroll("dev-b", 5)
	plan := mallory.join()
	mallory.update(plan, constant(8, 0.1), 5, map[string]float64{"loss": 1.7e308})
	if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, `metric "loss"`) {
		t.Fatalf("1.7e308 loss: %v", r)
	}
	// Metrics are signed: changed after signing, the report is refused.
	rep := mallory.signedUpdate(plan, constant(8, 0.1), 5, map[string]float64{"loss": 9})
	rep.Metrics.Values["loss"] = 0.01
	// Another message id: the stream would drop a second copy of the first.
	mallory.publish(wire.ReportSubject(rep.TaskId, rep.Round, mallory.id), rep, "tampered")
	if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, "signature does not verify") {
		t.Fatalf("altered metrics: %v", r)
	}
	for _, d := range []*device{a, b} {
		d.update(d.join(), constant(8, 0.1), 5, map[string]float64{"loss": 0.5})
		d.receipt()
	}
	h.clk.Advance(30 * time.Second)
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.GetMetrics().GetValues()["train_loss"] != 0.5 {
		t.Fatalf("round: %v", got)
	}
	// Committed and audited together: the round's close, its model and its metrics.
	if len(h.events(audit.TypeModelEvaluated)) != 1 || len(h.events(audit.TypeModelCommitted)) != 1 {
		t.Fatalf("audit: %v", h.audited)
	}
}

func TestUnboundedTaskStillCommitsNoAbsurdModel(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) {
		t.Aggregation.UnboundedUpdates = true
		t.Aggregation.ServerLearningRate = 2
		t.CohortTarget, t.ReportGoal = 1, 1
	}))
	ev := h.watch(task.Id)
	mallory := h.enroll("mallory", 5)
	mallory.update(mallory.join(), constant(8, 3e38), 5, nil)
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED || !containsAll(got.Reason, "aggregation") {
		t.Fatalf("round: %v", got)
	}
	if m := h.current(task.Id).Flatten(); m[0] != 1 {
		t.Fatalf("model moved: %v", m)
	}
}

func TestEvaluationRoundSignedMetrics(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) { t.EvalEvery = 1 }))
	ev := h.watch(task.Id)
	devs := []*device{h.enroll("dev-a", 10), h.enroll("dev-b", 30), h.enroll("dev-c", 60)}
	for _, d := range devs {
		d.update(d.join(), constant(8, 0.1), d.examples, nil)
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("training round: %v", got)
	}
	h.awaitOpen(task.Id, 2)
	for i, d := range devs {
		plan := d.join()
		if plan.Kind != pb.RoundKind_ROUND_KIND_EVALUATE {
			t.Fatalf("round 2 is %v", plan.Kind)
		}
		d.evaluate(plan, d.examples, map[string]float64{"accuracy": float64(i+1) / 10})
	}
	got := h.next(ev)
	// (10·0.1 + 30·0.2 + 60·0.3) / 100
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || math.Abs(got.GetMetrics().GetValues()["eval_accuracy"]-0.25) > 1e-12 {
		t.Fatalf("evaluation round: %v", got)
	}
	evals := h.events(audit.TypeModelEvaluated)
	if len(evals) == 0 || evals[len(evals)-1].(audit.ModelEvaluated).Dataset != "federated:evaluate" {
		t.Fatalf("audit: %v", evals)
	}
}

func TestPlanFailureRecordedWithRound(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	a, b, c := h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5)
	pa, pb_, pc := a.join(), b.join(), c.join()
	if ack := c.fail(pc, "train: module ran out of memory"); !ack.Accepted {
		t.Fatalf("failure refused: %s", ack.Reason)
	}
	if ack := c.fail(pc, "again"); ack.Accepted {
		t.Fatal("a second failure report for the round was recorded")
	}
	if ack := a.fail(&pb.RoundPlan{TaskId: task.Id, Round: 7}, "stale"); ack.Accepted {
		t.Fatal("a failure for a round that is not open was recorded")
	}
	a.update(pa, constant(8, 0.1), 5, nil)
	b.update(pb_, constant(8, 0.1), 5, nil)
	a.receipt()
	b.receipt()
	h.clk.Advance(30 * time.Second)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("round: %v", got)
	}
	row := h.round(task.Id, 1)
	if len(row.Failures) != 1 || !containsAll(row.Failures["dev-c"], "after 3 attempts", "out of memory") {
		t.Fatalf("failures: %v", row.Failures)
	}
}

func TestCommitWaitsForTheAuditLog(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) { t.CohortTarget, t.ReportGoal = 1, 1 }))
	ev := h.watch(task.Id)
	h.mu.Lock()
	h.auditFails = 3
	h.mu.Unlock()
	a := h.enroll("dev-a", 5)
	a.update(a.join(), constant(8, 0.1), 5, nil)
	a.receipt()
	// Each failed append is retried after a back-off on the clock; until
	// one succeeds nothing is committed.
	h.until("the audit log recovers", func() bool {
		h.mu.Lock()
		left := h.auditFails
		h.mu.Unlock()
		if left > 0 {
			if r := h.round(task.Id, 1); r.State != pb.RoundState_ROUND_STATE_OPEN {
				t.Fatalf("round closed while its events were not recorded: %v", r.State)
			}
			h.clk.AdvanceToNext()
			return false
		}
		return true
	})
	h.until("the retry", func() bool {
		if len(h.events(audit.TypeRoundClosed)) == 0 {
			h.clk.AdvanceToNext()
			return false
		}
		return true
	})
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("round: %v", got)
	}
	if n := len(h.events(audit.TypeRoundClosed)); n != 1 {
		t.Fatalf("%d round.closed events", n)
	}
	if r := h.round(task.Id, 1); r.State != pb.RoundState_ROUND_STATE_COMMITTED {
		t.Fatalf("round state %v", r.State)
	}
}
