package pool_test

import (
	"errors"
	"testing"

	"github.com/fleetlearn/fleetlearn/pool"
)

// A job restored after a server restart resumes from its committed step
// with the restarts it had, and the next placement starts it there.
func TestRestoreResumesFromCommittedStep(t *testing.T) {
	s, _ := newSched(t, nil)
	addWorkers(t, s, 1, gpuWorker)
	sp := spec("a", "acme", 0, 2)
	if err := s.Restore(pool.Job{Spec: sp, State: pool.Running, Submitted: t0, Restarts: 1, Committed: 300, Reason: "server restarted"}); err != nil {
		t.Fatal(err)
	}
	j := job(t, s, "a")
	if j.State != pool.Queued || j.Committed != 300 || j.Step != 300 || j.Restarts != 1 || j.Reason != "server restarted" {
		t.Fatalf("restored job = %+v", j)
	}
	ds := s.Schedule()
	if len(ds) != 1 || ds[0].Action != pool.Place || ds[0].Job != "a" {
		t.Fatalf("decisions = %+v", ds)
	}
	if err := s.Checkpointed("a", 400); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(pool.Job{Spec: sp, State: pool.Queued, Submitted: t0}); !errors.Is(err, pool.ErrDuplicate) {
		t.Fatalf("restore twice: %v", err)
	}
}

func TestRestoreRefusesBadJobs(t *testing.T) {
	s, _ := newSched(t, nil)
	for name, c := range map[string]struct {
		j    pool.Job
		want error
	}{
		"terminal":     {pool.Job{Spec: spec("a", "acme", 0, 1), State: pool.Succeeded, Submitted: t0}, pool.ErrBadTransition},
		"tenant":       {pool.Job{Spec: spec("b", "other", 0, 1), Submitted: t0}, pool.ErrUnknownTenant},
		"not boundary": {pool.Job{Spec: spec("c", "acme", 0, 1), Submitted: t0, Committed: 150}, pool.ErrNotBoundary},
		"done":         {pool.Job{Spec: spec("d", "acme", 0, 1), Submitted: t0, Committed: 1000}, pool.ErrNotBoundary},
		"restarts":     {pool.Job{Spec: spec("e", "acme", 0, 1), Submitted: t0, Restarts: 3}, pool.ErrInvalidSpec},
		"spec":         {pool.Job{Spec: spec("F", "acme", 0, 1), Submitted: t0}, pool.ErrInvalidSpec},
	} {
		if err := s.Restore(c.j); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if n := len(s.Jobs()); n != 0 {
		t.Fatalf("%d jobs after refused restores", n)
	}
}
