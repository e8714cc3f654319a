package server_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// startNamed starts edge agents with the given device ids, each on its own
// dataset, sharing one stop.
func startNamed(t testing.TB, h *servertest.Harness, ids []string, mk func(i int) *data.Dataset) *fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleet{cancel: cancel}
	t.Cleanup(f.stop)
	for i, id := range ids {
		a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, id), DeviceID: id},
			edge.WithDataset(mk(i)), edge.WithSandbox(sharedSandbox(t)))
		if err != nil {
			t.Fatal(err)
		}
		f.agents = append(f.agents, a)
		f.wg.Add(1)
		go func() { defer f.wg.Done(); a.Run(ctx) }()
	}
	return f
}

// dropoutTask is a task whose rounds end quickly when devices vanish.
// Twenty-five local epochs keep an honest agent's 200 examples fast but make
// a 200 000-example device train for seconds, long enough to vanish mid-round.
func dropoutTask(t testing.TB, h *servertest.Harness, name string, target, goal uint32, over float64, sel, report time.Duration) (task, version string) {
	t.Helper()
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version = h.ImportModel(t, "synthetic", init)
	code := wasmtest.Build(t, wasmtest.Softmax)
	module := h.RegisterModule(t, "softmax", code)
	warmModule(t, code)
	spec := baseTask(name, version, module, 1)
	spec.Hyperparameters, _ = json.Marshal(sgd.Hyper{Epochs: 25, BatchSize: 16, LearningRate: 0.1, EvalBatchSize: 256})
	spec.CohortTarget, spec.ReportGoal, spec.OverSelection = target, goal, over
	spec.SelectionTimeout, spec.ReportTimeout = durationpb.New(sel), durationpb.New(report)
	return h.CreateTask(t, spec).Id, version
}

func honestData(i int) *data.Dataset { return datatest.Synthetic(200, 8, 3, uint64(i+1)) }

// waitRound polls until the task has the given round in one of the states.
func waitRound(t testing.TB, h *servertest.Harness, task string, round uint64, timeout time.Duration, states ...pb.RoundState) *pb.RoundSummary {
	t.Helper()
	end := time.Now().Add(timeout)
	for {
		for _, r := range h.Rounds(t, task) {
			if r.Round != round {
				continue
			}
			for _, s := range states {
				if r.State == s {
					return r
				}
			}
		}
		if time.Now().After(end) {
			t.Fatalf("round %d of %s not in %v after %v: %v", round, task, states, timeout, h.Rounds(t, task))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDropoutRoundClosesAtDeadline: two of five selected devices vanish
// after selection, one an edge agent cancelled mid-training, one a device that
// takes its plan and never reports. The round neither closes early (the cohort
// target is not met) nor waits past its deadline: it commits at the deadline
// with the three reports it has, counting the two as dropped.
func TestDropoutRoundClosesAtDeadline(t *testing.T) {
	const sel, report = 2 * time.Second, 3 * time.Second
	h := servertest.New(t)
	// Five seats (4 × 1.25); the target of four is out of reach once two vanish.
	task, _ := dropoutTask(t, h, "dropout", 4, 2, 0.25, sel, report)

	ghost := newScripted(t, h, "ghost-1")
	ghost.join(t, task, 1)

	slow := startNamed(t, h, []string{"slow-1"}, func(int) *data.Dataset { return datatest.Synthetic(200000, 8, 3, 99) })
	for end := time.Now().Add(10 * time.Second); slow.agents[0].Stats().Rounds == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("slow agent was not selected")
		}
	}
	// Vanish while fetching or training, before any report. Not waiting for
	// the agent to exit: a blob fetch in flight can hold it for seconds.
	slow.cancel()

	fl := startNamed(t, h, []string{"dev-a", "dev-b", "dev-c"}, honestData)
	done := h.WaitTask(t, task, sel+report+15*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	rounds := h.Rounds(t, task)
	if len(rounds) != 1 {
		t.Fatalf("%d rounds, want 1: %v", len(rounds), rounds)
	}
	r := rounds[0]
	t.Logf("round 1: %v assigned %d reported %d dropped %d in %v (%s)", r.State, r.Assigned, r.Reported, r.Dropped,
		r.CloseTime.AsTime().Sub(r.OpenTime.AsTime()), r.Reason)
	if r.State != pb.RoundState_ROUND_STATE_COMMITTED || r.Assigned != 5 || r.Reported != 3 || r.Dropped != 2 {
		t.Errorf("round 1: %v assigned %d reported %d dropped %d, want COMMITTED 5/3/2", r.State, r.Assigned, r.Reported, r.Dropped)
	}
	if !strings.Contains(r.Reason, "report deadline passed") {
		t.Errorf("round 1 closed because %q, want the report deadline", r.Reason)
	}
	// The deadline is fixed when the round opens: selection plus report timeout.
	if d := r.CloseTime.AsTime().Sub(r.OpenTime.AsTime()); d < sel+report-10*time.Millisecond {
		t.Errorf("round closed %v after opening, before its deadline %v", d, sel+report)
	}
	checkStep(t, fetchModel(t, h, r.Model.GetVersion()), fetchModel(t, h, r.Model.GetParentVersion()), 100)
	for _, a := range fl.agents {
		if s := a.Stats(); s.Rounds == 0 {
			t.Errorf("%s never took part: %+v", a.ID(), s)
		}
	}
}

// TestDropoutBelowGoalAbandonsAndRecovers: with a device gone after
// selection, round 1 reaches its deadline one report short of the goal and is
// abandoned; round 2 cannot even select enough devices and is abandoned at the
// end of selection. Once more agents come back, round 3 commits and the task
// completes on it.
func TestDropoutBelowGoalAbandonsAndRecovers(t *testing.T) {
	const sel, report = 2 * time.Second, 2 * time.Second
	h := servertest.New(t)
	task, base := dropoutTask(t, h, "below-goal", 2, 2, 0.5, sel, report) // three seats, two reports needed

	ghost := newScripted(t, h, "ghost-1")
	ghost.join(t, task, 1)
	first := startNamed(t, h, []string{"dev-a"}, honestData)

	r1 := waitRound(t, h, task, 1, sel+report+10*time.Second, pb.RoundState_ROUND_STATE_ABANDONED, pb.RoundState_ROUND_STATE_COMMITTED)
	t.Logf("round 1: %v assigned %d reported %d (%s)", r1.State, r1.Assigned, r1.Reported, r1.Reason)
	if r1.State != pb.RoundState_ROUND_STATE_ABANDONED || r1.Assigned != 2 || r1.Reported != 1 || r1.Dropped != 1 {
		t.Errorf("round 1: %v assigned %d reported %d dropped %d, want ABANDONED 2/1/1", r1.State, r1.Assigned, r1.Reported, r1.Dropped)
	}
	if want := "report deadline passed with 1 reports, below the report goal 2"; r1.Reason != want {
		t.Errorf("round 1 abandoned because %q, want %q", r1.Reason, want)
	}
	if r1.Model.GetVersion() != "" {
		t.Errorf("abandoned round 1 produced model %s", r1.Model.GetVersion())
	}

	r2 := waitRound(t, h, task, 2, sel+10*time.Second, pb.RoundState_ROUND_STATE_ABANDONED, pb.RoundState_ROUND_STATE_COMMITTED)
	t.Logf("round 2: %v assigned %d reported %d (%s)", r2.State, r2.Assigned, r2.Reported, r2.Reason)
	if r2.State != pb.RoundState_ROUND_STATE_ABANDONED || !strings.HasPrefix(r2.Reason, "selection closed with") ||
		!strings.HasSuffix(r2.Reason, "below the report goal 2") {
		t.Errorf("round 2: %v (%s), want abandoned when selection closed below the goal", r2.State, r2.Reason)
	}
	tk, err := h.Tasks.GetTask(context.Background(), &pb.GetTaskRequest{TaskId: task})
	if err != nil {
		t.Fatal(err)
	}
	if tk.Task.State != pb.TaskState_TASK_STATE_RUNNING || tk.Task.CurrentModel.GetVersion() != base {
		t.Errorf("after two abandoned rounds the task is %v on model %s, want RUNNING on %s", tk.Task.State, tk.Task.CurrentModel.GetVersion(), base)
	}

	startNamed(t, h, []string{"dev-b", "dev-c"}, honestData)
	done := h.WaitTask(t, task, sel+report+15*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	rounds := h.Rounds(t, task)
	if len(rounds) != 3 {
		t.Fatalf("%d rounds, want 3: %v", len(rounds), rounds)
	}
	r3 := rounds[2]
	t.Logf("round 3: %v assigned %d reported %d (%s)", r3.State, r3.Assigned, r3.Reported, r3.Reason)
	if r3.State != pb.RoundState_ROUND_STATE_COMMITTED || r3.Reported < 2 {
		t.Fatalf("round 3: %v with %d reports (%s), want committed with at least 2", r3.State, r3.Reported, r3.Reason)
	}
	if done.CurrentModel.GetVersion() != r3.Model.GetVersion() || done.CurrentRound != 3 {
		t.Errorf("task ended on round %d model %s, want round 3's %s", done.CurrentRound, done.CurrentModel.GetVersion(), r3.Model.GetVersion())
	}
	if r3.Model.GetParentVersion() != base {
		t.Errorf("round 3 trained from %s, want the base model %s", r3.Model.GetParentVersion(), base)
	}
	checkStep(t, fetchModel(t, h, r3.Model.GetVersion()), fetchModel(t, h, base), 100)
	if s := first.agents[0].Stats(); s.Rounds < 2 {
		t.Errorf("dev-a took part in %d rounds, want it back after the abandon", s.Rounds)
	}
}
