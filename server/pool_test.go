package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
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
	jobs := apiv1.NewPoolServiceClient(h.Conn)
	wconn := h.DialAs(t, "pool-host-1", identity.RolePoolWorker)
	wk := apiv1.NewPoolWorkerServiceClient(wconn)

	if _, err := apiv1.NewPoolServiceClient(wconn).ListWorkers(ctx, &pb.ListWorkersRequest{}); err == nil {
		t.Fatal("a pool-worker token listed workers")
	}
	reg, err := wk.RegisterWorker(ctx, &pb.RegisterWorkerRequest{Name: "host-1",
		Capacity: &pb.PoolResources{MilliCpu: 4000, MemoryBytes: 8 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	spec := &pb.PoolJobSpec{Id: "pretrain-1", Ranks: 1, PerRank: &pb.PoolResources{MilliCpu: 1000, MemoryBytes: 1 << 30},
		CheckpointInterval: 10, TotalSteps: 10, OutputModel: "mnist-base",
		Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: []uint32{2, 1}, BatchSize: 4, LearningRate: 0.1,
			Dataset: &pb.PoolDataset{Source: "mnist-train"}}}}
	if _, err := jobs.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	hb, err := wk.Heartbeat(ctx, &pb.HeartbeatRequest{WorkerId: reg.GetWorkerId()})
	if err != nil || len(hb.GetStart()) != 1 {
		t.Fatalf("heartbeat %v %v", hb, err)
	}
	l := hb.GetStart()[0]
	ref := &pb.RankRef{WorkerId: reg.GetWorkerId(), JobId: l.GetJobId(), Attempt: l.GetAttempt(), Rank: l.GetRank()}

	local, err := checkpoint.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(model.Tensor{Name: "dense/w", Shape: []int{2}, Data: []float32{0.5, -0.25}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := checkpoint.Write(local, &checkpoint.Checkpoint{Job: "pretrain-1", Step: 10, Params: m}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	man, err := local.Manifest(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range man.Blobs() {
		b, _ := local.GetBlob(c.Digest)
		if _, err := wk.PutCheckpointBlob(ctx, &pb.PutCheckpointBlobRequest{Ref: ref, Digest: c.Digest.String(), Data: b}); err != nil {
			t.Fatal(err)
		}
	}
	enc, _, _ := man.Encode()
	if _, err := wk.CommitCheckpoint(ctx, &pb.CommitCheckpointRequest{Ref: ref, Manifest: enc}); err != nil {
		t.Fatal(err)
	}
	if _, err := wk.RankExited(ctx, &pb.RankExitedRequest{WorkerId: ref.WorkerId, JobId: ref.JobId, Attempt: ref.Attempt,
		Completed: true, Usage: &pb.PoolUsage{CpuSeconds: 3}}); err != nil {
		t.Fatal(err)
	}
	j, err := jobs.GetJob(ctx, &pb.GetJobRequest{JobId: "pretrain-1"})
	if err != nil {
		t.Fatal(err)
	}
	if j.GetJob().GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || j.GetJob().GetOutputVersion() == "" {
		t.Fatalf("job %v", j.GetJob())
	}
	got, err := h.Models.GetModel(ctx, &pb.GetModelRequest{Version: j.GetJob().GetOutputVersion()})
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
