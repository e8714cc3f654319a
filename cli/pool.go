package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/internal/bytesize"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func newPoolCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "Run pretraining jobs on the compute pool",
		Long: "pool submits gang-scheduled training jobs to the pool's workers (fleetlearn-worker),\n" +
			"follows them and lists the workers. A job's ranks start together or not at all,\n" +
			"checkpoint to the server, resume from their last common checkpoint after a failure,\n" +
			"and on success hand their model to the registry (fleetlearn model lineage).",
	}
	cmd.AddCommand(
		newPoolSubmitCommand(a),
		newPoolListCommand(a),
		newPoolGetCommand(a),
		newPoolCancelCommand(a),
		newPoolWatchCommand(a),
		newPoolLogsCommand(a),
		newPoolWorkersCommand(a),
	)
	return cmd
}

type submitFlags struct {
	id, tenant, outputModel  string
	priority                 int32
	ranks, maxRestarts       uint32
	cpu                      float64
	memory                   string
	gpus                     int64
	checkpointEvery, steps   int64
	deadline                 string
	carbonDuration           time.Duration
	carbonWatts              float64
	arch                     string
	dataset                  string
	datasetSHA               string
	batch                    uint32
	lr                       float64
	seed, initSeed           uint64
	syncEvery                int64
	initModel                string
	islands, quorum          uint32
	innerSteps               int64
	outerLR, outerMomentum   float64
	grace                    time.Duration
	int8                     bool
	executor                 string
	env                      []string
	specFile, thenTask, wait string
	format                   string
	follow                   bool
}

func newPoolSubmitCommand(a *app) *cobra.Command {
	var f submitFlags
	cmd := &cobra.Command{
		Use:   "submit --output-model NAME --steps N [flags] [-- COMMAND ARGS...]",
		Short: "Submit a pool job and print it",
		Long: "submit queues a job of --ranks identical ranks. Without a command the ranks run the\n" +
			"workers' built-in trainer on --dataset: an MLP (--arch) with SGD, or, when --init-model is a\n" +
			"language model (model init --arch lm:...), that model with AdamW (--lr, --batch; the other\n" +
			"AdamW settings are package lm's defaults). With a command, each rank runs\n" +
			"COMMAND as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, ...) plus the checkpoint\n" +
			"contract (FLEETLEARN_CHECKPOINT_DIR, FLEETLEARN_RESUME_FROM; docs/POOL.md).\n" +
			"--spec FILE reads the whole job as JSON (the spec field of pool get -o json) instead.\n" +
			"--islands N makes it a DiLoCo run: N one-rank island jobs train --inner-steps each on\n" +
			"their own shard, and the server takes an outer Nesterov step on their averaged\n" +
			"pseudo-gradients; islands may leave and rejoin (--quorum, --grace).\n" +
			"--then-task FILE creates a federated task (JSON, as task get -o json prints one,\n" +
			"without a model) from the job's model when the job succeeds.",
		Example: "  fleetlearn pool submit --output-model mnist-base --ranks 2 --steps 600 --checkpoint-every 100 \\\n" +
			"    --arch mlp:784,128,10 --dataset mnist-train:0:6000 --sync-every 20\n" +
			"  fleetlearn pool submit --output-model mnist-base --steps 600 --islands 3 --inner-steps 50 --quorum 2 \\\n" +
			"    --arch mlp:784,128,10 --dataset mnist-train:0:6000\n" +
			"  fleetlearn pool submit --output-model gocode --ranks 2 --steps 2000 --checkpoint-every 100 --sync-every 20 \\\n" +
			"    --init-model gocode-init --dataset dir:public --batch 16 --lr 0.001\n" +
			"  fleetlearn pool submit --output-model lm --ranks 4 --gpus 1 --steps 1000 --checkpoint-every 50 -- python3 train.py",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(f.format); err != nil {
				return err
			}
			req, err := f.request(cmd, args)
			if err != nil {
				return err
			}
			return a.call(cmd, f.follow, func(ctx context.Context, conn *grpc.ClientConn) error {
				if m := req.GetSpec().GetBuiltin().GetInitModel(); m != "" {
					v, err := resolveModel(ctx, apiv1.NewModelServiceClient(conn), m)
					if err != nil {
						return fmt.Errorf("--init-model: %w", err)
					}
					req.Spec.GetBuiltin().InitModel = v
				}
				c := apiv1.NewPoolServiceClient(conn)
				res, err := c.SubmitJob(ctx, req)
				if err != nil {
					return err
				}
				if !f.follow {
					return printJob(cmd.OutOrStdout(), f.format, res.GetJob())
				}
				return watchJob(ctx, c, res.GetJob().GetSpec().GetId(), cmd.OutOrStdout())
			})
		},
	}
	f.bind(cmd)
	return cmd
}

func (f *submitFlags) bind(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.id, "id", "", "job id, [a-z0-9-]; the server picks one when empty")
	fl.StringVar(&f.tenant, "tenant", "default", "tenant whose queue, quota and budget the job uses")
	fl.Int32Var(&f.priority, "priority", 0, "priority in [-1000, 1000]; higher runs first and may preempt lower jobs at their checkpoints")
	fl.Uint32Var(&f.ranks, "ranks", 1, "gang size: every rank starts together or none does")
	fl.Float64Var(&f.cpu, "cpu", 1, "CPU cores per rank (fractions allowed)")
	fl.StringVar(&f.memory, "memory", "1GiB", "memory per rank (bytes, or with KiB, MiB, GiB, TiB)")
	fl.Int64Var(&f.gpus, "gpus", 0, "GPUs per rank")
	fl.Uint32Var(&f.maxRestarts, "max-restarts", 3, "restarts allowed after worker loss or crashes (preemption is not counted)")
	fl.Int64Var(&f.checkpointEvery, "checkpoint-every", 100, "steps between checkpoints")
	fl.Int64Var(&f.steps, "steps", 0, "optimizer steps of the whole job (required)")
	fl.StringVar(&f.outputModel, "output-model", "", "model family name of the result (required)")
	fl.StringVar(&f.deadline, "deadline", "", "fail the job if not done by then: an RFC 3339 time or a duration from now")
	fl.DurationVar(&f.carbonDuration, "carbon-duration", 0, "carbon-aware placement: how long the job runs (with --carbon-watts and --deadline); the server starts it in the zone and window of least expected gCO2e")
	fl.Float64Var(&f.carbonWatts, "carbon-watts", 0, "carbon-aware placement: the job's expected average power in watts")
	fl.StringVar(&f.arch, "arch", archPrefix+"784,128,10", "built-in trainer: the model, "+archPrefix+"SIZES with the layer widths, input first")
	fl.StringVar(&f.dataset, "dataset", "mnist-train", "built-in trainer: SOURCE[:FIRST[:COUNT]], SOURCE mnist-train, mnist-test or dir:NAME (under the worker's --data-root)")
	fl.StringVar(&f.datasetSHA, "dataset-sha256", "", "built-in trainer: refuse data whose digest differs")
	fl.Uint32Var(&f.batch, "batch", 32, "built-in trainer: examples per step")
	fl.Float64Var(&f.lr, "lr", 0.05, "built-in trainer: SGD learning rate, or AdamW's, at most 1, for a language model")
	fl.Uint64Var(&f.seed, "seed", 1, "built-in trainer: seed of the example order")
	fl.Uint64Var(&f.initSeed, "init-seed", 1, "built-in trainer: seed of the initial parameters")
	fl.Int64Var(&f.syncEvery, "sync-every", 0, "built-in trainer: steps between parameter averages of the ranks (default: the checkpoint interval with several ranks)")
	fl.StringVar(&f.initModel, "init-model", "", "built-in trainer: start from this model (NAME, NAME@N or sha256) instead of --init-seed; a language model trains with AdamW")
	fl.Uint32Var(&f.islands, "islands", 0, "built-in trainer: train as this many DiLoCo islands (jobs ID-i0, ID-i1, ... of --ranks 1 each) joined by an outer step every --inner-steps")
	fl.Int64Var(&f.innerSteps, "inner-steps", 0, "DiLoCo: inner steps H between outer steps; --steps must be a multiple of it")
	fl.Float64Var(&f.outerLR, "outer-lr", 0, "DiLoCo: outer learning rate (default 0.7)")
	fl.Float64Var(&f.outerMomentum, "outer-momentum", 0.9, "DiLoCo: outer Nesterov momentum in [0, 1)")
	fl.Uint32Var(&f.quorum, "quorum", 0, "DiLoCo: islands an outer step needs (default a majority)")
	fl.DurationVar(&f.grace, "grace", 0, "DiLoCo: how long an outer step with its quorum waits for the other running islands (default 30s)")
	fl.BoolVar(&f.int8, "int8", false, "DiLoCo: send pseudo-gradients as int8 with per-block scales")
	fl.StringVar(&f.executor, "executor", "workers", "what runs the ranks: workers (fleetlearn-worker agents) or kubernetes (a JobSet admitted by Kueue; command jobs, on a server started with --pool-kubernetes)")
	fl.StringArrayVar(&f.env, "env", nil, "command jobs: KEY=VALUE for the ranks' environment (repeatable)")
	fl.StringVar(&f.specFile, "spec", "", "read the job spec from this JSON file; the job flags above are then not allowed")
	fl.StringVar(&f.thenTask, "then-task", "", "JSON file with a task to create from the job's model when it succeeds")
	fl.BoolVarP(&f.follow, "follow", "f", false, "watch the job after submitting it")
	addFormatFlag(cmd, &f.format)
}

// jobFlags are the flags --spec replaces.
var jobFlags = []string{"id", "tenant", "priority", "ranks", "cpu", "memory", "gpus", "max-restarts", "checkpoint-every",
	"steps", "output-model", "deadline", "arch", "dataset", "dataset-sha256", "batch", "lr", "seed", "init-seed",
	"sync-every", "init-model", "env", "carbon-duration", "carbon-watts",
	"islands", "inner-steps", "outer-lr", "outer-momentum", "quorum", "grace", "int8", "executor"}

// dilocoFlags are the flags that only a DiLoCo job (--islands) takes.
var dilocoFlags = []string{"inner-steps", "outer-lr", "outer-momentum", "quorum", "grace", "int8"}

func (f *submitFlags) request(cmd *cobra.Command, args []string) (*pb.SubmitJobRequest, error) {
	req := &pb.SubmitJobRequest{}
	if f.thenTask != "" {
		b, err := readSmallFile(f.thenTask, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("%w: --then-task: %w", ErrInput, err)
		}
		t := &pb.Task{}
		if err := (protojson.UnmarshalOptions{}).Unmarshal(b, t); err != nil {
			return nil, fmt.Errorf("%w: --then-task %s: not a task in JSON: %w", ErrInput, f.thenTask, err)
		}
		if t.GetModel() != nil {
			return nil, fmt.Errorf("%w: --then-task %s names a model; leave it out: the task starts from the job's model", ErrInput, f.thenTask)
		}
		req.ThenTask = t
	}
	if f.specFile != "" {
		for _, n := range jobFlags {
			if cmd.Flags().Changed(n) {
				return nil, fmt.Errorf("%w: --%s cannot be used with --spec: put it in the spec file", ErrUsage, n)
			}
		}
		if len(args) > 0 {
			return nil, fmt.Errorf("%w: a command cannot be used with --spec: put it in the spec file", ErrUsage)
		}
		b, err := readSmallFile(f.specFile, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("%w: --spec: %w", ErrInput, err)
		}
		s := &pb.PoolJobSpec{}
		if err := (protojson.UnmarshalOptions{}).Unmarshal(b, s); err != nil {
			return nil, fmt.Errorf("%w: --spec %s: not a job spec in JSON: %w", ErrInput, f.specFile, err)
		}
		req.Spec = s
		return req, nil
	}
	if f.outputModel == "" || f.steps <= 0 {
		return nil, fmt.Errorf("%w: --output-model and --steps are required (or give --spec FILE)", ErrUsage)
	}
	if !(f.cpu > 0) || f.cpu > 1e6 || math.IsInf(f.cpu, 0) {
		return nil, fmt.Errorf("%w: --cpu %v: want a positive number of cores", ErrUsage, f.cpu)
	}
	mem, err := bytesize.Parse(f.memory)
	if err != nil || mem == 0 {
		return nil, fmt.Errorf("%w: --memory %q: want a size such as 512MiB or 2GiB", ErrUsage, f.memory)
	}
	s := &pb.PoolJobSpec{
		Id: f.id, Tenant: f.tenant, Priority: f.priority, Ranks: f.ranks,
		PerRank:     &pb.PoolResources{MilliCpu: int64(math.Round(f.cpu * 1000)), MemoryBytes: mem, Gpus: f.gpus},
		MaxRestarts: f.maxRestarts, CheckpointInterval: f.checkpointEvery, TotalSteps: f.steps, OutputModel: f.outputModel,
	}
	switch f.executor {
	case "workers":
	case "kubernetes":
		s.Executor = pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES
		if len(args) == 0 {
			return nil, fmt.Errorf("%w: --executor kubernetes runs a command (give it after --); the built-in trainer runs on workers", ErrUsage)
		}
	default:
		return nil, fmt.Errorf("%w: --executor %q: want workers or kubernetes", ErrUsage, f.executor)
	}
	if f.deadline != "" {
		dl, err := parseDeadline(f.deadline, time.Now())
		if err != nil {
			return nil, fmt.Errorf("%w: --deadline: %w", ErrUsage, err)
		}
		s.Deadline = timestamppb.New(dl)
	}
	if f.carbonDuration != 0 || f.carbonWatts != 0 {
		if f.carbonDuration <= 0 || f.carbonWatts <= 0 || f.deadline == "" {
			return nil, fmt.Errorf("%w: carbon-aware placement needs --carbon-duration and --carbon-watts, both positive, and --deadline", ErrUsage)
		}
		s.Carbon = &pb.PoolCarbon{ExpectedDuration: durationpb.New(f.carbonDuration), ExpectedPowerWatts: f.carbonWatts}
	}
	if len(args) > 0 {
		for _, n := range []string{"arch", "dataset", "dataset-sha256", "batch", "lr", "seed", "init-seed", "sync-every", "init-model", "islands"} {
			if cmd.Flags().Changed(n) {
				return nil, fmt.Errorf("%w: --%s is for the built-in trainer, not for a command job", ErrUsage, n)
			}
		}
		env := map[string]string{}
		for _, kv := range f.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("%w: --env %q: want KEY=VALUE", ErrUsage, kv)
			}
			env[k] = v
		}
		s.Program = &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: args, Env: env}}
		req.Spec = s
		return req, nil
	}
	if len(f.env) > 0 {
		return nil, fmt.Errorf("%w: --env is for command jobs (give the command after --)", ErrUsage)
	}
	var arch []uint32
	// A registered model brings its own layout (an MLP's, or a language
	// model's that no widths describe), so the default --arch is not sent
	// with it.
	if f.initModel == "" || cmd.Flags().Changed("arch") {
		sizes, _, err := parseArch(f.arch)
		if err != nil {
			return nil, err
		}
		arch = make([]uint32, len(sizes))
		for i, n := range sizes {
			arch[i] = uint32(n)
		}
	}
	ds, err := parseDataset(f.dataset)
	if err != nil {
		return nil, fmt.Errorf("%w: --dataset: %w", ErrUsage, err)
	}
	ds.Sha256 = f.datasetSHA
	sync := f.syncEvery
	if sync == 0 && f.ranks > 1 {
		sync = f.checkpointEvery
	}
	if f.islands == 0 {
		for _, n := range dilocoFlags {
			if cmd.Flags().Changed(n) {
				return nil, fmt.Errorf("%w: --%s is for DiLoCo jobs: give --islands N too", ErrUsage, n)
			}
		}
	} else {
		if f.innerSteps <= 0 {
			return nil, fmt.Errorf("%w: --islands needs --inner-steps H, the inner steps between outer steps", ErrUsage)
		}
		if cmd.Flags().Changed("ranks") && f.ranks != 1 {
			return nil, fmt.Errorf("%w: --ranks %d: a DiLoCo island is one rank; --islands says how many run", ErrUsage, f.ranks)
		}
		s.Ranks = 1
		// An island's checkpoints are its outer steps.
		s.CheckpointInterval = f.innerSteps
		if cmd.Flags().Changed("checkpoint-every") && f.checkpointEvery != f.innerSteps {
			return nil, fmt.Errorf("%w: --checkpoint-every: a DiLoCo job checkpoints at its outer steps; leave it out", ErrUsage)
		}
		mu := f.outerMomentum
		s.Diloco = &pb.PoolDiLoCo{Islands: f.islands, InnerSteps: f.innerSteps, OuterLearningRate: f.outerLR,
			OuterMomentum: &mu, Quorum: f.quorum, Int8: f.int8}
		if f.grace != 0 {
			s.Diloco.Grace = durationpb.New(f.grace)
		}
	}
	s.Program = &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{
		Arch: arch, InitSeed: f.initSeed, Seed: f.seed, BatchSize: f.batch, LearningRate: f.lr,
		SyncEvery: sync, Dataset: ds, InitModel: f.initModel,
	}}
	req.Spec = s
	return req, nil
}

func parseDeadline(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2027-01-02T15:04:05Z) or a duration (36h)", s)
	}
	return now.Add(d), nil
}

func parseDataset(s string) (*pb.PoolDataset, error) {
	src, rest, _ := strings.Cut(s, ":")
	if src == "dir" {
		// dir:NAME[:FIRST[:COUNT]]
		name, more, _ := strings.Cut(rest, ":")
		src, rest = "dir:"+name, more
	}
	ds := &pb.PoolDataset{Source: src}
	if rest == "" {
		return ds, nil
	}
	first, count, hasCount := strings.Cut(rest, ":")
	var err error
	if ds.First, err = strconv.ParseInt(first, 10, 64); err != nil || ds.First < 0 {
		return nil, fmt.Errorf("%q: FIRST must be a non-negative example index", s)
	}
	if hasCount {
		if ds.Count, err = strconv.ParseInt(count, 10, 64); err != nil || ds.Count < 1 {
			return nil, fmt.Errorf("%q: COUNT must be a positive number of examples", s)
		}
	}
	return ds, nil
}

func newPoolListCommand(a *app) *cobra.Command {
	var state, format string
	cmd := &cobra.Command{
		Use:   "list [--state queued|running|succeeded|failed|cancelled]",
		Short: "List pool jobs, newest first",
		Example: "  fleetlearn pool list\n" +
			"  fleetlearn pool list --state running -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			st := pb.PoolJobState_POOL_JOB_STATE_UNSPECIFIED
			if state != "" {
				v, ok := pb.PoolJobState_value["POOL_JOB_STATE_"+strings.ToUpper(state)]
				if !ok || v == 0 {
					return fmt.Errorf("%w: --state %q: one of queued, running, succeeded, failed, cancelled", ErrUsage, state)
				}
				st = pb.PoolJobState(v)
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewPoolServiceClient(conn)
				var jobs []*pb.PoolJob
				token := ""
				for {
					res, err := c.ListJobs(ctx, &pb.ListJobsRequest{PageToken: token, State: st})
					if err != nil {
						return err
					}
					jobs = append(jobs, res.GetJobs()...)
					if token = res.GetNextPageToken(); token == "" {
						break
					}
				}
				w := cmd.OutOrStdout()
				if format == formatJSON {
					return writeJSON(w, &pb.ListJobsResponse{Jobs: jobs})
				}
				t := newTable(w, "JOB", "TENANT", "STATE", "RANKS", "STEP", "COMMITTED", "RESTARTS", "MODEL", "REASON")
				for _, j := range jobs {
					s := j.GetSpec()
					t.row(s.GetId(), s.GetTenant(), jobState(j.GetState()), strconv.Itoa(int(s.GetRanks())),
						fmt.Sprintf("%d/%d", j.GetStep(), s.GetTotalSteps()), strconv.FormatInt(j.GetCommittedStep(), 10),
						fmt.Sprintf("%d/%d", j.GetRestarts(), s.GetMaxRestarts()), shortSHA(j.GetOutputVersion()), j.GetStateReason())
				}
				return t.flush()
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only jobs in this state")
	addFormatFlag(cmd, &format)
	return cmd
}

func newPoolGetCommand(a *app) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:     "get JOB",
		Short:   "Show one pool job",
		Example: "  fleetlearn pool get job-7c1e9a42\n  fleetlearn pool get job-7c1e9a42 -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewPoolServiceClient(conn).GetJob(ctx, &pb.GetJobRequest{JobId: args[0]})
				if err != nil {
					return err
				}
				return printJob(cmd.OutOrStdout(), format, res.GetJob())
			})
		},
	}
	addFormatFlag(cmd, &format)
	return cmd
}

func newPoolCancelCommand(a *app) *cobra.Command {
	var reason, format string
	cmd := &cobra.Command{
		Use:     "cancel JOB [--reason TEXT]",
		Short:   "Cancel a queued or running pool job; its ranks are stopped",
		Example: `  fleetlearn pool cancel job-7c1e9a42 --reason "superseded by a larger run"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewPoolServiceClient(conn).CancelJob(ctx, &pb.CancelJobRequest{JobId: args[0], Reason: reason})
				if err != nil {
					return err
				}
				return printJob(cmd.OutOrStdout(), format, res.GetJob())
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why; recorded in the audit log")
	addFormatFlag(cmd, &format)
	return cmd
}

func newPoolWatchCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "watch JOB",
		Short: "Follow a pool job until it ends",
		Long: "watch prints a line whenever the job's state, placement, step or checkpoint\n" +
			"changes. It exits with status 0 when the job succeeds and non-zero when it fails\n" +
			"or is cancelled.",
		Example: "  fleetlearn pool watch job-7c1e9a42 && fleetlearn model list",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				return watchJob(ctx, apiv1.NewPoolServiceClient(conn), args[0], cmd.OutOrStdout())
			})
		},
	}
}

// ErrJobNotSucceeded is what watch returns for a job that ended otherwise.
var ErrJobNotSucceeded = errors.New("job did not succeed")

func watchJob(ctx context.Context, c apiv1.PoolServiceClient, id string, w io.Writer) error {
	stream, err := c.WatchJob(ctx, &pb.WatchJobRequest{JobId: id})
	if err != nil {
		return err
	}
	last := ""
	var job *pb.PoolJob
	for {
		res, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		job = res.GetJob()
		line := jobLine(job)
		if line != last {
			fmt.Fprintln(w, printable(line))
			last = line
		}
	}
	if job == nil {
		return fmt.Errorf("pool watch %s: the server ended the stream without the job", id)
	}
	if job.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
		return fmt.Errorf("pool job %s %s: %s: %w", id, jobState(job.GetState()), job.GetStateReason(), ErrJobNotSucceeded)
	}
	u := job.GetUsage()
	fmt.Fprintf(w, "job %s succeeded: model %s, %.1f CPU-s, %.1f GPU-s, peak %s\n", id, orDash(job.GetOutputVersion()),
		u.GetCpuSeconds(), u.GetGpuSeconds(), byteSize(uint64(max(u.GetPeakMemoryBytes(), 0))))
	if t := job.GetThenTaskId(); t != "" {
		fmt.Fprintf(w, "task %s created from it (fleetlearn task watch %s)\n", t, t)
	}
	return nil
}

func jobLine(j *pb.PoolJob) string {
	s := j.GetSpec()
	var where []string
	for _, p := range j.GetPlacement() {
		where = append(where, fmt.Sprintf("%s×%d", p.GetWorker(), p.GetRanks()))
	}
	line := fmt.Sprintf("%s  %-9s step %d/%d  checkpoint %d", s.GetId(), jobState(j.GetState()), j.GetStep(), s.GetTotalSteps(), j.GetCommittedStep())
	if len(where) > 0 {
		line += "  on " + strings.Join(where, ",")
	}
	if j.GetAttempt() > 1 {
		line += fmt.Sprintf("  attempt %d", j.GetAttempt())
	}
	if r := j.GetStateReason(); r != "" {
		line += "  (" + r + ")"
	}
	return line
}

func jobState(s pb.PoolJobState) string { return enumName(s.String(), "POOL_JOB_STATE_") }

func printJob(w io.Writer, format string, j *pb.PoolJob) error {
	if format == formatJSON {
		return writeJSON(w, j)
	}
	s := j.GetSpec()
	t := newTable(w)
	t.row("job", s.GetId())
	t.row("tenant", s.GetTenant())
	t.row("state", jobState(j.GetState())+" ("+j.GetStateReason()+")")
	t.row("priority", strconv.Itoa(int(s.GetPriority())))
	r := s.GetPerRank()
	t.row("ranks", fmt.Sprintf("%d × (%.3g CPU, %s, %d GPU)", s.GetRanks(), float64(r.GetMilliCpu())/1000,
		byteSize(uint64(max(r.GetMemoryBytes(), 0))), r.GetGpus()))
	switch p := s.GetProgram().(type) {
	case *pb.PoolJobSpec_Builtin:
		b := p.Builtin
		ds := b.GetDataset()
		t.row("program", fmt.Sprintf("built-in MLP %v on %s[%d:+%d], batch %d, lr %g, sync every %d",
			b.GetArch(), ds.GetSource(), ds.GetFirst(), ds.GetCount(), b.GetBatchSize(), b.GetLearningRate(), b.GetSyncEvery()))
	case *pb.PoolJobSpec_Command:
		t.row("program", strings.Join(p.Command.GetArgv(), " "))
	}
	t.row("steps", fmt.Sprintf("%d of %d, checkpoint at %d (every %d)", j.GetStep(), s.GetTotalSteps(), j.GetCommittedStep(), s.GetCheckpointInterval()))
	if d := s.GetDiloco(); d != nil {
		switch {
		case j.GetParent() != "":
			t.row("island", fmt.Sprintf("%d of %d of DiLoCo job %s", j.GetIsland(), d.GetIslands(), j.GetParent()))
		default:
			ds := j.GetDiloco()
			mode := "float32"
			if d.GetInt8() {
				mode = "int8"
			}
			t.row("diloco", fmt.Sprintf("%d islands (%s-i0 ...), H %d, outer step %d of %d, last with islands %v, %d late, %s pseudo-gradients",
				d.GetIslands(), s.GetId(), d.GetInnerSteps(), ds.GetOuterStep(), ds.GetOuterSteps(), ds.GetLastIslands(), ds.GetLateContributions(), mode))
		}
	}
	if st := j.GetCheckpointStall(); st.GetCount() > 0 {
		t.row("checkpoint stall", fmt.Sprintf("p50 %s, p99 %s, max %s over %d checkpoints, %s in all (as the ranks report)",
			seconds(st.GetP50Seconds()), seconds(st.GetP99Seconds()), seconds(st.GetMaxSeconds()), st.GetCount(), seconds(st.GetTotalSeconds())))
	}
	if j.GetSyncBytesReceived() > 0 || j.GetSyncBytesSent() > 0 {
		t.row("sync traffic", fmt.Sprintf("%s received, %s sent", byteSize(uint64(j.GetSyncBytesReceived())), byteSize(uint64(j.GetSyncBytesSent()))))
	}
	t.row("restarts", fmt.Sprintf("%d of %d", j.GetRestarts(), s.GetMaxRestarts()))
	t.row("attempt", strconv.Itoa(int(j.GetAttempt())))
	var where []string
	for _, p := range j.GetPlacement() {
		where = append(where, fmt.Sprintf("%s (ranks %d-%d)", p.GetWorker(), p.GetFirstRank(), p.GetFirstRank()+p.GetRanks()-1))
	}
	if s.GetExecutor() == pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES {
		t.row("executor", "kubernetes")
	}
	t.row("placement", orDash(strings.Join(where, ", ")))
	u := j.GetUsage()
	gpu := fmt.Sprintf("%.1f GPU-s", u.GetGpuSeconds())
	if m := u.GetGpuMeter(); m != "" {
		gpu += fmt.Sprintf(" held, %.1f busy (%s)", u.GetGpuBusySeconds(), m)
	}
	t.row("usage", fmt.Sprintf("%.1f CPU-s, %s, peak %s, %s (meter %s, energy %s)", u.GetCpuSeconds(), gpu,
		byteSize(uint64(max(u.GetPeakMemoryBytes(), 0))), energy(u.GetEnergyJoules()), orDash(u.GetMeter()), orDash(u.GetEnergySource())))
	if z := j.GetCarbonZone(); z != "" {
		t.row("carbon", fmt.Sprintf("zone %s from %s, %.1f gCO2e expected (forecast %s)", z, timeString(j.GetCarbonStart()),
			j.GetExpectedGco2E(), shortSHA(j.GetForecastSha256())))
	}
	if g := j.GetGco2E(); g > 0 {
		t.row("emissions", fmt.Sprintf("%.1f gCO2e", g))
	}
	t.row("spec digest", j.GetSpecDigest())
	t.row("data", orDash(j.GetDataSha256()))
	t.row("checkpoint", orDash(j.GetCheckpoint()))
	t.row("model", orDash(j.GetOutputVersion()))
	if j.GetThenTaskId() != "" {
		t.row("then task", j.GetThenTaskId())
	}
	t.row("submitted", timeString(j.GetSubmitTime())+" by "+orDash(j.GetSubmitter()))
	t.row("started", timeString(j.GetStartTime()))
	t.row("ended", timeString(j.GetEndTime()))
	return t.flush()
}

// seconds prints a duration the server sent in seconds, to the microsecond.
func seconds(sec float64) string {
	return time.Duration(sec * float64(time.Second)).Round(time.Microsecond).String()
}

func energy(j float64) string {
	if j <= 0 {
		return "energy -"
	}
	return fmt.Sprintf("%.1f J", j)
}

func newPoolLogsCommand(a *app) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs JOB [-f]",
		Short: "Print the output lines the job's ranks wrote",
		Long: "logs prints the lines the server kept (the newest 10,000 per job), each prefixed\n" +
			"with its attempt and rank; with -f it keeps printing new lines until the job ends.",
		Example: "  fleetlearn pool logs job-7c1e9a42 -f\n" +
			"  fleetlearn pool logs job-7c1e9a42 | grep '^\\[1/0 '   # the first attempt's rank 0",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, follow, func(ctx context.Context, conn *grpc.ClientConn) error {
				stream, err := apiv1.NewPoolServiceClient(conn).JobLogs(ctx, &pb.JobLogsRequest{JobId: args[0], Follow: follow})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				for {
					res, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						return nil
					}
					if err != nil {
						return err
					}
					for _, l := range res.GetLines() {
						fmt.Fprintf(w, "[%d/%d %s] %s\n", l.GetAttempt(), l.GetRank(), printable(l.GetStream()), printable(l.GetText()))
					}
				}
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new lines until the job ends")
	return cmd
}

func newPoolWorkersCommand(a *app) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:     "workers",
		Short:   "List the pool's workers with their capacity and what is free",
		Example: "  fleetlearn pool workers\n  fleetlearn pool workers -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewPoolServiceClient(conn).ListWorkers(ctx, &pb.ListWorkersRequest{})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if format == formatJSON {
					return writeJSON(w, res)
				}
				t := newTable(w, "WORKER", "NAME", "STATE", "CPU FREE/CAP", "MEMORY FREE/CAP", "GPUS FREE/CAP", "ZONE", "LAST SEEN", "VERSION")
				for _, wk := range res.GetWorkers() {
					c, f := wk.GetCapacity(), wk.GetFree()
					t.row(wk.GetId(), wk.GetName(), wk.GetState(),
						fmt.Sprintf("%.3g/%.3g", float64(f.GetMilliCpu())/1000, float64(c.GetMilliCpu())/1000),
						byteSize(uint64(max(f.GetMemoryBytes(), 0)))+"/"+byteSize(uint64(max(c.GetMemoryBytes(), 0))),
						fmt.Sprintf("%d/%d", f.GetGpus(), c.GetGpus()), orDash(wk.GetZone()), timeString(wk.GetLastSeen()), orDash(wk.GetVersion()))
				}
				return t.flush()
			})
		},
	}
	addFormatFlag(cmd, &format)
	return cmd
}
