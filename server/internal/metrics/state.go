package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Scrape-time state: the fleet, the tasks and the pool are read from their
// owners (the store, the pool's loop) when Prometheus scrapes, rather than
// kept in gauges that every state change would have to update. A scrape
// costs a few counting queries (no rows are read but at most MaxTaskSeries
// tasks), scrapes run one at a time, and each reading is bounded by
// StateTimeout.
const (
	StateTimeout = 5 * time.Second
	// MaxTaskSeries caps the tasks whose progress is exported: running and
	// paused ones only, the first MaxTaskSeries of them by id.
	MaxTaskSeries = 100
)

// FleetCounts are the devices by state.
type FleetCounts struct {
	Enrolled int // enrolled and not revoked
	Online   int // not revoked, checked in within the coordinator's seen window
	Revoked  int
}

// TaskProgress is one task's progress.
type TaskProgress struct {
	ID           string
	Round        uint64 // the task's current round (any kind)
	TrainRounds  uint32 // committed training rounds
	RoundsTarget uint32 // training rounds the task runs (rounds_total)
	// EpsilonBudget is the task's DP target epsilon; 0 without one.
	EpsilonBudget float64
}

// TaskCounts are the tasks by state (lower-case state names) and the
// progress of at most MaxTaskSeries running or paused ones.
type TaskCounts struct {
	ByState  map[string]int
	Progress []TaskProgress
}

// PoolJobKey labels a pool job count.
type PoolJobKey struct{ State, Tenant string }

// PoolCounts are the pool's jobs by state and tenant and its workers by state.
type PoolCounts struct {
	Jobs    map[PoolJobKey]int
	Workers map[string]int
}

// SetFleet makes fn the source of fleetlearn_devices.
func (m *M) SetFleet(fn func(context.Context) (FleetCounts, error)) {
	setSource(m.state, &m.state.fleet, fn)
}

// SetTasks makes fn the source of fleetlearn_tasks and the per-task series.
func (m *M) SetTasks(fn func(context.Context) (TaskCounts, error)) {
	setSource(m.state, &m.state.tasks, fn)
}

// SetPool makes fn the source of fleetlearn_pool_jobs and fleetlearn_pool_workers.
func (m *M) SetPool(fn func(context.Context) (PoolCounts, error)) {
	setSource(m.state, &m.state.pool, fn)
}

// source is one scrape-time reader.
type source[T any] struct {
	read func(context.Context) (T, error)
}

func setSource[T any](c *stateCollector, s *source[T], fn func(context.Context) (T, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*s = source[T]{read: fn}
}

// get reads s; false when there is no source or the read failed.
func get[T any](c *stateCollector, s *source[T], name string) (T, bool) {
	if s.read == nil {
		var zero T
		return zero, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), StateTimeout)
	defer cancel()
	v, err := s.read(ctx)
	if err != nil {
		c.errors.WithLabelValues(name).Inc()
		return v, false
	}
	return v, true
}

type stateCollector struct {
	// mu serializes scrapes, so that they never pile up on the store.
	mu    sync.Mutex
	fleet source[FleetCounts]
	tasks source[TaskCounts]
	pool  source[PoolCounts]

	errors                                            *prometheus.CounterVec
	devices, tasksByState, round, trainRounds, target *prometheus.Desc
	budget, poolJobs, poolWorkers                     *prometheus.Desc
	// descs and names are every family above, as built.
	descs []*prometheus.Desc
	names []string
}

func newStateCollector() *stateCollector {
	c := &stateCollector{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetlearn_metrics_source_errors_total",
			Help: "Scrape-time readings (fleet, tasks, pool) that failed; their series are left out of that scrape."}, []string{"source"}),
		names: []string{"fleetlearn_metrics_source_errors_total"},
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		desc := prometheus.NewDesc(name, help, labels, nil)
		c.descs = append(c.descs, desc)
		c.names = append(c.names, name)
		return desc
	}
	c.devices = d("fleetlearn_devices",
		"Devices by state: enrolled (and not revoked), online (not revoked, checked in within the coordinator's seen window), revoked.", "state")
	c.tasksByState = d("fleetlearn_tasks", "Tasks by state.", "state")
	c.round = d("fleetlearn_task_round", "A running or paused task's current round number (training and evaluation rounds).", "task")
	c.trainRounds = d("fleetlearn_task_train_rounds", "Training rounds a running or paused task has committed.", "task")
	c.target = d("fleetlearn_task_rounds_target", "Training rounds a running or paused task is configured to run (rounds_total).", "task")
	c.budget = d("fleetlearn_dp_epsilon_budget", "Differential privacy epsilon budget (target_epsilon) of a running or paused task with one.", "task")
	c.poolJobs = d("fleetlearn_pool_jobs", "Pool jobs the service holds, by state and tenant.", "state", "tenant")
	c.poolWorkers = d("fleetlearn_pool_workers", "Registered pool workers by state (ready, lost).", "state")
	return c
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	c.errors.Describe(ch)
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if f, ok := get(c, &c.fleet, "fleet"); ok {
		gauge(c.devices, float64(f.Enrolled), "enrolled")
		gauge(c.devices, float64(f.Online), "online")
		gauge(c.devices, float64(f.Revoked), "revoked")
	}
	if t, ok := get(c, &c.tasks, "tasks"); ok {
		for st, n := range t.ByState {
			gauge(c.tasksByState, float64(n), st)
		}
		for i, p := range t.Progress {
			if i == MaxTaskSeries {
				break
			}
			gauge(c.round, float64(p.Round), p.ID)
			gauge(c.trainRounds, float64(p.TrainRounds), p.ID)
			gauge(c.target, float64(p.RoundsTarget), p.ID)
			if p.EpsilonBudget > 0 {
				gauge(c.budget, p.EpsilonBudget, p.ID)
			}
		}
	}
	if p, ok := get(c, &c.pool, "pool"); ok {
		for k, n := range p.Jobs {
			gauge(c.poolJobs, float64(n), k.State, k.Tenant)
		}
		for st, n := range p.Workers {
			gauge(c.poolWorkers, float64(n), st)
		}
	}
	c.errors.Collect(ch)
}
