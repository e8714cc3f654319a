package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetlearn/fleetlearn/model/kernel"

	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/remote"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

// Exit statuses of a rank process (RankExitCode): the agent reads a rank's
// outcome from them.
const (
	RankExitCompleted = 0
	RankExitFailed    = 1
	RankExitStopped   = 3
)

// RankExitCode is the exit status for RunRank's result.
func RankExitCode(err error) int {
	switch {
	case err == nil:
		return RankExitCompleted
	case errors.Is(err, ErrRankStopped):
		return RankExitStopped
	}
	return RankExitFailed
}

// StopAtCheckpointSignal asks a rank to stop right after its next
// checkpoint; SIGTERM (a cancelled context in RunRank) stops it at once.
const StopAtCheckpointSignal = syscall.SIGUSR1

// Report lines: a rank writes these on standard output for its agent, which
// reads them instead of forwarding them to the job's log. Everything else
// the rank writes is log output.
const (
	reportPrefix   = "fleetlearn-rank "
	reportProgress = "progress" // progress STEP LOSS
	reportData     = "data"     // data SHA256
	reportError    = "error"    // error MESSAGE
)

// maxInitModelBytes bounds the model a job starts from.
const maxInitModelBytes = 1 << 30

// RunRank is a built-in trainer rank's main: the hidden command the agent
// runs as a child process ("fleetlearn-worker rank --lease FILE"). It reads
// and removes the lease file, trains the rank against the server's
// checkpoint store and parameter averaging, and returns nil when the job's
// every step is done, an error wrapping ErrRankStopped when it stopped as
// asked, or the failure. The caller exits with RankExitCode(err).
//
// StopAtCheckpointSignal (SIGUSR1) stops it after its next checkpoint; it
// installs the handler itself, first of all. Cancelling ctx (the caller's
// SIGTERM) stops it at once. Progress goes to standard output as report
// lines for the agent, logs to standard error.
func RunRank(ctx context.Context, leaseFile string) error {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, StopAtCheckpointSignal)
	defer signal.Stop(usr1)
	err := runRank(ctx, leaseFile, usr1, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, ErrRankStopped) {
		report(os.Stdout, reportError, oneLine(err.Error()))
	}
	return err
}

var reportMu sync.Mutex

func report(w io.Writer, kind, text string) {
	reportMu.Lock()
	defer reportMu.Unlock()
	fmt.Fprintf(w, "%s%s %s\n", reportPrefix, kind, text)
}

// stopRequests records a StopAtCheckpointSignal, saying on stderr that the
// rank stops after when.
func stopRequests(ctx context.Context, usr1 <-chan os.Signal, stderr io.Writer, when string) *atomic.Bool {
	var asked atomic.Bool
	go func() {
		select {
		case <-usr1:
			asked.Store(true)
			fmt.Fprintln(stderr, "stop requested: stopping after "+when)
		case <-ctx.Done():
		}
	}()
	return &asked
}

// reportStep tells the agent a step is done and its loss.
func reportStep(w io.Writer, step int64, met train.Metrics) {
	report(w, reportProgress, strconv.FormatInt(step, 10)+" "+strconv.FormatFloat(met.Loss, 'g', -1, 64))
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > maxLineBytes-64 {
		s = strings.ToValidUTF8(s[:maxLineBytes-64], "")
	}
	return s
}

func runRank(ctx context.Context, path string, usr1 <-chan os.Signal, stdout, stderr io.Writer) error {
	lf, l, err := readLeaseFile(path)
	if err != nil {
		return err
	}
	b := l.GetSpec().GetBuiltin()
	if b == nil {
		return fmt.Errorf("worker: rank: %w: not a built-in trainer job", ErrLease)
	}
	// The trainer's kernels use no more threads than the CPUs the rank was
	// leased; results do not depend on the count.
	if mc := l.GetSpec().GetPerRank().GetMilliCpu(); mc > 0 {
		kernel.SetThreads(int((mc + 999) / 1000))
	}
	opts := []client.DialOption{client.WithToken(lf.Token)}
	switch {
	case lf.Insecure:
		opts = append(opts, client.WithInsecure())
	case len(lf.CAPEM) > 0:
		opts = append(opts, client.WithCA(lf.CAPEM))
	}
	conn, err := client.Dial(lf.Server, opts...)
	if err != nil {
		return fmt.Errorf("worker: rank: %w", err)
	}
	defer conn.Close()
	if l.GetSpec().GetDiloco() != nil {
		return runIsland(ctx, lf, l, conn, usr1, stdout, stderr)
	}

	cfg, digest, err := trainerConfig(l, lf.DataRoot)
	if err != nil {
		return err
	}
	report(stdout, reportData, digest)
	if v := b.GetInitModel(); v != "" {
		if cfg.Init, err = initModel(ctx, conn, v); err != nil {
			return err
		}
		cfg.Arch = nil
	}

	ref := &pb.RankRef{WorkerId: lf.WorkerID, JobId: l.GetJobId(), Attempt: l.GetAttempt(), Rank: l.GetRank()}
	pw := apiv1.NewPoolWorkerServiceClient(conn)
	// The store lives on the caller's context, not the training one: a
	// stop at a checkpoint ends training while the checkpoint commits.
	store, err := remote.NewStore(ctx, pw, ref, remote.DefaultRetry())
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if err != nil {
		return fmt.Errorf("worker: rank: %w", err)
	}
	cfg.Store = store
	if cfg.WorldSize > 1 {
		if cfg.Sync, err = remote.NewSyncer(pw, ref, remote.DefaultRetry()); err != nil {
			return fmt.Errorf("worker: rank: %w", err)
		}
	}
	stopAsked := stopRequests(ctx, usr1, stderr, "the next checkpoint")
	errStopCheckpoint := fmt.Errorf("%w: at a checkpoint, as the agent asked", ErrRankStopped)
	errStopServer := fmt.Errorf("%w: the server asked at a checkpoint", ErrRankStopped)
	cfg.AfterStep = func(step int64, met train.Metrics, _ *model.Model) {
		reportStep(stdout, step, met)
		ckptStep := step%cfg.CheckpointEvery == 0 || step == cfg.TotalSteps
		switch {
		case store.StopRequested():
			// The commit answered after the Saver returned: Run waits
			// for it to settle and stops before the next step.
			cancel(errStopServer)
		case ckptStep && stopAsked.Load() && step < cfg.TotalSteps:
			cancel(errStopCheckpoint)
		}
	}
	from := "from the start"
	if l.GetResumeStep() > 0 {
		from = fmt.Sprintf("resuming from the checkpoint at step %d", l.GetResumeStep())
	}
	kind := "MLP, SGD"
	if cfg.Init != nil && train.IsLM(cfg.Init) {
		kind = "language model, AdamW"
	}
	fmt.Fprintf(stderr, "rank %d of %d: job %s attempt %d, %s, %d examples, steps %d, checkpoint every %d, %s\n",
		cfg.Rank, cfg.WorldSize, cfg.Job, l.GetAttempt(), kind, cfg.Data.Len(), cfg.TotalSteps, cfg.CheckpointEvery, from)
	res, err := trainer.Run(ctx, cfg)
	logSaves(stderr, res.Saves)
	if err == nil {
		fmt.Fprintf(stderr, "completed step %d (resumed from checkpoint %s), checkpoint %s, model %s\n", res.Step, orNone(res.ResumedFrom), res.Checkpoint, res.Digest)
		if store.StopRequested() && res.Step < cfg.TotalSteps {
			return errStopServer
		}
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrRankStopped) {
		fmt.Fprintf(stderr, "stopped at step %d, checkpoint %s\n", res.Step, res.Checkpoint)
		return cause
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		fmt.Fprintf(stderr, "stopped at step %d, checkpoint %s\n", res.Step, res.Checkpoint)
		return fmt.Errorf("%w: at once (step %d): %w", ErrRankStopped, res.Step, err)
	}
	return fmt.Errorf("worker: rank: %w", err)
}

// logSaves says what checkpointing cost the rank's training loop; the
// server has each checkpoint's figure (pool get's checkpoint stall).
func logSaves(w io.Writer, st checkpoint.SaverStats) {
	if st.Saves == 0 {
		return
	}
	fmt.Fprintf(w, "checkpoints: %d taken, training blocked %v in all, %v at most; %d waited for an earlier upload\n",
		st.Saves, st.Stall.Round(time.Microsecond), st.MaxStall.Round(time.Microsecond), st.Waits)
}

// initModel fetches and decodes the registered model version v.
func initModel(ctx context.Context, conn *grpc.ClientConn, v string) (*model.Model, error) {
	_, raw, err := client.ExportModelBytes(ctx, apiv1.NewModelServiceClient(conn), v, maxInitModelBytes)
	if err != nil {
		return nil, fmt.Errorf("worker: rank: initial model %s: %w", v, err)
	}
	m, err := model.DecodeSafetensors(raw)
	if err != nil {
		return nil, fmt.Errorf("worker: rank: initial model %s: %w", v, err)
	}
	return m, nil
}

// trainerConfig is the trainer's configuration for lease, with the rank's
// data loaded from dataRoot; digest is the shard's data digest.
func trainerConfig(l *pb.RankLease, dataRoot string) (trainer.Config, string, error) {
	spec := l.GetSpec()
	b := spec.GetBuiltin()
	world, rank := int(l.GetWorldSize()), int(l.GetRank())
	if world < 1 || rank >= world || world > 1024 {
		return trainer.Config{}, "", fmt.Errorf("worker: rank: %w: rank %d of %d", ErrLease, rank, world)
	}
	arch, err := builtinArch(b)
	if err != nil {
		return trainer.Config{}, "", err
	}
	all, err := loadDataset(b.GetDataset(), dataRoot)
	if err != nil {
		return trainer.Config{}, "", err
	}
	shard, err := trainer.Shard(all, rank, world)
	if err != nil {
		return trainer.Config{}, "", fmt.Errorf("worker: rank: %w", err)
	}
	cfg := trainer.Config{
		Job:             l.GetJobId(),
		Arch:            arch,
		InitSeed:        b.GetInitSeed(),
		Data:            shard,
		Hyper:           sgd.Hyper{Epochs: 1, BatchSize: int(b.GetBatchSize()), LearningRate: float32(b.GetLearningRate()), EvalBatchSize: sgd.Defaults.EvalBatchSize},
		LMHyper:         lmHyper(b),
		Seed:            b.GetSeed(),
		TotalSteps:      spec.GetTotalSteps(),
		CheckpointEvery: spec.GetCheckpointInterval(),
		Rank:            rank,
		WorldSize:       world,
		SyncEvery:       b.GetSyncEvery(),
	}
	cfg.SaverOptions.ChunkSize = remote.MaxBlobBytes
	if world == 1 {
		cfg.SyncEvery = 0
	}
	return cfg, shard.Digest(), nil
}

// lmHyper is AdamW's settings for a job whose initial model is a language
// model: the job's batch size and learning rate, lm.Defaults for the rest
// (warmup, betas, weight decay, clipping, heads). The trainer validates
// them when the model turns out to be one.
func lmHyper(b *pb.PoolBuiltinTrainer) lm.Hyper {
	h := lm.Defaults
	h.BatchSize, h.LearningRate = int(b.GetBatchSize()), float32(b.GetLearningRate())
	return h
}

// builtinArch checks b's layer widths and batch size and returns the
// widths.
func builtinArch(b *pb.PoolBuiltinTrainer) ([]int, error) {
	arch := make([]int, len(b.GetArch()))
	for i, w := range b.GetArch() {
		if w == 0 || w > 1<<16 {
			return nil, fmt.Errorf("worker: rank: %w: layer width %d", ErrLease, w)
		}
		arch[i] = int(w)
	}
	if b.GetBatchSize() == 0 || b.GetBatchSize() > 1<<16 {
		return nil, fmt.Errorf("worker: rank: %w: batch size %d", ErrLease, b.GetBatchSize())
	}
	return arch, nil
}

// loadDataset reads the slice of the source ds names and checks its digest.
func loadDataset(ds *pb.PoolDataset, dataRoot string) (*data.Dataset, error) {
	src := ds.GetSource()
	var d *data.Dataset
	switch {
	case src == "mnist-train" || src == "mnist-test":
		dir, err := data.MNISTDir()
		if err != nil {
			return nil, fmt.Errorf("worker: rank: dataset %s: %w", src, err)
		}
		tr, te, err := data.LoadMNIST(dir)
		if err != nil {
			return nil, fmt.Errorf("worker: rank: dataset %s: %w", src, err)
		}
		d = tr
		if src == "mnist-test" {
			d = te
		}
	case strings.HasPrefix(src, "dir:"):
		name := strings.TrimPrefix(src, "dir:")
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.ContainsRune(name, 0) || len(name) > 255 {
			return nil, fmt.Errorf("worker: rank: %w: dataset %q: want dir:NAME, NAME a plain directory name under the worker's --data-root", ErrLease, src)
		}
		if dataRoot == "" {
			return nil, fmt.Errorf("worker: rank: %w: dataset %q needs a data root: start the worker with --data-root DIR holding %s", ErrLease, src, name)
		}
		var err error
		if d, err = data.ReadDir(filepath.Join(dataRoot, name)); err != nil {
			return nil, fmt.Errorf("worker: rank: dataset %s: %w", src, err)
		}
	default:
		return nil, fmt.Errorf("worker: rank: %w: dataset source %.100q: want mnist-train, mnist-test or dir:NAME", ErrLease, src)
	}
	return sliceDataset(d, ds)
}

// sliceDataset takes ds's slice of d and checks its digest.
func sliceDataset(d *data.Dataset, ds *pb.PoolDataset) (*data.Dataset, error) {
	src := ds.GetSource()
	first, count := ds.GetFirst(), ds.GetCount()
	n := int64(d.Len())
	if count == 0 {
		count = n - first
	}
	if first < 0 || count < 1 || first > n || count > n-first {
		return nil, fmt.Errorf("worker: rank: %w: slice [%d, %d+%d) of %s, which has %d examples", ErrData, first, first, ds.GetCount(), src, n)
	}
	if first != 0 || count != n {
		idx := make([]int, count)
		for i := range idx {
			idx[i] = int(first) + i
		}
		d = d.Subset(idx)
	}
	if want := ds.GetSha256(); want != "" {
		if got := d.Digest(); !strings.EqualFold(got, want) {
			return nil, fmt.Errorf("worker: rank: %w: %s [%d, %d) has digest %s, the job wants %.64s", ErrData, src, first, first+count, got, want)
		}
	}
	return d, nil
}

func orNone(d checkpoint.Digest) string {
	if d.IsZero() {
		return "none"
	}
	return d.String()
}

// maxIslands bounds spec.diloco.islands, as the server does.
const maxIslands = 64

// runIsland is runRank for an island of a DiLoCo job: it trains the
// island's shard between outer syncs with the server, which holds the
// outer parameters, so it keeps no checkpoints. StopAtCheckpointSignal
// stops it right after its next outer sync, where it loses nothing: a
// later attempt rejoins at the server's outer step.
func runIsland(ctx context.Context, lf *leaseFile, l *pb.RankLease, conn *grpc.ClientConn, usr1 <-chan os.Signal, stdout, stderr io.Writer) error {
	cfg, digest, err := islandConfig(l, lf.DataRoot)
	if err != nil {
		return err
	}
	report(stdout, reportData, digest)
	b, dl := l.GetSpec().GetBuiltin(), l.GetSpec().GetDiloco()
	if v := b.GetInitModel(); v != "" {
		if cfg.Init, err = initModel(ctx, conn, v); err != nil {
			return err
		}
	} else if cfg.Init, err = train.InitMLP(cfg.Arch, cfg.InitSeed); err != nil {
		return fmt.Errorf("worker: rank: %w: %w", ErrLease, err)
	}
	cfg.Arch = nil

	ref := &pb.RankRef{WorkerId: lf.WorkerID, JobId: l.GetJobId(), Attempt: l.GetAttempt(), Rank: l.GetRank()}
	cfg.Outer, err = remote.NewOuterSyncer(apiv1.NewPoolWorkerServiceClient(conn), ref, remote.OuterConfig{
		Dim: cfg.Init.Layout().Size(), Int8: dl.GetInt8(), Seed: b.GetSeed(), Island: l.GetIsland(), Retry: remote.DefaultRetry(),
	})
	if err != nil {
		return fmt.Errorf("worker: rank: %w", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopAsked := stopRequests(ctx, usr1, stderr, "the next outer sync")
	errStopSync := fmt.Errorf("%w: at an outer sync, as the agent asked", ErrRankStopped)
	cfg.AfterStep = func(step int64, met train.Metrics, _ *model.Model) {
		reportStep(stdout, step, met)
	}
	// AfterSync runs on RunIsland's goroutine only, so prev needs no lock.
	prev := int64(-1)
	cfg.AfterSync = func(s trainer.OuterState) {
		switch {
		case prev < 0:
			fmt.Fprintf(stderr, "island %d of %d: job %s attempt %d, %d examples, H %d, outer steps %d, joining at outer step %d\n",
				l.GetIsland(), dl.GetIslands(), cfg.Job, l.GetAttempt(), cfg.Data.Len(), cfg.InnerSteps, cfg.OuterSteps, s.Step)
		case s.Late:
			fmt.Fprintf(stderr, "contribution to outer step %d was late: outer step %d closed without it; continuing from outer step %d\n", prev, prev, s.Step)
		}
		prev = s.Step
		if stopAsked.Load() && !s.Done {
			cancel(errStopSync)
		}
	}
	res, err := trainer.RunIsland(ctx, cfg)
	if err == nil {
		fmt.Fprintf(stderr, "completed outer step %d (joined at outer step %d, %d inner steps, %d late contributions), model %s\n",
			res.Step, res.Joined, res.InnerSteps, res.Late, res.Digest)
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrRankStopped) {
		fmt.Fprintf(stderr, "stopped at outer step %d\n", res.Step)
		return cause
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		fmt.Fprintf(stderr, "stopped during outer step %d\n", res.Step)
		return fmt.Errorf("%w: at once (outer step %d): %w", ErrRankStopped, res.Step, err)
	}
	return fmt.Errorf("worker: rank: %w", err)
}

// islandConfig is the island's configuration for lease, with its shard of
// the job's data loaded from dataRoot; digest is the shard's data digest.
// Outer and Init are left to the caller.
func islandConfig(l *pb.RankLease, dataRoot string) (trainer.IslandConfig, string, error) {
	spec := l.GetSpec()
	b, dl := spec.GetBuiltin(), spec.GetDiloco()
	islands, island := dl.GetIslands(), l.GetIsland()
	h, total := dl.GetInnerSteps(), spec.GetTotalSteps()
	switch {
	case b == nil:
		return trainer.IslandConfig{}, "", fmt.Errorf("worker: rank: %w: a DiLoCo island needs the built-in trainer", ErrLease)
	case l.GetWorldSize() != 1 || l.GetRank() != 0:
		return trainer.IslandConfig{}, "", fmt.Errorf("worker: rank: %w: a DiLoCo island is one rank, got rank %d of %d", ErrLease, l.GetRank(), l.GetWorldSize())
	case islands < 2 || islands > maxIslands:
		return trainer.IslandConfig{}, "", fmt.Errorf("worker: rank: %w: %d islands, want 2 to %d", ErrLease, islands, maxIslands)
	case island >= islands:
		return trainer.IslandConfig{}, "", fmt.Errorf("worker: rank: %w: island %d of %d", ErrLease, island, islands)
	case h < 1 || h > trainer.MaxSteps:
		return trainer.IslandConfig{}, "", fmt.Errorf("worker: rank: %w: %d inner steps, want 1 to %d", ErrLease, h, int64(trainer.MaxSteps))
	case total < h || total > trainer.MaxSteps || total%h != 0:
		return trainer.IslandConfig{}, "", fmt.Errorf("worker: rank: %w: total steps %d is not a positive multiple of %d inner steps", ErrLease, total, h)
	}
	arch, err := builtinArch(b)
	if err != nil {
		return trainer.IslandConfig{}, "", err
	}
	all, err := loadDataset(b.GetDataset(), dataRoot)
	if err != nil {
		return trainer.IslandConfig{}, "", err
	}
	shard, err := trainer.Shard(all, int(island), int(islands))
	if err != nil {
		return trainer.IslandConfig{}, "", fmt.Errorf("worker: rank: %w", err)
	}
	return trainer.IslandConfig{
		Job:        l.GetJobId(),
		Arch:       arch,
		InitSeed:   b.GetInitSeed(),
		Data:       shard,
		Hyper:      sgd.Hyper{Epochs: 1, BatchSize: int(b.GetBatchSize()), LearningRate: float32(b.GetLearningRate()), EvalBatchSize: sgd.Defaults.EvalBatchSize},
		Seed:       b.GetSeed(),
		InnerSteps: h,
		OuterSteps: total / h,
	}, shard.Digest(), nil
}
