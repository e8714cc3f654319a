package cli_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// script is two training rounds: one committed, one abandoned.
func script(id string) []*pb.RoundEvent {
	train := pb.RoundKind_ROUND_KIND_TRAIN
	return []*pb.RoundEvent{
		{TaskId: id, Round: 1, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_OPENED},
		{TaskId: id, Round: 1, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_CLOSED, Assigned: 13, Reported: 10, Dropped: 3,
			Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0.91234, "loss": 0.25}}},
		{TaskId: id, Round: 1, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED, Assigned: 13, Reported: 10, Dropped: 3,
			Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0.91234, "loss": 0.25}}, EpsilonSpent: 1.5,
			Model: &pb.ModelRef{Version: "mnist@2"}},
		{TaskId: id, Round: 2, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_OPENED},
		{TaskId: id, Round: 2, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED, Assigned: 13, Reported: 2, Dropped: 11,
			Reason: "too few reports"},
	}
}

func TestWatchPlain(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, State: pb.TaskState_TASK_STATE_RUNNING,
		CurrentModel: &pb.ModelRef{Version: "mnist@1"}})
	f.events[task.Id] = script(task.Id)
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"round 1/2 train opened [--------------------] 0/0 reported, 0 dropped",
		"round 1/2 train closed [--------------------] 10/13 reported, 3 dropped  accuracy=0.9123 loss=0.25",
		"round 1/2 train committed [##########----------] 10/13 reported, 3 dropped  accuracy=0.9123 loss=0.25  epsilon=1.5  model mnist@2",
		"round 2/2 train opened [##########----------] 0/0 reported, 0 dropped",
		"round 2/2 train abandoned [####################] 2/13 reported, 11 dropped  (too few reports)",
		"task task-1 completed after 2/2 rounds, model mnist@2",
		"",
	}, "\n")
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

func TestWatchTerminal(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, State: pb.TaskState_TASK_STATE_RUNNING})
	f.events[task.Id] = script(task.Id)
	f.final[task.Id] = pb.TaskState_TASK_STATE_STOPPED
	out, err := runWith(t, []cli.Option{cli.WithTerminal(true)}, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	// Each round is redrawn on one line, ending once it commits or is
	// abandoned; the outcome is coloured.
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want 2 rounds and the summary:\n%q", len(lines), out)
	}
	if strings.Count(lines[0], "\r\x1b[2K") != 3 || !strings.Contains(lines[0], "\x1b[32mcommitted\x1b[0m") {
		t.Errorf("round 1 line = %q", lines[0])
	}
	if strings.Count(lines[1], "\r\x1b[2K") != 2 || !strings.Contains(lines[1], "\x1b[31mabandoned\x1b[0m") {
		t.Errorf("round 2 line = %q", lines[1])
	}
	if lines[2] != "task task-1 stopped after 2/2 rounds, model mnist@2" {
		t.Errorf("summary = %q", lines[2])
	}
}

func TestWatchNoANSIWithoutTerminal(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, State: pb.TaskState_TASK_STATE_RUNNING})
	f.events[task.Id] = script(task.Id)
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	// No WithTerminal: stdout is a buffer, which is detected as no terminal.
	out, err := runWith(t, nil, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out, "\r\x1b") {
		t.Errorf("escape sequences in non-terminal output: %q", out)
	}
}

func TestWatchFailedTask(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, State: pb.TaskState_TASK_STATE_RUNNING})
	f.events[task.Id] = script(task.Id)[:1]
	f.final[task.Id] = pb.TaskState_TASK_STATE_FAILED
	_, err := run(t, addr, "task", "watch", task.Id)
	if !errors.Is(err, cli.ErrTaskFailed) || !strings.Contains(err.Error(), "privacy budget accountant crashed") {
		t.Errorf("err = %v", err)
	}
}

func TestWatchEndedTask(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 5, CurrentRound: 5, State: pb.TaskState_TASK_STATE_COMPLETED,
		CurrentModel: &pb.ModelRef{Version: "m@6"}})
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil || out != "task task-1 completed after 5/5 rounds, model m@6\n" {
		t.Errorf("watch of a completed task = %q, %v", out, err)
	}
}

func TestWatchEndsEarly(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 5, State: pb.TaskState_TASK_STATE_RUNNING})
	f.final[task.Id] = pb.TaskState_TASK_STATE_RUNNING
	if _, err := run(t, addr, "task", "watch", task.Id); !errors.Is(err, cli.ErrWatchEnded) {
		t.Errorf("err = %v", err)
	}
}

func TestWatchTimeout(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 5, State: pb.TaskState_TASK_STATE_RUNNING})
	f.hang = true
	_, err := run(t, addr, "--timeout", "100ms", "task", "watch", task.Id)
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "--timeout") {
		t.Errorf("err = %v", err)
	}
}
