package pool_test

import (
	"fmt"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/pool"
)

// The server's loop: report events, run a pass, carry out the decisions.
func Example() {
	clk := clock.NewFake(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	s, err := pool.NewScheduler(pool.Config{
		Tenants: map[string]pool.Tenant{"research": {Weight: 1}},
		Clock:   clk,
	})
	if err != nil {
		panic(err)
	}
	host := pool.Resources{MilliCPU: 64_000, Memory: 512 << 30, GPUs: 8}
	_ = s.AddWorker("gpu-a", host)
	_ = s.AddWorker("gpu-b", host)

	rank := pool.Resources{MilliCPU: 8_000, Memory: 64 << 30, GPUs: 1}
	_ = s.Submit(pool.Spec{ID: "pretrain-1", Tenant: "research", Ranks: 12, PerRank: rank,
		MaxRestarts: 2, CheckpointInterval: 500, TotalSteps: 10_000, OutputModel: "base-1b"})
	for _, d := range s.Schedule() {
		fmt.Println(d.Action, d.Job, d.Placement)
	}

	// gpu-b dies: the whole gang restarts from its last checkpoint.
	_ = s.Checkpointed("pretrain-1", 500)
	ds, _ := s.LoseWorker("gpu-b")
	fmt.Println(ds[0].Action, ds[0].Reason)
	j, _ := s.Job("pretrain-1")
	fmt.Println(j.State, "→ audit state", j.State.AuditState())
	// Output:
	// place pretrain-1 [{gpu-a 8} {gpu-b 4}]
	// abort worker gpu-b lost; restart 1 of 2 from checkpoint step 500
	// queued → audit state submitted
}

// A higher-priority gang that does not fit asks the victim with least work
// since its checkpoint to stop at its next one.
func ExampleScheduler_Schedule_preemption() {
	clk := clock.NewFake(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	s, _ := pool.NewScheduler(pool.Config{Tenants: map[string]pool.Tenant{"research": {Weight: 1}}, Clock: clk})
	_ = s.AddWorker("gpu-a", pool.Resources{MilliCPU: 64_000, Memory: 512 << 30, GPUs: 8})
	rank := pool.Resources{MilliCPU: 8_000, Memory: 64 << 30, GPUs: 1}
	for _, id := range []string{"sweep-1", "sweep-2"} {
		_ = s.Submit(pool.Spec{ID: id, Tenant: "research", Ranks: 4, PerRank: rank,
			CheckpointInterval: 100, TotalSteps: 1000, OutputModel: "probe"})
	}
	s.Schedule()
	_ = s.Progress("sweep-1", 80)
	_ = s.Progress("sweep-2", 30)
	_ = s.Submit(pool.Spec{ID: "urgent", Tenant: "research", Priority: 10, Ranks: 4, PerRank: rank,
		CheckpointInterval: 100, TotalSteps: 1000, OutputModel: "fix"})
	for _, d := range s.Schedule() {
		fmt.Println(d.Action, d.Job, d.Reason)
	}
	_ = s.Checkpointed("sweep-2", 100)
	for _, d := range s.Schedule() {
		fmt.Println(d.Action, d.Job, d.Placement)
	}
	// Output:
	// checkpoint-stop sweep-2 preempted by urgent at checkpoint step 100
	// place urgent [{gpu-a 4}]
}
