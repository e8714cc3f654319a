package round_test

import (
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/round"
)

// TestInfluence: what bounds one device's say in the sum (server
// TestHostileWeightClaim: a device claiming a huge example count;
// TestHostilePoisonDefaultBound: the bound a task without settings gets).
func TestInfluence(t *testing.T) {
	plain := round.Influence{MaxUpdateNorm: 10, MaxExamples: 1000}
	if got := plain.Weight(1 << 40); got != 1000 {
		t.Errorf("weight of a huge claim %v, want the cap 1000", got)
	}
	if got := plain.Weight(7); got != 7 {
		t.Errorf("weight %v, want 7", got)
	}
	if got := plain.NormBound(); got != 10 {
		t.Errorf("bound %v, want 10", got)
	}
	dp := round.Influence{MaxUpdateNorm: 10, MaxExamples: 1000, DP: true, ClipNorm: 2}
	if got := dp.Weight(500); got != 1 {
		t.Errorf("DP weight %v, want 1", got)
	}
	if got := dp.NormBound(); got < 2 || got > 2*(1+1e-4) {
		t.Errorf("DP bound %v, want the clip norm 2 and a rounding slack", got)
	}
	dp.LocalDP = true
	if got := dp.NormBound(); got != 0 {
		t.Errorf("local DP bound %v, want none (devices' noise lengthens updates)", got)
	}
}

// TestCheckFailure: a failure report names its own subject's round and
// device (server TestHostileFailingPlan, TestHostileCheckInImpersonation).
func TestCheckFailure(t *testing.T) {
	ok := round.Failure{Size: 100, SubjectTask: "t", BodyTask: "t", SubjectRound: 3, BodyRound: 3, SubjectDevice: "d", BodyDevice: "d"}
	if why := round.CheckFailure(ok); why != "" {
		t.Errorf("own failure: %s", why)
	}
	for _, c := range []struct {
		name   string
		change func(*round.Failure)
		want   string
	}{
		{"oversized", func(f *round.Failure) { f.Size = round.MaxFailureBytes + 1 }, "exceeds"},
		{"another device", func(f *round.Failure) { f.BodyDevice = "victim" }, "names t/3/victim, subject t/3/d"},
		{"another round", func(f *round.Failure) { f.BodyRound = 4 }, "names t/4/d"},
		{"another task", func(f *round.Failure) { f.BodyTask = "u" }, "names u/3/d"},
	} {
		f := ok
		c.change(&f)
		if why := round.CheckFailure(f); !strings.Contains(why, c.want) {
			t.Errorf("%s: %q, want %q", c.name, why, c.want)
		}
	}
}

func TestDescribeEligibility(t *testing.T) {
	e := round.Eligibility{ABI: 3, RequireCharging: true, RequireUnmetered: true, Classes: []string{"phone", "tablet"}}
	want := "kind=train min_examples=1 abi=3 charging unmetered device_classes=phone|tablet"
	if got := e.Describe(round.Train); got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got := (round.Eligibility{ABI: 1, MinExamples: 5}).Describe(round.Evaluate); got != "kind=evaluate min_examples=5 abi=1" {
		t.Errorf("evaluation: %q", got)
	}
}
