package server_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestTaskPausesForWantOfDevices: the README's task on a fleet of three
// is warned about at creation, pauses with its reason after three rounds
// no device could join, and resumes at an operator's (not an auditor's)
// call, each change in the audit log.
func TestTaskPausesForWantOfDevices(t *testing.T) {
	h := servertest.New(t)
	ctx := t.Context()
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "small-fleet", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	h.EnrollKeys(t, []string{"edge-1", "edge-2", "edge-3"})
	// No agent runs: every round closes its selection empty, at once.
	task := baseTask("small-fleet", version, module, 50)
	task.CohortTarget, task.OverSelection, task.ReportGoal = 20, 0.3, 16
	task.SelectionTimeout, task.ReportTimeout = durationpb.New(20*time.Millisecond), durationpb.New(20*time.Millisecond)

	operator := apiv1.NewTaskServiceClient(h.DialAs(t, "olga", identity.RoleOperator))
	auditor := apiv1.NewTaskServiceClient(h.DialAs(t, "audrey", identity.RoleAuditor))
	created, err := operator.CreateTask(ctx, &pb.CreateTaskRequest{Task: task})
	if err != nil {
		t.Fatal(err)
	}
	want := "3 devices are enrolled, 0 of them checked in within the last 10m0s; the task selects 26 per round " +
		"(cohort 20 + 30% over-selection) and needs 16 reports: rounds will be abandoned until more devices enroll " +
		"(after 3 such rounds in a row the task pauses)"
	if w := created.GetWarnings(); len(w) != 1 || w[0] != want {
		t.Fatalf("warnings %q\nwant %q", w, want)
	}
	id := created.GetTask().GetId()
	paused := h.WaitTask(t, id, time.Minute, pb.TaskState_TASK_STATE_PAUSED)
	// Both timers are 20 ms: on a loaded machine a round may start with
	// both expired and see the report deadline first, which is still a
	// want of devices (coord's runPlain).
	r := paused.GetStateReason()
	selection := strings.HasPrefix(r, "paused after 3 rounds in a row were abandoned for want of devices "+
		"(round 3: selection closed with 0 devices, below the report goal 16); 3 devices are enrolled")
	deadline := strings.HasPrefix(r, "paused after 3 rounds in a row were abandoned for want of devices "+
		"(round 3: report deadline passed with 0 reports, below the report goal 16); 3 devices are enrolled")
	if !selection && !deadline {
		t.Fatalf("paused: %q", r)
	}
	if rounds := h.Rounds(t, id); len(rounds) != 3 {
		t.Fatalf("%d rounds, want 3", len(rounds))
	}
	st, err := auditor.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetTask().GetState() != pb.TaskState_TASK_STATE_PAUSED {
		t.Fatalf("watch of the paused task: %v %v", m, err)
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("watch of the paused task did not end: %v", err)
	}

	_, err = auditor.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: id})
	wantCode(t, "auditor ResumeTask", err, codes.PermissionDenied)
	res, err := operator.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: id})
	if err != nil || res.GetTask().GetState() != pb.TaskState_TASK_STATE_RUNNING {
		t.Fatalf("operator ResumeTask: %v %v", res.GetTask(), err)
	}
	// A fresh run of three short rounds pauses it again; then it stops.
	h.WaitTask(t, id, time.Minute, pb.TaskState_TASK_STATE_PAUSED)
	if rounds := h.Rounds(t, id); len(rounds) != 6 {
		t.Fatalf("%d rounds, want 6", len(rounds))
	}
	if _, err := operator.StopTask(ctx, &pb.StopTaskRequest{TaskId: id, Reason: "too few devices"}); err != nil {
		t.Fatalf("stop the paused task: %v", err)
	}

	var changes []string
	for _, ev := range auditEvents(t, h, audit.TypeTaskChanged) {
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		c := p.(audit.TaskChanged)
		changes = append(changes, ev.Actor.String()+" "+c.Changes[0].Old+"->"+c.Changes[0].New)
	}
	if got, want := strings.Join(changes, ", "),
		"service:coordinator running->paused, service:api paused->running, service:coordinator running->paused"; got != want {
		t.Errorf("task.changed: %s\nwant %s", got, want)
	}
	actions := map[string]string{}
	for _, ev := range auditEvents(t, h, audit.TypeOperatorAction) {
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		a := p.(audit.OperatorAction)
		actions[ev.Actor.ID+" "+a.Method] = a.Result
	}
	for k, want := range map[string]string{
		"audrey fleetlearn.api.v1.TaskService/ResumeTask": audit.ResultDenied,
		"olga fleetlearn.api.v1.TaskService/ResumeTask":   audit.ResultOK,
	} {
		if actions[k] != want {
			t.Errorf("audit %s: %q, want %q", k, actions[k], want)
		}
	}
}
