package cli_test

import (
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/data"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
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
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, CohortTarget: 10, State: pb.TaskState_TASK_STATE_RUNNING,
		CurrentModel: &pb.ModelRef{Version: modelA}})
	f.events[task.Id] = script(task.Id)
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	// The abandoned round tried the second training round; only one
	// committed. An opened round has no counts yet: it selects its cohort.
	want := strings.Join([]string{
		"round 1 train 1/2 opened [--------------------] selecting a cohort of 10",
		"round 1 train 1/2 closed [--------------------] 10/13 reported, 3 dropped  accuracy=0.9123 loss=0.25",
		"round 1 train 1/2 committed [##########----------] 10/13 reported, 3 dropped  accuracy=0.9123 loss=0.25  epsilon=1.5  model b2b2b2b2b2b2",
		"round 2 train 2/2 opened [##########----------] selecting a cohort of 10",
		"round 2 train 2/2 abandoned [##########----------] 2/13 reported, 11 dropped  (too few reports)",
		"task task-1 completed after 1/2 training rounds, model b2b2b2b2b2b2",
		"",
	}, "\n")
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

// TestWatchAsync: an async task's rounds are buffers; watch says what each
// took, how stale it was and how many devices were training.
func TestWatchAsync(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 2, CohortTarget: 10, State: pb.TaskState_TASK_STATE_RUNNING,
		CurrentModel: &pb.ModelRef{Version: modelA}, Async: &pb.AsyncConfig{Concurrency: 100, Buffer: 10, MaxStaleness: 8}})
	train := pb.RoundKind_ROUND_KIND_TRAIN
	f.events[task.Id] = []*pb.RoundEvent{
		{TaskId: task.Id, Round: 1, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_OPENED},
		{TaskId: task.Id, Round: 1, Kind: train, Type: pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED, Assigned: 10, Reported: 10,
			Metrics: &pb.Metrics{Values: map[string]float64{"train_loss": 0.25, "async_staleness_mean": 2.4, "async_staleness_max": 6,
				"async_training": 93}}, Model: &pb.ModelRef{Version: modelB}},
	}
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"round 1 train 1/2 opened [--------------------] buffering 10 reports, up to 100 devices training, staleness at most 8",
		"round 1 train 1/2 committed [##########----------] 10 reports, staleness mean 2.4 max 6, 93/100 training  train_loss=0.25  model b2b2b2b2b2b2",
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

// TestWatchBaseModel: the server's measure of the base model before round
// 1 is printed first, and the end compares the final model with it.
func TestWatchBaseModel(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	task := f.addTask(&pb.Task{Name: "n", RoundsTotal: 1, State: pb.TaskState_TASK_STATE_RUNNING,
		Model: &pb.ModelRef{Version: modelA}, ServerEvalDataset: "/srv/heldout",
		BaseMetrics: &pb.Metrics{Values: map[string]float64{"server_accuracy": 0.1, "server_loss": 2.3}}})
	f.events[task.Id] = []*pb.RoundEvent{{Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN, Type: pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED,
		Assigned: 2, Reported: 2, Model: &pb.ModelRef{Version: modelB},
		Metrics: &pb.Metrics{Values: map[string]float64{"server_accuracy": 0.75, "server_loss": 0.5}}}}
	f.final[task.Id] = pb.TaskState_TASK_STATE_COMPLETED
	out, err := run(t, addr, "task", "watch", task.Id)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"base model a1a1a1a1a1a1: server_accuracy=0.1 server_loss=2.3",
		"round 1 train 1/1 committed [####################] 2/2 reported, 0 dropped  server_accuracy=0.75 server_loss=0.5  model b2b2b2b2b2b2",
		"task task-1 completed after 1/1 training rounds, model b2b2b2b2b2b2",
		"final model b2b2b2b2b2b2: server_accuracy=0.75 (base 0.1, +0.65) server_loss=0.5 (base 2.3, -1.8)",
		"",
	}, "\n")
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

// TestWatchBaseModelServer: a real server measures the base model on its
// evaluation set before round 1; watch shows it first and compares the
// final model with it at the end.
func TestWatchBaseModelServer(t *testing.T) {
	h := servertest.New(t)
	h.ImportModel(t, "tiny", tinyModel(t, 1))
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	dir := filepath.Join(t.TempDir(), "heldout")
	if err := data.WriteDir(dir, &data.Dataset{Features: make([]float32, 8), Labels: make([]uint8, 4), Dim: 2, NumClasses: 2}, "heldout"); err != nil {
		t.Fatal(err)
	}
	startSimFleet(t, simFleet(t, h, 2))
	id := createTask(t, h, "--name", "measured", "--model", "tiny", "--module", module, "--cohort", "2",
		"--over-selection", "1", "--rounds", "1", "--server-eval-dataset", dir)

	out, err := runServer(t, h, "task", "watch", id)
	if err != nil {
		t.Fatalf("watch: %v\n%s", err, out)
	}
	res, err := h.Tasks.GetTask(t.Context(), &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	task := res.GetTask()
	if got := task.GetBaseMetrics().GetValues(); len(got) != 1 || got["server_accuracy"] != 0 {
		t.Fatalf("the task's base metrics are %v, want server_accuracy=0 (the trivial module's)", task.GetBaseMetrics())
	}
	base, final := task.GetModel().GetVersion()[:12], task.GetCurrentModel().GetVersion()[:12]
	want := []string{
		`^base model ` + base + `: server_accuracy=0$`,
		`^round 1 train 1/1 committed \[#{20}\] 2/2 reported, 0 dropped  server_accuracy=0  model ` + final + `  \(cohort target 2 reached\)$`,
		`^task ` + id + ` completed after 1/1 training rounds, model ` + final + ` \(all rounds committed\)$`,
		`^final model ` + final + `: server_accuracy=0 \(base 0, \+0\)$`,
	}
	lines := finishedLines(out)
	if len(lines) != len(want) {
		t.Fatalf("watch printed:\n%s\nwant lines matching:\n%s", out, strings.Join(want, "\n"))
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("line %d = %q, want %s", i, lines[i], w)
		}
	}
}
