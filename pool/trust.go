package pool

import (
	"fmt"
	"time"
)

// A worker's capacity is a claim: the agent reports it and the scheduler
// cannot see the machine. Placement prefers the workers that take the
// most ranks, so a worker claiming 8 GPUs it lacks would be offered every
// job first and run none. The server reports what each worker actually
// does with a lease (Started, NoStart); a worker that let a lease go
// unstarted is distrusted for a while, and while distrusted it is placed
// on only within the capacity it has demonstrated by starting ranks.

// DefaultDistrust is how long a worker is distrusted after its first
// unstarted lease (Config.Distrust); each further one doubles the period,
// up to 64 times it.
const DefaultDistrust = time.Hour

// maxDistrustDoublings caps the doubling of the distrust period.
const maxDistrustDoublings = 6

// Started reports that worker started its ranks of running job id: what
// they hold there is capacity the worker has demonstrated.
func (s *Scheduler) Started(id, worker string) error {
	j, err := s.running(id, "started")
	if err != nil {
		return err
	}
	w, ok := s.workers[worker]
	if !ok {
		return fmt.Errorf("pool: started %s: worker %s: %w", id, worker, ErrUnknownWorker)
	}
	held := j.heldOn(worker)
	if held.isZero() {
		return fmt.Errorf("pool: started %s: worker %s holds none of its ranks: %w", id, worker, ErrUnknownWorker)
	}
	w.Proven = maxRes(w.Proven, held)
	return nil
}

// NoStart reports that worker did not start its ranks of running job id
// within the server's start timeout, though it was told to and kept
// calling. The job goes back to the queue at its committed step with no
// restart charged (it did nothing wrong), and the returned Abort stops its
// other ranks. The worker gets a strike: for Config.Distrust times 2^(strikes−1)
// it is placed on only within its demonstrated capacity (Worker.Proven).
func (s *Scheduler) NoStart(id, worker, detail string) (Decision, error) {
	j, err := s.running(id, "no start")
	if err != nil {
		return Decision{}, err
	}
	w, ok := s.workers[worker]
	if !ok || j.heldOn(worker).isZero() {
		return Decision{}, fmt.Errorf("pool: no start %s: worker %s holds none of its ranks: %w", id, worker, ErrUnknownWorker)
	}
	s.release(j)
	j.Step = j.Committed
	reason := fmt.Sprintf("worker %s did not start its ranks (%s); requeued from checkpoint step %d, no restart charged",
		worker, truncate(detail, 256), j.Committed)
	if err := s.move(j, Queued, reason); err != nil {
		return Decision{}, err
	}
	s.strike(w, w.Strikes+1)
	return Decision{Action: Abort, Job: id, Reason: reason}, nil
}

// SetStrikes gives worker at least strikes strikes, distrusted until at
// least until. A server that knows two workers are one principal's (one
// token) hands the new one the old one's record, so registering again
// does not wipe it.
func (s *Scheduler) SetStrikes(worker string, strikes int, until time.Time) error {
	w, ok := s.workers[worker]
	if !ok {
		return fmt.Errorf("pool: set strikes: worker %s: %w", worker, ErrUnknownWorker)
	}
	if strikes < 0 {
		return fmt.Errorf("pool: set strikes: worker %s: %d strikes: %w", worker, strikes, ErrInvalidConfig)
	}
	w.Strikes = max(w.Strikes, strikes)
	if until.After(w.DistrustedUntil) {
		w.DistrustedUntil = until
	}
	return nil
}

func (s *Scheduler) strike(w *Worker, strikes int) {
	w.Strikes = strikes
	d := s.distrust << min(strikes-1, maxDistrustDoublings)
	if until := s.clk.Now().Add(d); until.After(w.DistrustedUntil) {
		w.DistrustedUntil = until
	}
}

// trusted is the capacity placement counts on: the claim, or while the
// worker is distrusted only what it has demonstrated.
func trusted(w *Worker, now time.Time) Resources {
	if now.Before(w.DistrustedUntil) {
		return minRes(w.Capacity, w.Proven)
	}
	return w.Capacity
}

// trustedFree is the free capacity placement counts on: what the trusted
// capacity leaves after the ranks the worker holds.
func trustedFree(w *Worker, now time.Time) Resources {
	if !now.Before(w.DistrustedUntil) {
		return w.Free
	}
	used := w.Capacity.sub(w.Free)
	return minRes(w.Free, maxRes(w.Proven.sub(used), Resources{}))
}

// heldOn is what the job's ranks on worker hold there.
func (j *Job) heldOn(worker string) Resources {
	var r Resources
	for _, a := range j.Placement {
		if a.Worker == worker {
			r = r.add(j.Spec.PerRank.times(int64(a.Ranks)))
		}
	}
	return r
}

func maxRes(a, b Resources) Resources {
	return Resources{max(a.MilliCPU, b.MilliCPU), max(a.Memory, b.Memory), max(a.GPUs, b.GPUs)}
}
