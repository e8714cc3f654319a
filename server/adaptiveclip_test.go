package server_test

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// TestAdaptiveClipping: with adaptive clipping, real agents report their
// bit (signed in a plaintext round, through the secure sum in a secure
// one, noised on the devices under distributed DP), and every committed
// round's dp.spent records the bound it used, the noised fraction within
// it and the next bound, C·exp(−η·(b̄ − γ)); the next round uses that
// bound. The Trivial module's updates (norm 0.0045) are all within an
// initial bound of 0.1, which then falls every round, and all above one of
// 0.001, which rises. The count's noise on three reports, σ_b/3 = 0.1,
// keeps b̄ 5σ from the target 0.5 either way.
func TestAdaptiveClipping(t *testing.T) {
	const z, target, rate, countStddev = 0.5, 0.5, 0.3, 0.3
	for _, tc := range []struct {
		name   string
		mech   pb.DPMechanism
		secure bool
		clip   float64
	}{
		{"central", pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, false, 0.1},
		{"central-secagg", pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, true, 0.1},
		{"distributed", pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, true, 0.1},
		{"central-clipped", pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, false, 0.001},
		{"central-secagg-clipped", pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, true, 0.001},
		{"distributed-clipped", pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, true, 0.001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clip := tc.clip
			within := 1.0 // the fraction of updates within every round's bound
			if clip < 0.0045 {
				within = 0
			}
			h, version, module, _ := dpHarness(t, 4)
			spec := &pb.Task{Name: "adaptive", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
				CohortTarget: 4, ReportGoal: 3, RoundsTotal: 3, SelectionTimeout: durationpb.New(10 * time.Second),
				ReportTimeout: durationpb.New(20 * time.Second),
				Dp: &pb.DPConfig{Mechanism: tc.mech, ClipNorm: clip, NoiseMultiplier: z, TargetEpsilon: 1e6, Delta: 1e-6,
					TargetUnclippedQuantile: target, ClipLearningRate: rate, ClipCountStddev: countStddev}}
			if tc.secure {
				spec.Secagg = &pb.SecAggConfig{StageTimeout: durationpb.New(3 * time.Second)}
			}
			task := h.CreateTask(t, spec)
			done := h.WaitTask(t, task.Id, 3*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED,
				pb.TaskState_TASK_STATE_STOPPED)
			if done.State != pb.TaskState_TASK_STATE_COMPLETED {
				t.Fatalf("task %v: %s", done.State, done.StateReason)
			}
			spent := privacySpent(t, h, task.Id)
			if len(spent) != 3 {
				t.Fatalf("%d dp.spent events, want 3", len(spent))
			}
			bound := clip
			for _, ev := range spent {
				if ev.UnclippedFraction == nil {
					t.Fatalf("round %d: no adaptive clipping step in %+v", ev.Round, ev)
				}
				b := *ev.UnclippedFraction
				want := bound * math.Exp(-rate*(min(max(b, 0), 1)-target))
				if ev.ClipNorm != bound || math.Abs(ev.NextClipNorm-want) > 1e-12*want {
					t.Fatalf("round %d: bound %v → %v with b̄ %v; want %v → %v", ev.Round, ev.ClipNorm, ev.NextClipNorm, b, bound, want)
				}
				// b̄ is the fraction within, up to the count's noise
				// (σ_b/3 for three reports; 6σ).
				if math.Abs(b-within) > 6*countStddev/3 {
					t.Errorf("round %d: b̄ %v, want about %v", ev.Round, b, within)
				}
				if (ev.NextClipNorm < bound) != (within == 1) {
					t.Errorf("round %d: the bound went from %v to %v with a fraction %v of updates within it", ev.Round, bound, ev.NextClipNorm, within)
				}
				bound = ev.NextClipNorm
			}
		})
	}
}

// privacySpent is the task's dp.spent events, verified, in log order.
func privacySpent(t *testing.T, h *servertest.Harness, task string) []audit.PrivacySpent {
	t.Helper()
	var out []audit.PrivacySpent
	for _, ev := range h.AuditEvents(t, &pb.AuditFilter{TaskId: task, EventType: string(audit.TypePrivacySpent)}) {
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p.(audit.PrivacySpent))
	}
	return out
}
