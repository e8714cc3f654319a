package cli_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/internal/freeport"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

var moduleSHA = strings.Repeat("ab", 32)

func TestTaskCreate(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	first := f.addModel("mnist", safetensors(1)).GetRef().GetVersion()
	f.addModel("mnist", safetensors(2))
	out, err := run(t, addr, "task", "create", "--name", "mnist-ft", "--model", "mnist@1",
		"--module", strings.ToUpper(moduleSHA), "--hyper", `{ "lr": 0.05, "batch": 32 }`,
		"--cohort", "20", "--over-selection", "1.5", "--rounds", "50", "--selection-timeout", "1m",
		"--report-timeout", "5m", "--rule", "fedavgm", "--server-lr", "0.5", "--momentum", "0.8",
		"--max-update-norm", "10", "--max-examples-per-report", "500", "--min-examples", "100", "--require-charging", "--require-unmetered",
		"--eval-every", "5", "--server-eval-dataset", "data/heldout", "--memory-pages", "512", "--call-timeout", "20s", "--max-flops", "2e13")
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.Task{
		Name: "mnist-ft", Model: &pb.ModelRef{Version: first}, Module: &pb.ModuleRef{Sha256: moduleSHA},
		Hyperparameters: []byte(`{"lr":0.05,"batch":32}`),
		CohortTarget:    20, OverSelection: 0.5, ReportGoal: 16, RoundsTotal: 50,
		SelectionTimeout: durationpb.New(time.Minute), ReportTimeout: durationpb.New(5 * time.Minute),
		Aggregation: &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_FEDAVGM,
			ServerLearningRate: 0.5, Momentum: 0.8, MaxUpdateNorm: 10, MaxExamplesPerReport: 500},
		Eligibility:       &pb.Eligibility{MinExamples: 100, RequireCharging: true, RequireUnmetered: true},
		EvalEvery:         5,
		ServerEvalDataset: "data/heldout",
		Limits:            &pb.Limits{MemoryPages: 512, Timeout: durationpb.New(20 * time.Second), MaxFlops: 2e13},
	}
	if !proto.Equal(f.created, want) {
		t.Errorf("sent\n%v\nwant\n%v", f.created, want)
	}
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "ID ") || !strings.HasSuffix(lines[0], "task-1") {
		t.Errorf("first line = %q, want the task id", lines[0])
	}
	for _, s := range []string{"mnist-ft", "pending", "0/50", "fedavgm, server lr 0.5, momentum 0.8",
		"at least 100 examples, charging, unmetered", "every 5 rounds", "1.5x"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func TestTaskCreateDefaults(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("m", safetensors(1))
	latest := f.addModel("m", safetensors(2)).GetRef().GetVersion()
	f.createWarnings = []string{"the fleet has 3 enrolled devices; cohort 10 selects 13"}
	out, stderr, err := runErr(t, addr, "task", "create", "--name", "n", "--model", "m", "--module", moduleSHA, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.Task{
		Name: "n", Model: &pb.ModelRef{Version: latest}, Module: &pb.ModuleRef{Sha256: moduleSHA},
		CohortTarget: 10, OverSelection: 0.3, ReportGoal: 8, RoundsTotal: 20,
		SelectionTimeout: durationpb.New(30 * time.Second), ReportTimeout: durationpb.New(2 * time.Minute),
		Aggregation: &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_FEDAVG, ServerLearningRate: 1},
	}
	if !proto.Equal(f.created, want) {
		t.Errorf("sent\n%v\nwant\n%v", f.created, want)
	}
	var got struct{ ID, State string }
	if err := json.Unmarshal([]byte(strings.ReplaceAll(out, `"id"`, `"ID"`)), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.ID != "task-1" || got.State != "TASK_STATE_PENDING" {
		t.Errorf("json = %+v", got)
	}
	// The server's warnings go to standard error, out of the JSON.
	if stderr != "warning: the fleet has 3 enrolled devices; cohort 10 selects 13\n" {
		t.Errorf("stderr = %q", stderr)
	}
}

// TestTaskCreateUnknownModel: a model reference that names nothing is
// refused with what to do, and no task is created.
func TestTaskCreateUnknownModel(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("mnist", safetensors(1))
	for ref, want := range map[string]string{
		"cifar":   "--model: no model named cifar; fleetlearn model list shows the models",
		"mnist@2": "--model: mnist has 1 version; mnist@2 does not exist",
	} {
		_, err := run(t, addr, "task", "create", "--name", "n", "--model", ref, "--module", moduleSHA)
		if !errors.Is(err, cli.ErrUnknownModel) || err.Error() != want {
			t.Errorf("--model %s: %v, want %q", ref, err, want)
		}
	}
	if f.created != nil {
		t.Errorf("a task was created: %v", f.created)
	}
}

func TestTaskCreateHyperFile(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("m", safetensors(1))
	path := filepath.Join(t.TempDir(), "hyper.json")
	if err := os.WriteFile(path, []byte("{\n  \"epochs\": 2\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, addr, "task", "create", "--name", "n", "--model", "m@1", "--module", moduleSHA,
		"--hyper-file", path, "--rule", "trimmed-mean", "--trim", "0.2", "--cohort", "5"); err != nil {
		t.Fatal(err)
	}
	if got := string(f.created.GetHyperparameters()); got != `{"epochs":2}` {
		t.Errorf("hyperparameters = %s", got)
	}
	if a := f.created.GetAggregation(); a.GetTrimFraction() != 0.2 || a.GetMomentum() != 0 {
		t.Errorf("aggregation = %v", a)
	}
	if g := f.created.GetReportGoal(); g != 4 {
		t.Errorf("report goal = %d, want 80%% of 5", g)
	}
}

func TestTaskCreateRefusesBadFlags(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	base := []string{"task", "create", "--name", "n", "--model", "m@1"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"short module digest", []string{"--module", "abc"}, "--module"},
		{"missing module", nil, `required flag(s) "module" not set`},
		{"hyper not JSON", []string{"--module", moduleSHA, "--hyper", "lr=1"}, "not a JSON object"},
		{"hyper array", []string{"--module", moduleSHA, "--hyper", "[1,2]"}, "not a JSON object"},
		{"hyper and hyper-file", []string{"--module", moduleSHA, "--hyper", "{}", "--hyper-file", "x"}, "hyper"},
		{"missing hyper-file", []string{"--module", moduleSHA, "--hyper-file", "/nonexistent/h.json"}, "no such file"},
		{"unknown rule", []string{"--module", moduleSHA, "--rule", "fedsgd"}, `--rule "fedsgd"`},
		{"momentum without fedavgm", []string{"--module", moduleSHA, "--momentum", "0.5"}, "--momentum applies only"},
		{"trim without trimmed-mean", []string{"--module", moduleSHA, "--trim", "0.2"}, "--trim applies only"},
		{"trim out of range", []string{"--module", moduleSHA, "--rule", "trimmed-mean", "--trim", "0.5"}, "--trim 0.5"},
		{"goal above cohort", []string{"--module", moduleSHA, "--cohort", "5", "--report-goal", "6"}, "--report-goal 6"},
		{"zero cohort", []string{"--module", moduleSHA, "--cohort", "0"}, "--cohort"},
		{"negative cohort", []string{"--module", moduleSHA, "--cohort", "-3"}, "invalid argument"},
		{"zero rounds", []string{"--module", moduleSHA, "--rounds", "0"}, "--rounds"},
		{"over-selection below 1", []string{"--module", moduleSHA, "--over-selection", "0.3"}, "--over-selection 0.3"},
		{"NaN server lr", []string{"--module", moduleSHA, "--server-lr", "NaN"}, "--server-lr must be finite"},
		{"zero report timeout", []string{"--module", moduleSHA, "--report-timeout", "0s"}, "--report-timeout"},
		{"bad output format", []string{"--module", moduleSHA, "-o", "yaml"}, `output format "yaml"`},
		{"positional argument", []string{"--module", moduleSHA, "extra"}, "unknown command"},
		{"@ in the name", []string{"--module", moduleSHA, "--name", "ft@2"}, "may not contain @"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, addr, append(base, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if f.created != nil {
				t.Fatalf("the task reached the server: %v", f.created)
			}
		})
	}
}

func TestTaskListGetStopRounds(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	for _, name := range []string{"a", "b", "c"} {
		f.addTask(&pb.Task{Name: name, RoundsTotal: 10, State: pb.TaskState_TASK_STATE_RUNNING})
	}
	out, err := run(t, addr, "task", "list")
	if err != nil {
		t.Fatal(err)
	}
	// Three tasks over two pages, newest first, under a header.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "task-3") || !strings.HasPrefix(lines[3], "task-1") {
		t.Fatalf("task list:\n%s", out)
	}
	out, err = run(t, addr, "task", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Tasks []struct{ ID string } }
	if err := json.Unmarshal([]byte(strings.ReplaceAll(out, `"id"`, `"ID"`)), &list); err != nil || len(list.Tasks) != 3 {
		t.Fatalf("task list -o json: %v\n%s", err, out)
	}

	out, err = run(t, addr, "task", "stop", "task-2", "--reason", "bad data")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "stopped (bad data)") {
		t.Errorf("task stop:\n%s", out)
	}
	out, err = run(t, addr, "task", "list", "--state", "stopped")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "task-2") || strings.Contains(out, "task-1") {
		t.Errorf("task list --state stopped:\n%s", out)
	}
	if _, err := run(t, addr, "task", "list", "--state", "sleeping"); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("--state sleeping: %v", err)
	}

	out, err = run(t, addr, "task", "get", "task-2")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "ID") || !strings.Contains(out, "task-2") || !strings.Contains(out, "stopped (bad data)") {
		t.Errorf("task get:\n%s", out)
	}

	model := strings.Repeat("9f", 32)
	f.rounds["task-1"] = []*pb.RoundSummary{
		{TaskId: "task-1", Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_COMMITTED, EpsilonSpent: 1.25,
			Assigned: 13, Reported: 10, Dropped: 3, Metrics: &pb.Metrics{Values: map[string]float64{"train_loss": 0.5, "train_accuracy": 0.875}},
			Model: &pb.ModelRef{Version: model}},
		{TaskId: "task-1", Round: 2, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_ABANDONED,
			Assigned: 13, Reported: 2, Dropped: 11, Reason: "too few reports"},
		{TaskId: "task-1", Round: 3, Kind: pb.RoundKind_ROUND_KIND_EVALUATE, State: pb.RoundState_ROUND_STATE_OPEN, Assigned: 5},
	}
	f.mu.Lock()
	f.task("task-1").CurrentRound = 3
	f.mu.Unlock()
	out, err = run(t, addr, "task", "rounds", "task-1")
	if err != nil {
		t.Fatal(err)
	}
	// A column per metric, the model a round committed, newest first.
	want := []string{
		"ROUND  KIND      STATE      ASSIGNED  REPORTED  DROPPED  FAILURES  EPSILON  TRAIN_ACCURACY  TRAIN_LOSS  MODEL         REASON",
		"3      evaluate  open       5         0         0        0         -        -               -           -             -",
		"2      train     abandoned  13        2         11       0         -        -               -           -             too few reports",
		"1      train     committed  13        10        3        0         1.25     0.875           0.5         9f9f9f9f9f9f  -",
	}
	if got := strings.Split(strings.TrimSpace(out), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("task rounds:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
	// Progress counts committed training rounds, not round numbers.
	out, err = run(t, addr, "task", "get", "task-1")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "  "); ok {
			rows[k] = strings.TrimSpace(v)
		}
	}
	if rows["TRAINED"] != "1/10 rounds" || rows["ROUND"] != "3" {
		t.Errorf("task get:\n%s", out)
	}
	out, err = run(t, addr, "task", "list")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "task-1  a     running  1/10     3  ") {
		t.Errorf("task list:\n%s", out)
	}
}

func TestUnknownTask(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	for _, args := range [][]string{
		{"task", "get", "nope"},
		{"task", "stop", "nope"},
		{"task", "rounds", "nope"},
		{"task", "watch", "nope"},
	} {
		out, err := run(t, addr, args...)
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `task "nope": not found`) {
			t.Errorf("%v: err = %v", args, err)
		}
		if strings.Contains(err.Error(), "rpc error") {
			t.Errorf("%v: raw gRPC error text: %v", args, err)
		}
		if out != "" {
			t.Errorf("%v: printed %q", args, out)
		}
	}
}

func TestServerUnreachable(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	// A port that was just free: nothing listens there.
	closed := freePort(t)
	_, err := run(t, closed, "task", "list")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "server "+closed+" unavailable") {
		t.Errorf("err = %v", err)
	}
	// $FLEETLEARN_SERVER picks the server when --server is not given.
	env := func(k string) string {
		if k == cli.ServerEnv {
			return addr
		}
		return ""
	}
	if _, err := runWith(t, []cli.Option{cli.WithGetenv(env)}, "", "--insecure", "task", "list"); err != nil {
		t.Errorf("with $%s: %v", cli.ServerEnv, err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t)
}

func TestTaskCreateUnbounded(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("mnist", safetensors(1))
	base := []string{"task", "create", "--name", "open", "--model", "mnist@1", "--module", moduleSHA}
	if _, err := run(t, addr, append(base, "--unbounded-updates", "--max-update-norm", "3")...); !errors.Is(err, cli.ErrUsage) {
		t.Fatalf("--unbounded-updates with a bound: %v", err)
	}
	out, err := run(t, addr, append(base, "--unbounded-updates")...)
	if err != nil {
		t.Fatal(err)
	}
	if !f.created.GetAggregation().GetUnboundedUpdates() || f.created.GetAggregation().GetMaxUpdateNorm() != 0 {
		t.Fatalf("sent %v", f.created.GetAggregation())
	}
	if !strings.Contains(out, "updates unbounded") {
		t.Errorf("output does not show the opt-out:\n%s", out)
	}
}

// TestTaskCreateMaxFlops: the work limit is a count of flops, refused
// negative, not a number or beyond int64.
func TestTaskCreateMaxFlops(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("m", safetensors(1))
	for _, bad := range []string{"-1", "NaN", "1e19", "+Inf"} {
		_, err := run(t, addr, "task", "create", "--name", "n", "--model", "m@1", "--module", moduleSHA, "--max-flops", bad)
		if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "--max-flops") {
			t.Errorf("--max-flops %s: %v, want a usage error naming it", bad, err)
		}
	}
	if f.created != nil {
		t.Fatalf("a task was created: %v", f.created)
	}
	if _, err := run(t, addr, "task", "create", "--name", "n", "--model", "m@1", "--module", moduleSHA, "--max-flops", "5e12"); err != nil {
		t.Fatal(err)
	}
	if got := f.created.GetLimits().GetMaxFlops(); got != 5e12 {
		t.Errorf("max_flops %d, want 5e12", got)
	}
}
