package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// A pool job run through the real server ends as a model version with its
// lineage, and both pool services sit behind the role policy.
func TestPoolJobBecomesModelVersion(t *testing.T) {
	h := servertest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wconn := h.DialAs(t, "pool-host-1", identity.RolePoolWorker)

	if _, err := apiv1.NewPoolServiceClient(wconn).ListWorkers(ctx, &pb.ListWorkersRequest{}); err == nil {
		t.Fatal("a pool-worker token listed workers")
	}
	m, err := model.New(model.Tensor{Name: "dense/w", Shape: []int{2}, Data: []float32{0.5, -0.25}})
	if err != nil {
		t.Fatal(err)
	}
	spec := &pb.PoolJobSpec{Id: "pretrain-1", Ranks: 1, PerRank: &pb.PoolResources{MilliCpu: 1000, MemoryBytes: 1 << 30},
		CheckpointInterval: 10, TotalSteps: 10, OutputModel: "mnist-base",
		Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: []uint32{2, 1}, BatchSize: 4, LearningRate: 0.1,
			Dataset: &pb.PoolDataset{Source: "mnist-train"}}}}
	id, job := h.RunPoolJob(t, spec, m, &pb.PoolUsage{CpuSeconds: 3})
	if job.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || job.GetOutputVersion() == "" {
		t.Fatalf("job %v", job)
	}
	got, err := h.Models.GetModel(ctx, &pb.GetModelRequest{Version: job.GetOutputVersion()})
	if err != nil {
		t.Fatal(err)
	}
	mv := got.GetModel()
	if mv.GetSource() != pb.ModelSource_MODEL_SOURCE_POOL || mv.GetName() != "mnist-base" || mv.GetLineage().GetJobId() != "pretrain-1" ||
		mv.GetLineage().GetCheckpoint() != id.String() || mv.GetLineage().GetSteps() != 10 || mv.GetLineage().GetUsage().GetCpuSeconds() != 3 ||
		mv.GetParameterCount() != 2 {
		t.Fatalf("model %v", mv)
	}
}
