package round_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/seeds"
	"github.com/fleetlearn/fleetlearn/round"
)

var (
	t0   = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	pace = time.Second
)

func newCohort(wanted int) *round.Cohort {
	return round.NewCohort(round.CohortConfig{Round: 7, Wanted: wanted, SelectionEnd: t0.Add(30 * time.Second),
		Deadline: t0.Add(time.Minute), Pace: pace}, t0, nil)
}

var everyone = round.Eligibility{ABI: 3}

func device(id string) round.Candidate {
	return round.Candidate{Device: id, Attributes: round.Attributes{ABIs: []uint32{2, 3}, Examples: 100}}
}

// TestEligibility: each of the task's requirements turns away a device
// that lacks it, with what it lacks (server TestHostileCheckInImpersonation
// and the eligibility tests end to end).
func TestEligibility(t *testing.T) {
	ok := round.Attributes{ABIs: []uint32{3}, Examples: 5, Charging: true, Idle: true, Unmetered: true, Class: "phone"}
	strict := round.Eligibility{ABI: 3, MinExamples: 5, RequireCharging: true, RequireIdle: true, RequireUnmetered: true,
		Classes: []string{"phone", "tablet"}}
	for _, c := range []struct {
		name   string
		e      round.Eligibility
		change func(*round.Attributes)
		reason round.Reason
		want   string
	}{
		{"meets everything", strict, func(*round.Attributes) {}, 0, ""},
		{"other ABI", strict, func(a *round.Attributes) { a.ABIs = []uint32{1, 2} }, round.ReasonUnsupportedABI, "ABI v3"},
		{"no ABI at all", strict, func(a *round.Attributes) { a.ABIs = nil }, round.ReasonUnsupportedABI, "ABI v3"},
		{"too few examples", strict, func(a *round.Attributes) { a.Examples = 4 }, round.ReasonNotEligible, "at least 5 examples, device has 4"},
		{"no examples, no minimum", round.Eligibility{ABI: 3}, func(a *round.Attributes) { a.Examples = 0 }, round.ReasonNotEligible, "at least 1 examples"},
		{"not charging", strict, func(a *round.Attributes) { a.Charging = false }, round.ReasonNotEligible, "charging"},
		{"busy", strict, func(a *round.Attributes) { a.Idle = false }, round.ReasonNotEligible, "idle"},
		{"metered", strict, func(a *round.Attributes) { a.Unmetered = false }, round.ReasonNotEligible, "unmetered"},
		{"other class", strict, func(a *round.Attributes) { a.Class = "watch" }, round.ReasonNotEligible, `class "watch"`},
		{"any class", round.Eligibility{ABI: 3}, func(a *round.Attributes) { a.Class = "watch" }, 0, ""},
	} {
		a := ok
		c.change(&a)
		why, reason := c.e.Check(a)
		switch {
		case c.want == "" && why != "":
			t.Errorf("%s: turned away: %s", c.name, why)
		case c.want != "" && (reason != c.reason || !strings.Contains(why, c.want)):
			t.Errorf("%s: %q (reason %d), want %q (reason %d)", c.name, why, reason, c.want, c.reason)
		}
	}
}

// TestCheckIn: the check-in's size and the device it names (server
// TestHostileCheckInImpersonation end to end).
func TestCheckIn(t *testing.T) {
	if why := round.CheckCheckInSize(round.MaxCheckInBytes); why != "" {
		t.Errorf("largest check-in: %s", why)
	}
	if why := round.CheckCheckInSize(round.MaxCheckInBytes + 1); !strings.Contains(why, "exceeds") {
		t.Errorf("oversized check-in: %q", why)
	}
	if why := round.CheckCheckInDevice("d1", "d1"); why != "" {
		t.Errorf("own check-in: %s", why)
	}
	if why := round.CheckCheckInDevice("d1", "victim"); !strings.Contains(why, `names device "victim" on the subject of device "d1"`) {
		t.Errorf("impersonation: %q", why)
	}
}

func offer(t *testing.T, c *round.Cohort, now time.Time, cand round.Candidate, want round.Action, wantReason round.Reason, detail string) round.Offer {
	t.Helper()
	o := c.Offer(now, everyone, cand)
	if o.Action != want || o.Reason != wantReason || !strings.Contains(o.Detail, detail) {
		t.Fatalf("%s: offer %+v, want action %d reason %d naming %q", cand.Device, o, want, wantReason, detail)
	}
	return o
}

// TestSelection walks a cohort of two seats through the check-ins a fleet
// and a hostile device send.
func TestSelection(t *testing.T) {
	c := newCohort(2)
	now := t0.Add(time.Second)

	offer(t, c, now, device("a"), round.Reserve, 0, "")
	// A second check-in while the seat is being recorded gets no plan (it
	// has no participant yet) and no second seat.
	o := offer(t, c, now, device("a"), round.Defer, round.ReasonRoundFull, "round 7 is full")
	if o.Wait != 10*pace {
		t.Errorf("wait %v, want 10 pace windows (the deadline is further)", o.Wait)
	}
	if !c.Seat("a", round.Seat{Participant: 1, Examples: 100}) {
		t.Fatal("reservation lost")
	}
	if c.Seat("a", round.Seat{Participant: 9}) || c.Seat("nobody", round.Seat{}) {
		t.Error("a seat without a reservation was recorded")
	}
	// A restarted device gets its plan again, with its own participant.
	if o := offer(t, c, now, device("a"), round.Replan, 0, ""); o.Seat.Participant != 1 {
		t.Errorf("replan: participant %d, want 1", o.Seat.Participant)
	}
	offer(t, c, now, device("b"), round.Reserve, 0, "")
	offer(t, c, now, device("c"), round.Defer, round.ReasonRoundFull, "full")
	c.Release("b") // the store write failed
	offer(t, c, now, device("c"), round.Reserve, 0, "")
	c.Seat("c", round.Seat{Participant: 2, Examples: 100})
	if c.Assigned() != 2 || c.Seated() != 2 {
		t.Errorf("assigned %d, seated %d; want 2, 2", c.Assigned(), c.Seated())
	}

	// Near the deadline a turned-away device waits only until then.
	late := t0.Add(time.Minute - 3*time.Second)
	if o := offer(t, c, late, device("d"), round.Defer, round.ReasonRoundFull, "full"); o.Wait != 3*time.Second {
		t.Errorf("wait %v, want the 3 s left", o.Wait)
	}
	if o := offer(t, c, t0.Add(2*time.Minute), device("d"), round.Defer, round.ReasonRoundFull, "full"); o.Wait != 0 {
		t.Errorf("wait %v past the deadline, want 0", o.Wait)
	}

	// A device that reported cannot take a seat again, even one freed.
	c.Report("a")
	offer(t, c, now, device("a"), round.Defer, round.ReasonRoundFull, "full")
	if p := c.Plain(0, 2, false); p.Selecting || p.Assigned != 2 || p.Reported != 1 {
		t.Errorf("close view %+v", p)
	}
}

func TestSelectionRefusals(t *testing.T) {
	c := newCohort(3)
	now := t0.Add(time.Second)
	bad := device("old")
	bad.Attributes.ABIs = []uint32{1}
	if o := offer(t, c, now, bad, round.Defer, round.ReasonUnsupportedABI, "ABI v3"); o.Wait != 10*pace {
		t.Errorf("ineligible wait %v, want 10 pace windows", o.Wait)
	}
	capped := device("capped")
	capped.Rounds = 4
	e := everyone
	e.MaxRounds = 4
	if o := c.Offer(now, e, capped); o.Action != round.Defer || o.Reason != round.ReasonNotEligible ||
		!strings.Contains(o.Detail, "cap of 4 rounds") {
		t.Errorf("capped device: %+v", o)
	}
	if c.Capped() != 1 {
		t.Errorf("capped %d, want 1", c.Capped())
	}
	capped.Rounds = 3
	if o := c.Offer(now, e, capped); o.Action != round.Reserve {
		t.Errorf("device under the cap: %+v", o)
	}
	benched := device("silent")
	benched.Benched = round.NoShow{}.Strike(6).Benched(7)
	offer(t, c, now, benched, round.Defer, round.ReasonNotEligible, "sits out rounds up to 7")

	// Selection closed: nobody new.
	c.EndSelection()
	offer(t, c, now, device("late"), round.Defer, round.ReasonRoundFull, "full")
	why := c.CloseSelection(2, 0, 4)
	for _, w := range []string{"selection closed with 1 devices, below the report goal 2", "1 devices checked in but had reached the task's cap of 4 rounds"} {
		if !strings.Contains(why, w) {
			t.Errorf("close: %q, want %q", why, w)
		}
	}
	if why := c.CloseSelection(1, 5, 4); !strings.Contains(why, "secure aggregation minimum 5") {
		t.Errorf("secure minimum: %q", why)
	}
	if why := c.CloseSelection(1, 0, 4); why != "" {
		t.Errorf("enough seats: %q", why)
	}
}

// TestResumedCohort: a cohort resumed from the store keeps selecting only
// while seats are missing and its selection time lasts.
func TestResumedCohort(t *testing.T) {
	seats := map[string]round.Seat{"a": {Participant: 1, Examples: 5}}
	cfg := round.CohortConfig{Round: 7, Wanted: 2, SelectionEnd: t0.Add(time.Second), Deadline: t0.Add(time.Minute), Pace: pace}
	if c := round.NewCohort(cfg, t0, seats); !c.Selecting() {
		t.Error("a seat missing, time left: not selecting")
	}
	if c := round.NewCohort(cfg, t0.Add(time.Second), seats); c.Selecting() {
		t.Error("selection time over: still selecting")
	}
	seats["b"] = round.Seat{Participant: 2, Examples: 5}
	c := round.NewCohort(cfg, t0, seats)
	if c.Selecting() {
		t.Error("full: still selecting")
	}
	seats["c"] = round.Seat{}
	if c.Seated() != 2 {
		t.Error("the cohort shares the caller's map")
	}
}

// TestMembership: failures, settling and silence, as the close and the
// no-show rule see them (server TestHostileFailingPlan, the no-show tests).
func TestMembership(t *testing.T) {
	c := round.NewCohort(round.CohortConfig{Round: 7, Wanted: 4, Deadline: t0}, t0, map[string]round.Seat{
		"a": {Participant: 1, Examples: 1}, "b": {Participant: 2, Examples: 1}, "c": {Participant: 3, Examples: 1}, "d": {Participant: 4, Examples: 1}})
	c.Report("a")
	if c.Fail("a", "late failure") {
		t.Error("a device that reported was marked failed")
	}
	if !c.Fail("b", "plan failed: out of memory") || c.Fail("b", "second reason") {
		t.Error("first failure not kept, or a second one kept")
	}
	if c.Fail("stranger", "x") {
		t.Error("a device without a seat was marked failed")
	}
	if got := c.Failures(); len(got) != 1 || got["b"] != "plan failed: out of memory" {
		t.Errorf("failures %v", got)
	}
	if c.Settled() != 2 {
		t.Errorf("settled %d, want 2 (a reported, b failed)", c.Settled())
	}
	if got := c.Silent(); !slices.Equal(got, []string{"c", "d"}) {
		t.Errorf("silent %v, want [c d]", got)
	}
	if got := c.ReportedDevices(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("reported %v", got)
	}
	st := c.Standing("a")
	if !st.Seated || !st.Reported || st.Seat.Participant != 1 {
		t.Errorf("standing of a: %+v", st)
	}
	if st := c.Standing("stranger"); st.Seated {
		t.Errorf("standing of a stranger: %+v", st)
	}
}

// TestNoShow: each silent seat benches a device twice as long, up to
// MaxBench rounds.
func TestNoShow(t *testing.T) {
	var n round.NoShow
	if why := n.Benched(1); why != "" {
		t.Errorf("clean record benched: %s", why)
	}
	var lengths []uint64
	for r := uint64(10); len(lengths) < 9; r += 100 {
		n = n.Strike(r)
		lengths = append(lengths, n.Until-r)
		if n.Benched(n.Until) == "" || n.Benched(n.Until+1) != "" {
			t.Fatalf("strike %d: benched through round %d, but the record says %+v", n.Strikes, n.Until, n)
		}
	}
	if want := []uint64{1, 2, 4, 8, 16, 32, 64, 64, 64}; !slices.Equal(lengths, want) {
		t.Errorf("bench lengths %v, want %v", lengths, want)
	}
	for range 100 {
		n = n.Strike(n.Last + 1)
	}
	if n.Until-n.Last != round.MaxBench {
		t.Errorf("after 109 strikes: %+v, want at most %d rounds", n, round.MaxBench)
	}
}

// busyCohort is a cohort part way through a round: seats, a reservation,
// reports, failures and capped devices.
func busyCohort() *round.Cohort {
	c := newCohort(6)
	now := t0.Add(time.Second)
	for i, d := range []string{"d0", "d1", "d2", "d3", "d4"} {
		c.Offer(now, everyone, device(d))
		if i < 4 {
			c.Seat(d, round.Seat{Participant: uint32(i + 1), Examples: uint64(10 * (i + 1))})
		}
	}
	c.Report("d0")
	c.Report("d2")
	c.Fail("d1", "plan failed: \"quoted\" and\nnewline")
	e := everyone
	e.MaxRounds = 1
	capped := device("capped")
	capped.Rounds = 1
	c.Offer(now, e, capped)
	e.MinSeparation, e.Step = 3, 5
	recent := device("recent")
	recent.LastStep = 4
	c.Offer(now, e, recent)
	return c
}

// TestMinSeparation: a device that contributed to step s is turned away,
// with when it may come back, until step s+b; the round lists it.
func TestMinSeparation(t *testing.T) {
	c := newCohort(3)
	now := t0.Add(time.Second)
	e := everyone
	e.MinSeparation, e.Step = 3, 7
	recent := device("recent")
	recent.LastStep = 5 // 7 < 5+3
	if o := c.Offer(now, e, recent); o.Action != round.Defer || o.Reason != round.ReasonNotEligible ||
		!strings.Contains(o.Detail, "took part in training step 5; the task's minimum separation of 3 steps lets it take part again from step 8, and this round is step 7") {
		t.Errorf("a device 2 steps after its last: %+v", o)
	}
	apart := device("apart")
	apart.LastStep = 4 // 7 = 4+3
	if o := c.Offer(now, e, apart); o.Action != round.Reserve {
		t.Errorf("a device 3 steps after its last: %+v", o)
	}
	if o := c.Offer(now, e, device("new")); o.Action != round.Reserve {
		t.Errorf("a device that never took part: %+v", o)
	}
	want := []round.TurnedAway{{Device: "recent", Rule: round.RuleMinSeparation, LastStep: 5}}
	if got := c.TurnedAway(); !slices.Equal(got, want) {
		t.Errorf("turned away %+v, want %+v", got, want)
	}
	c.EndSelection()
	if why := c.CloseSelection(3, 0, 0); !strings.Contains(why, "1 devices checked in before their minimum separation had passed") {
		t.Errorf("close: %q", why)
	}
}

// TestCohortStateRestores: a cohort serialized and restored is the same
// cohort: the same bytes again, and the same answers to every event.
func TestCohortStateRestores(t *testing.T) {
	c := busyCohort()
	b, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var r round.Cohort
	if err := r.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	again, err := r.MarshalBinary()
	if err != nil || !bytes.Equal(again, b) {
		t.Fatalf("restored cohort serializes as\n%s\nwant\n%s (%v)", again, b, err)
	}
	// The same events give the same decisions on both.
	now := t0.Add(2 * time.Second)
	for _, d := range []string{"d0", "d1", "d3", "d4", "new", "capped", "recent"} {
		e := everyone
		e.MaxRounds, e.MinSeparation, e.Step = 1, 3, 5
		cand := device(d)
		switch d {
		case "capped":
			cand.Rounds = 1
		case "recent":
			cand.LastStep = 4
		}
		if a, b := c.Offer(now, e, cand), r.Offer(now, e, cand); !offersEqual(a, b) {
			t.Errorf("%s: original %+v, restored %+v", d, a, b)
		}
	}
	c.Seat("d4", round.Seat{Participant: 5, Examples: 1})
	r.Seat("d4", round.Seat{Participant: 5, Examples: 1})
	for _, cc := range []*round.Cohort{c, &r} {
		cc.Report("d3")
		cc.Fail("d4", "x")
	}
	x, _ := c.MarshalBinary()
	y, _ := r.MarshalBinary()
	if !bytes.Equal(x, y) {
		t.Errorf("after the same events:\n%s\n%s", x, y)
	}
	if a, b := c.Plain(3, 2, false), r.Plain(3, 2, false); a != b {
		t.Errorf("close views differ: %+v, %+v", a, b)
	}
	if !slices.Equal(c.Silent(), r.Silent()) || c.Settled() != r.Settled() || c.Capped() != r.Capped() {
		t.Error("membership differs after a restore")
	}
}

func offersEqual(a, b round.Offer) bool { return a == b }

// TestCohortStateRefused: state no cohort can reach is refused whole.
func TestCohortStateRefused(t *testing.T) {
	good, _ := busyCohort().MarshalBinary()
	long := strings.Repeat("x", round.MaxDeviceIDSize+1)
	for _, c := range []struct{ name, doc, want string }{
		{"not JSON", `{`, "unexpected end"},
		{"other version", `{"version":2}`, "version 2"},
		{"negative wanted", `{"version":1,"wanted":-1}`, "must not be negative"},
		{"negative pace", `{"version":1,"pace_ns":-5}`, "must not be negative"},
		{"report without a seat", `{"version":1,"reported":["ghost"]}`, `"ghost" is reported without a seat`},
		{"seated and reserved", `{"version":1,"seats":{"a":{}},"reserved":["a"]}`, `"a" is both reserved and seated`},
		{"reported twice", `{"version":1,"seats":{"a":{}},"reported":["a","a"]}`, "reported twice"},
		{"failure without a seat", `{"version":1,"failures":{"ghost":"x"}}`, "failed without a seat"},
		{"empty device", `{"version":1,"capped":[""]}`, "device name of 0 bytes"},
		{"long device", fmt.Sprintf(`{"version":1,"seats":{%q:{}}}`, long), "device name of 257 bytes"},
	} {
		r := busyCohort()
		err := r.UnmarshalBinary([]byte(c.doc))
		if !errors.Is(err, round.ErrState) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrState naming %q", c.name, err, c.want)
			continue
		}
		// A refused restore leaves the cohort as it was.
		if b, _ := r.MarshalBinary(); !bytes.Equal(b, good) {
			t.Errorf("%s: the refused restore changed the cohort", c.name)
		}
	}
}

// FuzzCohortState: whatever bytes a restore is given, it refuses them or
// yields a cohort that serializes to a fixed point.
func FuzzCohortState(f *testing.F) {
	good, _ := busyCohort().MarshalBinary()
	f.Add(good)
	seeds.AddTo(f, "cohort", "*.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		var c round.Cohort
		if err := c.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, round.ErrState) {
				t.Fatalf("refusal %v is not ErrState", err)
			}
			return
		}
		once, err := c.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var d round.Cohort
		if err := d.UnmarshalBinary(once); err != nil {
			t.Fatalf("own serialization refused: %v\n%s", err, once)
		}
		twice, _ := d.MarshalBinary()
		if !bytes.Equal(once, twice) {
			t.Fatalf("not a fixed point:\n%s\n%s", once, twice)
		}
		if d.Assigned() > len(once) || d.Settled() > d.Seated() {
			t.Fatalf("impossible counts: assigned %d, settled %d of %d seats", d.Assigned(), d.Settled(), d.Seated())
		}
	})
}
