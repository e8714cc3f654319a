package round_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/seeds"
	"github.com/fleetlearn/fleetlearn/round"
)

func newAsync(t *testing.T, cfg round.AsyncConfig) *round.Async {
	t.Helper()
	a, err := round.NewAsync(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAsyncConfig(t *testing.T) {
	for _, c := range []round.AsyncConfig{
		{Concurrency: 0, Buffer: 1},
		{Concurrency: 5, Buffer: 0},
		{Concurrency: 5, Buffer: 6},
		{Concurrency: round.MaxConcurrency + 1, Buffer: 1},
		{Concurrency: 20, Buffer: 10, MaxStaleness: round.MaxMaxStaleness + 1},
	} {
		if _, err := round.NewAsync(c, 0); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (round.AsyncConfig{Concurrency: 20, Buffer: 10, MaxStaleness: 5}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestStalenessWeight(t *testing.T) {
	for s, want := range map[uint64]float64{0: 1, 1: 1 / math.Sqrt2, 3: 0.5, 8: 1.0 / 3} {
		if got := round.StalenessWeight(s); math.Abs(got-want) > 1e-15 {
			t.Errorf("weight of staleness %d: %v, want %v", s, got, want)
		}
	}
}

// A whole async life: C devices train at once, the rest wait; each report
// is weighted by its staleness; the K-th fills the buffer, the step moves
// the version on and drops the seats that can no longer report.
func TestAsyncBuffers(t *testing.T) {
	a := newAsync(t, round.AsyncConfig{Concurrency: 3, Buffer: 2, MaxStaleness: 1})
	for i, d := range []string{"a", "b", "c"} {
		o := a.Offer(d, 10, t0.Add(time.Duration(i)*time.Second))
		if o.Action != round.Reserve || o.Seat.Version != 0 || o.Seat.Examples != 10 {
			t.Fatalf("%s: %+v", d, o)
		}
	}
	if o := a.Offer("d", 10, t0); o.Action != round.Defer || o.Reason != round.ReasonRoundFull || !strings.Contains(o.Detail, "3 devices train") {
		t.Fatalf("a fourth device: %+v", o)
	}
	if o := a.Offer("a", 10, t0.Add(time.Hour)); o.Action != round.Replan || o.Seat.Since != t0 {
		t.Fatalf("a device that trains already: %+v", o)
	}
	if _, err := a.Report("d", 0); err == nil {
		t.Fatal("a report without a seat taken")
	} else {
		refusedAs(t, "async", err, round.ClassCohort, "holds no seat")
	}
	refusedAs(t, "async", func() error { _, err := a.Report("a", 7); return err }(), round.ClassHeader, "seat of a on version 0")
	b, err := a.Report("a", 0)
	if err != nil || b.Staleness != 0 || b.Weight != 1 || a.Full() {
		t.Fatalf("a's report: %+v, %v (full %v)", b, err, a.Full())
	}
	// a waits for the step; d takes the freed seat.
	if o := a.Offer("a", 10, t0); o.Action != round.Defer || !strings.Contains(o.Detail, "in the buffer of version 1") {
		t.Fatalf("a again before the step: %+v", o)
	}
	if _, err := a.Report("a", 0); err == nil {
		t.Fatal("a second report to one buffer taken")
	} else {
		refusedAs(t, "async", err, round.ClassDuplicate, "one report a device a buffer")
	}
	if o := a.Offer("d", 10, t0.Add(10*time.Second)); o.Action != round.Reserve {
		t.Fatalf("d after a's report: %+v", o)
	}
	if _, err := a.Report("b", 0); err != nil || !a.Full() {
		t.Fatalf("b's report: %v, full %v", err, a.Full())
	}
	if _, err := round.NewAsync(round.AsyncConfig{Concurrency: 3, Buffer: 2}, 0); err != nil {
		t.Fatal(err)
	}
	stale, err := a.Step()
	if err != nil || len(stale) != 0 || a.Version() != 1 || len(a.Buffer()) != 0 {
		t.Fatalf("step: stale %v, %v; version %d, buffer %v", stale, err, a.Version(), a.Buffer())
	}
	if _, err := a.Step(); err == nil {
		t.Fatal("a step with an empty buffer")
	}
	// c and d trained on version 0: one version stale, weight 1/√2.
	b, err = a.Report("c", 0)
	if err != nil || b.Staleness != 1 || math.Abs(b.Weight-1/math.Sqrt2) > 1e-15 {
		t.Fatalf("c one version late: %+v, %v", b, err)
	}
	if o := a.Offer("a", 10, t0.Add(time.Minute)); o.Action != round.Reserve || o.Seat.Version != 1 {
		t.Fatalf("a after the step: %+v", o)
	}
	if _, err := a.Report("a", 1); err != nil || !a.Full() {
		t.Fatalf("a's fresh report: %v", err)
	}
	// d's seat, on version 0, is two behind after this step: past S = 1.
	stale, err = a.Step()
	if err != nil || !slices.Equal(stale, []string{"d"}) || a.Training() != 0 {
		t.Fatalf("second step: stale %v, %v; %d training", stale, err, a.Training())
	}
	refusedAs(t, "async", func() error { _, err := a.Report("d", 0); return err }(), round.ClassCohort, "holds no seat")
}

// A seat survives steps while its version is at most S behind, and the
// step that puts it further behind names it and frees it.
func TestAsyncStaleSeat(t *testing.T) {
	a := newAsync(t, round.AsyncConfig{Concurrency: 4, Buffer: 1, MaxStaleness: 1})
	a.Offer("slow", 1, t0)
	for v := range uint64(2) {
		d := fmt.Sprintf("fast-%d", v)
		a.Offer(d, 1, t0)
		if _, err := a.Report(d, v); err != nil {
			t.Fatal(err)
		}
		stale, err := a.Step()
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"slow"}; v == 0 && len(stale) != 0 || v == 1 && !slices.Equal(stale, want) {
			t.Fatalf("step to version %d: stale %v", v+1, stale)
		}
	}
	if _, ok := a.Seat("slow"); ok {
		t.Fatal("a seat two versions behind with max staleness 1 survived the step")
	}
}

// Check is Report without its effects; a refused stale report frees the
// seat at once.
func TestAsyncCheckAndStaleRefusal(t *testing.T) {
	a := newAsync(t, round.AsyncConfig{Concurrency: 2, Buffer: 1, MaxStaleness: 3})
	a.Offer("a", 1, t0)
	if b, err := a.Check("a", 0); err != nil || b.Weight != 1 || a.Training() != 1 || len(a.Buffer()) != 0 {
		t.Fatalf("check: %+v %v", b, err)
	}
	// A state restored with a seat past S (as a store written by another
	// version of the rules could hold): its report is refused as stale.
	b, err := round.NewAsync(round.AsyncConfig{Concurrency: 2, Buffer: 1, MaxStaleness: 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	state := []byte(`{"version":5,"seats":{"old":{"version":2,"since":"2026-12-01T00:00:00Z","examples":1}},"buffer":[]}`)
	if err := b.UnmarshalBinary(state); err != nil {
		t.Fatal(err)
	}
	refusedAs(t, "async", func() error { _, err := b.Report("old", 2); return err }(), round.ClassStale, "3 versions behind the current 5")
	if b.Training() != 0 {
		t.Fatal("the stale device keeps its seat")
	}
}

func TestAsyncExpiry(t *testing.T) {
	a := newAsync(t, round.AsyncConfig{Concurrency: 3, Buffer: 1})
	if !a.NextExpiry(time.Minute).IsZero() {
		t.Fatal("an expiry without seats")
	}
	a.Offer("b", 1, t0.Add(30*time.Second))
	a.Offer("a", 1, t0)
	if got := a.NextExpiry(time.Minute); !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("next expiry %v", got)
	}
	if e := a.Expired(t0.Add(time.Minute), time.Minute); len(e) != 0 {
		t.Fatalf("expired at the limit: %v", e)
	}
	if e := a.Expired(t0.Add(2*time.Minute), time.Minute); !slices.Equal(e, []string{"a", "b"}) {
		t.Fatalf("expired %v", e)
	}
	a.Release("a")
	if _, ok := a.Seat("a"); ok || a.Training() != 1 {
		t.Fatal("release kept the seat")
	}
}

// The state round-trips, and states no Async reaches are refused.
func TestAsyncState(t *testing.T) {
	cfg := round.AsyncConfig{Concurrency: 3, Buffer: 2, MaxStaleness: 2}
	a := newAsync(t, cfg)
	a.Offer("a", 4, t0)
	a.Offer("b", 5, t0)
	a.Report("a", 0)
	a.Report("b", 0)
	a.Step()
	a.Offer("c", 6, t0.Add(time.Second))
	a.Offer("a", 4, t0.Add(2*time.Second))
	a.Report("a", 1)
	b, err := a.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	back := newAsync(t, cfg)
	if err := back.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	again, _ := back.MarshalBinary()
	if string(again) != string(b) || back.Version() != 1 || back.Training() != 1 || len(back.Buffer()) != 1 {
		t.Fatalf("round trip:\n%s\n%s", b, again)
	}
	if o := back.Offer("a", 4, t0); o.Action != round.Defer {
		t.Fatalf("a buffered device after a restore: %+v", o)
	}
	for name, doc := range map[string]string{
		"json":           `{`,
		"future seat":    `{"version":1,"seats":{"a":{"version":2}},"buffer":[]}`,
		"empty device":   `{"version":1,"seats":{"":{"version":1}},"buffer":[]}`,
		"twice buffered": `{"version":1,"seats":{},"buffer":[{"device":"a","version":1,"staleness":0,"weight":1},{"device":"a","version":1,"staleness":0,"weight":1}]}`,
		"weight":         `{"version":1,"seats":{},"buffer":[{"device":"a","version":1,"staleness":0,"weight":5}]}`,
		"staleness":      `{"version":4,"seats":{},"buffer":[{"device":"a","version":1,"staleness":3,"weight":0.5}]}`,
		"seated and buffered": `{"version":1,"seats":{"a":{"version":1}},` +
			`"buffer":[{"device":"a","version":1,"staleness":0,"weight":1}]}`,
		"too many seats": `{"version":1,"seats":{"a":{"version":1},"b":{"version":1},"c":{"version":1},"d":{"version":1}},"buffer":[]}`,
	} {
		if err := newAsync(t, cfg).UnmarshalBinary([]byte(doc)); !errors.Is(err, round.ErrState) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzAsyncState: any bytes either restore to a state that serializes back
// to itself or are refused with ErrState. Seeds: testdata/async (each
// must restore: TestAsyncSeeds).
func FuzzAsyncState(f *testing.F) {
	seeds.AddTo(f, "async", "*.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg := round.AsyncConfig{Concurrency: 4, Buffer: 2, MaxStaleness: 3}
		a, err := round.NewAsync(cfg, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, round.ErrState) {
				t.Fatalf("refused without ErrState: %v", err)
			}
			return
		}
		out, err := a.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		c, _ := round.NewAsync(cfg, 0)
		if err := c.UnmarshalBinary(out); err != nil {
			t.Fatalf("a restored state does not restore again: %v\n%s", err, out)
		}
		again, _ := c.MarshalBinary()
		if string(again) != string(out) {
			t.Fatalf("not stable:\n%s\n%s", out, again)
		}
	})
}

func TestAsyncSeeds(t *testing.T) {
	for name, b := range seeds.Read(t, "async", "*.json") {
		if err := newAsync(t, round.AsyncConfig{Concurrency: 4, Buffer: 2, MaxStaleness: 3}).UnmarshalBinary(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAsyncStale: Stale refuses exactly the versions more than
// MaxStaleness behind, the seat's or one Step gave up.
func TestAsyncStale(t *testing.T) {
	a, err := round.NewAsync(round.AsyncConfig{Concurrency: 2, Buffer: 1, MaxStaleness: 2}, 5)
	if err != nil {
		t.Fatal(err)
	}
	for v := uint64(0); v <= 6; v++ {
		err := a.Stale(v)
		if (v < 3) != (err != nil) {
			t.Errorf("version %d of 5: %v", v, err)
		}
	}
	refusedAs(t, "stale", a.Stale(2), round.ClassStale, "3 versions behind the current 5")
	a.Offer("d", 1, time.Unix(0, 0))
	a.Report("d", 5)
	a.Abandon()
	if len(a.Buffer()) != 0 || a.Version() != 5 {
		t.Fatalf("after Abandon: %d buffered, version %d", len(a.Buffer()), a.Version())
	}
	if o := a.Offer("d", 1, time.Unix(0, 0)); o.Action != round.Reserve {
		t.Fatalf("d after Abandon: %+v", o)
	}
}
