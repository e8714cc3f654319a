package api_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
)

// seed stores a model and a module and returns a task that uses them.
func seed(e *env) *pb.Task {
	m := e.b.AddModel("mnist", "mnist@1", []byte("weights"))
	mod := e.b.AddModule("mlp", []byte("\x00asm"))
	return &pb.Task{
		Name:             "mnist-ft",
		Model:            &pb.ModelRef{Version: m.GetRef().GetVersion()},
		Module:           &pb.ModuleRef{Sha256: mod.GetRef().GetSha256()},
		Hyperparameters:  []byte(`{"lr":0.1}`),
		CohortTarget:     10,
		ReportGoal:       8,
		RoundsTotal:      3,
		SelectionTimeout: durationpb.New(30e9),
	}
}

func TestTaskLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	in := seed(e)
	// Output-only fields in the request must not reach the backend.
	withOutput := proto.CloneOf(in)
	withOutput.Id, withOutput.State, withOutput.CurrentRound, withOutput.StateReason = "forged", pb.TaskState_TASK_STATE_COMPLETED, 9, "x"

	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: withOutput})
	if err != nil {
		t.Fatal(err)
	}
	got := e.b.LastCreated()
	if got.GetId() != "" || got.GetState() != pb.TaskState_TASK_STATE_UNSPECIFIED || got.GetCurrentRound() != 0 || got.GetStateReason() != "" {
		t.Errorf("backend received output-only fields: %v", got)
	}
	if !proto.Equal(got, in) {
		t.Errorf("backend received %v, want %v", got, in)
	}
	id := created.GetTask().GetId()
	if id == "" || created.GetTask().GetState() != pb.TaskState_TASK_STATE_PENDING {
		t.Fatalf("created = %v", created.GetTask())
	}

	g, err := e.tasks.GetTask(ctx, &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(g.GetTask(), created.GetTask()) {
		t.Errorf("GetTask = %v, want %v", g.GetTask(), created.GetTask())
	}

	e.b.AddRound(&pb.RoundSummary{TaskId: id, Round: 1, State: pb.RoundState_ROUND_STATE_COMMITTED, Reported: 8})
	e.b.AddRound(&pb.RoundSummary{TaskId: id, Round: 2, State: pb.RoundState_ROUND_STATE_OPEN})
	rs, err := e.tasks.ListRounds(ctx, &pb.ListRoundsRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.GetRounds()) != 2 || rs.GetRounds()[0].GetRound() != 2 || rs.GetRounds()[1].GetReported() != 8 {
		t.Errorf("ListRounds = %v", rs.GetRounds())
	}

	st, err := e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: id, Reason: "enough"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTask().GetState() != pb.TaskState_TASK_STATE_STOPPED || st.GetTask().GetStateReason() != "enough" {
		t.Errorf("StopTask = %v", st.GetTask())
	}
	_, err = e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: id})
	wantCode(t, err, codes.FailedPrecondition)
}

func TestListTasksPaging(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	in := seed(e)
	for range 3 {
		if _, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: in}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: "task-2"}); err != nil {
		t.Fatal(err)
	}
	p1, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if ids(p1.GetTasks()) != "task-3,task-2" || p1.GetNextPageToken() == "" {
		t.Fatalf("page 1 = %s, token %q", ids(p1.GetTasks()), p1.GetNextPageToken())
	}
	p2, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{PageSize: 2, PageToken: p1.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	if ids(p2.GetTasks()) != "task-1" || p2.GetNextPageToken() != "" {
		t.Fatalf("page 2 = %s, token %q", ids(p2.GetTasks()), p2.GetNextPageToken())
	}
	stopped, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{State: pb.TaskState_TASK_STATE_STOPPED})
	if err != nil {
		t.Fatal(err)
	}
	if ids(stopped.GetTasks()) != "task-2" {
		t.Errorf("stopped = %s", ids(stopped.GetTasks()))
	}
	_, err = e.tasks.ListTasks(ctx, &pb.ListTasksRequest{PageToken: "garbage"})
	wantCode(t, err, codes.InvalidArgument)
}

func ids(ts []*pb.Task) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.GetId())
	}
	return strings.Join(s, ",")
}

func TestPageSizeIsCapped(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	for _, tc := range []struct{ in, want int32 }{{0, 0}, {7, 7}, {api.MaxPageSize, api.MaxPageSize}, {1 << 30, api.MaxPageSize}} {
		if _, err := e.models.ListModels(ctx, &pb.ListModelsRequest{PageSize: tc.in}); err != nil {
			t.Fatal(err)
		}
		if got := e.b.LastPage().Size; got != int(tc.want) {
			t.Errorf("page_size %d: backend got %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestWatchTask(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: seed(e)})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetTask().GetId()
	stream, err := e.tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.WaitWatchers(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	sent := []*pb.RoundEvent{
		{TaskId: id, Round: 1, Type: pb.RoundEventType_ROUND_EVENT_TYPE_OPENED},
		{TaskId: id, Round: 1, Type: pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED, Reported: 8, Assigned: 10},
	}
	for _, ev := range sent {
		e.b.Publish(ev)
	}
	for i, want := range sent {
		got, err := stream.Recv()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if !proto.Equal(got.GetEvent(), want) {
			t.Errorf("event %d = %v, want %v", i, got.GetEvent(), want)
		}
	}
	if err := e.b.SetTaskState(id, pb.TaskState_TASK_STATE_COMPLETED, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after the task completed: Recv = %v, want io.EOF", err)
	}
}

func TestWatchTaskEndsWhenClientGoesAway(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: seed(e)})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetTask().GetId()
	wctx, cancel := context.WithCancel(ctx)
	stream, err := e.tasks.WatchTask(wctx, &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.WaitWatchers(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("Recv after cancel = %v", err)
	}
	// The server handler returns and the backend sees its context end.
	if err := e.b.WaitWatchers(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
}

func TestWatchUnknownTask(t *testing.T) {
	e := newEnv(t)
	stream, err := e.tasks.WatchTask(testContext(t), &pb.WatchTaskRequest{TaskId: "nope"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantCode(t, err, codes.NotFound)
	if !strings.Contains(status.Convert(err).Message(), `watch task: task "nope": not found`) {
		t.Errorf("message = %q", status.Convert(err).Message())
	}
}

func TestCreateTaskBackendErrors(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	in := seed(e)
	in.Model.Version = "missing@1"
	_, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: in})
	wantCode(t, err, codes.NotFound)
	in = seed(e)
	in.RoundsTotal = 0
	_, err = e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: in})
	wantCode(t, err, codes.InvalidArgument)
	if !strings.HasPrefix(status.Convert(err).Message(), "create task: task \"mnist-ft\": cohort_target") {
		t.Errorf("message = %q", status.Convert(err).Message())
	}
}

func TestCreateTaskWarnings(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	task := seed(e)
	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: task})
	if err != nil || len(created.GetWarnings()) != 0 {
		t.Fatalf("warnings %q, %v; want none", created.GetWarnings(), err)
	}
	const w = "3 devices are enrolled; the task selects 10 per round and needs 8 reports: rounds will be abandoned until more devices enroll"
	e.b.WarnOnCreate(w)
	created, err = e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: task})
	if err != nil {
		t.Fatal(err)
	}
	if got := created.GetWarnings(); len(got) != 1 || got[0] != w || created.GetTask().GetId() == "" {
		t.Fatalf("created %v with warnings %q", created.GetTask(), got)
	}
}

// A paused task shows its reason in GetTask, ListTasks and WatchTask, and
// ResumeTask runs it again.
func TestPauseAndResumeTask(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: seed(e)})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetTask().GetId()
	_, err = e.tasks.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: id})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = e.tasks.ResumeTask(ctx, &pb.ResumeTaskRequest{})
	wantCode(t, err, codes.InvalidArgument)
	_, err = e.tasks.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: "nope"})
	wantCode(t, err, codes.NotFound)

	stream, err := e.tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.WaitWatchers(ctx, id, 1); err != nil {
		t.Fatal(err)
	}
	const reason = "paused after 3 rounds in a row were abandoned for want of devices"
	if err := e.b.SetTaskState(id, pb.TaskState_TASK_STATE_PAUSED, reason); err != nil {
		t.Fatal(err)
	}
	wantPaused := func(what string, task *pb.Task) {
		t.Helper()
		if task.GetId() != id || task.GetState() != pb.TaskState_TASK_STATE_PAUSED || task.GetStateReason() != reason {
			t.Errorf("%s: %v", what, task)
		}
	}
	got, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	wantPaused("watched", got.GetTask())
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after the pause: Recv = %v, want io.EOF", err)
	}
	// A watch that begins on a paused task says so and ends.
	stream, err = e.tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if got, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	wantPaused("watch of a paused task", got.GetTask())
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("watch of a paused task: Recv = %v, want io.EOF", err)
	}
	g, err := e.tasks.GetTask(ctx, &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	wantPaused("GetTask", g.GetTask())
	l, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{State: pb.TaskState_TASK_STATE_PAUSED})
	if err != nil || len(l.GetTasks()) != 1 {
		t.Fatalf("paused tasks: %v %v", l.GetTasks(), err)
	}
	wantPaused("ListTasks", l.GetTasks()[0])

	r, err := e.tasks.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetTask().GetState() != pb.TaskState_TASK_STATE_RUNNING || r.GetTask().GetStateReason() != "" {
		t.Fatalf("resumed: %v", r.GetTask())
	}
}

// ResumeTask is an operator action, recorded like StopTask.
func TestResumeTaskIsAudited(t *testing.T) {
	e := newAuditEnv(t, func(context.Context) string { return "olga" })
	ctx := testContext(t)
	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: seed(e.env)})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetTask().GetId()
	_, err = e.tasks.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: id})
	wantCode(t, err, codes.FailedPrecondition)
	if err := e.b.SetTaskState(id, pb.TaskState_TASK_STATE_PAUSED, "too few devices"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.tasks.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: id}); err != nil {
		t.Fatal(err)
	}
	got, actors := actions(t, e.lg)
	want := []audit.OperatorAction{
		{Method: "fleetlearn.api.v1.TaskService/ResumeTask", Resource: "tasks/" + id, Result: audit.ResultFailed,
			Code: "FAILED_PRECONDITION", Task: id},
		{Method: "fleetlearn.api.v1.TaskService/ResumeTask", Resource: "tasks/" + id, Result: audit.ResultOK, Code: "OK", Task: id},
	}
	got = got[1:] // after CreateTask's
	if len(got) != len(want) {
		t.Fatalf("recorded %+v, want %+v", got, want)
	}
	for i := range want {
		got[i].RequestSHA256 = ""
		if got[i] != want[i] || actors[i+1] != audit.Operator("olga") {
			t.Errorf("action %d = %+v by %v\nwant %+v", i, got[i], actors[i+1], want[i])
		}
	}
}
