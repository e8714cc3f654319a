package coord

import (
	"strings"
	"testing"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestSilentSeatSitsOut: a device that holds a seat in silence through a
// round that waits out its deadline sits out the next round (then 2, 4 …
// after further silent seats); a device whose plan failed is not waited for
// and not benched; one that reports again has its record cleared.
func TestSilentSeatSitsOut(t *testing.T) {
	h := newHarness(t)
	a, b, c := h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5)
	// Three seats, all needed: the cohort target is every seat.
	task := h.start(h.baseTask(func(t *pb.Task) { t.RoundsTotal, t.CohortTarget, t.ReportGoal = 10, 3, 2 }))
	ev := h.watch(task.Id)

	// Round 1: a and c report, b holds its seat in silence: the round waits
	// for its deadline.
	pa, pb1, pc := a.join(), b.join(), c.join()
	_ = pb1
	a.update(pa, constant(8, 0.1), 5, nil)
	c.update(pc, constant(8, 0.1), 5, nil)
	a.receipt()
	c.receipt()
	h.clk.Advance(30 * time.Second) // selection timeout and report timeout
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 1 || got.Reported != 2 {
		t.Fatalf("round 1: %v", got)
	}

	// Round 2: b sits out; d takes the third seat and its plan fails: the
	// round closes when a and c have reported, without waiting.
	h.awaitOpen(task.Id, 2)
	resp := b.checkIn()
	if r := resp.GetRetryAfter(); r == nil || r.Reason != pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE ||
		!strings.Contains(r.Detail, "held a seat in round 1 without reporting or failing") || !strings.Contains(r.Detail, "up to 2") {
		t.Fatalf("dev-b at round 2: %v, want it sitting the round out", resp)
	}
	d := h.enroll("dev-d", 5)
	pd := d.join()
	if ack := d.fail(pd, "out of memory"); !ack.Accepted {
		t.Fatalf("failure refused: %v", ack)
	}
	pa, pc = a.join(), c.join()
	a.update(pa, constant(8, 0.1), 5, nil)
	c.update(pc, constant(8, 0.1), 5, nil)
	a.receipt()
	c.receipt()
	got := h.next(ev)
	if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 2 || !strings.Contains(got.Reason, "reported or failed") {
		t.Fatalf("round 2: %v, want committed before its deadline", got)
	}

	// Round 3: b is back (and d, whose plan failed, was never benched); b is
	// silent again: it sits out rounds 4 and 5.
	h.awaitOpen(task.Id, 3)
	b.join()
	pa, pd = a.join(), d.join()
	a.update(pa, constant(8, 0.1), 5, nil)
	d.update(pd, constant(8, 0.1), 5, nil)
	a.receipt()
	d.receipt()
	h.clk.Advance(30 * time.Second) // selection timeout and report timeout
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 3 {
		t.Fatalf("round 3: %v", got)
	}
	for n := uint64(4); n <= 5; n++ {
		h.awaitOpen(task.Id, n)
		if r := b.checkIn().GetRetryAfter(); r == nil || !strings.Contains(r.Detail, "held a seat in round 3") || !strings.Contains(r.Detail, "up to 5") {
			t.Fatalf("dev-b at round %d: %v, want it sitting out up to round 5", n, r)
		}
		for _, x := range []*device{a, c, d} {
			x.update(x.join(), constant(8, 0.1), 5, nil)
			x.receipt()
		}
		if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != n {
			t.Fatalf("round %d: %v", n, got)
		}
	}

	// Round 6: b reports, which clears its record.
	h.awaitOpen(task.Id, 6)
	for _, x := range []*device{a, b, c} {
		x.update(x.join(), constant(8, 0.1), 5, nil)
		x.receipt()
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 6 {
		t.Fatalf("round 6: %v", got)
	}
	h.awaitOpen(task.Id, 7)
	if resp := b.checkIn(); resp.GetPlan() == nil {
		t.Fatalf("dev-b at round 7, after reporting: %v", resp.GetRetryAfter())
	}
}
