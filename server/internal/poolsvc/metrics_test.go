package poolsvc

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// counter reads the default tenant's series of a per-tenant counter.
func counter(t *testing.T, m *metrics.M, name string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if f.GetName() == name && l.GetName() == "tenant" && l.GetValue() == DefaultTenant {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{tenant=%q}", name, DefaultTenant)
	return 0
}

// TestMetricsUsageAndCounts: a rank's reported CPU time and its metered GPU
// time count for its tenant, and the scrape-time counts see the running
// job, one queued behind the spent budget and the worker.
func TestMetricsUsageAndCounts(t *testing.T) {
	m := metrics.New()
	// Over its budget, the heartbeat returns at once with a checkpoint
	// stop, rather than long-polling the fake clock.
	e := newEnv(t, func(d *Deps) {
		d.Metrics = m
		d.Tenants = map[string]pool.Tenant{DefaultTenant: {Weight: 1, Budget: pool.Budget{CPUSeconds: 100, Window: time.Hour}}}
	})
	ws, _ := startGang(t, e, "first", 1)
	e.clk.Advance(time.Second)
	if _, err := ws[0].heartbeat(&pb.RankStatus{JobId: "first", Attempt: 1, Rank: 0, Step: 5, Usage: &pb.PoolUsage{CpuSeconds: 150}}); err != nil {
		t.Fatal(err)
	}
	if cpu, gpu := counter(t, m, "fleetlearn_pool_usage_cpu_seconds_total"), counter(t, m, "fleetlearn_pool_usage_gpu_seconds_total"); cpu != 150 || gpu != 1 {
		t.Errorf("tenant usage %v CPU-s and %v GPU-s, want 150 and 1", cpu, gpu)
	}
	e.submit(spec("second", 1), nil)
	c, err := e.svc.poolCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	running := c.Jobs[metrics.PoolJobKey{State: "running", Tenant: DefaultTenant}]
	queued := c.Jobs[metrics.PoolJobKey{State: "queued", Tenant: DefaultTenant}]
	if running != 1 || queued != 1 || c.Workers[workerReady] != 1 || c.Workers[workerLost] != 0 {
		t.Errorf("counts %+v, want 1 running and 1 queued job and 1 ready worker", c)
	}
}
