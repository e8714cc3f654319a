package demo

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/worker"
)

// The demo's pool: two workers with room for one rank each, so the
// pretraining job is a gang of two ranks on two workers that average their
// parameters through the server.
const (
	poolWorkers    = 2
	poolRankCPU    = 1000 // millicores per rank
	poolRankMemory = 768 << 20
	// A rank loads the embedded MNIST whole (about 220 MB decoded) before
	// it slices its shard; it peaks near 520 MB.
	poolWorkerMemory = 1 << 30
	// RankCommandName is the hidden command of the fleetlearn binary that
	// runs one built-in trainer rank for the demo's embedded workers
	// (worker.RunRank).
	RankCommandName = "pool-rank"
)

// pretrainJob is the demo's pretraining as a pool job: the MLP on the
// public slice, split over the ranks, for pretrainEpochs epochs of the
// slice, with a checkpoint every two epochs and an average every sixth of
// an epoch.
func pretrainJob(cfg Config) *pb.PoolJobSpec {
	perRank := cfg.BaseExamples / poolWorkers
	stepsPerEpoch := max(1, perRank/pretrainBatch)
	sync := max(1, stepsPerEpoch/6)
	interval := max(sync, (2*stepsPerEpoch/sync)*sync)
	return &pb.PoolJobSpec{
		Id: "pretrain-mnist", Tenant: "default", Ranks: poolWorkers,
		PerRank:     &pb.PoolResources{MilliCpu: poolRankCPU, MemoryBytes: poolRankMemory},
		MaxRestarts: 3, CheckpointInterval: int64(interval), TotalSteps: int64(pretrainEpochs * stepsPerEpoch),
		OutputModel: "mnist-mlp",
		Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{
			Arch: []uint32{784, 128, 10}, InitSeed: cfg.Seed, Seed: cfg.Seed, BatchSize: pretrainBatch,
			LearningRate: pretrainLR, SyncEvery: int64(sync),
			Dataset: &pb.PoolDataset{Source: "mnist-train", First: 0, Count: int64(cfg.BaseExamples)},
		}},
	}
}

// Pretraining hyperparameters, as the demo used before the pool ran them.
const (
	pretrainBatch = 32
	pretrainLR    = 0.05
)

// startPool starts the demo's workers, in this process, each running its
// ranks as child processes of rankCommand. They stop when ctx ends; wait
// returns once they have.
func startPool(ctx context.Context, srv *server.Server, dataDir, dataRoot string, rankCommand []string, log *slog.Logger) (wait func(), err error) {
	var wg sync.WaitGroup
	for i := range poolWorkers {
		tok, err := srv.MintToken(fmt.Sprintf("demo-worker-%d", i), []identity.Role{identity.RolePoolWorker}, time.Hour)
		if err != nil {
			return nil, err
		}
		a, err := worker.New(worker.Config{
			Server: srv.GRPCAddr(), CAPEM: srv.CACertPEM(), Token: tok, Name: fmt.Sprintf("demo-worker-%d", i),
			Capacity: worker.Capacity{MilliCPU: poolRankCPU, MemoryBytes: poolWorkerMemory},
			WorkDir:  filepath.Join(dataDir, "workers", fmt.Sprint(i)), RankCommand: rankCommand, DataRoot: dataRoot,
			Logger: log.With("component", "worker", "worker", i),
		})
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				log.Error("pool worker stopped", "worker", i, "err", err)
			}
		}()
	}
	return wg.Wait, nil
}

// RankMain runs the hidden rank command with the arguments after its name
// ("--lease FILE") and returns the exit status the worker reads
// (worker.RankExitCode). Its caller handles signals: ctx ends on SIGTERM.
func RankMain(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet(RankCommandName, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	lease := fs.String("lease", "", "")
	if err := fs.Parse(args); err != nil || *lease == "" || fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: run by the demo's pool workers, with --lease FILE\n", RankCommandName)
		return worker.RankExitFailed
	}
	return worker.RankExitCode(worker.RunRank(ctx, *lease))
}

// defaultRankCommand is this executable's hidden rank command: the demo
// runs inside the fleetlearn binary, which has it.
func defaultRankCommand() ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("pool workers: locate this program for their ranks: %w", err)
	}
	return []string{exe, RankCommandName}, nil
}

// pretrainOnPool submits the pretraining job, with then the fine-tuning
// task to create from its model, and follows it to the end. It returns the
// job as it ended and the base model.
func pretrainOnPool(ctx context.Context, conn *grpc.ClientConn, spec *pb.PoolJobSpec, what string, pr *progress, then *pb.Task) (*pb.PoolJob, *model.Model, error) {
	pool := apiv1.NewPoolServiceClient(conn)
	if _, err := pool.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: spec, ThenTask: then}); err != nil {
		return nil, nil, fmt.Errorf("submit the pretraining job: %w", err)
	}
	checkpoints := int((spec.GetTotalSteps() + spec.GetCheckpointInterval() - 1) / spec.GetCheckpointInterval())
	ph := pr.start("pretraining", checkpoints, fmt.Sprintf(
		"pretraining the base model on the pool: job %s, %d ranks on %d workers, %s, %d steps",
		spec.GetId(), spec.GetRanks(), poolWorkers, what, spec.GetTotalSteps()))
	stream, err := pool.WatchJob(ctx, &pb.WatchJobRequest{JobId: spec.GetId()})
	if err != nil {
		return nil, nil, fmt.Errorf("watch the pretraining job: %w", err)
	}
	var job *pb.PoolJob
	var committed int64
	started := false
	for {
		res, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("watch the pretraining job: %w", err)
		}
		job = res.GetJob()
		if !started && job.GetState() == pb.PoolJobState_POOL_JOB_STATE_RUNNING {
			started = true
			pr.printf("  job %s placed: %s", job.GetSpec().GetId(), placement(job))
		}
		for committed < job.GetCommittedStep() {
			committed = min(committed+spec.GetCheckpointInterval(), job.GetCommittedStep())
			ph.step(fmt.Sprintf("step %d", committed))
			if !pr.terminal {
				pr.printf("  checkpoint at step %d/%d", committed, spec.GetTotalSteps())
			}
		}
	}
	if job.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
		return nil, nil, fmt.Errorf("pretraining job %s %s: %s", spec.GetId(), jobState(job), job.GetStateReason())
	}
	_, raw, err := client.ExportModelBytes(ctx, apiv1.NewModelServiceClient(conn), job.GetOutputVersion(), 0)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch the pretrained model: %w", err)
	}
	base, err := model.ReadSafetensors(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("pretrained model %s: %w", job.GetOutputVersion(), err)
	}
	pr.end()
	u := job.GetUsage()
	pr.printf("pool job %s succeeded: model %s, %.1f CPU-seconds metered (%s), peak memory %.0f MiB",
		spec.GetId(), job.GetOutputVersion()[:12], u.GetCpuSeconds(), u.GetMeter(), float64(u.GetPeakMemoryBytes())/(1<<20))
	return job, base, nil
}

func placement(j *pb.PoolJob) string {
	s := ""
	for i, a := range j.GetPlacement() {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("ranks %d-%d on %s", a.GetFirstRank(), a.GetFirstRank()+a.GetRanks()-1, a.GetWorker())
	}
	return s
}

func jobState(j *pb.PoolJob) string {
	switch j.GetState() {
	case pb.PoolJobState_POOL_JOB_STATE_FAILED:
		return "failed"
	case pb.PoolJobState_POOL_JOB_STATE_CANCELLED:
		return "was cancelled"
	}
	return "ended " + j.GetState().String()
}
