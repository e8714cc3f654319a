package pool_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool"
)

// A job with NotBefore waits without holding anything back: a later job
// that would have backfilled around a reservation takes the whole pool,
// and the waiting job is placed on the first pass at or after NotBefore.
func TestNotBeforeWaitsWithoutReservation(t *testing.T) {
	s, clk := newSched(t, nil)
	addWorkers(t, s, 1, gpuWorker)
	late := spec("late", "acme", 10, 8)
	late.NotBefore = t0.Add(2 * time.Hour)
	submit(t, s, late)
	submit(t, s, spec("small", "acme", 0, 8))

	placed := byAction(s.Schedule(), pool.Place)
	if _, ok := placed["small"]; !ok || len(placed) != 1 {
		t.Fatalf("placed %v, want only small: the waiting job must not reserve", placed)
	}
	want := "waiting for the low-carbon window at 2026-03-01T02:00:00Z in zone any (2h0m0s from now)"
	if j := job(t, s, "late"); j.State != pool.Queued || j.Reason != want {
		t.Fatalf("late: %s %q, want queued %q", j.State, j.Reason, want)
	}
	if err := s.Checkpointed("small", 1000); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2*time.Hour - time.Nanosecond)
	if ds := s.Schedule(); len(ds) != 0 {
		t.Fatalf("placed before NotBefore: %+v", ds)
	}
	clk.Advance(time.Nanosecond)
	if d, ok := byAction(s.Schedule(), pool.Place)["late"]; !ok || len(d.Placement) != 1 {
		t.Fatalf("late not placed at NotBefore: %+v", d)
	}
	checkCapacity(t, s)
}

// A job with a Zone runs only on that zone's workers, even when others
// are free, and waits with a reason naming the zone when they are full.
func TestZonePlacement(t *testing.T) {
	s, _ := newSched(t, nil)
	for _, w := range []struct{ id, zone string }{{"a-1", "eastus"}, {"b-1", "westus"}, {"c-1", ""}} {
		if err := s.AddWorkerInZone(w.id, w.zone, gpuWorker); err != nil {
			t.Fatal(err)
		}
	}
	west := spec("west", "acme", 0, 8)
	west.Zone = "westus"
	submit(t, s, west)
	d, ok := byAction(s.Schedule(), pool.Place)["west"]
	if !ok || len(d.Placement) != 1 || d.Placement[0].Worker != "b-1" {
		t.Fatalf("west placed %+v, want on b-1", d)
	}
	again := spec("west-2", "acme", 0, 1)
	again.Zone = "westus"
	submit(t, s, again)
	anyZone := spec("free", "acme", 0, 16)
	submit(t, s, anyZone)
	placed := byAction(s.Schedule(), pool.Place)
	if _, ok := placed["west-2"]; ok {
		t.Fatalf("west-2 placed outside its zone: %+v", placed)
	}
	if d := placed["free"]; len(d.Placement) != 2 || d.Placement[0].Worker != "a-1" || d.Placement[1].Worker != "c-1" {
		t.Fatalf("unzoned job placed %+v, want on a-1 and c-1", d)
	}
	if j := job(t, s, "west-2"); j.State != pool.Queued || j.Reason != "head of line: reserved 1 ranks, waiting for running jobs to finish" {
		t.Fatalf("west-2: %s %q", j.State, j.Reason)
	}
	nowhere := spec("nowhere", "acme", 0, 1)
	nowhere.Zone = "northeurope"
	submit(t, s, nowhere)
	s.Schedule()
	if err := s.Checkpointed("west", 1000); err != nil {
		t.Fatal(err)
	}
	placed = byAction(s.Schedule(), pool.Place)
	if d := placed["west-2"]; len(d.Placement) != 1 || d.Placement[0].Worker != "b-1" {
		t.Fatalf("west-2 after west finished: %+v", placed)
	}
	if j := job(t, s, "nowhere"); j.State != pool.Queued ||
		j.Reason != "gang of 1 ranks (8000m CPU, 68719476736 B, 1 GPU each) does not fit the capacity of the workers in zone northeurope" {
		t.Fatalf("nowhere: %s %q", j.State, j.Reason)
	}
	for _, w := range s.Workers() {
		if w.ID == "b-1" && w.Zone != "westus" {
			t.Fatalf("worker b-1 zone %q", w.Zone)
		}
	}
	checkCapacity(t, s)
}

// The same events give the same decisions and reasons.
func TestNotBeforeZoneDeterministic(t *testing.T) {
	run := func() []pool.Job {
		s, clk := newSched(t, nil)
		for _, w := range []struct{ id, zone string }{{"a-1", "eastus"}, {"a-2", "eastus"}, {"b-1", "westus"}} {
			if err := s.AddWorkerInZone(w.id, w.zone, gpuWorker); err != nil {
				t.Fatal(err)
			}
		}
		for i, z := range []string{"eastus", "westus", "", "eastus"} {
			sp := spec(string(rune('a'+i))+"-job", "acme", i, 4+4*(i%2))
			sp.Zone = z
			sp.NotBefore = t0.Add(time.Duration(i) * 30 * time.Minute)
			submit(t, s, sp)
		}
		for range 5 {
			s.Schedule()
			clk.Advance(20 * time.Minute)
		}
		return s.Jobs()
	}
	a, b := run(), run()
	for i := range a {
		if a[i].State != b[i].State || a[i].Reason != b[i].Reason || len(a[i].Placement) != len(b[i].Placement) {
			t.Fatalf("replay differs: %+v vs %+v", a[i], b[i])
		}
		for k := range a[i].Placement {
			if a[i].Placement[k] != b[i].Placement[k] {
				t.Fatalf("replay placement differs: %+v vs %+v", a[i], b[i])
			}
		}
	}
}

func TestZoneAndNotBeforeValidation(t *testing.T) {
	s, _ := newSched(t, nil)
	if err := s.AddWorkerInZone("w", "bad zone", gpuWorker); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatalf("zone with a space: %v", err)
	}
	for _, mod := range []func(*pool.Spec){
		func(sp *pool.Spec) { sp.Zone = "east us" },
		func(sp *pool.Spec) { sp.NotBefore = t0.Add(400 * 24 * time.Hour) },
		func(sp *pool.Spec) { sp.Deadline, sp.NotBefore = t0.Add(time.Hour), t0.Add(time.Hour) },
	} {
		sp := spec("j", "acme", 0, 1)
		mod(&sp)
		if err := s.Submit(sp); !errors.Is(err, pool.ErrInvalidSpec) {
			t.Errorf("%+v: %v", sp, err)
		}
	}
	sp := spec("j", "acme", 0, 1)
	d := sp.Digest()
	sp.Zone, sp.NotBefore = "westus", t0.Add(time.Hour)
	if sp.Digest() != d {
		t.Fatal("zone and not-before changed the spec digest")
	}
}
