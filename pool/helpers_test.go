package pool_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/pool"
)

var t0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

const gib = 1 << 30

// gpuWorker is a typical pool host: 8 GPUs, 64 cores, 512 GiB.
var gpuWorker = pool.Resources{MilliCPU: 64_000, Memory: 512 * gib, GPUs: 8}

// rank1 is one GPU with its share of the host.
var rank1 = pool.Resources{MilliCPU: 8_000, Memory: 64 * gib, GPUs: 1}

func newSched(t testing.TB, tenants map[string]pool.Tenant) (*pool.Scheduler, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	if tenants == nil {
		tenants = map[string]pool.Tenant{"acme": {Weight: 1}}
	}
	s, err := pool.NewScheduler(pool.Config{Tenants: tenants, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

func addWorkers(t testing.TB, s *pool.Scheduler, n int, c pool.Resources) {
	t.Helper()
	for i := range n {
		if err := s.AddWorker(fmt.Sprintf("w-%02d", i), c); err != nil {
			t.Fatal(err)
		}
	}
}

func spec(id, tenant string, prio, ranks int) pool.Spec {
	return pool.Spec{ID: id, Tenant: tenant, Priority: prio, Ranks: ranks, PerRank: rank1,
		MaxRestarts: 2, CheckpointInterval: 100, TotalSteps: 1000, OutputModel: "m-" + id}
}

func submit(t testing.TB, s *pool.Scheduler, sp pool.Spec) {
	t.Helper()
	if err := s.Submit(sp); err != nil {
		t.Fatal(err)
	}
}

func job(t testing.TB, s *pool.Scheduler, id string) pool.Job {
	t.Helper()
	j, ok := s.Job(id)
	if !ok {
		t.Fatalf("no job %s", id)
	}
	return j
}

func byAction(ds []pool.Decision, a pool.Action) map[string]pool.Decision {
	out := map[string]pool.Decision{}
	for _, d := range ds {
		if d.Action == a {
			out[d.Job] = d
		}
	}
	return out
}

// checkCapacity recomputes every worker's use from the running jobs'
// placements: a placement is never partial and no worker is overcommitted.
func checkCapacity(t testing.TB, s *pool.Scheduler) {
	t.Helper()
	used := map[string]pool.Resources{}
	for _, j := range s.Jobs() {
		if j.State != pool.Running {
			if len(j.Placement) != 0 {
				t.Fatalf("%s job %s has a placement", j.State, j.Spec.ID)
			}
			continue
		}
		n := 0
		for _, a := range j.Placement {
			n += a.Ranks
			u := used[a.Worker]
			used[a.Worker] = pool.Resources{MilliCPU: u.MilliCPU + j.Spec.PerRank.MilliCPU*int64(a.Ranks),
				Memory: u.Memory + j.Spec.PerRank.Memory*int64(a.Ranks), GPUs: u.GPUs + j.Spec.PerRank.GPUs*int64(a.Ranks)}
		}
		if n != j.Spec.Ranks {
			t.Fatalf("job %s placed %d of %d ranks", j.Spec.ID, n, j.Spec.Ranks)
		}
	}
	for _, w := range s.Workers() {
		u := used[w.ID]
		if u.MilliCPU > w.Capacity.MilliCPU || u.Memory > w.Capacity.Memory || u.GPUs > w.Capacity.GPUs {
			t.Fatalf("worker %s overcommitted: %v of %v", w.ID, u, w.Capacity)
		}
		if free := (pool.Resources{MilliCPU: w.Capacity.MilliCPU - u.MilliCPU, Memory: w.Capacity.Memory - u.Memory,
			GPUs: w.Capacity.GPUs - u.GPUs}); free != w.Free {
			t.Fatalf("worker %s free %v, placements leave %v", w.ID, w.Free, free)
		}
	}
}
