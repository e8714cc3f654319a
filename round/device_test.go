package round_test

import (
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/round"
)

func noJitter(time.Duration) time.Duration { return 0 }

// TestDeviceRetriesThenGivesUp: a failing plan is tried MaxAttempts times
// with doubling waits, then given up once (server TestHostileFailingPlan
// and devproto's tests end to end).
func TestDeviceRetriesThenGivesUp(t *testing.T) {
	d := round.NewDevices(0, noJitter)
	p := round.Plan{Task: "t", Round: 1, Deadline: t0.Add(time.Hour)}
	now := t0
	var waits []time.Duration
	for i := 1; i <= round.DefaultMaxAttempts; i++ {
		s := d.Planned(p, now)
		if !s.Work || s.Attempt != i {
			t.Fatalf("check-in %d: %+v, want attempt %d", i, s, i)
		}
		next := d.Attempted(p, now, round.Failed)
		if i < round.DefaultMaxAttempts {
			if next.GiveUp {
				t.Fatalf("gave up after %d of %d attempts", i, round.DefaultMaxAttempts)
			}
			waits = append(waits, next.Wait)
			now = now.Add(next.Wait)
			continue
		}
		if !next.GiveUp || next.Attempt != round.DefaultMaxAttempts {
			t.Fatalf("last attempt: %+v, want give up after %d", next, round.DefaultMaxAttempts)
		}
		if next.Wait != round.MaxIdleWait {
			t.Errorf("wait after giving up %v, want %v (the deadline is an hour away)", next.Wait, round.MaxIdleWait)
		}
	}
	if waits[0] != time.Second || waits[1] != 2*time.Second || waits[2] != 4*time.Second {
		t.Errorf("retry waits %v, want 1s, 2s, 4s", waits)
	}
	// Done with the round: the same plan is waited out, never worked again.
	if s := d.Planned(p, now); s.Work || s.Wait != round.MaxIdleWait {
		t.Errorf("plan of a round given up: %+v", s)
	}
	// The next round starts afresh.
	if s := d.Planned(round.Plan{Task: "t", Round: 2, Deadline: t0.Add(time.Hour)}, now); !s.Work || s.Attempt != 1 {
		t.Errorf("next round: %+v", s)
	}
}

func TestDeviceOutcomes(t *testing.T) {
	deadline := t0.Add(10 * time.Second)
	p := round.Plan{Task: "t", Round: 3, Deadline: deadline}
	for _, c := range []struct {
		name   string
		result round.Result
		now    time.Time
		want   round.Step
	}{
		{"done", round.Done, t0, round.Step{Wait: 10 * time.Second}},
		{"done near the deadline", round.Done, deadline, round.Step{Wait: time.Second}},
		{"left on purpose", round.Left, t0, round.Step{Wait: 10 * time.Second}},
		{"superseded", round.Superseded, t0, round.Step{}},
		{"stopping", round.Stopped, t0, round.Step{}},
		{"fatal", round.Fatal, t0, round.Step{Wait: 10 * time.Second, Attempt: 1, GiveUp: true}},
		{"failed, retry before the deadline", round.Failed, t0, round.Step{Wait: time.Second, Attempt: 1}},
		{"failed, no time for a retry", round.Failed, deadline.Add(-time.Second), round.Step{Wait: time.Second, Attempt: 1, GiveUp: true}},
	} {
		d := round.NewDevices(0, noJitter)
		d.Planned(p, c.now)
		if got := d.Attempted(p, c.now, c.result); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestDeviceServedPlans: a plan whose report is stored, or for a round
// older than one seen, backs off instead of working again.
func TestDeviceServedPlans(t *testing.T) {
	d := round.NewDevices(2, noJitter)
	p := round.Plan{Task: "t", Round: 5, Deadline: t0.Add(time.Minute)}
	d.Planned(p, t0)
	d.Reported("t", 5)
	d.Reported("t", 4) // another round's: ignored
	d.Reported("u", 5) // another task's: ignored
	var waits []time.Duration
	for range 3 {
		s := d.Planned(p, t0)
		if s.Work {
			t.Fatal("a reported round was worked again")
		}
		waits = append(waits, s.Wait)
	}
	if waits[0] != 250*time.Millisecond || waits[2] != time.Second {
		t.Errorf("waits %v, want a back-off from 250ms", waits)
	}
	if s := d.Planned(round.Plan{Task: "t", Round: 4}, t0); s.Work {
		t.Error("an older round's plan was worked")
	}
	if s := d.Planned(round.Plan{Task: "u", Round: 5, Deadline: t0.Add(time.Minute)}, t0); !s.Work {
		t.Error("another task's plan was not worked")
	}
}

// TestDeviceForgets: a device handed plans of ever new tasks (a hostile
// server) keeps at most MaxDeviceTasks of them.
func TestDeviceForgets(t *testing.T) {
	d := round.NewDevices(0, noJitter)
	first := round.Plan{Task: "task-0", Round: 1, Deadline: t0.Add(time.Minute)}
	d.Planned(first, t0)
	d.Attempted(first, t0, round.Done)
	for i := 1; i <= round.MaxDeviceTasks; i++ {
		d.Planned(round.Plan{Task: "task-" + string(rune('A'+i%26)) + time.Duration(i).String(), Round: 1}, t0)
	}
	// Forgotten: the done round's plan is worked again, harmlessly.
	if s := d.Planned(first, t0); !s.Work {
		t.Errorf("after %d other tasks the first is still remembered: %+v", round.MaxDeviceTasks, s)
	}
}

func TestRetryWait(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{0, round.MinRetryAfter}, {-time.Hour, round.MinRetryAfter}, {time.Second, time.Second},
		{24 * time.Hour, round.MaxRetryAfter},
	} {
		if got := round.RetryWait(c.in); got != c.want {
			t.Errorf("RetryWait(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
