package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
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
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

var (
	sbOnce sync.Once
	sb     *wasm.Sandbox
)

func sharedSandbox(t testing.TB) *wasm.Sandbox {
	sbOnce.Do(func() {
		s, err := wasm.New()
		if err != nil {
			t.Fatal(err)
		}
		sb = s
	})
	return sb
}

type fleet struct {
	agents []*edge.Agent
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startFleet starts n enrolled agents dev-000... on the harness's server.
func startFleet(t testing.TB, h *servertest.Harness, n int, mk func(i int) *data.Dataset, opts ...edge.Option) *fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleet{cancel: cancel}
	for i := range n {
		id := fmt.Sprintf("dev-%03d", i)
		a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, id), DeviceID: id},
			append([]edge.Option{edge.WithDataset(mk(i)), edge.WithSandbox(sharedSandbox(t))}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		f.agents = append(f.agents, a)
		f.wg.Add(1)
		go func() { defer f.wg.Done(); a.Run(ctx) }()
	}
	t.Cleanup(f.stop)
	return f
}

func (f *fleet) stop() { f.cancel(); f.wg.Wait() }

func baseTask(name, modelVersion, module string, rounds uint32) *pb.Task {
	hyper, _ := json.Marshal(sgd.Hyper{Epochs: 1, BatchSize: 16, LearningRate: 0.5, EvalBatchSize: 256})
	return &pb.Task{Name: name, Model: &pb.ModelRef{Version: modelVersion}, Module: &pb.ModuleRef{Sha256: module},
		Hyperparameters: hyper, CohortTarget: 3, OverSelection: 0.34, ReportGoal: 2, RoundsTotal: rounds,
		SelectionTimeout: durationpb.New(5 * time.Second), ReportTimeout: durationpb.New(20 * time.Second)}
}

// TestRoundsEndToEnd: a server, five edge agents over NATS, a task created
// through the API; three training rounds commit, each a loadable model version
// whose parent is the previous one, and the model improves.
func TestRoundsEndToEnd(t *testing.T) {
	h := servertest.New(t)
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "synthetic", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	startFleet(t, h, 5, func(i int) *data.Dataset { return datatest.Synthetic(200, 8, 3, uint64(i+1)) })
	task := h.CreateTask(t, baseTask("e2e", version, module, 3))
	done := h.WaitTask(t, task.Id, 60*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	rounds := h.Rounds(t, task.Id)
	parent := version
	committed := 0
	for _, r := range rounds {
		t.Logf("round %d %v %v assigned %d reported %d metrics %v %s", r.Round, r.Kind, r.State, r.Assigned, r.Reported, r.Metrics.GetValues(), r.Reason)
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
			continue
		}
		committed++
		if r.Model.GetParentVersion() != parent {
			t.Fatalf("round %d parent %q, want %q", r.Round, r.Model.GetParentVersion(), parent)
		}
		parent = r.Model.GetVersion()
		st, err := h.Models.ExportModel(context.Background(), &pb.ExportModelRequest{Version: parent})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("export %s: %v", parent, err)
		}
		if r.Reported < 2 {
			t.Fatalf("round %d committed with %d reports", r.Round, r.Reported)
		}
	}
	if committed != 3 {
		t.Fatalf("%d rounds committed, want 3", committed)
	}
	if done.CurrentModel.GetVersion() != parent {
		t.Fatalf("task model %s, last committed %s", done.CurrentModel.GetVersion(), parent)
	}
	first, last := rounds[0].Metrics.GetValues()["train_loss"], rounds[len(rounds)-1].Metrics.GetValues()["train_loss"]
	if !(last < first) {
		t.Fatalf("train loss did not fall: %v -> %v", first, last)
	}
}
