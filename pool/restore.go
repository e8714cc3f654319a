package pool

import "fmt"

// Restore puts back a job the server held before it restarted. A job that
// was queued or running comes back queued from its committed checkpoint
// with the restarts it had: a restart the server caused is not the job's
// fault, so nothing is charged. Jobs are ordered after those already held,
// so restoring in submission order keeps the FIFO tie-break. Terminal jobs
// are not restored; the server answers for them from its own records.
func (s *Scheduler) Restore(j Job) error {
	id := j.Spec.ID
	if j.State.Terminal() {
		return fmt.Errorf("pool: restore %s: job is %s: %w", id, j.State, ErrBadTransition)
	}
	// The deadline was checked against the submission time when the job
	// was accepted; a deadline that passed while the server was down fails
	// the job on the next pass, as it would have live.
	if err := j.Spec.Validate(j.Submitted); err != nil {
		return fmt.Errorf("pool: restore: %w", err)
	}
	if _, ok := s.tenants[j.Spec.Tenant]; !ok {
		return fmt.Errorf("pool: restore %s: tenant %s: %w", id, j.Spec.Tenant, ErrUnknownTenant)
	}
	if _, ok := s.jobs[id]; ok {
		return fmt.Errorf("pool: restore %s: %w", id, ErrDuplicate)
	}
	c := j.Committed
	if c < 0 || c >= j.Spec.TotalSteps || c%j.Spec.CheckpointInterval != 0 {
		return fmt.Errorf("pool: restore %s: committed step %d (every %d, total %d): %w",
			id, c, j.Spec.CheckpointInterval, j.Spec.TotalSteps, ErrNotBoundary)
	}
	if j.Restarts < 0 || j.Restarts > j.Spec.MaxRestarts {
		return fmt.Errorf("pool: restore %s: restarts %d outside [0, %d]: %w", id, j.Restarts, j.Spec.MaxRestarts, ErrInvalidSpec)
	}
	reason := j.Reason
	if reason == "" {
		reason = "restored"
	}
	r := &Job{Spec: j.Spec, State: Queued, Reason: truncate(reason, 1024), Submitted: j.Submitted,
		Restarts: j.Restarts, Committed: c, Step: c}
	s.jobs[id], s.active[id] = r, r
	s.seq[id] = s.next
	s.next++
	return nil
}
