package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// One pool-worker token registers workers on the real server until its
// cap (here 3, set as --pool-max-workers-per-token sets it), then is
// refused with ResourceExhausted saying what to do; a job then runs to
// its model through another token's worker.
func TestPoolWorkersPerTokenCapped(t *testing.T) {
	h := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.PoolMaxWorkersPerToken = 3 }))
	wk := apiv1.NewPoolWorkerServiceClient(h.DialAs(t, "one-token", identity.RolePoolWorker))
	reg := func() error {
		_, err := wk.RegisterWorker(t.Context(), &pb.RegisterWorkerRequest{Name: "fake",
			Capacity: &pb.PoolResources{MilliCpu: 1, MemoryBytes: 1 << 20}})
		return err
	}
	for i := range 3 {
		if err := reg(); err != nil {
			t.Fatalf("registration %d: %v", i+1, err)
		}
	}
	err := reg()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "holds 3 live workers") ||
		!strings.Contains(err.Error(), "its own token") {
		t.Fatalf("fourth registration with one token: %v, want ResourceExhausted naming the cap and the fix", err)
	}

	m, err := model.New(model.Tensor{Name: "dense/w", Shape: []int{2}, Data: []float32{0.5, -0.25}})
	if err != nil {
		t.Fatal(err)
	}
	spec := &pb.PoolJobSpec{Id: "honest", Ranks: 1, PerRank: &pb.PoolResources{MilliCpu: 1000, MemoryBytes: 1 << 30},
		CheckpointInterval: 10, TotalSteps: 10, OutputModel: "honest-base",
		Program: &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"python3", "train.py"}}}}
	if _, job := h.RunPoolJob(t, spec, m, &pb.PoolUsage{CpuSeconds: 1}); job.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
		t.Fatalf("honest job %v: %s", job.GetState(), job.GetStateReason())
	}
}
