package coord

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// A coordinator that stopped after recording a round's close in the audit
// log but before committing it finishes the commit on restart: the log
// says the round closed, so the store must too, exactly once.
func TestPreparedCloseRecordedIsCommittedOnRestart(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	h.c.Shutdown() // the "crash": round 1 is open
	row := h.round(task.Id, 1)
	row.State, row.Close, row.Reason, row.Assigned = pb.RoundState_ROUND_STATE_ABANDONED, h.clk.Now(), "closed before the crash", 2
	if err := h.st.PrepareClose(t.Context(), &store.PendingClose{Row: row}); err != nil {
		t.Fatal(err)
	}
	if err := h.audit(t.Context(), auditActor, audit.RoundClosed{Task: task.Id, Round: 1, Outcome: audit.RoundAbandoned,
		AggregationRule: "AGGREGATION_RULE_FEDAVG", Reason: row.Reason}); err != nil {
		t.Fatal(err)
	}
	h.restart()
	h.awaitOpen(task.Id, 2)
	if r := h.round(task.Id, 1); r.State != pb.RoundState_ROUND_STATE_ABANDONED || r.Reason != "closed before the crash" {
		t.Fatalf("round 1 after restart: %v %q", r.State, r.Reason)
	}
	if n := len(h.events(audit.TypeRoundClosed)); n != 1 {
		t.Fatalf("%d round.closed events, want the one recorded before the crash", n)
	}
	if p, err := h.st.Pending(t.Context(), task.Id, 1); err != nil || p != nil {
		t.Fatalf("pending close left behind: %v %v", p, err)
	}
}

// A close prepared but never recorded did not happen: the round is
// replayed from the stream and closes on its own terms.
func TestPreparedCloseNotRecordedIsReplayed(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(func(t *pb.Task) { t.CohortTarget, t.ReportGoal = 1, 1 }))
	h.c.Shutdown()
	row := h.round(task.Id, 1)
	row.State, row.Reason = pb.RoundState_ROUND_STATE_ABANDONED, "never recorded"
	if err := h.st.PrepareClose(t.Context(), &store.PendingClose{Row: row}); err != nil {
		t.Fatal(err)
	}
	h.restart()
	h.awaitOpen(task.Id, 1)
	ev := h.watch(task.Id)
	a := h.enroll("dev-a", 5)
	a.update(a.join(), constant(8, 0.1), 5, nil)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Round != 1 {
		t.Fatalf("round 1: %v", got)
	}
}
