package coord

import (
	"testing"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestEpsilonAskedOnce: the accountant's answers are kept for the rounds
// still asked about (a round's open and its commit ask for the same two),
// equal to a fresh accountant's, and only those are kept.
func TestEpsilonAskedOnce(t *testing.T) {
	task := &pb.Task{CohortTarget: 10, Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN,
		ClipNorm: 1, NoiseMultiplier: 1, Delta: 1e-5, TargetEpsilon: 100}}
	d, err := newDPRun(task, 10)
	if err != nil || d == nil {
		t.Fatalf("dp: %v, %v", d, err)
	}
	fresh, err := newDPRun(task, 10)
	if err != nil {
		t.Fatal(err)
	}
	for rounds := 1; rounds <= 6; rounds++ {
		for range 2 { // open, then commit
			for _, n := range []int{rounds - 1, rounds} {
				got, err := d.epsilonAfter(n)
				if err != nil {
					t.Fatal(err)
				}
				want, err := fresh.acct.EpsilonAfter(n)
				if err != nil || got != want {
					t.Fatalf("ε after %d rounds: %v, a fresh accountant says %v (%v)", n, got, want, err)
				}
			}
		}
		if len(d.eps) > 2 {
			t.Fatalf("after round %d: %d answers kept, want at most 2", rounds, len(d.eps))
		}
	}
}
