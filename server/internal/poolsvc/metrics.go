package poolsvc

import (
	"context"
	"fmt"
	"strings"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// Worker states: PoolWorker.state, and the labels of fleetlearn_pool_workers.
const (
	workerReady = "ready"
	workerLost  = "lost"
)

// meterTenant adds charged usage to the tenant's counters. Tenants are the
// configured ones (Submit refuses others), so the label set is bounded.
func (s *Service) meterTenant(tenant string, cpu, gpu, energy float64) {
	m := s.d.Metrics
	if cpu > 0 {
		m.PoolCPU.WithLabelValues(tenant).Add(cpu)
	}
	if gpu > 0 {
		m.PoolGPU.WithLabelValues(tenant).Add(gpu)
	}
	if energy > 0 {
		m.PoolEnergy.WithLabelValues(tenant).Add(energy)
	}
}

// poolCounts is the scrape-time source of the pool's job and worker series,
// read on the loop goroutine, which owns them. Only jobs that have not
// ended are counted (ended ones leave memory once their ranks report), and
// every configured tenant reads 0 queued and running jobs when it has none.
func (s *Service) poolCounts(ctx context.Context) (metrics.PoolCounts, error) {
	out := metrics.PoolCounts{Jobs: map[metrics.PoolJobKey]int{}, Workers: map[string]int{workerReady: 0, workerLost: 0}}
	for tenant := range s.d.Tenants {
		for _, st := range []pb.PoolJobState{pb.PoolJobState_POOL_JOB_STATE_QUEUED, pb.PoolJobState_POOL_JOB_STATE_RUNNING} {
			out.Jobs[metrics.PoolJobKey{State: jobStateName(st), Tenant: tenant}] = 0
		}
	}
	err := s.do(ctx, func() error {
		for _, rt := range s.jobs {
			if rt.terminal() {
				continue
			}
			out.Jobs[metrics.PoolJobKey{State: jobStateName(rt.rec.GetState()), Tenant: rt.spec.Tenant}]++
		}
		for _, w := range s.workers {
			if w.lost {
				out.Workers[workerLost]++
			} else {
				out.Workers[workerReady]++
			}
		}
		return nil
	})
	if err != nil {
		return metrics.PoolCounts{}, fmt.Errorf("poolsvc: metrics: %w", err)
	}
	return out, nil
}

// jobStateName is a job state as the metrics label it: "queued", "running".
func jobStateName(st pb.PoolJobState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "POOL_JOB_STATE_"))
}
