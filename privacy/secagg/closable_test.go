package secagg_test

import (
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

// keptBy counts the participants the closed stage kept, as the next
// stage's replies show them; -1 for the unmask stage, whose set has none.
func keptBy(c *cohort, closed secagg.Stage) int {
	kept := 0
	for id := uint32(1); int(id) <= c.r.N(); id++ {
		var err error
		switch closed {
		case secagg.StageAdvertise:
			_, err = c.srv.PeerKeys(id)
		case secagg.StageShareKeys:
			_, err = c.srv.ForwardedShares(id)
		case secagg.StageMaskedInput:
			_, err = c.srv.SurvivorSet(id)
		case secagg.StageConsistency:
			_, err = c.srv.UnmaskRequest(id)
		default:
			return -1
		}
		if err == nil {
			kept++
		}
	}
	return kept
}

// TestClosableForetellsCloseStage: before every CloseStage of rounds with
// random dropout, heavy enough that many abort, Closable gives the number
// of participants the close then keeps, or the very error it then aborts
// with, and asking it (twice) changes nothing the close decides.
func TestClosableForetellsCloseStage(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	rounds, aborted := 24, 0
	if testing.Short() {
		rounds = 12
	}
	for i := range rounds {
		n := 3 + r.IntN(40)
		c := newCohort(t, randomRound(t, r, n), n, 3, uint64(300+i))
		plan := make([]int, n)
		p := 0.6 * r.Float64()
		for j := range plan {
			if r.Float64() < p {
				plan[j] = 1 + r.IntN(numDropoutChoices-1)
			}
		}
		var (
			stage   = secagg.StageDone // the stage last foretold
			kept    int
			predErr error
		)
		c.beforeClose = func() {
			if stage != secagg.StageDone {
				if got := keptBy(c, stage); got >= 0 && got != kept {
					t.Fatalf("n=%d %v stage: Closable said %d kept, the close kept %d", n, stage, kept, got)
				}
			}
			stage = c.srv.Stage()
			kept, predErr = c.srv.Closable()
			again, err := c.srv.Closable()
			if again != kept || (err == nil) != (predErr == nil) {
				t.Fatalf("n=%d %v stage: Closable %d, %v then %d, %v", n, stage, kept, predErr, again, err)
			}
		}
		out := c.run(t, plan, randomInputs(r, n, 3, c.r.Bits()))
		switch {
		case predErr == nil && out.err != nil:
			t.Fatalf("n=%d %v stage: Closable found no fault, the close failed: %v", n, stage, out.err)
		case predErr != nil && (out.err == nil || out.err.Error() != predErr.Error()):
			t.Fatalf("n=%d %v stage: Closable foretold %v, the close gave %v", n, stage, predErr, out.err)
		case predErr != nil:
			aborted++
			if _, err := c.srv.Closable(); err == nil {
				t.Fatalf("n=%d: Closable after the abort: no error", n)
			}
		}
	}
	if aborted == 0 || aborted == rounds {
		t.Fatalf("%d of %d rounds aborted: the draw exercises only one outcome", aborted, rounds)
	}
}
