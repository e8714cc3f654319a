package pool_test

import (
	"errors"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/pool"
)

func TestTransition(t *testing.T) {
	all := []pool.State{pool.Queued, pool.Running, pool.Succeeded, pool.Failed, pool.Cancelled}
	allowed := map[[2]pool.State]bool{
		{pool.Queued, pool.Running}: true, {pool.Queued, pool.Failed}: true, {pool.Queued, pool.Cancelled}: true,
		{pool.Running, pool.Queued}: true, {pool.Running, pool.Succeeded}: true,
		{pool.Running, pool.Failed}: true, {pool.Running, pool.Cancelled}: true,
	}
	for _, from := range all {
		for _, to := range all {
			err := pool.Transition(from, to)
			if allowed[[2]pool.State{from, to}] != (err == nil) {
				t.Errorf("%s → %s: %v", from, to, err)
			}
			if err != nil && !errors.Is(err, pool.ErrBadTransition) {
				t.Errorf("%s → %s: %v does not wrap ErrBadTransition", from, to, err)
			}
		}
	}
	if err := pool.Transition(pool.State(9), pool.Running); err == nil {
		t.Error("unknown state accepted")
	}
}

// The audit log accepts exactly the pool's states, one for one.
func TestAuditStateMapping(t *testing.T) {
	want := map[pool.State]string{
		pool.Queued: audit.JobSubmitted, pool.Running: audit.JobRunning, pool.Succeeded: audit.JobSucceeded,
		pool.Failed: audit.JobFailed, pool.Cancelled: audit.JobCancelled,
	}
	for s, a := range want {
		if s.AuditState() != a {
			t.Errorf("%s maps to %q, want %q", s, s.AuditState(), a)
		}
		ev := audit.PoolJob{Job: "j-1", Kind: "pretrain", State: s.AuditState(), Detail: "preempted by j-2 at checkpoint step 300"}
		if _, err := audit.NewEvent(audit.Operator("pool"), ev); err != nil {
			t.Errorf("audit rejects state %s: %v", s, err)
		}
	}
}
