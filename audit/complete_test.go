package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// A step of a test log: one event, named for the test to find it, in the
// batch the server would record it in (a committed round's close and what
// it produced go in one AppendBatch, as commitEvents writes them).
type logStep struct {
	name  string // "task/round/what", e.g. "t-train/4/dp.spent"
	batch int
	actor Actor
	p     Payload
}

func modelVersion(n int) string { return fmt.Sprintf("%064x", n) }

// roundSteps are the events of one round of task as the coordinator
// records them: round.opened alone, then the close batch.
func roundSteps(task string, round uint64, kind, outcome string, dp, serverEval bool, batch int) []logStep {
	coord := Service("coordinator")
	base, next := modelVersion(int(round)), modelVersion(int(round)+1)
	elig := "kind=" + kind + " min_examples=1 abi=1"
	if kind == "" {
		elig = "charging, unmetered" // recorded before rounds had kinds: a training round
	}
	at := func(what string) string { return fmt.Sprintf("%s/%d/%s", task, round, what) }
	out := []logStep{{at("round.opened"), batch, coord, RoundOpened{Task: task, Round: round, Model: base, Module: hexB,
		CohortSize: 12, Eligibility: elig}}}
	batch++
	if outcome == RoundAbandoned {
		return append(out, logStep{at("round.closed"), batch, coord, RoundClosed{Task: task, Round: round,
			Outcome: RoundAbandoned, Reports: 2, Dropouts: 10, AggregationRule: "fedavg", Reason: "too few reports"}})
	}
	out = append(out, logStep{at("round.closed"), batch, coord, RoundClosed{Task: task, Round: round, Outcome: RoundCommitted,
		Reports: 10, Dropouts: 2, AggregationRule: "fedavg"}})
	if kind == "evaluate" {
		return append(out, logStep{at("eval.federated"), batch, coord, ModelEvaluated{Task: task, Round: round, Model: base,
			Dataset: "federated:evaluate", Samples: 640, Metrics: map[string]float64{"eval_loss": 0.4}}})
	}
	out = append(out,
		logStep{at("model.committed"), batch, coord, ModelCommitted{Task: task, Round: round, Model: next, SHA256: next, Parent: base}},
		logStep{at("eval.train"), batch, coord, ModelEvaluated{Task: task, Round: round, Model: base, Dataset: "federated:train",
			Samples: 640, Metrics: map[string]float64{"train_loss": 0.7}}})
	if serverEval {
		out = append(out, logStep{at("eval.server"), batch, coord, ModelEvaluated{Task: task, Round: round, Model: next,
			Dataset: "server:heldout.csv", Samples: 100, Metrics: map[string]float64{"loss": 0.6}}})
	}
	if dp {
		out = append(out, logStep{at("dp.spent"), batch, coord, PrivacySpent{Task: task, Round: round, Mechanism: "gaussian",
			Accountant: "rdp", ClipNorm: 1, NoiseMultiplier: 1.1, SamplingRate: 0.01, Delta: 1e-5, Epsilon: 0.2,
			CumulativeEpsilon: 0.2 * float64(round), EpsilonBudget: 8}})
	}
	return out
}

// completeSteps is the record of a server that did everything right:
//
//   - t-train (DP, server evaluation): round 1 trains, round 2 evaluates,
//     round 3 is abandoned, round 4 trains, round 5 is still open; an
//     evaluation outside any round;
//   - t-plain (no DP, no server evaluation): one training round whose
//     round.opened predates round kinds;
//   - t-legacy: rounds but no task.created (a log continued under new
//     keys), one of them missing its model.committed.
func completeSteps() []logStep {
	op := Operator("alice")
	s := []logStep{
		{"t-train/created", 0, op, TaskCreated{Task: "t-train", Name: "keyboard", BaseModel: modelVersion(1), Module: hexB, Rounds: 10,
			CohortTarget: 10, ReportGoal: 8, AggregationRule: "fedavg", SecAgg: true, DP: true, ConfigSHA256: hexC,
			Settings: map[string]string{"server_eval_dataset": "/data/heldout.csv", "learning_rate": "0.1"}}},
		{"t-plain/created", 1, op, TaskCreated{Task: "t-plain", BaseModel: modelVersion(1), Module: hexB, Rounds: 1,
			AggregationRule: "fedavg", Settings: map[string]string{"learning_rate": "0.1"}}},
	}
	s = append(s, roundSteps("t-train", 1, "train", RoundCommitted, true, true, 10)...)
	s = append(s, roundSteps("t-plain", 1, "", RoundCommitted, false, false, 20)...)
	s = append(s, roundSteps("t-train", 2, "evaluate", RoundCommitted, true, true, 30)...)
	s = append(s, roundSteps("t-legacy", 7, "train", RoundCommitted, false, false, 40)...)
	s = append(s, roundSteps("t-train", 3, "train", RoundAbandoned, true, true, 50)...)
	s = append(s, logStep{"t-train/0/eval.adhoc", 60, op, ModelEvaluated{Task: "t-train", Model: modelVersion(3), Dataset: "server:audit.csv",
		Samples: 10, Metrics: map[string]float64{"loss": 0.5}}})
	s = append(s, roundSteps("t-train", 4, "train", RoundCommitted, true, true, 70)...)
	s = append(s, roundSteps("t-legacy", 8, "train", RoundCommitted, false, false, 80)...)
	s = append(s, roundSteps("t-train", 5, "train", RoundCommitted, true, true, 90)[:1]...) // opened, in flight
	return slices.DeleteFunc(s, func(st logStep) bool { return st.name == "t-legacy/8/model.committed" })
}

// writeSteps records the steps in a fresh log, one AppendBatch per batch,
// and returns the export.
func writeSteps(t *testing.T, steps []logStep) []byte {
	t.Helper()
	ctx := context.Background()
	lg, _, _ := openTest(t)
	for i := 0; i < len(steps); {
		var evs []Event
		j := i
		for ; j < len(steps) && steps[j].batch == steps[i].batch; j++ {
			ev, err := NewEvent(steps[j].actor, steps[j].p)
			if err != nil {
				t.Fatalf("%s: %v", steps[j].name, err)
			}
			evs = append(evs, ev)
		}
		if _, err := lg.AppendBatch(ctx, evs); err != nil {
			t.Fatal(err)
		}
		i = j
	}
	return exportBytes(t, lg)
}

func stepIndex(t *testing.T, steps []logStep, name string) int64 {
	t.Helper()
	i := slices.IndexFunc(steps, func(s logStep) bool { return s.name == name })
	if i < 0 {
		t.Fatalf("no step %s", name)
	}
	return int64(i)
}

func TestCompleteLogVerifies(t *testing.T) {
	steps := completeSteps()
	rep, err := VerifyExport(bytes.NewReader(writeSteps(t, steps)))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Entries != uint64(len(steps)) {
		t.Fatalf("%d entries, want %d", rep.Entries, len(steps))
	}
	at := func(name string) uint64 { return uint64(stepIndex(t, steps, name)) }
	train := []EventType{TypeRoundOpened, TypeRoundClosed, TypeModelCommitted, TypeModelEvaluated, TypeModelEvaluated, TypePrivacySpent}
	want := []RoundRecord{
		{Task: "t-train", Round: 1, Kind: "train", Closed: at("t-train/1/round.closed"), Events: train},
		{Task: "t-plain", Round: 1, Kind: "train", Closed: at("t-plain/1/round.closed"),
			Events: []EventType{TypeRoundOpened, TypeRoundClosed, TypeModelCommitted, TypeModelEvaluated}},
		{Task: "t-train", Round: 2, Kind: "evaluate", Closed: at("t-train/2/round.closed"),
			Events: []EventType{TypeRoundOpened, TypeRoundClosed, TypeModelEvaluated}},
		// Round 3 was abandoned and round 5 is open: neither is listed.
		{Task: "t-train", Round: 4, Kind: "train", Closed: at("t-train/4/round.closed"), Events: train},
	}
	if len(rep.Rounds) != len(want) {
		t.Fatalf("rounds %+v, want %+v", rep.Rounds, want)
	}
	for i := range want {
		g, w := rep.Rounds[i], want[i]
		if g.Task != w.Task || g.Round != w.Round || g.Kind != w.Kind || g.Closed != w.Closed || !slices.Equal(g.Events, w.Events) {
			t.Errorf("round %d: %+v, want %+v", i, g, w)
		}
	}
	// t-legacy's round 8 lacks its model.committed, but without
	// task.created nothing says what its rounds need.
	if !slices.Equal(rep.UncheckedTasks, []string{"t-legacy"}) {
		t.Errorf("unchecked tasks %q, want [t-legacy]", rep.UncheckedTasks)
	}
}

// Each rule, broken by one change to the complete log, fails naming the
// round's entry and the task and round.
func TestIncompleteRounds(t *testing.T) {
	coord := Service("coordinator")
	drop := func(names ...string) func([]logStep) []logStep {
		return func(s []logStep) []logStep {
			return slices.DeleteFunc(s, func(st logStep) bool { return slices.Contains(names, st.name) })
		}
	}
	dropPrefix := func(prefix string) func([]logStep) []logStep {
		return func(s []logStep) []logStep {
			return slices.DeleteFunc(s, func(st logStep) bool { return strings.HasPrefix(st.name, prefix) })
		}
	}
	// add inserts p after the step named after, in its batch.
	add := func(after string, p Payload) func([]logStep) []logStep {
		return func(s []logStep) []logStep {
			i := slices.IndexFunc(s, func(st logStep) bool { return st.name == after })
			return slices.Insert(s, i+1, logStep{"added", s[i].batch, coord, p})
		}
	}
	for _, tc := range []struct {
		name   string
		change func([]logStep) []logStep
		at     string   // step the error names
		msg    []string // in the message
	}{
		{"round.closed", drop("t-train/1/round.closed"), "t-train/1/round.opened",
			[]string{"task t-train round 1:", "model.committed", "without round.closed"}},
		{"model.committed", drop("t-train/4/model.committed"), "t-train/4/round.closed",
			[]string{"task t-train round 4:", "model.committed missing"}},
		{"server evaluation", drop("t-train/1/eval.server"), "t-train/1/round.closed",
			[]string{"task t-train round 1:", "model.evaluated (server dataset)"}},
		{"federated evaluation", drop("t-train/2/eval.federated"), "t-train/2/round.closed",
			[]string{"task t-train round 2:", "model.evaluated (federated:evaluate)"}},
		{"dp.spent", drop("t-train/4/dp.spent"), "t-train/4/round.closed",
			[]string{"task t-train round 4:", "dp.spent missing"}},
		{"two events", drop("t-train/4/dp.spent", "t-train/4/eval.server"), "t-train/4/round.closed",
			[]string{"task t-train round 4:", "model.evaluated (server dataset) and dp.spent missing"}},
		{"round.opened", drop("t-plain/1/round.opened"), "t-plain/1/round.closed",
			[]string{"task t-plain round 1:", "round.closed without round.opened"}},
		{"abandoned round's close", drop("t-train/3/round.closed"), "t-train/3/round.opened",
			[]string{"task t-train round 3:", "round 5 was opened after it", "no round.closed"}},
		{"whole round", dropPrefix("t-train/3/"), "t-train/4/round.opened",
			[]string{"task t-train round 3:", "no event of it at all", "round 4 of the task was opened"}},
		{"whole first round", dropPrefix("t-train/1/"), "t-train/2/round.opened",
			[]string{"task t-train round 1:", "no event of it at all", "round 2 of the task was opened"}},
		{"evaluation without close", add("t-train/5/round.opened", ModelEvaluated{Task: "t-train", Round: 5, Model: modelVersion(5),
			Dataset: "federated:evaluate"}), "t-train/5/round.opened",
			[]string{"task t-train round 5:", "model.evaluated without round.closed"}},
		{"abandoned with model", add("t-train/3/round.closed", ModelCommitted{Task: "t-train", Round: 3, Model: modelVersion(9),
			SHA256: modelVersion(9), Parent: modelVersion(3)}), "t-train/3/round.closed",
			[]string{"task t-train round 3:", "abandoned, yet it has", "model.committed"}},
		{"abandoned with dp.spent", add("t-train/3/round.closed", PrivacySpent{Task: "t-train", Round: 3, Mechanism: "gaussian",
			Epsilon: 0.2, CumulativeEpsilon: 0.6}), "t-train/3/round.closed",
			[]string{"task t-train round 3:", "abandoned, yet it has", "dp.spent"}},
		// The server evaluation must be on a server dataset: one on the
		// devices' training data does not stand in for it.
		{"wrong dataset", func(s []logStep) []logStep {
			s = drop("t-train/1/eval.server")(s)
			return add("t-train/1/eval.train", ModelEvaluated{Task: "t-train", Round: 1, Model: modelVersion(2), Dataset: "federated:heldout.csv"})(s)
		}, "t-train/1/round.closed", []string{"task t-train round 1:", "model.evaluated (server dataset)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := tc.change(completeSteps())
			_, err := VerifyExport(bytes.NewReader(writeSteps(t, steps)))
			ve := wantVerifyError(t, err, stepIndex(t, steps, tc.at), ErrIncomplete)
			if ve.Checkpoint != -1 || errors.Is(err, ErrTampered) || errors.Is(err, ErrExportFormat) {
				t.Errorf("checkpoint %d; tampered %v, malformed %v: every entry verifies, the record has a gap",
					ve.Checkpoint, errors.Is(err, ErrTampered), errors.Is(err, ErrExportFormat))
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("%q does not say %q", err, m)
				}
			}
		})
	}
}

// A round.opened missing in the middle of a task is named at the round's
// own close, not at the next round's opening.
func TestIncompleteMiddleRoundOpened(t *testing.T) {
	steps := slices.DeleteFunc(completeSteps(), func(s logStep) bool { return s.name == "t-train/2/round.opened" })
	_, err := VerifyExport(bytes.NewReader(writeSteps(t, steps)))
	wantVerifyError(t, err, stepIndex(t, steps, "t-train/2/round.closed"), ErrIncomplete)
	if !strings.Contains(err.Error(), "task t-train round 2: round.closed without round.opened") {
		t.Fatalf("%v does not name round 2", err)
	}
}

// Rules follow task.created: a task without DP needs no dp.spent, one
// without a server dataset no server evaluation, and a task whose
// task.created is not in the log is listed as unchecked, whatever its
// rounds lack.
func TestCompletenessFollowsTask(t *testing.T) {
	var steps []logStep
	steps = append(steps, logStep{"t-a/created", 0, Operator("alice"), TaskCreated{Task: "t-a", BaseModel: modelVersion(1), Module: hexB,
		AggregationRule: "fedavg", DP: false, Settings: map[string]string{"server_eval_dataset": ""}}})
	steps = append(steps, roundSteps("t-a", 1, "train", RoundCommitted, false, false, 10)...)
	steps = append(steps, roundSteps("t-b", 1, "train", RoundCommitted, false, false, 20)[:2]...) // opened, closed, nothing else
	steps = append(steps, roundSteps("t-c", 3, "evaluate", RoundCommitted, false, false, 30)[:2]...)
	rep, err := VerifyExport(bytes.NewReader(writeSteps(t, steps)))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rounds) != 1 || rep.Rounds[0].Task != "t-a" || !slices.Equal(rep.UncheckedTasks, []string{"t-b", "t-c"}) {
		t.Fatalf("rounds %+v, unchecked %q", rep.Rounds, rep.UncheckedTasks)
	}
	// The same rounds once task.created asks for DP: dp.spent is missing.
	steps[0].p = TaskCreated{Task: "t-a", BaseModel: modelVersion(1), Module: hexB, AggregationRule: "fedavg", DP: true}
	_, err = VerifyExport(bytes.NewReader(writeSteps(t, steps)))
	wantVerifyError(t, err, stepIndex(t, steps, "t-a/1/round.closed"), ErrIncomplete)
}

// A signed entry of a known type whose payload does not decode is named as
// a bad entry, not as a gap.
func TestCompletenessUndecodablePayload(t *testing.T) {
	lg, _, _ := openTest(t)
	ev := Event{Actor: Service("coordinator"), Type: TypeRoundOpened,
		Subject: Subject{Task: "t"}, Payload: []byte(`{"round":"x","task":"t"}`)}
	if _, err := lg.Append(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	_, err := VerifyExport(bytes.NewReader(exportBytes(t, lg)))
	wantVerifyError(t, err, 0, ErrTampered, ErrInvalidEvent)
}
