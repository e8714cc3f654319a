package demo

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/round"
)

// FedBuffConfig sizes the sync-vs-async comparison: one simulated fleet,
// one data split, one initial model and one set of device speeds, trained
// once with synchronous FedAvg rounds and once with FedBuff's buffered
// asynchronous aggregation, each until it has started Budget local
// trainings.
//
// Every training a device starts takes a time drawn from its speed class:
// BaseTime for the fast devices, SlowFactor·BaseTime for the
// SlowFraction that are slow, each times a uniform jitter in
// [1−Jitter, 1+Jitter] drawn from (Seed, device, the device's training
// count), so a device's n-th training takes the same time in both modes.
// The SilentFraction of devices accept work and never report. Devices are
// always online: a device not training is available at once.
type FedBuffConfig struct {
	// Population is the number of simulated devices; MNIST's 60,000
	// training images are split among them.
	Population int
	// Alpha is the Dirichlet label-skew concentration of the split
	// (data.Dirichlet); 0 splits IID (data.IID, equal shares).
	Alpha float64
	Seed  uint64
	// Sizes are the MLP's layer sizes, 784 first and 10 last.
	Sizes []int
	// Hyper is one local training, the same work in both modes.
	Hyper sgd.Hyper

	// BaseTime is a fast device's virtual time for one training: model
	// download, local training and upload.
	BaseTime time.Duration
	// Jitter scales each training's time by a uniform draw in
	// [1−Jitter, 1+Jitter]; in [0, 1).
	Jitter float64
	// SlowFraction of the devices take SlowFactor times as long;
	// SilentFraction take a seat and never report. The classes are a
	// seeded draw, the same in both modes.
	SlowFraction, SlowFactor, SilentFraction float64

	// Budget is the compute budget: local trainings started, per mode
	// (sync starts whole cohorts, so a multiple of Cohort is spent
	// exactly). A training counts when it starts, whether it reports, is
	// dropped, goes stale or never ends.
	Budget int

	// Sync: FedAvg rounds as round.Plain.Decide closes them. Each round
	// seats Cohort devices (M) drawn uniformly from the population and
	// closes at once when CohortTarget (T) have reported, when every
	// seated device has reported (with at least ReportGoal reports), or at
	// the report Deadline (D) after its start: it commits with the reports
	// in if they reach ReportGoal (G), else it is abandoned. Devices still
	// training at the close are dropped (told at once, they stop) and the
	// next round starts at the close.
	Cohort, CohortTarget, ReportGoal int
	Deadline                         time.Duration
	// SyncLR is the server learning rate on the round's example-weighted
	// mean update; SyncMomentum, when not 0, makes it FedAvgM.
	SyncLR, SyncMomentum float64

	// Async: FedBuff driven by round.Async. Concurrency (C) devices train
	// at once, each on the version current when it checked in; every
	// Buffer (K) reports the server steps; a seat more than MaxStaleness
	// (S) versions behind is freed at the step (the device is told and
	// stops); a seat held past Timeout is freed (round.Async.Expired).
	Concurrency, Buffer int
	MaxStaleness        uint64
	Timeout             time.Duration
	// AsyncLR is the server learning rate η: each step adds η times
	// FedBuff's step as the service takes it (aggregator.Staleness),
	// Σ sₖwₖΔₖ / Σ wₖ, wₖ the examples and sₖ = round.StalenessWeight.
	// AsyncMomentum, when not 0, adds server momentum (FedAvgM on that
	// step); 0 is plain SGD.
	AsyncLR, AsyncMomentum float64

	// Target is the test accuracy whose first reach is timed.
	Target float64
	// EvalInterval spaces the evaluations in virtual time, alike in both
	// modes: a committed version is evaluated when EvalInterval has passed
	// since the last evaluation (0: every version); the initial and the
	// last version always are. Sync commits about every BaseTime, so at a
	// BaseTime or less it evaluates every round.
	EvalInterval time.Duration
	// Only runs one mode, "sync" or "async", for tuning grids; "" runs
	// both. StopAtTarget ends a mode when it first reaches Target, also
	// for grids. OutDir is written only for a whole run of both modes.
	Only         string
	StopAtTarget bool
	// Workers train devices in parallel; 0 is GOMAXPROCS. The result does
	// not depend on it.
	Workers int
	// OutDir receives results.csv, curve.csv and accuracy.png; "" writes
	// nothing.
	OutDir string
	// Out receives one line per finished mode; nil discards them.
	Out io.Writer
	// Train and Test replace MNIST, for tests; both nil loads MNIST.
	Train, Test *data.Dataset
}

// FedBuffDefaults are the full experiment's settings: 2,000 devices with 30
// MNIST images each (IID), a 784→128→10 MLP, two local epochs of batch 10
// at LR 0.05 per training, fast devices taking 1 min ±25%, 10% taking 10×
// longer and 2% never reporting; 40,000 trainings started per mode. Each
// mode's own settings are its fastest point to 96% on the grid of
// TestFedBuffGrid (docs/bench/fedbuff/README.md): sync seats M = 400,
// closes at T = 200 reports (goal 160, deadline 90 s) and steps with
// FedAvgM, η = 5, β = 0.9; async trains C = 130 at once, steps every K =
// 10 reports with η = 2 on the service's FedBuff step, S = 100, seats
// expiring after 15 min.
var FedBuffDefaults = FedBuffConfig{
	Population: 2000, Seed: 1,
	Sizes:    []int{784, 128, 10},
	Hyper:    sgd.Hyper{Epochs: 2, BatchSize: 10, LearningRate: 0.05, EvalBatchSize: 1000},
	BaseTime: time.Minute, Jitter: 0.25,
	SlowFraction: 0.10, SlowFactor: 10, SilentFraction: 0.02,
	Budget: 40000,
	Cohort: 400, CohortTarget: 200, ReportGoal: 160, Deadline: 90 * time.Second,
	SyncLR: 5, SyncMomentum: 0.9,
	Concurrency: 130, Buffer: 10, MaxStaleness: 100, Timeout: 15 * time.Minute,
	AsyncLR: 2,
	Target:  0.96, EvalInterval: time.Minute,
}

// FedBuffPoint is the test accuracy of one committed version.
type FedBuffPoint struct {
	Time     time.Duration // virtual time of the commit
	Version  int           // rounds or server steps committed so far
	Started  int           // local trainings started so far
	Accuracy float64
}

// FedBuffRun is one mode's run.
type FedBuffRun struct {
	Mode string // "sync" or "async"
	// Reached says the Target was reached; TimeToTarget is the virtual
	// time of the first evaluated version at or above it, and
	// TrainingsToTarget and BytesToTarget (mean per device) what had been
	// spent by then.
	Reached           bool
	TimeToTarget      time.Duration
	TrainingsToTarget int
	BytesToTarget     float64
	// HeldFrom is the virtual time from which every evaluation is at or
	// above Target (0 when the last is below): a check on TimeToTarget
	// against a lucky evaluation.
	HeldFrom time.Duration
	// FinalAccuracy is the last version's; FinalTime its commit time.
	FinalAccuracy float64
	FinalTime     time.Duration
	// Versions are the committed rounds (sync) or server steps (async);
	// Abandoned the sync rounds closed below the report goal.
	Versions, Abandoned int
	// Started trainings (the budget spent), Completed ones (the device
	// finished and uploaded its update) and Used ones (folded into a
	// committed version). Started − Used are wasted: Dropped (sync: still
	// training at their round's close, or in an abandoned round), Stale
	// (async: freed at a step more than MaxStaleness behind, or refused as
	// stale), Expired (async: seat timed out), Unused (async: in the last,
	// partial buffer) and Silent (never-reporting devices' seats, a part
	// of Dropped or Expired).
	Started, Completed, Used                     int
	Dropped, Stale, Expired, Unused, SilentSeats int
	// MeanStaleness and MaxStalenessSeen describe the reports folded
	// (async; 0 for sync).
	MeanStaleness    float64
	MaxStalenessSeen uint64
	// BytesMean and BytesMax are each device's traffic over the run,
	// mean and max over the population: the model downloaded for every
	// training started and the update uploaded for every training
	// completed, 4 bytes a parameter each way.
	BytesMean, BytesMax float64
	Points              []FedBuffPoint
	Elapsed             time.Duration // wall time
}

// FedBuffResult is the comparison.
type FedBuffResult struct {
	Sync, Async FedBuffRun
	// Speedup is sync's TimeToTarget over async's; 0 unless both reached
	// the target.
	Speedup float64
	// Params is the model's parameter count; ModelBytes 4·Params.
	Params, ModelBytes int
}

// FedBuff trains the fleet both ways and writes the tables and plot to
// cfg.OutDir. It is an in-process simulation of the rounds' arithmetic in
// virtual time with the native trainer: no server, network or secure
// aggregation; the round and async decisions are the round engine's
// (round.Plain, round.Async) and the server steps the aggregator's. The
// result depends on cfg alone, not on Workers. Its errors start with
// "demo: fedbuff: ".
func FedBuff(ctx context.Context, cfg FedBuffConfig) (*FedBuffResult, error) {
	res, err := fedBuff(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("demo: fedbuff: %w", err)
	}
	return res, nil
}

func fedBuff(ctx context.Context, cfg FedBuffConfig) (*FedBuffResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	trainSet, testSet, err := orMNIST(cfg.Train, cfg.Test)
	if err != nil {
		return nil, err
	}
	fl, err := newFleet(cfg, trainSet, testSet)
	if err != nil {
		return nil, err
	}
	res := &FedBuffResult{Params: fl.dim, ModelBytes: 4 * fl.dim}
	for _, mode := range []string{"sync", "async"} {
		if cfg.Only != "" && cfg.Only != mode {
			continue
		}
		start := time.Now()
		r, err := fl.run(ctx, mode)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		r.Elapsed = time.Since(start)
		reached := "not reached"
		if r.Reached {
			reached = fmt.Sprintf("at %s", fbMinutes(r.TimeToTarget))
		}
		fmt.Fprintf(cfg.Out, "fedbuff: %-5s %.2f%% %s; final %.2f%% at %s, %d versions, %d/%d/%d started/completed/used (%s)\n",
			mode, 100*cfg.Target, reached, 100*r.FinalAccuracy, fbMinutes(r.FinalTime), r.Versions, r.Started, r.Completed,
			r.Used, r.Elapsed.Round(time.Second))
		if mode == "sync" {
			res.Sync = r
		} else {
			res.Async = r
		}
	}
	if res.Sync.Reached && res.Async.Reached && res.Async.TimeToTarget > 0 {
		res.Speedup = float64(res.Sync.TimeToTarget) / float64(res.Async.TimeToTarget)
	}
	if cfg.OutDir != "" {
		if err := writeFedBuff(cfg, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (cfg *FedBuffConfig) validate() error {
	switch {
	case cfg.Population < 1:
		return fmt.Errorf("population %d, want ≥ 1", cfg.Population)
	case cfg.Alpha < 0:
		return fmt.Errorf("alpha %v, want 0 (IID) or > 0", cfg.Alpha)
	case len(cfg.Sizes) < 2:
		return fmt.Errorf("model sizes %v, want input, hidden…, classes", cfg.Sizes)
	case cfg.BaseTime <= 0:
		return fmt.Errorf("base time %v, want > 0", cfg.BaseTime)
	case !(cfg.Jitter >= 0 && cfg.Jitter < 1):
		return fmt.Errorf("jitter %v, want [0, 1)", cfg.Jitter)
	case !(cfg.SlowFraction >= 0 && cfg.SilentFraction >= 0 && cfg.SlowFraction+cfg.SilentFraction <= 1):
		return fmt.Errorf("slow %v and silent %v fractions, want ≥ 0 and at most 1 together", cfg.SlowFraction, cfg.SilentFraction)
	case !(cfg.SlowFactor >= 1) || math.IsInf(cfg.SlowFactor, 0):
		return fmt.Errorf("slow factor %v, want a finite value ≥ 1", cfg.SlowFactor)
	case cfg.Budget < 1:
		return fmt.Errorf("budget %d trainings, want ≥ 1", cfg.Budget)
	case cfg.Cohort < 1 || cfg.Cohort > cfg.Population || cfg.Cohort > cfg.Budget:
		return fmt.Errorf("cohort %d, want 1..min(population %d, budget %d)", cfg.Cohort, cfg.Population, cfg.Budget)
	case cfg.CohortTarget < 1 || cfg.CohortTarget > cfg.Cohort:
		return fmt.Errorf("cohort target %d, want 1..cohort %d", cfg.CohortTarget, cfg.Cohort)
	case cfg.ReportGoal < 1 || cfg.ReportGoal > cfg.CohortTarget:
		return fmt.Errorf("report goal %d, want 1..cohort target %d", cfg.ReportGoal, cfg.CohortTarget)
	case cfg.Deadline <= 0 || cfg.Timeout <= 0:
		return fmt.Errorf("deadline %v and timeout %v, want > 0", cfg.Deadline, cfg.Timeout)
	case !(cfg.SyncLR > 0) || !(cfg.AsyncLR > 0) || math.IsInf(cfg.SyncLR, 0) || math.IsInf(cfg.AsyncLR, 0):
		return fmt.Errorf("server learning rates %v (sync) and %v (async), want finite values > 0", cfg.SyncLR, cfg.AsyncLR)
	case !(cfg.SyncMomentum >= 0 && cfg.SyncMomentum < 1) || !(cfg.AsyncMomentum >= 0 && cfg.AsyncMomentum < 1):
		return fmt.Errorf("server momentum %v (sync) and %v (async), want [0, 1)", cfg.SyncMomentum, cfg.AsyncMomentum)
	case cfg.Concurrency >= cfg.Population:
		// Leave devices to draw from: a device whose report is buffered
		// waits for the step.
		return fmt.Errorf("concurrency %d, want below the population %d", cfg.Concurrency, cfg.Population)
	case !(cfg.Target > 0 && cfg.Target <= 1):
		return fmt.Errorf("target accuracy %v, want (0, 1]", cfg.Target)
	case cfg.EvalInterval < 0:
		return fmt.Errorf("eval interval %v, want ≥ 0", cfg.EvalInterval)
	case cfg.Only != "" && cfg.Only != "sync" && cfg.Only != "async":
		return fmt.Errorf("only %q, want sync, async or both (\"\")", cfg.Only)
	case cfg.OutDir != "" && (cfg.Only != "" || cfg.StopAtTarget):
		return errors.New("an output directory needs whole runs of both modes")
	case (cfg.Train == nil) != (cfg.Test == nil):
		return errors.New("give both train and test sets, or neither")
	}
	if err := (round.AsyncConfig{Concurrency: cfg.Concurrency, Buffer: cfg.Buffer, MaxStaleness: cfg.MaxStaleness}).Validate(); err != nil {
		return err
	}
	return cfg.Hyper.Validate()
}

// Device speed classes.
const (
	fbFast = iota
	fbSlow
	fbSilent
)

// fleet is what both modes share: devices' data and speeds, the initial
// model, the test set.
type fleet struct {
	cfg      FedBuffConfig
	devices  []*data.Dataset
	names    []string
	index    map[string]int // inverts names
	class    []int
	test     *data.Dataset
	init     []float32
	layout   model.Layout
	dim      int
	workers  int
	evalRows int
}

func newFleet(cfg FedBuffConfig, trainSet, testSet *data.Dataset) (*fleet, error) {
	if cfg.Sizes[0] != trainSet.Dim || cfg.Sizes[len(cfg.Sizes)-1] != trainSet.NumClasses {
		return nil, fmt.Errorf("model sizes %v do not fit %d features and %d classes", cfg.Sizes, trainSet.Dim, trainSet.NumClasses)
	}
	var parts [][]int
	var err error
	if cfg.Alpha == 0 {
		parts, err = data.IID(trainSet.Len(), cfg.Population, cfg.Seed)
	} else {
		parts, err = data.Dirichlet(trainSet.Labels, trainSet.NumClasses, cfg.Population, cfg.Alpha, cfg.Seed)
	}
	if err != nil {
		return nil, err
	}
	f := &fleet{cfg: cfg, devices: make([]*data.Dataset, len(parts)), names: make([]string, len(parts)), index: map[string]int{},
		class: make([]int, len(parts)), test: testSet, evalRows: max(1, cfg.Hyper.EvalBatchSize)}
	for i, idx := range parts {
		f.devices[i] = trainSet.Subset(idx)
		f.names[i] = fmt.Sprintf("dev%05d", i)
		f.index[f.names[i]] = i
	}
	// Speed classes are a seeded shuffle, so that no class inherits an
	// ordering the partitioner may leave in device indices.
	perm := rand.New(rand.NewPCG(cfg.Seed, 0x7370656564)).Perm(cfg.Population)
	silent := int(math.Round(cfg.SilentFraction * float64(cfg.Population)))
	slow := int(math.Round(cfg.SlowFraction * float64(cfg.Population)))
	for i, d := range perm {
		switch {
		case i < silent:
			f.class[d] = fbSilent
		case i < silent+slow:
			f.class[d] = fbSlow
		}
	}
	init, err := train.InitMLP(cfg.Sizes, cfg.Seed)
	if err != nil {
		return nil, err
	}
	f.init, f.layout, f.dim = init.Flatten(), init.Layout(), init.Layout().Size()
	f.workers = cfg.Workers
	if f.workers <= 0 {
		f.workers = runtime.GOMAXPROCS(0)
	}
	return f, nil
}

// fbMix is SplitMix64's finalizer over a, b and c: seeds for draws that
// depend on (seed, device, training) alone.
func fbMix(a, b, c uint64) uint64 {
	z := a ^ (b+0x9e3779b97f4a7c15)*0xbf58476d1ce4e5b9 ^ (c+0x632be59bd9b4e019)*0x94d049bb133111eb
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// duration is how long device d's n-th training takes; false for a
// device that never reports.
func (f *fleet) duration(d, n int) (time.Duration, bool) {
	factor := 1.0
	switch f.class[d] {
	case fbSilent:
		return 0, false
	case fbSlow:
		factor = f.cfg.SlowFactor
	}
	u := float64(fbMix(f.cfg.Seed, uint64(d), uint64(n)^0x6a6974746572)>>11) / (1 << 53)
	j := 1 + f.cfg.Jitter*(2*u-1)
	return time.Duration(factor * j * float64(f.cfg.BaseTime)), true
}

// version is a committed model: the vector devices' updates are taken
// against and the model they train from.
type version struct {
	f      *fleet
	n      int
	global []float32
	model  *model.Model
}

func (f *fleet) snapshot(n int, global []float32) (*version, error) {
	m, err := f.layout.Unflatten(global)
	if err != nil {
		return nil, err
	}
	return &version{f: f, n: n, global: slices.Clone(global), model: m}, nil
}

// begin starts a mode's run from the initial model: the vector it steps,
// and version 0, evaluated.
func (f *fleet) begin(s *runState) ([]float32, *version, error) {
	global := slices.Clone(f.init)
	cur, err := f.snapshot(0, global)
	if err != nil {
		return nil, nil, err
	}
	if err := s.evaluate(cur, 0); err != nil {
		return nil, nil, err
	}
	return global, cur, nil
}

// runState is one mode's bookkeeping: the counters of FedBuffRun, each
// device's trainings and bytes.
type runState struct {
	f        *fleet
	run      FedBuffRun
	count    []int   // trainings each device has started
	bytes    []int64 // each device's traffic
	stSum    float64 // staleness of the folded reports
	lastEval int     // the version last evaluated
	evalAt   time.Duration
}

// start counts device d's next training and its model download, and
// returns its index n and duration.
func (s *runState) start(d int) (n int, dur time.Duration, reports bool) {
	n = s.count[d]
	s.count[d]++
	s.run.Started++
	s.bytes[d] += int64(4 * s.f.dim)
	if s.f.class[d] == fbSilent {
		s.run.SilentSeats++
	}
	dur, reports = s.f.duration(d, n)
	return n, dur, reports
}

// complete counts device d's upload.
func (s *runState) complete(d int) {
	s.run.Completed++
	s.bytes[d] += int64(4 * s.f.dim)
}

// meanBytes is the mean traffic per device so far.
func (s *runState) meanBytes() float64 {
	var sum int64
	for _, b := range s.bytes {
		sum += b
	}
	return float64(sum) / float64(len(s.bytes))
}

// evaluate measures v at virtual time now and records the first reach of
// the target.
func (s *runState) evaluate(v *version, now time.Duration) error {
	met, err := train.Evaluate(v.model, s.f.test, s.f.evalRows)
	if err != nil {
		return err
	}
	if math.IsNaN(met.Loss) {
		return fmt.Errorf("version %d: %w", v.n, train.ErrDiverged)
	}
	s.lastEval, s.evalAt = v.n, now
	s.run.Points = append(s.run.Points, FedBuffPoint{Time: now, Version: v.n, Started: s.run.Started, Accuracy: met.Accuracy})
	if !s.run.Reached && met.Accuracy >= s.f.cfg.Target {
		s.run.Reached, s.run.TimeToTarget = true, now
		s.run.TrainingsToTarget, s.run.BytesToTarget = s.run.Started, s.meanBytes()
	}
	return nil
}

// committed records version v, committed at now, and evaluates it when
// due. It reports whether the mode is done: StopAtTarget and the target
// reached.
func (s *runState) committed(v *version, now time.Duration) (bool, error) {
	s.run.Versions, s.run.FinalTime = v.n, now
	if now-s.evalAt >= s.f.cfg.EvalInterval {
		if err := s.evaluate(v, now); err != nil {
			return false, err
		}
	}
	return s.f.cfg.StopAtTarget && s.run.Reached, nil
}

// finish evaluates the last version if it was not, and fills in the
// summary figures.
func (s *runState) finish(v *version, now time.Duration) (FedBuffRun, error) {
	if s.lastEval != v.n || len(s.run.Points) == 0 {
		if err := s.evaluate(v, now); err != nil {
			return FedBuffRun{}, err
		}
	}
	r := &s.run
	last := r.Points[len(r.Points)-1]
	r.FinalAccuracy = last.Accuracy
	r.HeldFrom = 0
	for i := len(r.Points) - 1; i >= 0 && r.Points[i].Accuracy >= s.f.cfg.Target; i-- {
		r.HeldFrom = r.Points[i].Time
	}
	r.BytesMean = s.meanBytes()
	r.BytesMax = float64(slices.Max(s.bytes))
	if r.Used > 0 && r.Mode == "async" {
		r.MeanStaleness = s.stSum / float64(r.Used+r.Unused)
	}
	return *r, nil
}

func (f *fleet) run(ctx context.Context, mode string) (FedBuffRun, error) {
	s := &runState{f: f, run: FedBuffRun{Mode: mode}, count: make([]int, len(f.devices)), bytes: make([]int64, len(f.devices))}
	p := newTrainPool(f.workers)
	defer p.close()
	if mode == "sync" {
		return f.runSync(ctx, s, p)
	}
	return f.runAsync(ctx, s, p)
}

// runSync trains with FedAvg rounds: each seats M devices, closes as
// round.Plain.Decide says, and steps the model with the aggregator's
// FedAvg (or FedAvgM) on the example-weighted mean of the reports in.
func (f *fleet) runSync(ctx context.Context, s *runState, p *trainPool) (FedBuffRun, error) {
	cfg := f.cfg
	rule, err := serverRule(f.dim, cfg.SyncLR, cfg.SyncMomentum)
	if err != nil {
		return FedBuffRun{}, err
	}
	global, cur, err := f.begin(s)
	if err != nil {
		return FedBuffRun{}, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x73796e63))
	perm := make([]int, len(f.devices))
	for i := range perm {
		perm[i] = i
	}
	type arrival struct {
		at  time.Duration // after the round's start
		dev int
		job *trainJob
	}
	var now time.Duration
	for s.run.Started+cfg.Cohort <= cfg.Budget {
		if err := ctx.Err(); err != nil {
			return FedBuffRun{}, err
		}
		// Every device is free at a round's start: the last close dropped
		// whoever was still training. Seat M of them uniformly.
		var arr []arrival
		for i := 0; i < cfg.Cohort; i++ {
			j := i + rng.IntN(len(perm)-i)
			perm[i], perm[j] = perm[j], perm[i]
			d := perm[i]
			n, dur, reports := s.start(d)
			if reports {
				arr = append(arr, arrival{at: dur, dev: d, job: &trainJob{dev: d, n: n}})
			}
		}
		slices.SortFunc(arr, func(a, b arrival) int {
			if a.at != b.at {
				return cmp.Compare(a.at, b.at)
			}
			return a.dev - b.dev
		})
		// The close: after each report by the deadline, then at it.
		plain := round.Plain{CohortTarget: cfg.CohortTarget, ReportGoal: cfg.ReportGoal, Assigned: cfg.Cohort}
		outcome, closeAt, in := round.Wait, cfg.Deadline, 0
		for _, a := range arr {
			if a.at > cfg.Deadline {
				break
			}
			in++
			plain.Reported, plain.Settled = in, in
			if o, _, _ := plain.Decide(); o != round.Wait {
				outcome, closeAt = o, a.at
				break
			}
		}
		if outcome == round.Wait {
			plain.DeadlinePassed = true
			outcome, _, _ = plain.Decide()
		}
		now += closeAt
		for _, a := range arr[:in] {
			s.complete(a.dev)
		}
		if outcome != round.Commit {
			s.run.Abandoned++
			s.run.Dropped += cfg.Cohort
			continue
		}
		s.run.Dropped += cfg.Cohort - in
		for _, a := range arr[:in] {
			a.job.from, a.job.due = cur, now-closeAt+a.at
			p.submit(a.job)
		}
		c, err := rule.NewCollector(0)
		if err != nil {
			return FedBuffRun{}, err
		}
		// Summed in arrival order, after the parallel part, so the result
		// does not depend on which worker finished first.
		for _, a := range arr[:in] {
			delta, err := a.job.wait()
			if err != nil {
				return FedBuffRun{}, err
			}
			if err := c.Add(delta, float64(f.devices[a.dev].Len())); err != nil {
				return FedBuffRun{}, err
			}
		}
		agg, err := c.Aggregate()
		if err != nil {
			return FedBuffRun{}, err
		}
		if err := rule.Apply(global, agg); err != nil {
			return FedBuffRun{}, err
		}
		s.run.Used += in
		if cur, err = f.snapshot(cur.n+1, global); err != nil {
			return FedBuffRun{}, err
		}
		if done, err := s.committed(cur, now); err != nil || done {
			if err != nil {
				return FedBuffRun{}, err
			}
			break
		}
	}
	return s.finish(cur, now)
}

// serverRule is the aggregator's FedAvg with server learning rate lr, or
// FedAvgM with momentum β when β > 0.
func serverRule(dim int, lr, beta float64) (aggregator.Rule, error) {
	if beta > 0 {
		return aggregator.NewRule(aggregator.FedAvgM, dim, aggregator.WithServerLR(lr), aggregator.WithMomentum(beta))
	}
	return aggregator.NewRule(aggregator.FedAvg, dim, aggregator.WithServerLR(lr))
}

// Async events.
const (
	evReport = iota // a device finishes its training and uploads
	evExpiry        // a seat's timeout passes
)

type fbEvent struct {
	at   time.Duration
	seq  uint64 // ties break in the order events were made
	kind int
	dev  int
	job  *trainJob // evReport: the training reported
}

type fbEvents []fbEvent

func (h fbEvents) Len() int { return len(h) }
func (h fbEvents) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h fbEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *fbEvents) Push(x any)   { *h = append(*h, x.(fbEvent)) }
func (h *fbEvents) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// runAsync trains with FedBuff, every decision round.Async's: who gets a
// seat (Offer), which reports the buffer takes and with what weight
// (Report), the step (Full, Step, which frees the seats now too stale),
// and the seats given up at the timeout (Expired, Release).
func (f *fleet) runAsync(ctx context.Context, s *runState, p *trainPool) (FedBuffRun, error) {
	cfg := f.cfg
	a, err := round.NewAsync(round.AsyncConfig{Concurrency: cfg.Concurrency, Buffer: cfg.Buffer, MaxStaleness: cfg.MaxStaleness}, 0)
	if err != nil {
		return FedBuffRun{}, err
	}
	rule, err := serverRule(f.dim, cfg.AsyncLR, cfg.AsyncMomentum)
	if err != nil {
		return FedBuffRun{}, err
	}
	col, err := rule.NewCollector(0)
	if err != nil {
		return FedBuffRun{}, err
	}
	coll := aggregator.NewStaleness(col)
	global, cur, err := f.begin(s)
	if err != nil {
		return FedBuffRun{}, err
	}
	// Virtual time t is the instant epoch+t for the engine.
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6173796e63))
	var events fbEvents
	var seq uint64
	push := func(e fbEvent) {
		seq++
		e.seq = seq
		heap.Push(&events, e)
	}
	training := map[int]*trainJob{} // each seated device's training
	stop := func(d int) {
		if j := training[d]; j != nil {
			j.cancel()
		}
		delete(training, d)
	}
	var now time.Duration
	// fill seats devices drawn uniformly from those free while fewer than
	// C train and the budget lasts.
	fill := func() {
		for a.Training() < cfg.Concurrency && s.run.Started < cfg.Budget {
			seated := false
			for try := 0; try < 1000 && !seated; try++ {
				d := rng.IntN(len(f.devices))
				if _, ok := a.Seat(f.names[d]); ok {
					continue
				}
				o := a.Offer(f.names[d], uint64(f.devices[d].Len()), epoch.Add(now))
				if o.Action != round.Reserve {
					continue // its report is in the buffer: it waits for the step
				}
				seated = true
				n, dur, reports := s.start(d)
				push(fbEvent{at: now + cfg.Timeout + 1, kind: evExpiry, dev: d})
				if !reports {
					training[d] = nil
					continue
				}
				j := &trainJob{dev: d, n: n, from: cur, due: now + dur}
				training[d] = j
				p.submit(j)
				push(fbEvent{at: now + dur, kind: evReport, dev: d, job: j})
			}
			if !seated {
				return
			}
		}
	}
	fill()
	lastCommit := time.Duration(0)
	for events.Len() > 0 {
		if err := ctx.Err(); err != nil {
			return FedBuffRun{}, err
		}
		e := heap.Pop(&events).(fbEvent)
		now = e.at
		switch e.kind {
		case evExpiry:
			for _, name := range a.Expired(epoch.Add(now), cfg.Timeout) {
				d := f.index[name]
				a.Release(name)
				stop(d)
				s.run.Expired++
			}
		case evReport:
			if training[e.dev] != e.job {
				continue // its seat was freed: the device was told and stopped
			}
			delete(training, e.dev)
			s.complete(e.dev)
			b, err := a.Report(f.names[e.dev], uint64(e.job.from.n))
			if err != nil {
				var r *round.Refusal
				if errors.As(err, &r) && r.Class == round.ClassStale {
					s.run.Stale++
					break
				}
				return FedBuffRun{}, err
			}
			delta, err := e.job.wait()
			if err != nil {
				return FedBuffRun{}, err
			}
			if err := coll.Add(delta, float64(f.devices[e.dev].Len()), b.Weight); err != nil {
				return FedBuffRun{}, err
			}
			s.stSum += float64(b.Staleness)
			s.run.MaxStalenessSeen = max(s.run.MaxStalenessSeen, b.Staleness)
			if !a.Full() {
				break
			}
			agg, err := coll.Aggregate()
			if err != nil {
				return FedBuffRun{}, err
			}
			if err := rule.Apply(global, agg); err != nil {
				return FedBuffRun{}, err
			}
			stale, err := a.Step()
			if err != nil {
				return FedBuffRun{}, err
			}
			for _, name := range stale {
				stop(f.index[name])
				s.run.Stale++
			}
			s.run.Used += cfg.Buffer
			if col, err = rule.NewCollector(0); err != nil {
				return FedBuffRun{}, err
			}
			coll = aggregator.NewStaleness(col)
			if cur, err = f.snapshot(cur.n+1, global); err != nil {
				return FedBuffRun{}, err
			}
			lastCommit = now
			done, err := s.committed(cur, now)
			if err != nil {
				return FedBuffRun{}, err
			}
			if done {
				return s.finish(cur, lastCommit)
			}
		}
		fill()
	}
	s.run.Unused = coll.Count()
	return s.finish(cur, lastCommit)
}

// trainJob is one local training: device dev's n-th, from version from,
// due (reported) at virtual time due.
type trainJob struct {
	dev, n int
	from   *version
	due    time.Duration
	seq    uint64

	mu        sync.Mutex
	cancelled bool
	done      chan struct{}
	delta     []float32
	err       error
}

func (j *trainJob) cancel() {
	j.mu.Lock()
	j.cancelled = true
	j.mu.Unlock()
}

func (j *trainJob) wait() ([]float32, error) {
	<-j.done
	return j.delta, j.err
}

// trainPool trains jobs on a fixed number of goroutines, the earliest due
// first: the simulation waits for reports in virtual-time order.
type trainPool struct {
	mu   sync.Mutex
	cond *sync.Cond
	q    jobQueue
	seq  uint64
	shut bool
	wg   sync.WaitGroup
}

type jobQueue []*trainJob

func (q jobQueue) Len() int { return len(q) }
func (q jobQueue) Less(i, j int) bool {
	if q[i].due != q[j].due {
		return q[i].due < q[j].due
	}
	return q[i].seq < q[j].seq
}
func (q jobQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *jobQueue) Push(x any)   { *q = append(*q, x.(*trainJob)) }
func (q *jobQueue) Pop() any {
	old := *q
	j := old[len(old)-1]
	*q = old[:len(old)-1]
	return j
}

func newTrainPool(workers int) *trainPool {
	p := &trainPool{}
	p.cond = sync.NewCond(&p.mu)
	for range workers {
		p.wg.Add(1)
		go p.work()
	}
	return p
}

func (p *trainPool) submit(j *trainJob) {
	j.done = make(chan struct{})
	p.mu.Lock()
	p.seq++
	j.seq = p.seq
	heap.Push(&p.q, j)
	p.mu.Unlock()
	p.cond.Signal()
}

func (p *trainPool) work() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		for p.q.Len() == 0 && !p.shut {
			p.cond.Wait()
		}
		if p.shut {
			p.mu.Unlock()
			return
		}
		j := heap.Pop(&p.q).(*trainJob)
		p.mu.Unlock()
		j.mu.Lock()
		skip := j.cancelled
		j.mu.Unlock()
		if !skip {
			j.delta, j.err = j.run()
		}
		close(j.done)
	}
}

func (p *trainPool) close() {
	p.mu.Lock()
	p.shut = true
	p.mu.Unlock()
	p.cond.Broadcast()
	p.wg.Wait()
}

// run trains the job's device from its version and returns the update
// (trained − version). The shuffle seed depends on the seed, the device
// and its training count only, not on the worker.
func (j *trainJob) run() ([]float32, error) {
	f := j.from.f
	trained, _, err := train.Train(j.from.model, f.devices[j.dev], f.cfg.Hyper, fbMix(f.cfg.Seed, uint64(j.dev), uint64(j.n)))
	if err != nil {
		return nil, fmt.Errorf("device %d training %d: %w", j.dev, j.n, err)
	}
	u := trained.Flatten()
	for i := range u {
		u[i] -= j.from.global[i]
	}
	return u, nil
}

// fbMinutes formats a virtual time in minutes.
func fbMinutes(d time.Duration) string {
	return strconv.FormatFloat(d.Minutes(), 'f', 1, 64) + " min"
}

// writeFedBuff writes results.csv (one row per mode), curve.csv (every
// evaluation) and accuracy.png.
func writeFedBuff(cfg FedBuffConfig, res *FedBuffResult) error {
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return err
	}
	ff := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	mins := func(d time.Duration) string { return ff(d.Minutes(), 2) }
	mb := func(b float64) string { return ff(b/1e6, 3) }
	head := []string{"mode", "reached", "time_to_target_min", "trainings_to_target", "mb_per_device_to_target", "held_from_min",
		"final_accuracy", "final_time_min", "versions", "abandoned", "started", "completed", "used", "wasted",
		"dropped", "stale", "expired", "unused", "silent_seats", "mean_staleness", "max_staleness",
		"mb_per_device_mean", "mb_per_device_max"}
	rows := [][]string{head}
	for _, r := range []FedBuffRun{res.Sync, res.Async} {
		tt, tn, tb, held := "", "", "", ""
		if r.FinalAccuracy >= cfg.Target {
			held = mins(r.HeldFrom)
		}
		if r.Reached {
			tt, tn, tb = mins(r.TimeToTarget), strconv.Itoa(r.TrainingsToTarget), mb(r.BytesToTarget)
		}
		rows = append(rows, []string{r.Mode, strconv.FormatBool(r.Reached), tt, tn, tb, held,
			ff(r.FinalAccuracy, 4), mins(r.FinalTime), strconv.Itoa(r.Versions), strconv.Itoa(r.Abandoned),
			strconv.Itoa(r.Started), strconv.Itoa(r.Completed), strconv.Itoa(r.Used), strconv.Itoa(r.Started - r.Used),
			strconv.Itoa(r.Dropped), strconv.Itoa(r.Stale), strconv.Itoa(r.Expired), strconv.Itoa(r.Unused),
			strconv.Itoa(r.SilentSeats), ff(r.MeanStaleness, 2), strconv.FormatUint(r.MaxStalenessSeen, 10),
			mb(r.BytesMean), mb(r.BytesMax)})
	}
	if err := writeCSVFile(filepath.Join(cfg.OutDir, "results.csv"), rows); err != nil {
		return err
	}
	rows = [][]string{{"mode", "version", "time_min", "started", "accuracy"}}
	for _, r := range []FedBuffRun{res.Sync, res.Async} {
		for _, p := range r.Points {
			rows = append(rows, []string{r.Mode, strconv.Itoa(p.Version), mins(p.Time), strconv.Itoa(p.Started), ff(p.Accuracy, 4)})
		}
	}
	if err := writeCSVFile(filepath.Join(cfg.OutDir, "curve.csv"), rows); err != nil {
		return err
	}
	return plotFedBuff(filepath.Join(cfg.OutDir, "accuracy.png"), cfg, res)
}

func writeCSVFile(path string, rows [][]string) error {
	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		return err
	}
	defer f.Abort()
	w := csv.NewWriter(f)
	if err := w.WriteAll(rows); err != nil {
		return err
	}
	return f.Commit()
}

// plotFedBuff draws test accuracy against virtual time for both modes,
// with the target as a dashed line.
func plotFedBuff(path string, cfg FedBuffConfig, res *FedBuffResult) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("MNIST, %d devices (%g%% %gx slower, %g%% silent), %d trainings a mode",
		cfg.Population, 100*cfg.SlowFraction, cfg.SlowFactor, 100*cfg.SilentFraction, cfg.Budget)
	p.X.Label.Text = "virtual time (minutes; a fast device trains in " + fbMinutes(cfg.BaseTime) + ")"
	p.Y.Label.Text = "test accuracy (%)"
	p.Add(plotter.NewGrid())
	colors := map[string]color.Color{
		"sync":  color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		"async": color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	}
	var end float64
	lowest := 1.0
	for _, r := range []FedBuffRun{res.Sync, res.Async} {
		xy := make(plotter.XYs, len(r.Points))
		for i, pt := range r.Points {
			xy[i] = plotter.XY{X: pt.Time.Minutes(), Y: 100 * pt.Accuracy}
		}
		end = max(end, r.FinalTime.Minutes())
		lowest = min(lowest, r.FinalAccuracy)
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = colors[r.Mode]
		l.Width = vg.Points(1.2)
		p.Add(l)
		name := fmt.Sprintf("%s: %.2f%% final", r.Mode, 100*r.FinalAccuracy)
		if r.Reached {
			name = fmt.Sprintf("%s: %g%% at %s, %.2f%% final", r.Mode, 100*cfg.Target, fbMinutes(r.TimeToTarget), 100*r.FinalAccuracy)
		}
		p.Legend.Add(name, l)
	}
	target, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 100 * cfg.Target}, {X: end, Y: 100 * cfg.Target}})
	if err != nil {
		return err
	}
	target.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(target)
	p.Legend.Add(fmt.Sprintf("target %g%%", 100*cfg.Target), target)
	// The axis starts 10 points below the target, so that the approach
	// to it stays visible; the first versions lie below.
	p.Y.Min = max(0, min(100*lowest, 100*cfg.Target)-10)
	p.Y.Max = 100
	p.X.Min = 0
	p.Legend.Top = false
	p.Legend.Left = false
	return savePNG(p, path)
}
