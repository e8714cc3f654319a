// Package demo runs Fleetlearn end to end in one process: the aggregator
// (embedded NATS, SQLite), a fleet of real edge agents talking to it over NATS,
// MNIST split non-IID across them, a base model pretrained on a small public
// slice by a gang of two ranks on the aggregator's compute pool (two embedded
// workers), and federated fine-tuning rounds of that model, started by the
// pool job's hand-over and watched through the API.
package demo

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
)

// Config sizes the demo.
type Config struct {
	Edges  int     // simulated devices
	Rounds int     // federated training rounds
	Cohort int     // reports per round
	Alpha  float64 // Dirichlet label-skew concentration
	// OverSelection is the extra fraction of devices selected per round.
	// Selection is first come, first served and a round closes at its target,
	// so over-selected rounds drop their slowest devices, which under label
	// skew are the ones with the most data; the demo selects exactly the cohort.
	OverSelection float64
	BaseExamples  int // public slice the cloud pretrains on
	// SecureAggregation runs the training rounds through SecAgg+: the server
	// learns only the sum of each round's updates.
	SecureAggregation bool
	// Dropout is the chance that a device selected for a secure round
	// vanishes right after uploading its keys, to exercise dropout recovery.
	Dropout float64
	// DP adds differential privacy: "central" (the server noises the sum,
	// DP-FedAvg) or "distributed" (each device adds discrete Gaussian noise
	// under secure aggregation); "" runs without.
	DP string
	// NoiseMultiplier and ClipNorm are the DP noise multiplier z and the L2
	// bound C of each device's update; DPDelta is δ. The task's ε target is
	// the ε its Rounds rounds spend, so the budget ends the task exactly.
	NoiseMultiplier float64
	ClipNorm        float64
	DPDelta         float64
	Seed            uint64
	// UpdateEncoding is the task's update encoding: none (float32), int8
	// or int4, quantized with error feedback.
	UpdateEncoding pb.UpdateEncoding
	DataDir        string // server state; "" uses a temporary directory
	// OutDir is the one directory the demo writes its results to
	// (results.csv, accuracy.png; privacy.csv and privacy.png for a sweep),
	// created if missing; "" is DefaultOutDir.
	OutDir   string
	Out      io.Writer
	Log      *slog.Logger
	Terminal bool // Out is a terminal: redraw progress bars in place
	// RankCommand runs one pool rank (worker.RunRank) for the embedded
	// workers; empty is this executable with the hidden RankCommandName
	// command, which the fleetlearn binary has.
	RankCommand []string
	// Tracer records the rounds' spans, the server's and the agents', in
	// one provider (docs/TRACING.md); nil records none.
	Tracer trace.TracerProvider
	// UI serves the web dashboard on this address ("" for none), and
	// keeps it up after the run until ctx ends.
	UI string
}

// DefaultOutDir is where the demo writes its results unless told otherwise,
// relative to the working directory.
const DefaultOutDir = "fleetlearn-demo-out"

// pretrainEpochs are the epochs of the base model's pretraining.
const pretrainEpochs = 10

// Defaults are the demo's standard scale.
var Defaults = Config{Edges: 100, Rounds: 20, Cohort: 30, Alpha: 0.5, BaseExamples: 5000, Dropout: 0.1,
	NoiseMultiplier: 0.1, ClipNorm: 1, DPDelta: 1e-5, Seed: 1, OutDir: DefaultOutDir}

// Secure aggregation settings of the demo's task: update elements are
// clipped to ±SecAggClipRange and weights (example counts) capped at
// SecAggMaxWeight inside the masked vector; a stage that has had no answer
// for SecAggStageTimeout (or half the time its answers took, if longer)
// stops waiting for devices that dropped out.
const (
	SecAggClipRange    = 1.0
	SecAggMaxWeight    = 4096
	SecAggStageTimeout = 2 * time.Second
)

// Result is what the demo measured.
type Result struct {
	BaseAccuracy  float64
	FinalAccuracy float64
	Epsilon       float64 // DP ε spent at Config.DPDelta; 0 without DP
	Rounds        []RoundResult
	Elapsed       time.Duration
}

// RoundResult is one committed round.
type RoundResult struct {
	Round    uint64
	Reports  uint32
	Dropped  uint32
	Accuracy float64
	Loss     float64
	Elapsed  time.Duration
}

// Hyper are the devices' local training hyper-parameters.
var Hyper = sgd.Hyper{Epochs: 4, BatchSize: 32, LearningRate: 0.2, EvalBatchSize: 1000}

// Run executes the demo. Its errors start with "demo: ", once.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	res, err := run(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	return res, nil
}

func run(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Edges < 1 || cfg.Rounds < 1 || cfg.Cohort < 1 || cfg.Cohort > cfg.Edges {
		return nil, fmt.Errorf("need edges ≥ 1, rounds ≥ 1 and 1 ≤ cohort ≤ edges (got %d, %d, %d)", cfg.Edges, cfg.Rounds, cfg.Cohort)
	}
	privacy, err := dpConfig(cfg) // checked before minutes of work
	if err != nil {
		return nil, err
	}
	if err := tryUIAddr(cfg.UI); err != nil {
		return nil, err
	}
	if cfg.OutDir == "" {
		cfg.OutDir = DefaultOutDir
	}
	dataDir, removeData, err := workDirs(cfg.OutDir, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer removeData()
	pr := &progress{w: cfg.Out, terminal: cfg.Terminal}
	defer pr.end()

	pr.printf("Fleetlearn demo: %d edge agents, %d rounds of %d reports, MNIST split Dirichlet(α=%g); results go to %s",
		cfg.Edges, cfg.Rounds, cfg.Cohort, cfg.Alpha, cfg.OutDir)
	ph := pr.start("loading MNIST", 1, "loading MNIST")
	trainSet, testSet, err := orMNIST(nil, nil)
	if err != nil {
		return nil, err
	}
	ph.step(fmt.Sprintf("%d+%d examples", trainSet.Len(), testSet.Len()))
	if cfg.BaseExamples < 1 || cfg.BaseExamples >= trainSet.Len() {
		return nil, fmt.Errorf("base examples %d: want 1 to %d", cfg.BaseExamples, trainSet.Len()-1)
	}

	// The cloud holds a small public slice, the first BaseExamples of the
	// training set, which the pool's workers load themselves; the rest lives
	// on devices only.
	ph = pr.start("splitting the dataset", 2, fmt.Sprintf("splitting %d examples across %d devices, Dirichlet(α=%g)",
		trainSet.Len()-cfg.BaseExamples, cfg.Edges, cfg.Alpha))
	rest := make([]int, trainSet.Len()-cfg.BaseExamples)
	for i := range rest {
		rest[i] = cfg.BaseExamples + i
	}
	private := trainSet.Subset(rest)
	parts, err := data.Dirichlet(private.Labels, private.NumClasses, cfg.Edges, cfg.Alpha, cfg.Seed)
	if err != nil {
		return nil, err
	}
	ph.step(fmt.Sprintf("%d devices", len(parts)))
	evalDir := filepath.Join(dataDir, "heldout")
	if err := data.WriteDir(evalDir, testSet, "mnist-test"); err != nil {
		return nil, err
	}
	ph.step("held-out set written")

	sys, err := startSystem(ctx, dataDir, "off", cfg.Log, cfg.Tracer, cfg.UI)
	if err != nil {
		return nil, err
	}
	defer sys.close()
	if err := sys.announceUI(pr); err != nil {
		return nil, err
	}
	srv, conn := sys.srv, sys.conn
	mod, sha, err := sys.registerExample(ctx, "mlp")
	if err != nil {
		return nil, err
	}
	pr.printf("update module: mlp, sha256 %s (embedded)", sha)

	// The fleet: real agents over NATS.
	datasets := make([]*data.Dataset, len(parts))
	for i, idx := range parts {
		datasets[i] = private.Subset(idx)
	}
	stopFleet, err := sys.startFleet(ctx, pr, dataDir, datasets, cfg.Log, func(id string) []edge.Option {
		if cfg.SecureAggregation && cfg.Dropout > 0 {
			return []edge.Option{edge.WithDropout(dropout(cfg.Seed, id, cfg.Dropout))}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer stopFleet()

	hyper, _ := json.Marshal(Hyper)
	var secure *pb.SecAggConfig
	if cfg.SecureAggregation || cfg.DP == "distributed" {
		secure = &pb.SecAggConfig{ClipRange: SecAggClipRange, MaxWeight: SecAggMaxWeight,
			StageTimeout: durationpb.New(SecAggStageTimeout)}
	}
	// The fine-tuning task is created by the server when the pretraining
	// job succeeds, from the model the job hands over.
	then := &pb.Task{
		Name: "mnist-finetune", Module: mod.GetRef(),
		Hyperparameters: hyper, CohortTarget: uint32(cfg.Cohort), OverSelection: cfg.OverSelection,
		ReportGoal: uint32(max(1, cfg.Cohort*3/4)), RoundsTotal: uint32(cfg.Rounds),
		SelectionTimeout: durationpb.New(20 * time.Second), ReportTimeout: durationpb.New(60 * time.Second),
		Eligibility:       &pb.Eligibility{MinExamples: 1, RequireCharging: true},
		Aggregation:       &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_FEDAVGM, ServerLearningRate: 1, Momentum: 0.8},
		ServerEvalDataset: evalDir,
		Secagg:            secure,
		Dp:                privacy,
		UpdateEncoding:    cfg.UpdateEncoding,
	}
	rankCommand := cfg.RankCommand
	if len(rankCommand) == 0 {
		if rankCommand, err = defaultRankCommand(); err != nil {
			return nil, err
		}
	}
	poolCtx, stopPool := context.WithCancel(ctx)
	waitPool, err := startPool(poolCtx, srv, dataDir, "", rankCommand, cfg.Log)
	if err != nil {
		stopPool()
		return nil, err
	}
	defer func() { stopPool(); waitPool() }()
	pr.printf("compute pool: %d workers (embedded), ranks run as child processes", poolWorkers)
	job, baseModel, err := pretrainOnPool(ctx, conn, pretrainJob(cfg),
		fmt.Sprintf("%d public examples (%d epochs)", cfg.BaseExamples, pretrainEpochs), pr, then)
	if err != nil {
		return nil, err
	}
	// The pool's work is done; its workers need not idle through the rounds.
	stopPool()
	waitPool()
	baseEval, err := train.Evaluate(baseModel, testSet, 1000)
	if err != nil {
		return nil, err
	}
	pr.printf("base model: %.2f%% test accuracy", 100*baseEval.Accuracy)
	if job.GetThenTaskId() == "" {
		return nil, fmt.Errorf("pretraining job %s succeeded but created no fine-tuning task: %s", job.GetSpec().GetId(), job.GetStateReason())
	}
	tasks := apiv1.NewTaskServiceClient(conn)
	created, err := tasks.GetTask(ctx, &pb.GetTaskRequest{TaskId: job.GetThenTaskId()})
	if err != nil {
		return nil, fmt.Errorf("fine-tuning task: %w", err)
	}
	pr.printf("task %s created from model %s (fleetlearn model lineage %s)", created.Task.Id,
		job.GetOutputVersion()[:12], job.GetOutputVersion()[:12])

	res := &Result{BaseAccuracy: baseEval.Accuracy, FinalAccuracy: baseEval.Accuracy}
	watch, err := tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: created.Task.Id})
	if err != nil {
		return nil, err
	}
	pr.start("training rounds", cfg.Rounds, fmt.Sprintf("training %d rounds", cfg.Rounds))
	roundStart := time.Now()
	for len(res.Rounds) < cfg.Rounds {
		msg, err := watch.Recv()
		if err != nil {
			return nil, fmt.Errorf("watch: %w", err)
		}
		ev := msg.GetEvent()
		switch ev.GetType() {
		case pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED:
			m := ev.GetMetrics().GetValues()
			r := RoundResult{Round: ev.Round, Reports: ev.Reported, Dropped: ev.Dropped,
				Accuracy: m["server_accuracy"], Loss: m["server_loss"], Elapsed: time.Since(roundStart)}
			res.Rounds = append(res.Rounds, r)
			res.FinalAccuracy, res.Epsilon = r.Accuracy, ev.GetEpsilonSpent()
			pr.round(r)
			roundStart = time.Now()
		case pb.RoundEventType_ROUND_EVENT_TYPE_OPENED:
			pr.status("selecting devices")
		case pb.RoundEventType_ROUND_EVENT_TYPE_CLOSED:
			pr.status("aggregating")
		case pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED:
			pr.printf("  round %d abandoned: %s; retrying", ev.Round, ev.Reason)
		}
	}
	pr.end()
	res.Elapsed = time.Since(start)
	if err := writeResults(cfg.OutDir, res); err != nil {
		return nil, err
	}
	pr.printf("wrote %s and %s", filepath.Join(cfg.OutDir, "results.csv"), filepath.Join(cfg.OutDir, "accuracy.png"))
	if privacy != nil {
		pr.printf("differential privacy (%s, noise multiplier %g, clip norm %g): epsilon %.4g at delta %g, no amplification by sampling claimed",
			cfg.DP, cfg.NoiseMultiplier, cfg.ClipNorm, res.Epsilon, cfg.DPDelta)
	}
	pr.printf("done in %v: final test accuracy %.2f%%, base model %.2f%% (%+.2f points)",
		res.Elapsed.Round(100*time.Millisecond), 100*res.FinalAccuracy, 100*res.BaseAccuracy, 100*(res.FinalAccuracy-res.BaseAccuracy))
	sys.keepServingUI(ctx, pr)
	return res, nil
}

// Sweep runs the demo once without DP and once per noise multiplier with
// cfg.DP, each in its own subdirectory of cfg.OutDir, and writes
// privacy.csv and privacy.png there: final accuracy against ε.
func Sweep(ctx context.Context, cfg Config, noise []float64) ([]PrivacyPoint, error) {
	pts, err := sweep(ctx, cfg, noise)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	return pts, nil
}

func sweep(ctx context.Context, cfg Config, noise []float64) ([]PrivacyPoint, error) {
	if cfg.DP == "" || cfg.DP == "none" {
		return nil, fmt.Errorf("a privacy sweep needs --dp central or distributed")
	}
	if len(noise) == 0 {
		return nil, fmt.Errorf("a privacy sweep needs noise multipliers")
	}
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	if cfg.OutDir == "" {
		cfg.OutDir = DefaultOutDir
	}
	plainCfg := cfg
	plainCfg.DP, plainCfg.OutDir = "", filepath.Join(cfg.OutDir, "no-dp")
	fmt.Fprintf(out, "== without differential privacy\n")
	plain, err := run(ctx, plainCfg)
	if err != nil {
		return nil, err
	}
	var pts []PrivacyPoint
	for _, z := range noise {
		c := cfg
		c.NoiseMultiplier, c.OutDir = z, filepath.Join(cfg.OutDir, fmt.Sprintf("%s-z%g", cfg.DP, z))
		fmt.Fprintf(out, "== %s DP, noise multiplier %g\n", cfg.DP, z)
		res, err := run(ctx, c)
		if err != nil {
			return nil, err
		}
		pts = append(pts, PrivacyPoint{NoiseMultiplier: z, Epsilon: res.Epsilon, Accuracy: res.FinalAccuracy})
	}
	f, err := atomicfile.Create(filepath.Join(cfg.OutDir, "privacy.csv"), 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Abort()
	w := csv.NewWriter(f)
	w.Write([]string{"mechanism", "noise_multiplier", "clip_norm", "delta", "epsilon", "accuracy"})
	w.Write([]string{"none", "", "", "", "", strconv.FormatFloat(plain.FinalAccuracy, 'f', 6, 64)})
	for _, pt := range pts {
		w.Write([]string{cfg.DP, strconv.FormatFloat(pt.NoiseMultiplier, 'g', -1, 64), strconv.FormatFloat(cfg.ClipNorm, 'g', -1, 64),
			strconv.FormatFloat(cfg.DPDelta, 'g', -1, 64), strconv.FormatFloat(pt.Epsilon, 'g', 6, 64),
			strconv.FormatFloat(pt.Accuracy, 'f', 6, 64)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return nil, err
	}
	if err := f.Commit(); err != nil {
		return nil, err
	}
	if err := plotPrivacy(filepath.Join(cfg.OutDir, "privacy.png"), cfg.DP, pts, plain.FinalAccuracy, plain.BaseAccuracy); err != nil {
		return nil, err
	}
	for _, pt := range pts {
		fmt.Fprintf(out, "%s DP z=%g: epsilon %.4g at delta %g -> accuracy %.2f%% (without DP %.2f%%)\n",
			cfg.DP, pt.NoiseMultiplier, pt.Epsilon, cfg.DPDelta, 100*pt.Accuracy, 100*plain.FinalAccuracy)
	}
	return pts, nil
}

// enrollAgent enrolls a simulated device the way a real one enrolls, with a
// single-use token and the server's CA, unless its directory holds
// credentials from an earlier run (--data-dir).
func enrollAgent(ctx context.Context, srv *server.Server, devices apiv1.DeviceServiceClient, id, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, edge.CredsFile)); err == nil {
		return nil
	}
	tok, err := devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{Ttl: durationpb.New(10 * time.Minute)})
	if err != nil {
		return fmt.Errorf("enrollment token: %w", err)
	}
	if _, err := edge.Enroll(ctx, edge.EnrollConfig{API: srv.GRPCAddr(), CAPEM: srv.CACertPEM(), Token: tok.GetToken(),
		DataDir: dir, DeviceID: id}); err != nil {
		return err
	}
	return nil
}

// dpConfig is the task's DP settings for cfg.DP, with an ε target that the
// task's rounds spend exactly.
func dpConfig(cfg Config) (*pb.DPConfig, error) {
	var c *pb.DPConfig
	switch cfg.DP {
	case "", "none":
		return nil, nil
	case "central":
		c = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN}
	case "distributed":
		c = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN}
	default:
		return nil, fmt.Errorf("--dp %q: want none, central or distributed", cfg.DP)
	}
	c.ClipNorm, c.NoiseMultiplier, c.Delta = cfg.ClipNorm, cfg.NoiseMultiplier, cfg.DPDelta
	eps, err := demoEpsilon(cfg)
	if err != nil {
		return nil, err
	}
	c.TargetEpsilon = eps * (1 + 1e-9)
	return c, nil
}

// mlpParams is the size of the demo's 784-128-10 MLP.
const mlpParams = 784*128 + 128 + 128*10 + 10

// demoEpsilon is the ε the demo's rounds spend under cfg's DP settings.
func demoEpsilon(cfg Config) (float64, error) {
	if cfg.DP == "distributed" {
		dist, err := dp.NewDistributed(dp.DiscreteGaussian, mlpParams, 32, max(1, cfg.Cohort*3/4), cfg.ClipNorm, cfg.NoiseMultiplier)
		if err != nil {
			return 0, err
		}
		return dist.Epsilon(cfg.Rounds, cfg.DPDelta)
	}
	return dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: cfg.NoiseMultiplier, Steps: cfg.Rounds}}, cfg.DPDelta)
}

// dropout decides, the same way for a device and round in every run, whether
// the device vanishes from a secure round after uploading its keys.
func dropout(seed uint64, device string, p float64) func(string, uint64, string) bool {
	return func(task string, round uint64, stage string) bool {
		if stage != edge.DropAfterAdvertise {
			return false
		}
		h := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%s/%d", seed, device, task, round))
		return float64(binary.BigEndian.Uint64(h[:8])>>11)/(1<<53) < p
	}
}

func writeResults(dir string, res *Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := atomicfile.Create(filepath.Join(dir, "results.csv"), 0o644)
	if err != nil {
		return err
	}
	defer f.Abort()
	w := csv.NewWriter(f)
	w.Write([]string{"round", "accuracy", "loss", "reports", "dropped", "seconds"})
	w.Write([]string{"0", strconv.FormatFloat(res.BaseAccuracy, 'f', 6, 64), "", "", "", ""})
	for _, r := range res.Rounds {
		w.Write([]string{strconv.FormatUint(r.Round, 10), strconv.FormatFloat(r.Accuracy, 'f', 6, 64),
			strconv.FormatFloat(r.Loss, 'f', 6, 64), strconv.Itoa(int(r.Reports)), strconv.Itoa(int(r.Dropped)),
			strconv.FormatFloat(r.Elapsed.Seconds(), 'f', 3, 64)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	if err := f.Commit(); err != nil {
		return err
	}
	return plotAccuracy(filepath.Join(dir, "accuracy.png"), res)
}

// orMNIST returns train and test, or MNIST's training and test sets when
// train is nil (the experiments' tests give small datasets of their own).
func orMNIST(train, test *data.Dataset) (*data.Dataset, *data.Dataset, error) {
	if train != nil {
		return train, test, nil
	}
	dir, err := data.MNISTDir()
	if err != nil {
		return nil, nil, err
	}
	return data.LoadMNIST(dir)
}
