package cli_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestTaskRoundsFailures(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addTask(&pb.Task{Id: "task-1", Name: "ft", State: pb.TaskState_TASK_STATE_RUNNING})
	rounds := []*pb.RoundSummary{
		{TaskId: "task-1", Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_COMMITTED,
			Assigned: 3, Reported: 3, Metrics: &pb.Metrics{Values: map[string]float64{"loss": 0.5}}},
		{TaskId: "task-1", Round: 2, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_ABANDONED,
			Assigned: 3, Reported: 1, Dropped: 2, Reason: "too few reports", Metrics: &pb.Metrics{Values: map[string]float64{"loss": 0.75}},
			Failures: []*pb.DeviceFailure{
				{DeviceId: "d-1", Reason: "train: wasm: memory limit exceeded"},
				{DeviceId: "d-2", Reason: "evil\x1b[2J\nsecond line\tcell"},
			}},
	}
	// The fake lists what it holds last first: held so, the rounds come
	// oldest first, as the real server sends them. The CLI puts the newest
	// first whatever the order.
	f.rounds["task-1"] = slices.Clone(rounds)
	slices.Reverse(f.rounds["task-1"])

	// The table keeps an abandoned round's metrics beside its reason and
	// counts its failures; the reasons themselves need --failures.
	out, err := run(t, addr, "task", "rounds", "task-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ROUND  KIND   STATE      ASSIGNED  REPORTED  DROPPED  FAILURES  EPSILON  LOSS  MODEL  REASON",
		"2      train  abandoned  3         1         2        2         -        0.75  -      too few reports",
		"1      train  committed  3         3         0        0         -        0.5   -      -",
	}
	if got := strings.TrimSpace(out); got != strings.Join(want, "\n") {
		t.Errorf("task rounds:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}

	out, err = run(t, addr, "task", "rounds", "task-1", "--failures")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, "",
		"ROUND  DEVICE  FAILURE",
		"2      d-1     train: wasm: memory limit exceeded",
		"2      d-2     evil\ufffd[2J\ufffdsecond line\ufffdcell",
	)
	if got := strings.TrimSpace(out); got != strings.Join(want, "\n") {
		t.Errorf("task rounds --failures:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
	if strings.ContainsAny(out, "\x1b\t") {
		t.Errorf("a device's reason reached the terminal raw: %q", out)
	}

	// JSON carries the reasons as the API sent them.
	out, err = run(t, addr, "task", "rounds", "task-1", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var res pb.ListRoundsResponse
	if err := protojson.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if len(res.GetRounds()) != 2 || !proto.Equal(res.GetRounds()[0], rounds[1]) || !strings.Contains(out, `"failures"`) {
		t.Errorf("-o json:\n%s", out)
	}
}

func TestTaskRoundsNoFailures(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addTask(&pb.Task{Id: "task-1", Name: "ft", State: pb.TaskState_TASK_STATE_RUNNING})
	f.rounds["task-1"] = []*pb.RoundSummary{{TaskId: "task-1", Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN,
		State: pb.RoundState_ROUND_STATE_COMMITTED, Assigned: 2, Reported: 2}}
	out, err := run(t, addr, "task", "rounds", "task-1", "--failures")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out, "\nno device failures\n") {
		t.Errorf("task rounds --failures without failures:\n%s", out)
	}
}

// TestTaskRoundsManyMetrics: past a few metrics, they share one column.
func TestTaskRoundsManyMetrics(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addTask(&pb.Task{Id: "task-1", Name: "ft", State: pb.TaskState_TASK_STATE_RUNNING})
	vals := map[string]float64{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		vals[k] = 1
	}
	f.rounds["task-1"] = []*pb.RoundSummary{{TaskId: "task-1", Round: 1, Kind: pb.RoundKind_ROUND_KIND_EVALUATE,
		State: pb.RoundState_ROUND_STATE_COMMITTED, Metrics: &pb.Metrics{Values: vals}}}
	out, err := run(t, addr, "task", "rounds", "task-1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, " METRICS ") || !strings.Contains(out, "a=1 b=1 c=1 d=1 e=1 f=1 g=1") {
		t.Errorf("task rounds:\n%s", out)
	}
}
