package server_test

import (
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestAuditRoundEvents: a task's whole life lands in the audit log in order
// — creation with its design choices, every round's opening and close, each
// committed model version with its parent, the devices' metrics, the end of
// the task — and an export of the log verifies offline.
func TestAuditRoundEvents(t *testing.T) {
	h := servertest.New(t)
	ctx := t.Context()
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "audited", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	startFleet(t, h, 4, func(i int) *data.Dataset { return datatest.Synthetic(100, 8, 3, uint64(i+1)) })
	task := h.CreateTask(t, baseTask("audited", version, module, 2))
	done := h.WaitTask(t, task.Id, 3*time.Minute, // a hang guard: -race on a loaded machine is slow
		pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	committed := map[uint64]*pb.RoundSummary{}
	for _, r := range h.Rounds(t, task.Id) {
		if r.State == pb.RoundState_ROUND_STATE_COMMITTED {
			committed[r.Round] = r
		}
	}

	c := apiv1.NewAuditServiceClient(h.Conn)
	keys, err := c.GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil {
		t.Fatal(err)
	}
	// The task's end is recorded just after its state changes; wait for it.
	var res *pb.QueryEntriesResponse
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		res, err = c.QueryEntries(ctx, &pb.QueryEntriesRequest{Filter: &pb.AuditFilter{TaskId: task.Id,
			EventType: string(audit.TypeTaskStopped)}})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.GetEntries()) > 0 || time.Now().After(end) {
			break
		}
	}
	res, err = c.QueryEntries(ctx, &pb.QueryEntriesRequest{Filter: &pb.AuditFilter{TaskId: task.Id}, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var types []audit.EventType
	opened := map[uint64]bool{}
	parent := version
	for _, pe := range res.GetEntries() {
		ev, err := audit.VerifyEntry(audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}, entryKey)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
		switch p := p.(type) {
		case audit.TaskCreated:
			if p.BaseModel != version || p.Module != module || p.Rounds != 2 || p.CohortTarget != 3 ||
				p.AggregationRule != "AGGREGATION_RULE_FEDAVG" || p.Settings["hyperparameters"] == "" {
				t.Errorf("task created: %+v", p)
			}
		case audit.RoundOpened:
			opened[p.Round] = true
			if p.CohortSize != 5 || p.Module != module || p.Eligibility == "" {
				t.Errorf("round opened: %+v", p)
			}
		case audit.RoundClosed:
			if !opened[p.Round] {
				t.Errorf("round %d closed before it opened", p.Round)
			}
			if r := committed[p.Round]; r != nil && (p.Outcome != audit.RoundCommitted || p.Reports != uint64(r.Reported)) {
				t.Errorf("round closed %+v, round summary reported %d", p, r.Reported)
			}
		case audit.ModelCommitted:
			r := committed[p.Round]
			if r == nil || p.Model != r.Model.GetVersion() || p.Parent != parent {
				t.Errorf("model committed %+v, parent want %s", p, parent)
			}
			parent = p.Model
		case audit.ModelEvaluated:
			if _, ok := p.Metrics["train_loss"]; !ok || p.Samples == 0 {
				t.Errorf("model evaluated %+v", p)
			}
		case audit.TaskStopped:
			if p.State != audit.TaskCompleted || p.Rounds != 2 {
				t.Errorf("task stopped %+v", p)
			}
		}
	}
	count := map[audit.EventType]int{}
	for _, ty := range types {
		count[ty]++
	}
	if types[0] != audit.TypeTaskCreated || types[len(types)-1] != audit.TypeTaskStopped ||
		count[audit.TypeModelCommitted] != 2 || count[audit.TypeRoundOpened] != count[audit.TypeRoundClosed] ||
		count[audit.TypeModelEvaluated] != 2 || count[audit.TypeOperatorAction] != 1 {
		t.Fatalf("event sequence %v", types)
	}
	if parent != done.CurrentModel.GetVersion() {
		t.Fatalf("last committed model in the log %s, task has %s", parent, done.CurrentModel.GetVersion())
	}
	for _, typ := range []audit.EventType{audit.TypeModelImported, audit.TypeModuleRegistered} {
		res, err := c.QueryEntries(ctx, &pb.QueryEntriesRequest{Filter: &pb.AuditFilter{EventType: string(typ)}})
		if err != nil || len(res.GetEntries()) != 1 {
			t.Fatalf("%s: %d entries, %v", typ, len(res.GetEntries()), err)
		}
	}

	rep := verifiedExport(t, h)
	t.Logf("export verified: %d entries, %d rounds", rep.Entries, len(rep.Rounds))
}
