package coord

import (
	"math"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func adaptiveTask(h *harness) *pb.Task {
	return h.baseTask(func(t *pb.Task) {
		t.CohortTarget, t.ReportGoal, t.RoundsTotal = 2, 2, 3
		// Count noise σ_b = 0.12 on two reports: b̄ is within 0.06 of the
		// fraction unclipped, 8σ from the target 0.5 either way.
		t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 0.2,
			TargetEpsilon: 1e6, Delta: 1e-6, TargetUnclippedQuantile: 0.5, ClipLearningRate: 0.4, ClipCountStddev: 0.12}
	})
}

// withClipBit is rep with its clip bit set to bit and signed again by d;
// a bit no statement encodes keeps the signature rep had.
func (d *device) withClipBit(rep *pb.UpdateReport, bit pb.ClipBit) *pb.UpdateReport {
	d.h.t.Helper()
	rep.ClipBit = bit
	sig, err := identity.SignReport(d.key, identity.UpdateStatement(rep))
	switch {
	case err == nil:
		rep.Signature = sig
	case bit == pb.ClipBit_CLIP_BIT_UNSPECIFIED || bit == pb.ClipBit_CLIP_BIT_UNCLIPPED || bit == pb.ClipBit_CLIP_BIT_CLIPPED:
		d.h.t.Fatal(err)
	}
	return rep
}

// TestAdaptiveClipAfterRestart: the bound a committed round sets is the
// next round's, in its plans, after a restart too.
func TestAdaptiveClipAfterRestart(t *testing.T) {
	h := newHarness(t)
	task := h.start(adaptiveTask(h))
	ev := h.watch(task.Id)
	devs := []*device{h.enroll("dev-a", 5), h.enroll("dev-b", 5)}
	bound := 1.0
	for round := uint64(1); round <= 3; round++ {
		for _, d := range devs {
			plan := d.join()
			if plan.GetMaxUpdateNorm() != bound || plan.GetDp().GetClipNorm() != bound {
				t.Fatalf("round %d: plan's bound %v (dp %v), want %v", round, plan.GetMaxUpdateNorm(), plan.GetDp().GetClipNorm(), bound)
			}
			// An update clipped to the bound, as the device says.
			rep := d.signedUpdate(plan, constant(8, float32(0.999*bound/math.Sqrt(8))), 5, nil)
			d.send(d.withClipBit(rep, pb.ClipBit_CLIP_BIT_CLIPPED))
		}
		if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
			t.Fatalf("round %d: %v", round, got)
		}
		spent := h.events(audit.TypePrivacySpent)
		last := spent[len(spent)-1].(audit.PrivacySpent)
		if last.Round != round || last.ClipNorm != bound || last.UnclippedFraction == nil || !(last.NextClipNorm > bound) {
			t.Fatalf("round %d: dp.spent %+v after a bound of %v with every update clipped", round, last, bound)
		}
		b := min(max(*last.UnclippedFraction, 0), 1)
		if want := bound * math.Exp(-0.4*(b-0.5)); math.Abs(last.NextClipNorm-want) > 1e-12*want {
			t.Fatalf("round %d: next bound %v, want %v for b̄ %v", round, last.NextClipNorm, want, *last.UnclippedFraction)
		}
		bound = last.NextClipNorm
		if round == 1 {
			h.c.Shutdown()
			h.restart()
			ev = h.watch(task.Id)
		}
		if round < 3 {
			h.awaitOpen(task.Id, round+1)
		}
	}
}

// TestClipBitRefusals: in a round that clips adaptively, a report without
// the bit is refused, with what to do; in one that does not, a report with
// a bit is refused. Neither touches the round.
func TestClipBitRefusals(t *testing.T) {
	for _, tc := range []struct {
		name     string
		adaptive bool
		bit      pb.ClipBit
		want     string
	}{
		{"missing", true, pb.ClipBit_CLIP_BIT_UNSPECIFIED, "carries no clip bit"},
		{"unknown", true, 9, "carries no clip bit"},
		{"unasked", false, pb.ClipBit_CLIP_BIT_UNCLIPPED, "a clip bit (CLIP_BIT_UNCLIPPED) in a round without adaptive clipping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			spec := adaptiveTask(h)
			if !tc.adaptive {
				spec.Dp.TargetUnclippedQuantile, spec.Dp.ClipLearningRate, spec.Dp.ClipCountStddev = 0, 0, 0
			}
			spec.CohortTarget = 3
			task := h.start(spec)
			ev := h.watch(task.Id)
			a, b, c := h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5)
			plan := a.join()
			a.send(a.withClipBit(a.signedUpdate(plan, constant(8, 0.1), 5, nil), tc.bit))
			if r := a.receipt(); r.Accepted || !strings.Contains(r.Reason, tc.want) {
				t.Fatalf("receipt %v, want a refusal saying %q", r, tc.want)
			}
			// The round goes on: the honest reports commit it.
			b.update(b.join(), constant(8, 0.1), 5, nil)
			c.update(c.join(), constant(8, 0.1), 5, nil)
			if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
				t.Fatalf("round 1: %v", got)
			}
		})
	}
}

// TestShardedAdaptiveClipping: aggregation workers pass each report's bit
// to the leader, which counts it: with every update within the bound, the
// noised fraction is about 1 and the bound falls; a report without its bit
// is refused by the worker.
func TestShardedAdaptiveClipping(t *testing.T) {
	h, _ := newShardHarness(t, 2)
	spec := adaptiveTask(h)
	spec.CohortTarget = 3
	task := h.start(spec)
	ev := h.watch(task.Id)
	a, b, c := h.enroll("dev-a", 5), h.enroll("dev-b", 5), h.enroll("dev-c", 5)
	plan := a.join()
	a.send(a.withClipBit(a.signedUpdate(plan, constant(8, 0.1), 5, nil), pb.ClipBit_CLIP_BIT_UNSPECIFIED))
	if r := a.receipt(); r.Accepted || !strings.Contains(r.Reason, "carries no clip bit") {
		t.Fatalf("a report without its bit: %v", r)
	}
	for _, d := range []*device{b, c} {
		d.update(d.join(), constant(8, 0.1), 5, nil) // norm 0.28, within 1
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("round 1: %v", got)
	}
	if w := h.shardReports("worker"); w != 3 {
		t.Errorf("%v reports read by workers, want 3", w)
	}
	spent := h.events(audit.TypePrivacySpent)
	ev1 := spent[len(spent)-1].(audit.PrivacySpent)
	if ev1.UnclippedFraction == nil || math.Abs(*ev1.UnclippedFraction-1) > 6*0.12/2 || !(ev1.NextClipNorm < 1) {
		t.Fatalf("dp.spent %+v: want a fraction of about 1 and a falling bound", ev1)
	}
}
