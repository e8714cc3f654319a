package coord

import (
	"fmt"
	"math"
	mrand "math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// correlatedRun trains a task with correlated noise for 4 rounds on two
// devices whose updates are fixed, restarting the coordinator after round
// restartAfter (0: never), and returns the final model and each round's ε.
func correlatedRun(t *testing.T, noise pb.DPNoise, restartAfter uint64) ([]float32, []float64) {
	h := newHarness(t)
	h.c.Shutdown()
	h.deps.SecretReader = mrand.NewChaCha8([32]byte{7})
	h.restart()
	task := h.start(h.baseTask(func(t *pb.Task) {
		t.CohortTarget, t.ReportGoal, t.RoundsTotal = 2, 2, 4
		t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 0.5,
			TargetEpsilon: 1000, Delta: 1e-6, Noise: noise}
	}))
	ev := h.watch(task.Id)
	devs := []*device{h.enroll("dev-a", 5), h.enroll("dev-b", 5)}
	var eps []float64
	for round := uint64(1); round <= 4; round++ {
		for i, d := range devs {
			d.update(d.join(), constant(8, float32(i+1)*0.02*float32(round)), 5, nil)
		}
		got := h.next(ev)
		if got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != round {
			t.Fatalf("round %d: %v", round, got)
		}
		eps = append(eps, got.EpsilonSpent)
		if round == restartAfter {
			h.c.Shutdown()
			h.restart()
			ev = h.watch(task.Id)
		}
		if round < 4 {
			h.awaitOpen(task.Id, round+1)
		}
	}
	// Each round's dp.spent names the noise and a state of its own.
	seen := map[string]bool{}
	for _, p := range h.events(audit.TypePrivacySpent) {
		ev := p.(audit.PrivacySpent)
		if want := map[pb.DPNoise]string{pb.DPNoise_DP_NOISE_TREE: "tree", pb.DPNoise_DP_NOISE_BLT: "blt"}[noise]; ev.Noise != want ||
			len(ev.NoiseStateSHA256) != 64 || seen[ev.NoiseStateSHA256] {
			t.Fatalf("round %d: dp.spent noise %q, state digest %q (seen before: %v)", ev.Round, ev.Noise, ev.NoiseStateSHA256, seen[ev.NoiseStateSHA256])
		}
		seen[ev.NoiseStateSHA256] = true
	}
	if len(seen) != 4 {
		t.Fatalf("%d noise states in dp.spent events, want 4", len(seen))
	}
	return h.current(task.Id).Flatten(), eps
}

// TestCorrelatedNoiseContinuesAfterRestart: a coordinator restarted in the
// middle of a task with tree or BLT noise continues the same noise stream:
// its final model equals an uninterrupted run's bit for bit (the secret
// fixed), and differs from the model without noise. Each round's ε is the
// mechanism's over the rounds so far.
func TestCorrelatedNoiseContinuesAfterRestart(t *testing.T) {
	for _, noise := range []pb.DPNoise{pb.DPNoise_DP_NOISE_TREE, pb.DPNoise_DP_NOISE_BLT} {
		t.Run(noise.String(), func(t *testing.T) {
			whole, eps := correlatedRun(t, noise, 0)
			restarted, _ := correlatedRun(t, noise, 2)
			for i := range whole {
				if math.Float32bits(whole[i]) != math.Float32bits(restarted[i]) {
					t.Fatalf("model[%d]: %v uninterrupted, %v restarted after round 2", i, whole[i], restarted[i])
				}
			}
			// Without noise, w[0] would be 1 + Σ_r mean(0.02r, 0.04r) = 1.3.
			if math.Abs(float64(whole[0])-1.3) < 1e-6 {
				t.Fatalf("model[0] = %v: no noise was added", whole[0])
			}
			for n, got := range eps {
				var rho float64
				var err error
				if noise == pb.DPNoise_DP_NOISE_TREE {
					rho, err = dp.TreeZCDP(0.5, n+1, 4, 0)
				} else {
					var b dp.BLT
					if b, err = dp.FitBLT(4, 4, 1, 4); err == nil {
						rho, err = b.ZCDP(0.5, n+1, 4, 1)
					}
				}
				if err != nil {
					t.Fatal(err)
				}
				want, _, err := dp.EpsilonFromZCDP(rho, 1e-6, nil)
				if err != nil || math.Abs(got-want) > 1e-9*want {
					t.Errorf("ε after round %d: %v, want %v (%v)", n+1, got, want, err)
				}
			}
			t.Log(fmt.Sprint("ε by round: ", eps))
		})
	}
}
