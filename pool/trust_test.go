package pool_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool"
)

// workerOf is the worker a one-rank job was placed on.
func workerOf(t *testing.T, ds []pool.Decision, job string) string {
	t.Helper()
	d, ok := byAction(ds, pool.Place)[job]
	if !ok || len(d.Placement) != 1 {
		t.Fatalf("job %s not placed on one worker: %+v", job, ds)
	}
	return d.Placement[0].Worker
}

func strikes(t *testing.T, s *pool.Scheduler, id string) pool.Worker {
	t.Helper()
	for _, w := range s.Workers() {
		if w.ID == id {
			return w
		}
	}
	t.Fatalf("no worker %s", id)
	return pool.Worker{}
}

// A worker claiming 8 GPUs is preferred by placement (it takes the most
// ranks). Once it leaves a lease unstarted it gets nothing beyond what it
// has demonstrated, for a period that doubles with each strike, and the
// jobs go to the honest one-GPU workers.
func TestFakeCapacityStopsBeingPreferred(t *testing.T) {
	s, clk := newSched(t, nil)
	if err := s.AddWorker("fake", gpuWorker); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"honest-1", "honest-2"} {
		if err := s.AddWorker(id, rank1); err != nil {
			t.Fatal(err)
		}
	}
	submit(t, s, spec("a", "acme", 0, 1))
	if w := workerOf(t, s.Schedule(), "a"); w != "fake" {
		t.Fatalf("job a on %s: the claimed 8 GPUs should have drawn it", w)
	}
	d, err := s.NoStart("a", "fake", "no rank reported within 30s")
	if err != nil {
		t.Fatal(err)
	}
	if d.Action != pool.Abort || d.Job != "a" || !strings.Contains(d.Reason, "worker fake did not start its ranks") {
		t.Fatalf("decision %+v", d)
	}
	if j := job(t, s, "a"); j.State != pool.Queued || j.Restarts != 0 {
		t.Fatalf("job a after the no-start: %v, %d restarts (want queued, none charged)", j.State, j.Restarts)
	}
	w := strikes(t, s, "fake")
	if w.Strikes != 1 || !w.DistrustedUntil.Equal(t0.Add(pool.DefaultDistrust)) || w.Free != gpuWorker {
		t.Fatalf("fake worker after its no-start: %+v", w)
	}
	// Honest work proceeds on the honest workers; the fake one, which has
	// demonstrated nothing, gets nothing.
	submit(t, s, spec("b", "acme", 0, 1))
	ds := s.Schedule()
	if wa, wb := workerOf(t, ds, "a"), workerOf(t, ds, "b"); wa == "fake" || wb == "fake" || wa == wb {
		t.Fatalf("a on %s, b on %s", wa, wb)
	}
	submit(t, s, spec("c", "acme", 0, 1))
	if ds := s.Schedule(); len(byAction(ds, pool.Place)) != 0 {
		t.Fatalf("placed on the distrusted worker: %+v", ds)
	}
	if j := job(t, s, "c"); !strings.Contains(j.Reason, "head of line") {
		t.Fatalf("job c waits with %q, want a reservation on an honest worker", j.Reason)
	}
	checkCapacity(t, s)

	// The period ends: the claim is trusted again, and a second strike
	// distrusts it for twice as long.
	clk.Advance(pool.DefaultDistrust)
	if w := workerOf(t, s.Schedule(), "c"); w != "fake" {
		t.Fatalf("job c on %s after the distrust ended", w)
	}
	if _, err := s.NoStart("c", "fake", "again"); err != nil {
		t.Fatal(err)
	}
	if w := strikes(t, s, "fake"); w.Strikes != 2 || !w.DistrustedUntil.Equal(clk.Now().Add(2*pool.DefaultDistrust)) {
		t.Fatalf("after the second strike: %+v", w)
	}
	if _, err := s.NoStart("c", "fake", "stale"); !errors.Is(err, pool.ErrBadTransition) {
		t.Fatalf("no-start of a queued job: %v", err)
	}
	if _, err := s.NoStart("a", "fake", "not there"); !errors.Is(err, pool.ErrUnknownWorker) {
		t.Fatalf("no-start on a worker the job is not on: %v", err)
	}
}

// A distrusted worker keeps what it demonstrated: it started a one-GPU
// rank, then left a two-rank lease unstarted, and is offered one-GPU
// ranks only.
func TestDistrustedWorkerKeepsProvenCapacity(t *testing.T) {
	s, _ := newSched(t, nil)
	if err := s.AddWorker("big", gpuWorker); err != nil {
		t.Fatal(err)
	}
	submit(t, s, spec("one", "acme", 0, 1))
	if w := workerOf(t, s.Schedule(), "one"); w != "big" {
		t.Fatal(w)
	}
	if err := s.Started("one", "big"); err != nil {
		t.Fatal(err)
	}
	if err := s.Started("one", "nobody"); !errors.Is(err, pool.ErrUnknownWorker) {
		t.Fatalf("started on an unknown worker: %v", err)
	}
	if err := s.Cancel("one"); err != nil {
		t.Fatal(err)
	}
	submit(t, s, spec("two", "acme", 0, 2))
	if ds := s.Schedule(); len(byAction(ds, pool.Place)) != 1 {
		t.Fatalf("%+v", ds)
	}
	if _, err := s.NoStart("two", "big", "silent"); err != nil {
		t.Fatal(err)
	}
	if w := strikes(t, s, "big"); w.Proven != rank1 {
		t.Fatalf("proven %v, want one rank's %v", w.Proven, rank1)
	}
	submit(t, s, spec("small", "acme", 1, 1))
	ds := s.Schedule()
	if _, ok := byAction(ds, pool.Place)["two"]; ok {
		t.Fatalf("two ranks placed beyond the proven capacity: %+v", ds)
	}
	if w := workerOf(t, ds, "small"); w != "big" {
		t.Fatal(w)
	}
	if j := job(t, s, "two"); !strings.Contains(j.Reason, "does not fit the pool's capacity") {
		t.Fatalf("job two waits with %q: a reservation of the unproven claim would hold the queue", j.Reason)
	}
	checkCapacity(t, s)

	// A new worker of the same owner can be handed the record.
	if err := s.AddWorker("big-again", gpuWorker); err != nil {
		t.Fatal(err)
	}
	until := t0.Add(3 * time.Hour)
	if err := s.SetStrikes("big-again", 1, until); err != nil {
		t.Fatal(err)
	}
	if w := strikes(t, s, "big-again"); w.Strikes != 1 || !w.DistrustedUntil.Equal(until) {
		t.Fatalf("%+v", w)
	}
	if err := s.SetStrikes("gone", 1, until); !errors.Is(err, pool.ErrUnknownWorker) {
		t.Fatal(err)
	}
}
