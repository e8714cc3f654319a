package edge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// BenchmarkSelection is the MNIST job's device round with one device, per
// sandbox engine: a real server, one enrolled agent with its own sandbox and
// caches (a fresh device), the example MLP module, the job's model
// (784-128-10) and the size of its device 0's data (1,184 examples), the
// default local training (1 epoch, batch 32, SGD lr 0.05). Each iteration
// is one round of a task of b.N rounds; the first includes the device's
// first selection (module download and load). Run it with -cpuprofile and
// focus on edge.(*Agent).participate for what a device spends a round on.
func BenchmarkSelection(b *testing.B) {
	code, err := embedded.Lookup("mlp")
	if err != nil {
		b.Fatal(err)
	}
	module, err := code.Code()
	if err != nil {
		b.Fatal(err)
	}
	for _, engine := range wasm.Engines() {
		b.Run("engine="+engine, func(b *testing.B) {
			h := servertest.New(b)
			init, err := train.InitMLP([]int{784, 128, 10}, 1)
			if err != nil {
				b.Fatal(err)
			}
			version := h.ImportModel(b, "mnist-mlp", init)
			sha := h.RegisterModule(b, "mlp", module)
			dir := filepath.Join(b.TempDir(), "edge")
			tok, err := h.Devices.CreateEnrollmentToken(context.Background(), &pb.CreateEnrollmentTokenRequest{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := edge.Enroll(context.Background(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(),
				Token: tok.GetToken(), DataDir: dir, DeviceID: "dev-000"}); err != nil {
				b.Fatal(err)
			}
			a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: dir, DeviceID: "dev-000", WASMEngine: engine},
				edge.WithDataset(datatest.Synthetic(1184, 784, 10, 1)))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { a.Run(ctx) })
			b.Cleanup(func() { cancel(); wg.Wait() })
			hyper, _ := json.Marshal(sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.05, EvalBatchSize: 512})
			rounds := b.N
			start := cpuTime()
			b.ResetTimer()
			task := h.CreateTask(b, &pb.Task{Name: fmt.Sprintf("sel-%s", engine), Model: &pb.ModelRef{Version: version},
				Module: &pb.ModuleRef{Sha256: sha}, Hyperparameters: hyper, CohortTarget: 1, ReportGoal: 1,
				RoundsTotal: uint32(rounds), SelectionTimeout: durationpb.New(time.Minute), ReportTimeout: durationpb.New(5 * time.Minute)})
			done := h.WaitTask(b, task.Id, time.Duration(rounds)*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
			b.StopTimer()
			if done.State != pb.TaskState_TASK_STATE_COMPLETED {
				b.Fatalf("task %v: %s", done.State, done.StateReason)
			}
			b.ReportMetric((cpuTime()-start).Seconds()/float64(rounds), "cpu-s/round")
		})
	}
}
