package pool_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool"
)

func TestGangNeverPartial(t *testing.T) {
	s, _ := newSched(t, nil)
	addWorkers(t, s, 3, pool.Resources{MilliCPU: 32_000, Memory: 256 * gib, GPUs: 4})
	submit(t, s, spec("big", "acme", 0, 10)) // 12 GPUs free, 10 fit: two ranks share... all on 3 hosts
	submit(t, s, spec("next", "acme", 0, 3)) // 2 GPUs left: must not start 2 of 3
	ds := s.Schedule()
	placed := byAction(ds, pool.Place)
	if len(placed) != 1 || placed["big"].Job != "big" {
		t.Fatalf("decisions %+v", ds)
	}
	want := []pool.Assignment{{"w-00", 4}, {"w-01", 4}, {"w-02", 2}}
	if got := placed["big"].Placement; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("placement %+v, want %+v", got, want)
	}
	if j := job(t, s, "next"); j.State != pool.Queued || len(j.Placement) != 0 {
		t.Fatalf("next: %+v", j)
	}
	checkCapacity(t, s)

	// Fragmentation: 2 GPUs free on each of two hosts is 4 GPUs, but no
	// 4-GPU rank fits anywhere, so nothing may start.
	s2, _ := newSched(t, nil)
	addWorkers(t, s2, 2, pool.Resources{MilliCPU: 32_000, Memory: 256 * gib, GPUs: 2})
	sp := spec("wide", "acme", 0, 1)
	sp.PerRank.GPUs = 4
	submit(t, s2, sp)
	if ds := s2.Schedule(); len(ds) != 0 {
		t.Fatalf("fragmented gang placed: %+v", ds)
	}
	if j := job(t, s2, "wide"); !strings.Contains(j.Reason, "does not fit the pool") {
		t.Fatalf("reason %q", j.Reason)
	}
}

// Placement is a function of the inputs: two schedulers fed the same
// events decide the same.
func TestPlacementDeterministic(t *testing.T) {
	run := func() []pool.Decision {
		s, _ := newSched(t, nil)
		addWorkers(t, s, 5, gpuWorker)
		r := rand.New(rand.NewPCG(1, 2))
		var ids []string
		for i := range 30 {
			sp := spec(strings.ToLower(string(rune('a'+i%26)))+"-"+string(rune('a'+i/26)), "acme", r.IntN(3), 1+r.IntN(8))
			ids = append(ids, sp.ID)
			submit(t, s, sp)
		}
		return s.Schedule()
	}
	a, b := run(), run()
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("%d vs %d decisions", len(a), len(b))
	}
	for i := range a {
		if a[i].Job != b[i].Job || len(a[i].Placement) != len(b[i].Placement) {
			t.Fatalf("decision %d: %+v vs %+v", i, a[i], b[i])
		}
		for k := range a[i].Placement {
			if a[i].Placement[k] != b[i].Placement[k] {
				t.Fatalf("decision %d: %+v vs %+v", i, a[i], b[i])
			}
		}
	}
}

func TestQuota(t *testing.T) {
	s, _ := newSched(t, map[string]pool.Tenant{
		"acme":   {Weight: 1, Quota: pool.Resources{GPUs: 4}},
		"globex": {Weight: 1},
	})
	addWorkers(t, s, 2, gpuWorker)
	submit(t, s, spec("a1", "acme", 0, 3))
	submit(t, s, spec("a2", "acme", 0, 2)) // 5 > 4
	submit(t, s, spec("a3", "acme", 0, 1)) // would fit the quota, but waits behind a2
	submit(t, s, spec("g1", "globex", 0, 6))
	placed := byAction(s.Schedule(), pool.Place)
	if len(placed) != 2 || placed["a1"].Job == "" || placed["g1"].Job == "" {
		t.Fatalf("placed %v", placed)
	}
	for _, id := range []string{"a2", "a3"} {
		if j := job(t, s, id); j.State != pool.Queued || !strings.Contains(j.Reason, "over quota: tenant acme would hold 5 of 4 GPUs") {
			t.Fatalf("%s: %s %q", id, j.State, j.Reason)
		}
	}
	if err := s.Checkpointed("a1", 1000); err != nil {
		t.Fatal(err)
	}
	placed = byAction(s.Schedule(), pool.Place)
	if len(placed) != 2 || placed["a2"].Job == "" || placed["a3"].Job == "" {
		t.Fatalf("after a1 finished: %v", placed)
	}
	checkCapacity(t, s)
}

// With 3:1 weights and both queues always full, GPU-seconds split 3:1.
// The tolerance is for backfill: a tenant's 1-rank job may take a GPU that
// the other tenant's 2-rank head cannot use yet.
func TestFairShareConvergesToWeights(t *testing.T) {
	s, clk := newSched(t, map[string]pool.Tenant{"acme": {Weight: 3}, "globex": {Weight: 1}})
	addWorkers(t, s, 2, gpuWorker)
	r := rand.New(rand.NewPCG(7, 7))
	n := 0
	left := map[string]int{} // ticks until a running job ends
	gpuSec := map[string]float64{}
	queued := map[string]int{}
	for tick := range 2000 {
		for _, ten := range []string{"acme", "globex"} {
			for ; queued[ten] < 16; queued[ten]++ {
				n++
				sp := spec(ten+"-"+itoa(n), ten, 0, 1+r.IntN(2))
				sp.TotalSteps, sp.CheckpointInterval = 1, 1
				submit(t, s, sp)
			}
		}
		for id := range byAction(s.Schedule(), pool.Place) {
			left[id] = 1 + r.IntN(4)
			queued[job(t, s, id).Spec.Tenant]--
		}
		if tick >= 200 {
			for id := range left {
				j := job(t, s, id)
				gpuSec[j.Spec.Tenant] += float64(j.Spec.Ranks)
			}
		}
		clk.Advance(time.Second)
		for id := range left {
			if left[id]--; left[id] == 0 {
				delete(left, id)
				if err := s.Checkpointed(id, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ratio := gpuSec["acme"] / gpuSec["globex"]
	t.Logf("GPU-seconds acme %.0f globex %.0f ratio %.2f (weights 3:1)", gpuSec["acme"], gpuSec["globex"], ratio)
	if ratio < 2.55 || ratio > 3.45 {
		t.Fatalf("ratio %.2f, want 3 ± 15%%", ratio)
	}
}

func itoa(n int) string {
	const d = "0123456789"
	if n < 10 {
		return d[n : n+1]
	}
	return itoa(n/10) + d[n%10:n%10+1]
}

func TestPreemptionLeastWorkAtCheckpoint(t *testing.T) {
	s, _ := newSched(t, nil)
	addWorkers(t, s, 1, gpuWorker)
	// Four low-priority jobs, 2 GPUs each, fill the host.
	since := map[string]int64{"lo-a": 30, "lo-b": 5, "lo-c": 50, "lo-d": 5}
	for _, id := range []string{"lo-a", "lo-b", "lo-c", "lo-d"} {
		submit(t, s, spec(id, "acme", 0, 2))
	}
	if got := len(byAction(s.Schedule(), pool.Place)); got != 4 {
		t.Fatalf("placed %d", got)
	}
	submit(t, s, spec("lo-e", "acme", 1, 2)) // above lo-*, below hi
	for id, n := range since {
		if err := s.Checkpointed(id, 200); err != nil {
			t.Fatal(err)
		}
		if err := s.Progress(id, 200+n); err != nil {
			t.Fatal(err)
		}
	}
	submit(t, s, spec("hi", "acme", 5, 2))
	ds := s.Schedule()
	stops := byAction(ds, pool.CheckpointStop)
	// lo-b and lo-d tie on 5 steps; the id breaks the tie.
	if len(stops) != 1 || stops["lo-b"].Job == "" || len(byAction(ds, pool.Place)) != 0 {
		t.Fatalf("decisions %+v", ds)
	}
	if want := "preempted by hi at checkpoint step 300"; stops["lo-b"].Reason != want {
		t.Fatalf("reason %q, want %q", stops["lo-b"].Reason, want)
	}
	// Until lo-b reaches its boundary nothing changes, and no second victim
	// is taken: the one stopping already frees enough.
	if ds := s.Schedule(); len(ds) != 0 {
		t.Fatalf("second pass: %+v", ds)
	}
	if j := job(t, s, "lo-b"); j.State != pool.Running || !j.Stopping {
		t.Fatalf("lo-b %+v", j)
	}
	if err := s.Checkpointed("lo-b", 250); !errors.Is(err, pool.ErrNotBoundary) {
		t.Fatalf("checkpoint off a boundary: %v", err)
	}
	if err := s.Checkpointed("lo-b", 300); err != nil {
		t.Fatal(err)
	}
	j := job(t, s, "lo-b")
	if j.State != pool.Queued || j.Committed != 300 || j.Restarts != 0 || j.Reason != "preempted by hi at checkpoint step 300" {
		t.Fatalf("lo-b after stop: %+v", j)
	}
	placed := byAction(s.Schedule(), pool.Place)
	if len(placed) != 1 || placed["hi"].Job == "" {
		t.Fatalf("placed %v", placed)
	}
	checkCapacity(t, s)
	// lo-b resumes from its checkpoint once there is room.
	if err := s.Checkpointed("hi", 1000); err != nil {
		t.Fatal(err)
	}
	// lo-e (priority 1) goes before lo-b (priority 0).
	placed = byAction(s.Schedule(), pool.Place)
	if len(placed) != 1 || placed["lo-e"].Job == "" {
		t.Fatalf("placed %v", placed)
	}
	if err := s.Cancel("lo-a"); err != nil {
		t.Fatal(err)
	}
	placed = byAction(s.Schedule(), pool.Place)
	if j := job(t, s, "lo-b"); placed["lo-b"].Job == "" || j.Step != 300 {
		t.Fatalf("lo-b not resumed from 300: %+v", j)
	}
}

// Equal priorities never preempt each other.
func TestNoPreemptionBetweenEquals(t *testing.T) {
	s, _ := newSched(t, nil)
	addWorkers(t, s, 1, gpuWorker)
	submit(t, s, spec("a", "acme", 3, 8))
	submit(t, s, spec("b", "acme", 3, 8))
	ds := s.Schedule()
	if len(ds) != 1 || ds[0].Job != "a" {
		t.Fatalf("%+v", ds)
	}
	if ds := s.Schedule(); len(ds) != 0 {
		t.Fatalf("%+v", ds)
	}
}

func TestBudgetHold(t *testing.T) {
	s, clk := newSched(t, map[string]pool.Tenant{"acme": {Weight: 1, Budget: pool.Budget{GPUSeconds: 100, Window: time.Hour}}})
	addWorkers(t, s, 1, gpuWorker)
	submit(t, s, spec("a", "acme", 0, 2))
	if len(byAction(s.Schedule(), pool.Place)) != 1 {
		t.Fatal("a not placed")
	}
	clk.Advance(time.Minute)
	if err := s.Meter("a", pool.Reading{At: clk.Now(), CPUSeconds: 960, GPUSeconds: 120}); err != nil {
		t.Fatal(err)
	}
	if err := s.Meter("a", pool.Reading{At: clk.Now(), GPUSeconds: -1}); !errors.Is(err, pool.ErrBadReading) {
		t.Fatalf("negative reading: %v", err)
	}
	submit(t, s, spec("b", "acme", 0, 2))
	ds := s.Schedule()
	want := "over budget: tenant acme used 120 of 100 GPU-seconds in period 1h0m0s ending 2026-03-01T00:01:00Z"
	if len(ds) != 1 || ds[0].Action != pool.CheckpointStop || ds[0].Job != "a" || ds[0].Reason != want {
		t.Fatalf("decisions %+v", ds)
	}
	if j := job(t, s, "b"); j.State != pool.Queued || j.Reason != want {
		t.Fatalf("b: %s %q", j.State, j.Reason)
	}
	// a finishes its interval and stops there, keeping the checkpoint.
	if err := s.Checkpointed("a", 100); err != nil {
		t.Fatal(err)
	}
	if j := job(t, s, "a"); j.State != pool.Queued || j.Committed != 100 || !strings.HasPrefix(j.Reason, "over budget") {
		t.Fatalf("a: %+v", j)
	}
	clk.Advance(58 * time.Minute)
	if ds := s.Schedule(); len(byAction(ds, pool.Place)) != 0 {
		t.Fatalf("placed inside the window: %+v", ds)
	}
	clk.Advance(2 * time.Minute) // the reading is now more than an hour old
	if placed := byAction(s.Schedule(), pool.Place); len(placed) != 2 {
		t.Fatalf("after the window rolled: %v", placed)
	}
}

func TestRestartsExhausted(t *testing.T) {
	s, _ := newSched(t, nil)
	addWorkers(t, s, 2, gpuWorker)
	sp := spec("j", "acme", 0, 12)
	sp.MaxRestarts = 1
	submit(t, s, sp)
	s.Schedule()
	if err := s.Checkpointed("j", 100); err != nil {
		t.Fatal(err)
	}
	if err := s.Progress("j", 160); err != nil {
		t.Fatal(err)
	}
	ds, err := s.LoseWorker("w-01")
	if err != nil || len(ds) != 1 || ds[0].Action != pool.Abort {
		t.Fatalf("%+v %v", ds, err)
	}
	j := job(t, s, "j")
	if j.State != pool.Queued || j.Restarts != 1 || j.Committed != 100 || j.Step != 100 ||
		j.Reason != "worker w-01 lost; restart 1 of 1 from checkpoint step 100" {
		t.Fatalf("%+v", j)
	}
	if err := s.AddWorker("w-02", gpuWorker); err != nil {
		t.Fatal(err)
	}
	if len(byAction(s.Schedule(), pool.Place)) != 1 {
		t.Fatal("not replaced")
	}
	checkCapacity(t, s)
	ds, _ = s.LoseWorker("w-02")
	if len(ds) != 1 || ds[0].Action != pool.Fail || !strings.Contains(ds[0].Reason, "restarts exhausted (1 of 1)") {
		t.Fatalf("%+v", ds)
	}
	if j := job(t, s, "j"); j.State != pool.Failed {
		t.Fatalf("%+v", j)
	}
	checkCapacity(t, s)
	if _, err := s.LoseWorker("w-02"); !errors.Is(err, pool.ErrUnknownWorker) {
		t.Fatal(err)
	}
}

func TestDeadline(t *testing.T) {
	s, clk := newSched(t, nil)
	addWorkers(t, s, 1, gpuWorker)
	sp := spec("late", "acme", 0, 16) // never fits
	sp.PerRank.GPUs = 1
	sp.Deadline = t0.Add(time.Hour)
	submit(t, s, sp)
	s.Schedule()
	clk.Advance(time.Hour)
	ds := s.Schedule()
	if len(ds) != 1 || ds[0].Action != pool.Fail || !strings.HasPrefix(ds[0].Reason, "deadline") {
		t.Fatalf("%+v", ds)
	}
}

func TestSubmitRejects(t *testing.T) {
	s, _ := newSched(t, nil)
	if err := s.Submit(spec("x", "nobody", 0, 1)); !errors.Is(err, pool.ErrUnknownTenant) {
		t.Fatal(err)
	}
	submit(t, s, spec("x", "acme", 0, 1))
	if err := s.Submit(spec("x", "acme", 0, 1)); !errors.Is(err, pool.ErrDuplicate) {
		t.Fatal(err)
	}
	bad := spec("y", "acme", 0, 0)
	if err := s.Submit(bad); !errors.Is(err, pool.ErrInvalidSpec) {
		t.Fatal(err)
	}
	if err := s.AddWorker("W", gpuWorker); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := pool.NewScheduler(pool.Config{Tenants: map[string]pool.Tenant{"a": {Weight: 0}}}); !errors.Is(err, pool.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

func TestCrashedRestartsFromCheckpoint(t *testing.T) {
	s, _ := newSched(t, nil)
	addWorkers(t, s, 1, gpuWorker)
	sp := spec("j", "acme", 0, 4)
	sp.MaxRestarts = 0
	submit(t, s, sp)
	submit(t, s, spec("k", "acme", 0, 4))
	s.Schedule()
	if err := s.Progress("j", 2000); !errors.Is(err, pool.ErrBadReading) {
		t.Fatalf("progress past the end: %v", err)
	}
	if _, err := s.Crashed("nope", "x"); !errors.Is(err, pool.ErrUnknownJob) {
		t.Fatal(err)
	}
	d, err := s.Crashed("j", "CUDA error: an illegal memory access")
	if err != nil || d.Action != pool.Fail || !strings.Contains(d.Reason, "restarts exhausted (0 of 0)") {
		t.Fatalf("%+v %v", d, err)
	}
	d, err = s.Crashed("k", "oom")
	if err != nil || d.Action != pool.Abort || job(t, s, "k").Restarts != 1 {
		t.Fatalf("%+v %v", d, err)
	}
	checkCapacity(t, s)
	if w := s.Workers()[0]; w.Free != w.Capacity {
		t.Fatalf("crashed gangs still hold %v", w.Capacity.GPUs-w.Free.GPUs)
	}
}
