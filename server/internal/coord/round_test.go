package coord

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestRoundCommitsWeightedMean(t *testing.T) {
	h := newHarness(t)
	began := time.Now()
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	a, b, c := h.enroll("dev-a", 10), h.enroll("dev-b", 30), h.enroll("dev-c", 60)
	for i, d := range []*device{a, b, c} {
		plan := d.join()
		if plan.GetMaxUpdateNorm() <= 0 {
			t.Fatalf("plan carries no update norm bound: %v", plan.GetMaxUpdateNorm())
		}
		d.update(plan, constant(8, float32(i+1)/10), d.examples, map[string]float64{"loss": float64(i + 1)})
	}
	h.checkWeightedMean(task.Id, h.next(ev))
	for _, d := range []*device{a, b, c} {
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s refused: %s", d.id, r.Reason)
		}
	}
	t.Logf("a whole round on the fake clock took %v", time.Since(began))
}

// checkWeightedMean checks round 1 of TestRoundCommitsWeightedMean: three
// reports of 0.1, 0.2, 0.3 weighted 10, 30, 60 committed, and with loss
// the mean of the losses 1, 2, 3 they reported.
func (h *harness) checkWeightedMean(task string, got *pb.RoundEvent) {
	h.t.Helper()
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 3 {
		h.t.Fatalf("round 1: %v", got)
	}
	// (10·0.1 + 30·0.2 + 60·0.3) / 100 = 0.25; loss (10·1 + 30·2 + 60·3) / 100 = 2.5
	want := []float32{1.25, 2.25, 3.25, 4.25, 5.25, 6.25, 0.75, -0.25}
	for i, x := range h.current(task).Flatten() {
		if math.Abs(float64(x-want[i])) > 1e-6 {
			h.t.Fatalf("model[%d] = %v, want %v", i, x, want[i])
		}
	}
	if l := got.GetMetrics().GetValues()["train_loss"]; math.Abs(l-2.5) > 1e-12 {
		h.t.Fatalf("train_loss = %v", l)
	}
}

func TestSelectionTimeoutAbandonsThenRetries(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) { t.CohortTarget, t.ReportGoal = 2, 2 }))
	ev := h.watch(task.Id)
	a := h.enroll("dev-a", 5)
	a.join()
	h.clk.Advance(10 * time.Second) // selection timeout
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED ||
		!containsAll(got.Reason, "selection closed with 1 devices, below the report goal 2") {
		t.Fatalf("round 1: %v", got)
	}
	// The next round opens with a new number and takes the same device.
	h.awaitOpen(task.Id, 2)
	b := h.enroll("dev-b", 5)
	for _, d := range []*device{a, b} {
		plan := d.join()
		if plan.Round != 2 {
			t.Fatalf("plan for round %d", plan.Round)
		}
		d.update(plan, constant(8, 0.5), 5, nil)
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 2 {
		t.Fatalf("round 2: %v", got)
	}
}

func TestReportDeadlineCommitsWithDropout(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	devs := []*device{h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5)}
	plans := make([]*pb.RoundPlan, 3)
	for i, d := range devs {
		plans[i] = d.join()
	}
	for i, d := range devs[:2] {
		d.update(plans[i], constant(8, 0.1), 5, nil)
		if r := d.receipt(); !r.Accepted {
			t.Fatal(r.Reason)
		}
	}
	h.clk.Advance(30 * time.Second) // the report deadline
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 || got.Dropped != 1 ||
		got.Reason != "report deadline passed" {
		t.Fatalf("round 1: %v", got)
	}
	// The dropped device is too late now.
	devs[2].update(plans[2], constant(8, 0.1), 5, nil)
	if r := devs[2].receipt(); r.Accepted {
		t.Fatal("a report for a closed round was accepted")
	}
}

func TestReportGoalMissedAbandons(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	devs := []*device{h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5)}
	var first *pb.RoundPlan
	for i, d := range devs {
		p := d.join()
		if i == 0 {
			first = p
		}
	}
	devs[0].update(first, constant(8, 0.1), 5, nil)
	devs[0].receipt()
	before := h.current(task.Id).Flatten()
	h.clk.Advance(30 * time.Second)
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED ||
		!containsAll(got.Reason, "report deadline passed with 1 reports, below the report goal 2") {
		t.Fatalf("round 1: %v", got)
	}
	if after := h.current(task.Id).Flatten(); after[0] != before[0] {
		t.Fatal("an abandoned round changed the model")
	}
	h.awaitOpen(task.Id, 2)
}

func TestDPParticipationCapOnFakeClock(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) {
		t.CohortTarget, t.ReportGoal, t.RoundsTotal = 2, 2, 2
		t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
			TargetEpsilon: 1000, Delta: 1e-5, MaxRoundsPerDevice: 1}
	}))
	ev := h.watch(task.Id)
	a, b := h.enroll("dev-a", 5), h.enroll("dev-b", 5)
	for _, d := range []*device{a, b} {
		plan := d.join()
		if plan.GetDp() == nil || plan.GetMaxUpdateNorm() != 1 {
			t.Fatalf("DP plan: %v", plan)
		}
		d.update(plan, constant(8, 0.1), 5, nil)
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.EpsilonSpent <= 0 {
		t.Fatalf("round 1: %v", got)
	}
	h.awaitOpen(task.Id, 2)
	for _, d := range []*device{a, b} {
		r := d.checkIn().GetRetryAfter()
		if r == nil || r.Reason != pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE || !containsAll(r.Detail, "cap of 1 rounds") {
			t.Fatalf("%s at its cap: %v", d.id, r)
		}
	}
	h.clk.Advance(10 * time.Second)
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED ||
		!containsAll(got.Reason, "2 devices checked in but had reached the task's cap of 1 rounds each") {
		t.Fatalf("round 2: %v", got)
	}
}

// TestDPMinSeparation: with a minimum separation of 2 training steps, the
// devices of step 1 are refused at step 2 with the step they may return
// at, and take part again at step 3; the audit log lists each refusal,
// under the device's pseudonym, with the round's close.
func TestDPMinSeparation(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) {
		t.CohortTarget, t.ReportGoal, t.RoundsTotal = 2, 2, 3
		t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
			TargetEpsilon: 1000, Delta: 1e-5, MinSeparation: 2}
	}))
	ev := h.watch(task.Id)
	a, b, c, d := h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5), h.enroll("dev-d", 5)
	train := func(round uint64, devs ...*device) {
		t.Helper()
		for _, dv := range devs {
			dv.update(dv.join(), constant(8, 0.1), 5, nil)
		}
		if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != round {
			t.Fatalf("round %d: %v", round, got)
		}
		if round < 3 {
			h.awaitOpen(task.Id, round+1)
		}
	}
	train(1, a, b)
	for _, dv := range []*device{a, b} {
		r := dv.checkIn().GetRetryAfter()
		if r == nil || r.Reason != pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE ||
			!containsAll(r.Detail, "took part in training step 1", "minimum separation of 2 steps", "from step 3", "this round is step 2") {
			t.Fatalf("%s one step after its last: %v", dv.id, r)
		}
	}
	train(2, c, d)
	train(3, a, b) // two steps after step 1: welcome again
	var refused []audit.ParticipationRefused
	for _, p := range h.events(audit.TypeParticipationRefused) {
		refused = append(refused, p.(audit.ParticipationRefused))
	}
	if len(refused) != 1 {
		t.Fatalf("%d dp.participation_refused events, want 1 (round 2's): %+v", len(refused), refused)
	}
	pseudo := func(dv *device) string { p, _ := h.deps.Pseudonym(dv.id); return p }
	want := audit.ParticipationRefused{Task: task.Id, Round: 2, Step: 2, MinSeparation: 2, Devices: []audit.RefusedDevice{
		{Device: pseudo(a), Rule: audit.RuleMinSeparation, LastStep: 1}, {Device: pseudo(b), Rule: audit.RuleMinSeparation, LastStep: 1}}}
	slices.SortFunc(want.Devices, func(x, y audit.RefusedDevice) int { return strings.Compare(x.Device, y.Device) })
	slices.SortFunc(refused[0].Devices, func(x, y audit.RefusedDevice) int { return strings.Compare(x.Device, y.Device) })
	if !reflect.DeepEqual(refused[0], want) {
		t.Fatalf("recorded %+v, want %+v", refused[0], want)
	}
}

// TestLateNoticeOfAnsweredReport: the stored notice of a report that the
// round's runner took and answered can come after the round closed. The
// device has its receipt already; it must not get a second one saying the
// round is not open. A report stored after the close is still refused
// with a receipt.
func TestLateNoticeOfAnsweredReport(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	ev := h.watch(task.Id)
	devs, plans := h.joinCohort(3)
	for i, d := range devs {
		d.update(plans[i], constant(8, 0.1), d.examples, nil)
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("round 1: %v", got)
	}
	for _, d := range devs {
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s refused: %s", d.id, r.Reason)
		}
	}
	notice := func(round, seq uint64) *nats.Msg {
		m := nats.NewMsg(wire.SubjectStoredPrefix + wire.ReportSubject(task.Id, round, "dev-0"))
		m.Header.Set(jetstream.SequenceHeader, fmt.Sprint(seq))
		m.Header.Set(msgSizeHeader, "100")
		return m
	}
	// Round 1's reports were the stream's first messages: sequence 1 was
	// answered. Round 7 never opened: its report is refused.
	h.c.handleStored(notice(1, 1))
	h.c.handleStored(notice(7, 1<<40))
	// Receipts to one device arrive in the order they were sent.
	// The task's one round over, its runner may or may not have exited
	// yet: the refusal says "not open" or "no open round" accordingly.
	if r := devs[0].receipt(); r.Accepted || r.Round != 7 ||
		!strings.Contains(r.Reason, "is not open") && !strings.Contains(r.Reason, "has no open round (round 7)") {
		t.Fatalf("first receipt after the close: %v; want round 7's refusal, and none for round 1's answered report", r)
	}
}
