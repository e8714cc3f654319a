package coord

import (
	"maps"
	"path/filepath"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/data"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// withServerEval gives a task a real module (wasmtest.Trivial: evaluate
// reports accuracy 0) and a held-out set of n examples named "heldout".
func (h *harness) withServerEval(n int) func(*pb.Task) {
	h.t.Helper()
	sha, err := h.deps.Blobs.Put(h.t.Context(), wasmtest.Trivial())
	if err != nil {
		h.t.Fatal(err)
	}
	dir := filepath.Join(h.t.TempDir(), "heldout")
	ds := &data.Dataset{Features: make([]float32, 2*n), Labels: make([]uint8, n), Dim: 2, NumClasses: 2}
	if err := data.WriteDir(dir, ds, "heldout"); err != nil {
		h.t.Fatal(err)
	}
	return func(t *pb.Task) {
		t.Module = &pb.ModuleRef{Sha256: sha}
		t.ServerEvalDataset = dir
	}
}

// insert stores the task as start does, without starting it.
func (h *harness) insert(task *pb.Task) {
	h.t.Helper()
	rb, err := ResolveRobustness(task, h.model)
	if err != nil {
		h.t.Fatal(err)
	}
	rb.Apply(task)
	if err := h.st.InsertTask(h.t.Context(), task, h.clk.Now()); err != nil {
		h.t.Fatal(err)
	}
}

// baseEvaluations are the model.evaluated events outside rounds, with
// their places among all the events recorded.
func (h *harness) baseEvaluations() (evs []audit.ModelEvaluated, at []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, p := range h.audited {
		if e, ok := p.(audit.ModelEvaluated); ok && e.Round == 0 {
			evs, at = append(evs, e), append(at, i)
		}
	}
	return evs, at
}

// opened is where round's round.opened is among the events recorded, or -1.
func (h *harness) opened(round uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, p := range h.audited {
		if o, ok := p.(audit.RoundOpened); ok && o.Round == round {
			return i
		}
	}
	return -1
}

// The base model is measured on the server's held-out set before round 1
// opens: recorded in the audit log first, kept with the task, shown on the
// API's Task, and not measured again by a restarted coordinator.
func TestBaseModelEvaluatedBeforeRound1(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(h.withServerEval(5)))
	want := map[string]float64{"server_accuracy": 0}
	row, err := h.st.Task(t.Context(), task.Id)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(row.BaseMetrics, want) || !maps.Equal(row.Proto().GetBaseMetrics().GetValues(), want) ||
		row.Proto().GetBaseMetrics() == nil {
		t.Fatalf("base metrics %v, on the task %v; want %v", row.BaseMetrics, row.Proto().GetBaseMetrics(), want)
	}
	evs, at := h.baseEvaluations()
	if len(evs) != 1 {
		t.Fatalf("%d model.evaluated events at round 0, want 1", len(evs))
	}
	e := evs[0]
	if e.Task != task.Id || e.Model != h.ver || e.Dataset != "server:heldout" || e.Samples != 5 ||
		!maps.Equal(e.Metrics, map[string]float64{"accuracy": 0}) {
		t.Fatalf("base evaluation recorded as %+v", e)
	}
	if o := h.opened(1); o < 0 || at[0] > o {
		t.Fatalf("model.evaluated at %d, round.opened of round 1 at %d: the evaluation must come first", at[0], o)
	}

	h.c.Shutdown()
	h.restart()
	h.awaitOpen(task.Id, 1)
	if evs, _ := h.baseEvaluations(); len(evs) != 1 {
		t.Fatalf("%d base evaluations after a restart, want the first only", len(evs))
	}
}

// A coordinator that stopped after keeping the base model's measure but
// before opening round 1 opens it without measuring again: what the store
// holds stays, and nothing new is recorded.
func TestBaseModelNotEvaluatedAgain(t *testing.T) {
	h := newHarness(t)
	task := h.baseTask(h.withServerEval(3))
	h.insert(task)
	kept := map[string]float64{"server_accuracy": 0.25}
	if err := h.st.SetBaseMetrics(t.Context(), task.Id, kept, h.clk.Now()); err != nil {
		t.Fatal(err)
	}
	h.c.StartTask(task.Id)
	h.awaitOpen(task.Id, 1)
	if evs, _ := h.baseEvaluations(); len(evs) != 0 {
		t.Fatalf("base model evaluated again: %+v", evs)
	}
	row, err := h.st.Task(t.Context(), task.Id)
	if err != nil || !maps.Equal(row.BaseMetrics, kept) {
		t.Fatalf("base metrics %v (%v), want the ones kept %v", row.BaseMetrics, err, kept)
	}
}

// An audit log that refuses the evaluation holds round 1 back; the retry
// records it once and the round opens.
func TestBaseEvaluationWaitsForTheAuditLog(t *testing.T) {
	h := newHarness(t)
	task := h.baseTask(h.withServerEval(3))
	h.mu.Lock()
	h.auditFails = 2
	h.mu.Unlock()
	h.insert(task)
	h.c.StartTask(task.Id)
	h.until("the audit log recovers and round 1 opens", func() bool {
		// A timer pending before round 1 is recorded opened is the
		// runner's back-off: it sleeps until the clock moves.
		pending := h.clk.Pending()
		if h.opened(1) >= 0 {
			return true
		}
		h.mu.Lock()
		left := h.auditFails
		h.mu.Unlock()
		if row, err := h.st.Task(t.Context(), task.Id); err != nil || row.CurrentRound != 0 || (left > 0 && row.BaseMetrics != nil) {
			t.Fatalf("task %+v (%v) while the audit log refused the base evaluation", row, err)
		}
		if pending > 0 {
			h.clk.AdvanceToNext()
		}
		return false
	})
	h.awaitOpen(task.Id, 1)
	evs, at := h.baseEvaluations()
	if len(evs) != 1 || at[0] > h.opened(1) {
		t.Fatalf("base evaluations %+v at %v, round 1 opened at %d", evs, at, h.opened(1))
	}
}

// Without a server evaluation set nothing is measured before round 1.
func TestNoBaseEvaluationWithoutServerSet(t *testing.T) {
	h := newHarness(t)
	task := h.start(h.baseTask(nil))
	row, err := h.st.Task(t.Context(), task.Id)
	if err != nil {
		t.Fatal(err)
	}
	if row.BaseMetrics != nil || row.Proto().BaseMetrics != nil {
		t.Fatalf("base metrics %v without a server evaluation set", row.BaseMetrics)
	}
	if n := len(h.events(audit.TypeModelEvaluated)); n != 0 {
		t.Fatalf("%d model.evaluated events", n)
	}
}
