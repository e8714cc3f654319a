package server_test

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// TestAsyncTaskWithCentralDP: an async task run by real agents, with
// central DP, commits a version per buffer until its rounds are done: each
// version records its buffer's staleness and the seats in use, each step
// spends privacy once, and the audit log's export verifies offline.
func TestAsyncTaskWithCentralDP(t *testing.T) {
	const steps = 4
	h, version, module, _ := dpHarness(t, 6)
	task := h.CreateTask(t, &pb.Task{Name: "async", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		RoundsTotal: steps, ReportTimeout: durationpb.New(20 * time.Second),
		Async: &pb.AsyncConfig{Concurrency: 5, Buffer: 3, MaxStaleness: 2},
		Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 0.1, NoiseMultiplier: 0.5,
			TargetEpsilon: 1e6, Delta: 1e-6}})
	if task.CohortTarget != 3 || task.ReportGoal != 3 {
		t.Fatalf("async task's cohort %d, goal %d: want its buffer, 3", task.CohortTarget, task.ReportGoal)
	}
	done := h.WaitTask(t, task.Id, 3*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED,
		pb.TaskState_TASK_STATE_STOPPED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	checkAsyncRun(t, h, task.Id, steps, 3, 2)
}

// TestAsyncSecureBuffers: an async task with secure
// aggregation per buffer of K = 10 and central DP, run by real agents,
// completes. Each device trains first and holds its update; the first ten
// to hold one form the buffer's SecAgg+ group, so the server learns only
// the buffer's sum, noised once per step; the audit log's export verifies.
func TestAsyncSecureBuffers(t *testing.T) {
	const steps, k = 2, 10
	h, version, module, _ := dpHarness(t, 12)
	task := h.CreateTask(t, &pb.Task{Name: "async-secure", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		RoundsTotal: steps, ReportTimeout: durationpb.New(30 * time.Second), SelectionTimeout: durationpb.New(30 * time.Second),
		Async:  &pb.AsyncConfig{Concurrency: 12, Buffer: k, MaxStaleness: 2},
		Secagg: &pb.SecAggConfig{StageTimeout: durationpb.New(10 * time.Second)},
		Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 0.1, NoiseMultiplier: 0.5,
			TargetEpsilon: 1e6, Delta: 1e-6}})
	done := h.WaitTask(t, task.Id, 5*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED,
		pb.TaskState_TASK_STATE_STOPPED, pb.TaskState_TASK_STATE_PAUSED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	checkAsyncRun(t, h, task.Id, steps, k, 2)
}

// checkAsyncRun checks a finished async task's rounds: steps committed,
// each with k reports and its staleness (at most maxStale), a dp.spent
// each, and an audit log whose export verifies. Rounds abandoned on the
// way (a secure group a device left) are logged.
func checkAsyncRun(t *testing.T, h *servertest.Harness, task string, steps, k int, maxStale float64) {
	t.Helper()
	committed := 0
	for _, r := range h.Rounds(t, task) {
		m := r.GetMetrics().GetValues()
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
			t.Logf("round %d %v: %s", r.Round, r.State, r.Reason)
			continue
		}
		committed++
		if _, ok := m["async_staleness_mean"]; !ok || int(r.Reported) != k || m["async_staleness_max"] > maxStale {
			t.Fatalf("round %d: %d reports, metrics %v", r.Round, r.Reported, m)
		}
	}
	if committed != steps {
		t.Fatalf("%d rounds committed, want %d", committed, steps)
	}
	if spent := privacySpent(t, h, task); len(spent) != steps {
		t.Fatalf("%d dp.spent events, want %d", len(spent), steps)
	}
	rep := verifiedExport(t, h)
	t.Logf("export verified: %d entries, %d rounds", rep.Entries, len(rep.Rounds))
}

// verifiedExport shuts h down, exports its audit log and verifies the
// export offline against the keys the service published.
func verifiedExport(t *testing.T, h *servertest.Harness) audit.Report {
	t.Helper()
	ctx := t.Context()
	keys, err := apiv1.NewAuditServiceClient(h.Conn).GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	lg, err := audit.OpenReadOnly(ctx, h.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lg.Close()
	var export bytes.Buffer
	if err := lg.Export(ctx, &export); err != nil {
		t.Fatal(err)
	}
	rep, err := audit.VerifyExport(&export, audit.WithEntryKey(entryKey), audit.WithVerifierKey(keys.GetCheckpointVerifierKey()))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
