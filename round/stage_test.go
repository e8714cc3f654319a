package round

import (
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

func TestStageTimingDecide(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	base := StageTiming{Start: t0, Expected: 150, MinQuiet: 2 * time.Second, Cap: at(60)}
	with := func(answered int, last float64) StageTiming {
		s := base
		s.Answered = answered
		if last >= 0 {
			s.Last = at(last)
		}
		return s
	}
	cases := []struct {
		name      string
		s         StageTiming
		now       float64
		viable    bool
		wantClose bool
		wantWake  float64 // seconds after t0; ignored when closing
		wantAsked bool    // viable consulted
	}{
		{"everyone answered closes at once", with(150, 0.5), 0.5, false, true, 0, false},
		{"more than expected closes too", with(151, 0.5), 0.5, false, true, 0, false},
		{"nothing yet: wait the least quiet period", with(0, -1), 0, true, false, 2, false},
		{"nothing for the least quiet period, closing would lose the round: wait for the cap", with(0, -1), 2, false, false, 60, true},
		{"nothing for the least quiet period, viable: close", with(120, -1), 2, true, true, 0, true},
		{"answers still coming: quiet ends a least period after the latest", with(40, 1), 1.5, true, false, 3, false},
		{"answers that took 10 s earn 5 s of silence", with(120, 10), 12, true, false, 15, false},
		{"quiet after 10 s of answers, viable: close", with(120, 10), 15, true, true, 0, true},
		{"quiet after 10 s of answers, not viable: wait for the cap", with(100, 10), 15, false, false, 60, true},
		{"the cap bounds the quiet period", with(100, 50), 51, true, false, 60, false},
		{"at the cap the stage closes whatever it has", with(10, 59), 60, false, true, 0, false},
		{"answers before the stage began (advertisements during selection) count from its start", StageTiming{
			Start: at(5), Last: at(3), Answered: 100, Expected: 150, MinQuiet: 2 * time.Second, Cap: at(60)}, 6, true, false, 7, false},
		{"an empty stage waits: nobody is there to answer yet", StageTiming{
			Start: t0, Expected: 0, MinQuiet: 2 * time.Second, Cap: at(60)}, 0, false, false, 2, false},
	}
	for _, c := range cases {
		asked := false
		gotClose, wake := c.s.Decide(at(c.now), func() bool { asked = true; return c.viable })
		if gotClose != c.wantClose || asked != c.wantAsked {
			t.Errorf("%s: close %v (viable asked %v), want %v (%v)", c.name, gotClose, asked, c.wantClose, c.wantAsked)
			continue
		}
		if !gotClose && !wake.Equal(at(c.wantWake)) {
			t.Errorf("%s: wake at %v, want %v", c.name, wake.Sub(t0), at(c.wantWake).Sub(t0))
		}
	}
}

// TestStageTimingSteadyStream: answers arriving at a steady pace, however
// slow against the task's stage timeout, never find the stage closed;
// once they stop, it closes after half the time they took.
func TestStageTimingSteadyStream(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, gap := range []time.Duration{100 * time.Millisecond, time.Second, 1900 * time.Millisecond} {
		s := StageTiming{Start: t0, Expected: 1000, MinQuiet: 2 * time.Second, Cap: t0.Add(time.Hour)}
		for i := 1; i < 1000; i++ {
			now := t0.Add(time.Duration(i) * gap)
			if c, wake := s.Decide(now, func() bool { return true }); c || !wake.After(now) {
				t.Fatalf("gap %v: closed (%v) or woke in the past (%v) at answer %d", gap, c, wake, i)
			}
			s.Answered, s.Last = i, now
		}
		took := s.Last.Sub(t0)
		want := s.Last.Add(max(2*time.Second, took/2))
		if c, wake := s.Decide(s.Last, func() bool { return true }); c || !wake.Equal(want) {
			t.Fatalf("gap %v: after the last answer: close %v, wake %v, want %v", gap, c, wake, want)
		}
		if c, _ := s.Decide(want, func() bool { return true }); !c {
			t.Fatalf("gap %v: still open once quiet", gap)
		}
	}
}

func TestStageCap(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const T = 2 * time.Second
	deadline := t0.Add(90 * time.Second) // masked input ends at 86 s
	cases := []struct {
		stage secagg.Stage
		start time.Duration
		want  time.Duration
	}{
		{secagg.StageAdvertise, 2 * time.Second, 2*time.Second + 21*time.Second},   // a quarter of 84 s
		{secagg.StageShareKeys, 23 * time.Second, 23*time.Second + 21*time.Second}, // a third of 63 s
		{secagg.StageMaskedInput, 44 * time.Second, 86 * time.Second},
		{secagg.StageConsistency, 50 * time.Second, 70 * time.Second}, // half of 40 s
		{secagg.StageUnmask, 70 * time.Second, 90 * time.Second},
		// Late stages still get one stage timeout.
		{secagg.StageAdvertise, 85 * time.Second, 87 * time.Second},
		{secagg.StageConsistency, 89 * time.Second, 91 * time.Second},
		{secagg.StageUnmask, 90 * time.Second, 92 * time.Second},
	}
	for _, c := range cases {
		if got := StageCap(c.stage, t0.Add(c.start), deadline, T); !got.Equal(t0.Add(c.want)) {
			t.Errorf("%v stage begun at %v: cap %v, want %v", c.stage, c.start, got.Sub(t0), c.want)
		}
	}
}

// TestStages walks a secure round's stage clock through a stage whose
// answers trickle in, go quiet and close, and a successor that closes once
// everyone answered.
func TestStages(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := Stages{MinQuiet: 10 * time.Second, Deadline: start.Add(time.Hour)}
	if s.Begun() {
		t.Fatal("begun before selection ended")
	}
	s.Begin(start)
	viable := func() bool { return true }
	// Answers over 40 s: the quiet period grows to half of that.
	for i, at := range []time.Duration{5, 20, 40} {
		d := s.Decide(start.Add(at*time.Second), secagg.StageShareKeys, i+1, 5, viable)
		if d.Close {
			t.Fatalf("closed at %v with %d of 5", at, i+1)
		}
	}
	d := s.Decide(start.Add(55*time.Second), secagg.StageShareKeys, 3, 5, viable)
	if d.Close || !d.Wake.Equal(start.Add(60*time.Second)) {
		t.Fatalf("at 55 s: %+v, want a wake at 60 s (40 s + 20 s quiet)", d)
	}
	d = s.Decide(start.Add(60*time.Second), secagg.StageShareKeys, 3, 5, viable)
	if !d.Close || !d.WaitedOut {
		t.Fatalf("at 60 s: %+v, want a close that waited out two devices", d)
	}
	s.Begin(start.Add(61 * time.Second))
	if d := s.Decide(start.Add(62*time.Second), secagg.StageMaskedInput, 3, 3, viable); !d.Close || d.WaitedOut {
		t.Fatalf("everyone answered: %+v", d)
	}
	// A quiet stage whose close would lose the round waits for its cap.
	s.Begin(start.Add(70 * time.Second))
	unviable := func() bool { return false }
	s.Decide(start.Add(71*time.Second), secagg.StageConsistency, 1, 3, unviable)
	d = s.Decide(start.Add(100*time.Second), secagg.StageConsistency, 1, 3, unviable)
	if d.Close || !d.Wake.Equal(StageCap(secagg.StageConsistency, start.Add(70*time.Second), s.Deadline, s.MinQuiet)) {
		t.Fatalf("unviable close: %+v, want a wake at the stage's cap", d)
	}
}
