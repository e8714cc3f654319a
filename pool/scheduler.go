package pool

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
)

// Tenant is one tenant's queue settings.
type Tenant struct {
	// Weight is the tenant's fair-share weight (> 0): with equal demand,
	// tenants' dominant shares converge to the ratio of their weights.
	Weight float64
	// Quota caps the tenant's concurrently allocated resources; a zero
	// field is uncapped.
	Quota  Resources
	Budget Budget
}

// Config is the scheduler's fixed configuration. NewScheduler copies it;
// later changes to the caller's maps do not reach the scheduler.
type Config struct {
	Tenants map[string]Tenant
	// Clock drives deadlines and budget windows; nil is the system clock.
	Clock clock.Clock
	// Distrust is how long a worker that left a lease unstarted is placed
	// on only within its demonstrated capacity (NoStart); it doubles with
	// each further strike. 0 is DefaultDistrust.
	Distrust time.Duration
}

// Action is what a Decision asks the server to do.
type Action uint8

const (
	// Place starts every rank of the job on the listed workers.
	Place Action = iota + 1
	// CheckpointStop asks the job to stop at its next checkpoint boundary
	// and report it with Checkpointed; its resources stay allocated until
	// then.
	CheckpointStop
	// Abort stops whatever ranks of the job still run, now. Its resources
	// are already free in the scheduler's view, so the server must stop
	// them before it starts the next placement on those workers.
	Abort
	// Fail stops any ranks and records the job failed.
	Fail
)

var actionNames = [...]string{"", "place", "checkpoint-stop", "abort", "fail"}

func (a Action) String() string {
	if int(a) < len(actionNames) && a != 0 {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", a)
}

// Decision is one instruction for the server. The scheduler never acts:
// it returns decisions, and the server executes them and reports back.
type Decision struct {
	Action    Action
	Job       string
	Placement []Assignment // for Place
	Reason    string
}

// Worker is a snapshot of one worker.
type Worker struct {
	ID       string
	Zone     string    // "" when the worker declared none
	Capacity Resources // as the worker claims it
	Free     Resources
	// Proven is the most the worker has been seen to run: the largest
	// share of one job it started (Started).
	Proven Resources
	// Strikes counts the leases it left unstarted (NoStart); until
	// DistrustedUntil it is placed on only within Proven.
	Strikes         int
	DistrustedUntil time.Time
}

type reservation struct {
	job  string
	plan []Assignment
}

// Scheduler is a pure, deterministic gang scheduler. The server feeds it
// events (submissions, workers, progress, checkpoints, meter readings) and
// calls Schedule for decisions. It is not safe for concurrent use: the
// server drives it from one goroutine, which is also what makes it
// replayable.
type Scheduler struct {
	tenants map[string]Tenant
	clk     clock.Clock
	jobs    map[string]*Job
	active  map[string]*Job   // not terminal: what a pass looks at
	seq     map[string]uint64 // submission order, the FIFO tie-break
	next    uint64
	workers map[string]*Worker
	wids    []string             // worker ids, sorted: the stable order placement walks
	usage   map[string]Resources // allocated to running jobs, per tenant
	ledgers map[string]*ledger
	resv    *reservation
	// distrust is Config.Distrust.
	distrust time.Duration
}

// NewScheduler checks and copies cfg.
func NewScheduler(cfg Config) (*Scheduler, error) {
	if len(cfg.Tenants) == 0 {
		return nil, fmt.Errorf("pool: new scheduler: no tenants: %w", ErrInvalidConfig)
	}
	for name, t := range cfg.Tenants {
		if err := checkName(name); err != nil {
			return nil, fmt.Errorf("pool: new scheduler: tenant %q: %v: %w", name, err, ErrInvalidConfig)
		}
		if !(t.Weight > 0) || math.IsInf(t.Weight, 0) || !t.Quota.nonNegative() ||
			!(t.Budget.CPUSeconds >= 0) || !(t.Budget.GPUSeconds >= 0) || t.Budget.Window < 0 {
			return nil, fmt.Errorf("pool: new scheduler: tenant %s: weight, quota or budget out of range: %w", name, ErrInvalidConfig)
		}
	}
	if cfg.Distrust < 0 || cfg.Distrust > 30*24*time.Hour {
		return nil, fmt.Errorf("pool: new scheduler: distrust %s outside [0, 30 days]: %w", cfg.Distrust, ErrInvalidConfig)
	}
	if cfg.Distrust == 0 {
		cfg.Distrust = DefaultDistrust
	}
	return &Scheduler{
		tenants:  maps.Clone(cfg.Tenants),
		clk:      clock.Or(cfg.Clock),
		jobs:     map[string]*Job{},
		active:   map[string]*Job{},
		seq:      map[string]uint64{},
		workers:  map[string]*Worker{},
		usage:    map[string]Resources{},
		ledgers:  map[string]*ledger{},
		distrust: cfg.Distrust,
	}, nil
}

// Submit queues a job after validating it.
func (s *Scheduler) Submit(spec Spec) error {
	now := s.clk.Now()
	if err := spec.Validate(now); err != nil {
		return fmt.Errorf("pool: submit: %w", err)
	}
	if _, ok := s.tenants[spec.Tenant]; !ok {
		return fmt.Errorf("pool: submit %s: tenant %s: %w", spec.ID, spec.Tenant, ErrUnknownTenant)
	}
	if _, ok := s.jobs[spec.ID]; ok {
		return fmt.Errorf("pool: submit %s: %w", spec.ID, ErrDuplicate)
	}
	j := &Job{Spec: spec, State: Queued, Reason: "submitted", Submitted: now}
	s.jobs[spec.ID], s.active[spec.ID] = j, j
	s.seq[spec.ID] = s.next
	s.next++
	return nil
}

// AddWorker adds a worker in no zone with all its capacity free.
func (s *Scheduler) AddWorker(id string, capacity Resources) error {
	return s.AddWorkerInZone(id, "", capacity)
}

// AddWorkerInZone adds a worker in zone ("" for none) with all its
// capacity free. Jobs with a Zone run only on workers of that zone; jobs
// without one run anywhere.
func (s *Scheduler) AddWorkerInZone(id, zone string, capacity Resources) error {
	if err := checkName(id); err != nil {
		return fmt.Errorf("pool: add worker: %v: %w", err, ErrInvalidConfig)
	}
	if zone != "" {
		if err := CheckZone(zone); err != nil {
			return fmt.Errorf("pool: add worker %s: %v: %w", id, err, ErrInvalidConfig)
		}
	}
	if !capacity.nonNegative() || capacity.MilliCPU > 1<<40 || capacity.Memory > 1<<50 || capacity.GPUs > 1<<10 {
		return fmt.Errorf("pool: add worker %s: capacity %v out of range: %w", id, capacity, ErrInvalidConfig)
	}
	if _, ok := s.workers[id]; ok {
		return fmt.Errorf("pool: add worker %s: %w", id, ErrDuplicate)
	}
	s.workers[id] = &Worker{ID: id, Zone: zone, Capacity: capacity, Free: capacity}
	i, _ := slices.BinarySearch(s.wids, id)
	s.wids = slices.Insert(s.wids, i, id)
	return nil
}

// LoseWorker removes a worker that died or left. Every job with a rank on
// it loses its whole gang (a membership change restarts all ranks, as in
// TorchElastic): it is requeued from its last checkpoint with a restart
// charged, or failed when its restarts are exhausted. The decisions abort
// the surviving ranks.
func (s *Scheduler) LoseWorker(id string) ([]Decision, error) {
	if _, ok := s.workers[id]; !ok {
		return nil, fmt.Errorf("pool: lose worker %s: %w", id, ErrUnknownWorker)
	}
	var ds []Decision
	for _, j := range s.sortedJobs() {
		if j.State != Running || !slices.ContainsFunc(j.Placement, func(a Assignment) bool { return a.Worker == id }) {
			continue
		}
		ds = append(ds, s.restart(j, fmt.Sprintf("worker %s lost", id)))
	}
	delete(s.workers, id)
	if i, ok := slices.BinarySearch(s.wids, id); ok {
		s.wids = slices.Delete(s.wids, i, i+1)
	}
	return ds, nil
}

// Crashed reports that a running job's process failed on its own; it is
// treated like a worker loss for that job alone.
func (s *Scheduler) Crashed(id, detail string) (Decision, error) {
	j, err := s.running(id, "crashed")
	if err != nil {
		return Decision{}, err
	}
	return s.restart(j, "crashed: "+truncate(detail, 256)), nil
}

func (s *Scheduler) restart(j *Job, why string) Decision {
	s.release(j)
	j.Step = j.Committed
	if j.Restarts >= j.Spec.MaxRestarts {
		reason := fmt.Sprintf("%s; restarts exhausted (%d of %d)", why, j.Restarts, j.Spec.MaxRestarts)
		_ = s.move(j, Failed, reason)
		return Decision{Action: Fail, Job: j.Spec.ID, Reason: reason}
	}
	j.Restarts++
	reason := fmt.Sprintf("%s; restart %d of %d from checkpoint step %d", why, j.Restarts, j.Spec.MaxRestarts, j.Committed)
	_ = s.move(j, Queued, reason)
	return Decision{Action: Abort, Job: j.Spec.ID, Reason: reason}
}

// Progress records the latest step a running job has reached; preemption
// uses it to pick the victim that loses least.
func (s *Scheduler) Progress(id string, step int64) error {
	j, err := s.running(id, "progress")
	if err != nil {
		return err
	}
	if step < j.Committed || step > j.Spec.TotalSteps {
		return fmt.Errorf("pool: progress %s: step %d outside [%d, %d]: %w", id, step, j.Committed, j.Spec.TotalSteps, ErrBadReading)
	}
	j.Step = max(j.Step, step)
	return nil
}

// Checkpointed records a committed checkpoint at step, which must be the
// job's next boundary or a later one. A job asked to stop stops here: it
// goes back to the queue, keeping the checkpoint, and its resources are
// freed. A checkpoint at TotalSteps completes the job.
func (s *Scheduler) Checkpointed(id string, step int64) error {
	j, err := s.running(id, "checkpoint")
	if err != nil {
		return err
	}
	if step <= j.Committed || step > j.Spec.TotalSteps || (step%j.Spec.CheckpointInterval != 0 && step != j.Spec.TotalSteps) {
		return fmt.Errorf("pool: checkpoint %s at step %d (committed %d, every %d): %w",
			id, step, j.Committed, j.Spec.CheckpointInterval, ErrNotBoundary)
	}
	j.Committed, j.Step = step, max(j.Step, step)
	switch {
	case step == j.Spec.TotalSteps:
		s.release(j)
		return s.move(j, Succeeded, fmt.Sprintf("completed %d steps", step))
	case j.Stopping:
		why := j.Reason
		s.release(j)
		return s.move(j, Queued, fmt.Sprintf("%s at checkpoint step %d", why, step))
	}
	return nil
}

// Cancel ends a job at the client's request; its ranks, if any, are the
// server's to stop.
func (s *Scheduler) Cancel(id string) error {
	j, ok := s.jobs[id]
	if !ok {
		return fmt.Errorf("pool: cancel %s: %w", id, ErrUnknownJob)
	}
	if j.State == Running {
		s.release(j)
	}
	return s.move(j, Cancelled, "cancelled by client")
}

// Meter records a reading against the job's tenant budget.
func (s *Scheduler) Meter(id string, r Reading) error {
	j, ok := s.jobs[id]
	if !ok {
		return fmt.Errorf("pool: meter %s: %w", id, ErrUnknownJob)
	}
	if err := r.check(); err != nil {
		return fmt.Errorf("pool: meter %s: %w", id, err)
	}
	l := s.ledgers[j.Spec.Tenant]
	if l == nil {
		l = &ledger{}
		s.ledgers[j.Spec.Tenant] = l
	}
	l.add(r)
	return nil
}

// Job returns a snapshot of one job.
func (s *Scheduler) Job(id string) (Job, bool) {
	j, ok := s.jobs[id]
	if !ok {
		return Job{}, false
	}
	c := *j
	c.Placement = slices.Clone(j.Placement)
	return c, true
}

// Jobs returns snapshots of every job, finished ones included, by id.
func (s *Scheduler) Jobs() []Job {
	out := make([]Job, 0, len(s.jobs))
	for _, id := range slices.Sorted(maps.Keys(s.jobs)) {
		j := s.jobs[id]
		c, _ := s.Job(j.Spec.ID)
		out = append(out, c)
	}
	return out
}

// Workers returns snapshots of every worker, by id.
func (s *Scheduler) Workers() []Worker {
	out := make([]Worker, 0, len(s.workers))
	for _, id := range s.wids {
		out = append(out, *s.workers[id])
	}
	return out
}

func (s *Scheduler) running(id, op string) (*Job, error) {
	j, ok := s.jobs[id]
	if !ok {
		return nil, fmt.Errorf("pool: %s %s: %w", op, id, ErrUnknownJob)
	}
	if j.State != Running {
		return nil, fmt.Errorf("pool: %s %s: job is %s: %w", op, id, j.State, ErrBadTransition)
	}
	return j, nil
}

// sortedJobs are the jobs still in play, by id. Finished jobs stay
// readable through Job but cost a pass nothing.
func (s *Scheduler) sortedJobs() []*Job {
	ids := slices.Sorted(maps.Keys(s.active))
	out := make([]*Job, len(ids))
	for i, id := range ids {
		out[i] = s.active[id]
	}
	return out
}

// move changes a job's state and keeps the active set in step.
func (s *Scheduler) move(j *Job, to State, reason string) error {
	if err := j.move(to, reason); err != nil {
		return err
	}
	if to.Terminal() {
		delete(s.active, j.Spec.ID)
	}
	return nil
}

// release returns a running job's resources to its workers and tenant.
func (s *Scheduler) release(j *Job) {
	for _, a := range j.Placement {
		if w, ok := s.workers[a.Worker]; ok {
			w.Free = w.Free.add(j.Spec.PerRank.times(int64(a.Ranks)))
		}
	}
	s.usage[j.Spec.Tenant] = s.usage[j.Spec.Tenant].sub(j.Spec.total())
	j.Placement = nil
}

func (s *Scheduler) allocate(j *Job, plan []Assignment) {
	for _, a := range plan {
		w := s.workers[a.Worker]
		w.Free = w.Free.sub(j.Spec.PerRank.times(int64(a.Ranks)))
	}
	s.usage[j.Spec.Tenant] = s.usage[j.Spec.Tenant].add(j.Spec.total())
	_ = s.move(j, Running, fmt.Sprintf("placed on %d workers", len(plan)))
	j.Placement = slices.Clone(plan)
	j.Step = j.Committed
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (s *Scheduler) freeSum() Resources {
	var t Resources
	for _, w := range s.workers {
		t = t.add(w.Free)
	}
	return t
}

// total is the pool's whole capacity, the denominator of shares.
func (s *Scheduler) total() Resources {
	var t Resources
	for _, w := range s.workers {
		t = t.add(w.Capacity)
	}
	return t
}

// dominantShare is weighted dominant-resource fairness: the largest
// fraction of any one resource the tenant holds, over its weight. DRF and
// not GPU-only share, because a CPU-heavy tenant (data preparation,
// evaluation) must not take the whole pool's CPU while holding no GPU.
func dominantShare(use, total Resources, weight float64) float64 {
	f := func(u, t int64) float64 {
		if t <= 0 {
			return 0
		}
		return float64(u) / float64(t)
	}
	return max(f(use.MilliCPU, total.MilliCPU), f(use.Memory, total.Memory), f(use.GPUs, total.GPUs)) / weight
}

func (s *Scheduler) overQuota(tenant string, j *Job) string {
	q := s.tenants[tenant].Quota
	after := s.usage[tenant].add(j.Spec.total())
	for _, d := range []struct {
		name     string
		use, lim int64
	}{{"CPU millicores", after.MilliCPU, q.MilliCPU}, {"memory bytes", after.Memory, q.Memory}, {"GPUs", after.GPUs, q.GPUs}} {
		if d.lim > 0 && d.use > d.lim {
			return fmt.Sprintf("over quota: tenant %s would hold %d of %d %s", tenant, d.use, d.lim, d.name)
		}
	}
	return ""
}

// Schedule runs one scheduling pass at the clock's time and returns its
// decisions, already applied to the scheduler's view. In order:
//
//  1. Jobs past their deadline fail.
//  2. Running jobs of tenants over budget are asked to stop at their next
//     checkpoint: the interval in progress finishes, no work is lost, and
//     the tenant's queue is held until its window rolls.
//  3. Queued jobs are taken in priority order, then by tenant dominant
//     share over weight (lowest first), then submission order. Each is
//     placed whole or not at all.
//  4. The first job that does not fit becomes the head of line and holds a
//     reservation: a plan on specific workers whose free resources no
//     other job may take. If lower-priority jobs hold what it needs, the
//     ones with least work since their checkpoint are asked to stop there.
//     Later jobs backfill only around the reservation, so small jobs keep
//     the pool busy but cannot starve the gang.
func (s *Scheduler) Schedule() []Decision {
	now := s.clk.Now()
	var ds []Decision
	active := s.sortedJobs()
	for _, j := range active {
		if j.State.Terminal() || j.Spec.Deadline.IsZero() || now.Before(j.Spec.Deadline) {
			continue
		}
		if j.State == Running {
			s.release(j)
		}
		reason := fmt.Sprintf("deadline %s passed at checkpoint step %d", j.Spec.Deadline.UTC().Format(time.RFC3339), j.Committed)
		_ = s.move(j, Failed, reason)
		ds = append(ds, Decision{Action: Fail, Job: j.Spec.ID, Reason: reason})
	}

	held := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(s.tenants)) {
		if r := overBudget(name, s.tenants[name].Budget, s.ledgers[name], now); r != "" {
			held[name] = r
		}
	}
	for _, j := range active {
		if r, ok := held[j.Spec.Tenant]; ok && j.State == Running && !j.Stopping {
			j.Stopping, j.Reason = true, r
			ds = append(ds, Decision{Action: CheckpointStop, Job: j.Spec.ID, Reason: r})
		}
	}

	if s.resv != nil {
		if j := s.jobs[s.resv.job]; j == nil || j.State != Queued {
			s.resv = nil
		}
	}

	queues := map[string][]*Job{}
	for _, j := range active {
		if j.State == Queued {
			queues[j.Spec.Tenant] = append(queues[j.Spec.Tenant], j)
		}
	}
	for _, q := range queues {
		slices.SortFunc(q, func(a, b *Job) int {
			if c := cmp.Compare(b.Spec.Priority, a.Spec.Priority); c != 0 {
				return c
			}
			return cmp.Compare(s.seq[a.Spec.ID], s.seq[b.Spec.ID])
		})
	}
	tenantNames := slices.Sorted(maps.Keys(queues))
	total := s.total()
	var firstBlocked *Job // first job held back by another's reservation
	for {
		var best *Job
		var bestShare float64
		for _, t := range tenantNames {
			q := queues[t]
			if len(q) == 0 {
				continue
			}
			c := q[0]
			sh := dominantShare(s.usage[t], total, s.tenants[t].Weight)
			if best == nil || c.Spec.Priority > best.Spec.Priority ||
				(c.Spec.Priority == best.Spec.Priority && sh < bestShare) {
				best, bestShare = c, sh
			}
		}
		if best == nil {
			break
		}
		t := best.Spec.Tenant
		queues[t] = queues[t][1:]
		if r, ok := held[t]; ok {
			// The whole queue is held: its jobs all draw on the same budget.
			s.hold(append(queues[t], best), r)
			queues[t] = nil
			continue
		}
		if r := s.overQuota(t, best); r != "" {
			// Later jobs of the tenant wait too, or its small jobs would
			// starve its own big one under the quota.
			s.hold(append(queues[t], best), r)
			queues[t] = nil
			continue
		}
		if nb := best.Spec.NotBefore; !nb.IsZero() && now.Before(nb) {
			// Not a blocked job: it takes no reservation, and the jobs
			// behind it run meanwhile.
			s.hold([]*Job{best}, waitReason(best.Spec, now))
			continue
		}
		// The pool-wide sum is a cheap necessary condition; most blocked
		// jobs fail it and skip the per-worker walk.
		if best.Spec.total().fits(s.freeSum()) {
			if plan, ok := placeGang(s.slots(best.Spec.ID), best.Spec.PerRank, best.Spec.Ranks); ok {
				s.allocate(best, plan)
				if s.resv != nil && s.resv.job == best.Spec.ID {
					s.resv = nil
				}
				ds = append(ds, Decision{Action: Place, Job: best.Spec.ID, Placement: plan, Reason: best.Reason})
				continue
			}
		}
		switch {
		case s.resv == nil && firstBlocked == nil,
			s.resv != nil && s.resv.job == best.Spec.ID,
			// Only a strictly more urgent job takes a reservation over:
			// moving it between equals would reset the wait and starve both.
			s.resv != nil && best.Spec.Priority > s.jobs[s.resv.job].Spec.Priority:
			ds = append(ds, s.reserve(best)...)
		default:
			best.Reason = "waiting: resources held for " + s.resvJob()
			if firstBlocked == nil {
				firstBlocked = best
			}
		}
	}
	// The reservation was placed during the pass: the next one goes to the
	// first job that waited behind it, the one fair share put first.
	if s.resv == nil && firstBlocked != nil {
		ds = append(ds, s.reserve(firstBlocked)...)
	}
	return ds
}

// hold sets the reason on jobs that may not run this pass, and drops the
// reservation of one of them: held resources would idle for nothing.
func (s *Scheduler) hold(js []*Job, reason string) {
	for _, j := range js {
		j.Reason = reason
		if s.resv != nil && s.resv.job == j.Spec.ID {
			s.resv = nil
		}
	}
}

func (s *Scheduler) resvJob() string {
	if s.resv == nil {
		return "the head of the queue"
	}
	return s.resv.job
}

// slots are the workers' free resources as job id may use them: minus the
// reservation, unless id holds it.
func (s *Scheduler) slots(id string) []slot {
	out := make([]slot, 0, len(s.workers))
	var withheld map[string]Resources
	if s.resv != nil && s.resv.job != id {
		j := s.jobs[s.resv.job]
		withheld = map[string]Resources{}
		for _, a := range s.resv.plan {
			withheld[a.Worker] = withheld[a.Worker].add(j.Spec.PerRank.times(int64(a.Ranks)))
		}
	}
	zone := s.jobs[id].Spec.Zone
	now := s.clk.Now()
	for _, id := range s.wids {
		w := s.workers[id]
		if zone != "" && w.Zone != zone {
			continue
		}
		free := trustedFree(w, now)
		if h, ok := withheld[id]; ok {
			free = free.sub(minRes(free, h))
		}
		out = append(out, slot{id, free})
	}
	return out
}

// reserve makes j the head of line. It first looks for lower-priority
// victims to stop at their checkpoints; failing that, it reserves a plan
// over the workers' capacity and waits for running jobs to finish there.
func (s *Scheduler) reserve(j *Job) []Decision {
	base := s.slots(j.Spec.ID)
	idx := map[string]int{}
	for i, sl := range base {
		idx[sl.id] = i
	}
	with := func(victims []*Job) []slot {
		sl := slices.Clone(base)
		for _, v := range victims {
			for _, a := range v.Placement {
				if i, ok := idx[a.Worker]; ok {
					sl[i].free = sl[i].free.add(v.Spec.PerRank.times(int64(a.Ranks)))
				}
			}
		}
		return sl
	}
	var stopping, cands []*Job
	for _, r := range s.sortedJobs() {
		if r.State != Running {
			continue
		}
		if r.Stopping {
			stopping = append(stopping, r)
		} else if r.Spec.Priority < j.Spec.Priority {
			cands = append(cands, r)
		}
	}
	// Least work since the last checkpoint first: that is the work a stop
	// costs when the victim resumes from its checkpoint. Then lowest
	// priority, then id, so replays pick the same victim.
	slices.SortStableFunc(cands, func(a, b *Job) int {
		if c := cmp.Compare(a.SinceCheckpoint(), b.SinceCheckpoint()); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Spec.Priority, b.Spec.Priority); c != 0 {
			return c
		}
		return cmp.Compare(a.Spec.ID, b.Spec.ID)
	})
	if plan, ok := placeGang(with(stopping), j.Spec.PerRank, j.Spec.Ranks); ok {
		s.resv = &reservation{j.Spec.ID, plan}
		j.Reason = "waiting for jobs stopping at their checkpoints"
		return nil
	}
	victims := slices.Clone(stopping)
	var chosen []*Job
	var plan []Assignment
	ok := false
	for _, c := range cands {
		victims = append(victims, c)
		chosen = append(chosen, c)
		if plan, ok = placeGang(with(victims), j.Spec.PerRank, j.Spec.Ranks); ok {
			break
		}
	}
	if ok {
		// Drop victims the plan does not need, earliest-chosen first: the
		// greedy pass may have taken one on a worker that could not help.
		for i := 0; i < len(chosen); {
			trial := slices.Concat(stopping, chosen[:i], chosen[i+1:])
			if p, fit := placeGang(with(trial), j.Spec.PerRank, j.Spec.Ranks); fit {
				chosen, plan = slices.Delete(chosen, i, i+1), p
				continue
			}
			i++
		}
		s.resv = &reservation{j.Spec.ID, plan}
		j.Reason = fmt.Sprintf("waiting for %d preempted jobs to reach their checkpoints", len(chosen))
		var ds []Decision
		for _, v := range chosen {
			v.Stopping = true
			v.Reason = fmt.Sprintf("preempted by %s", j.Spec.ID)
			ds = append(ds, Decision{Action: CheckpointStop, Job: v.Spec.ID,
				Reason: fmt.Sprintf("preempted by %s at checkpoint step %d", j.Spec.ID, v.nextBoundary())})
		}
		return ds
	}
	// A distrusted worker's claim is not reserved: a head-of-line gang
	// would wait on capacity that may not exist.
	capSlots := make([]slot, 0, len(s.workers))
	now := s.clk.Now()
	for _, sl := range base {
		capSlots = append(capSlots, slot{sl.id, trusted(s.workers[sl.id], now)})
	}
	// Keep a standing plan while it still fits the pool, so the resources
	// it has collected are not scattered by a re-plan.
	if s.resv != nil && s.resv.job == j.Spec.ID && planFits(s.resv.plan, capSlots, j.Spec.PerRank) {
		j.Reason = fmt.Sprintf("head of line: reserved %d ranks, waiting for running jobs to finish", j.Spec.Ranks)
		return nil
	}
	if plan, ok := placeGang(capSlots, j.Spec.PerRank, j.Spec.Ranks); ok {
		s.resv = &reservation{j.Spec.ID, plan}
		j.Reason = fmt.Sprintf("head of line: reserved %d ranks, waiting for running jobs to finish", j.Spec.Ranks)
		return nil
	}
	s.resv = nil
	if j.Spec.Zone != "" {
		j.Reason = fmt.Sprintf("gang of %d ranks (%v each) does not fit the capacity of the workers in zone %s", j.Spec.Ranks, j.Spec.PerRank, j.Spec.Zone)
		return nil
	}
	j.Reason = fmt.Sprintf("gang of %d ranks (%v each) does not fit the pool's capacity", j.Spec.Ranks, j.Spec.PerRank)
	return nil
}

// waitReason says what a job held for its NotBefore waits for.
func waitReason(sp Spec, now time.Time) string {
	zone := sp.Zone
	if zone == "" {
		zone = "any"
	}
	return fmt.Sprintf("waiting for the low-carbon window at %s in zone %s (%s from now)",
		sp.NotBefore.UTC().Format(time.RFC3339), zone, sp.NotBefore.Sub(now).Round(time.Second))
}

func planFits(plan []Assignment, cap []slot, r Resources) bool {
	for _, a := range plan {
		i := slices.IndexFunc(cap, func(s slot) bool { return s.id == a.Worker })
		if i < 0 || !r.times(int64(a.Ranks)).fits(cap[i].free) {
			return false
		}
	}
	return true
}
