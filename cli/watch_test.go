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

// Model versions, as the server names them.
var (
	modelA = strings.Repeat("a1", 32)
	modelB = strings.Repeat("b2", 32)
	modelC = strings.Repeat("c3", 32)
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
			Model: &pb.ModelRef{Version: modelB}},
		{TaskId: id, Round: 2, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_OPENED},
		{TaskId: id, Round: 2, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED, Assigned: 13, Reported: 2, Dropped: 11,
			Reason: "too few reports"},
	}
}

func TestWatchPlain(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, State: pb.TaskState_TASK_STATE_RUNNING,
		CurrentModel: &pb.ModelRef{Version: modelA}})
	f.events[task.Id] = script(task.Id)
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	// The abandoned round tried the second training round; only one committed.
	want := strings.Join([]string{
		"round 1 train 1/2 opened [--------------------] 0/0 reported, 0 dropped",
		"round 1 train 1/2 closed [--------------------] 10/13 reported, 3 dropped  accuracy=0.9123 loss=0.25",
		"round 1 train 1/2 committed [##########----------] 10/13 reported, 3 dropped  accuracy=0.9123 loss=0.25  epsilon=1.5  model b2b2b2b2b2b2",
		"round 2 train 2/2 opened [##########----------] 0/0 reported, 0 dropped",
		"round 2 train 2/2 abandoned [##########----------] 2/13 reported, 11 dropped  (too few reports)",
		"task task-1 completed after 1/2 training rounds, model b2b2b2b2b2b2",
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
	if lines[2] != "task task-1 stopped after 1/2 training rounds, model b2b2b2b2b2b2" {
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
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 1, CurrentRound: 2, State: pb.TaskState_TASK_STATE_COMPLETED,
		CurrentModel: &pb.ModelRef{Version: modelB}})
	f.rounds[task.Id] = []*pb.RoundSummary{
		{Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_ABANDONED, Assigned: 3, Reason: "too few reports"},
		{Round: 2, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_COMMITTED, Assigned: 3, Reported: 3,
			Model: &pb.ModelRef{Version: modelB}},
	}
	// The rounds it missed, then how it ended.
	out, err := run(t, addr, "task", "watch", task.Id)
	want := "round 1 train 1/1 abandoned [--------------------] 0/3 reported, 0 dropped  (too few reports)\n" +
		"round 2 train 1/1 committed [####################] 3/3 reported, 0 dropped  model b2b2b2b2b2b2\n" +
		"task task-1 completed after 1/1 training rounds, model b2b2b2b2b2b2\n"
	if err != nil || out != want {
		t.Errorf("watch of a completed task = %q, %v\nwant %q", out, err, want)
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

// TestWatchCountsTrainingRounds: evaluation rounds are shown and not
// counted; an evaluation of the base model (here one before any training)
// is printed as such, and the end compares the final model with it on the
// same data.
func TestWatchCountsTrainingRounds(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, EvalEvery: 1, State: pb.TaskState_TASK_STATE_RUNNING,
		Model: &pb.ModelRef{Version: modelA}})
	train, eval := pb.RoundKind_ROUND_KIND_TRAIN, pb.RoundKind_ROUND_KIND_EVALUATE
	committed := pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED
	metrics := func(kv ...any) *pb.Metrics {
		m := &pb.Metrics{Values: map[string]float64{}}
		for i := 0; i < len(kv); i += 2 {
			m.Values[kv[i].(string)] = kv[i+1].(float64)
		}
		return m
	}
	f.events[task.Id] = []*pb.RoundEvent{
		{Round: 1, Kind: eval, Type: committed, Assigned: 3, Reported: 3, Metrics: metrics("eval_accuracy", 0.5)},
		{Round: 2, Kind: train, Type: committed, Assigned: 3, Reported: 3, Model: &pb.ModelRef{Version: modelB},
			Metrics: metrics("train_loss", 0.9, "server_accuracy", 0.7)},
		{Round: 3, Kind: eval, Type: committed, Assigned: 3, Reported: 3, Metrics: metrics("eval_accuracy", 0.75)},
		{Round: 4, Kind: train, Type: committed, Assigned: 3, Reported: 3, Model: &pb.ModelRef{Version: modelC},
			Metrics: metrics("train_loss", 0.5, "server_accuracy", 0.8)},
		{Round: 5, Kind: eval, Type: committed, Assigned: 3, Reported: 2, Dropped: 1, Metrics: metrics("eval_accuracy", 0.875)},
	}
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"round 1 evaluate committed [--------------------] 3/3 reported, 0 dropped  eval_accuracy=0.5",
		"base model a1a1a1a1a1a1: eval_accuracy=0.5",
		"round 2 train 1/2 committed [##########----------] 3/3 reported, 0 dropped  server_accuracy=0.7 train_loss=0.9  model b2b2b2b2b2b2",
		"round 3 evaluate committed [##########----------] 3/3 reported, 0 dropped  eval_accuracy=0.75",
		"round 4 train 2/2 committed [####################] 3/3 reported, 0 dropped  server_accuracy=0.8 train_loss=0.5  model c3c3c3c3c3c3",
		"round 5 evaluate committed [####################] 2/3 reported, 1 dropped  eval_accuracy=0.875",
		"task task-1 completed after 2/2 training rounds, model c3c3c3c3c3c3",
		"final model c3c3c3c3c3c3: eval_accuracy=0.875 (base 0.5, +0.375) server_accuracy=0.8",
		"",
	}, "\n")
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

// TestWatchAttachedLate: rounds that finished before the watch are printed
// first, events for them are not printed again, and a round whose events
// the stream dropped is filled in from the server's record, in order.
func TestWatchAttachedLate(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 5, CurrentRound: 3, State: pb.TaskState_TASK_STATE_RUNNING})
	train := pb.RoundKind_ROUND_KIND_TRAIN
	summary := func(round uint64, state pb.RoundState) *pb.RoundSummary {
		r := &pb.RoundSummary{Round: round, Kind: train, State: state, Assigned: 2}
		if state == pb.RoundState_ROUND_STATE_COMMITTED {
			r.Reported = 2
		}
		return r
	}
	committed, open := pb.RoundState_ROUND_STATE_COMMITTED, pb.RoundState_ROUND_STATE_OPEN
	f.rounds[task.Id] = []*pb.RoundSummary{summary(1, committed), summary(2, committed), summary(3, open)}
	f.later[task.Id] = []*pb.RoundSummary{summary(1, committed), summary(2, committed), summary(3, committed),
		summary(4, committed), summary(5, committed)}
	ev := func(round uint64, typ pb.RoundEventType) *pb.RoundEvent {
		e := &pb.RoundEvent{Round: round, Kind: train, Type: typ, Assigned: 2}
		if typ == pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
			e.Reported = 2
		}
		return e
	}
	opened, done := pb.RoundEventType_ROUND_EVENT_TYPE_OPENED, pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED
	f.events[task.Id] = []*pb.RoundEvent{
		ev(2, done),   // before the listing: already printed
		ev(3, opened), // likewise
		ev(3, done),
		ev(5, opened), // round 4's events were dropped
		ev(5, done),
	}
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"round 1 train 1/5 committed [####----------------] 2/2 reported, 0 dropped",
		"round 2 train 2/5 committed [########------------] 2/2 reported, 0 dropped",
		"round 3 train 3/5 opened [########------------] 0/2 reported, 0 dropped",
		"round 3 train 3/5 committed [############--------] 2/2 reported, 0 dropped",
		"round 4 train 4/5 committed [################----] 2/2 reported, 0 dropped",
		"round 5 train 5/5 opened [################----] 0/2 reported, 0 dropped",
		"round 5 train 5/5 committed [####################] 2/2 reported, 0 dropped",
		"task task-1 completed after 5/5 training rounds",
		"",
	}, "\n")
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

// TestWatchPaused: a task the server pauses ends the watch with the reason
// and what to do.
func TestWatchPaused(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 5, State: pb.TaskState_TASK_STATE_RUNNING})
	f.events[task.Id] = script(task.Id)
	f.final[task.Id] = pb.TaskState_TASK_STATE_PAUSED
	out, err := run(t, addr, "task", "watch", task.Id)
	want := "task task-1 paused after 1/5 training rounds: 3 rounds in a row abandoned: 2 of 8 devices took a seat; " +
		"fleetlearn task resume task-1 runs it again once devices can fill its cohort, fleetlearn task stop task-1 ends it"
	if !errors.Is(err, cli.ErrTaskPaused) || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
	if !strings.HasSuffix(out, "(too few reports)\n") {
		t.Errorf("output:\n%s", out)
	}
	// Watching a paused task says the same at once.
	_, err = run(t, addr, "task", "watch", task.Id)
	if !errors.Is(err, cli.ErrTaskPaused) {
		t.Errorf("watch of a paused task: %v", err)
	}
}
