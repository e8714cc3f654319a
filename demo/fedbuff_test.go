package demo_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/demo"
	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// smallFedBuff is a fleet of 100 devices on a synthetic 4-class problem:
// milliseconds a run.
func smallFedBuff() demo.FedBuffConfig {
	cfg := demo.FedBuffDefaults
	cfg.Train, cfg.Test = datatest.Synthetic(2000, 20, 4, 1), datatest.Synthetic(500, 20, 4, 2)
	cfg.Sizes = []int{20, 16, 4}
	cfg.Hyper = sgd.Hyper{Epochs: 2, BatchSize: 10, LearningRate: 0.1, EvalBatchSize: 500}
	cfg.Population, cfg.Budget = 100, 650
	cfg.SilentFraction = 0.1
	cfg.Cohort, cfg.CohortTarget, cfg.ReportGoal = 13, 10, 8
	cfg.SyncLR, cfg.SyncMomentum = 1, 0
	cfg.Deadline, cfg.Timeout = 3*time.Minute, 15*time.Minute
	cfg.Concurrency, cfg.Buffer, cfg.MaxStaleness = 13, 5, 2
	cfg.AsyncLR, cfg.AsyncMomentum = 0.5, 0
	cfg.Target, cfg.EvalInterval = 0.6, 0
	return cfg
}

// TestFedBuffSmall checks the mechanics at a scale of milliseconds: the
// budget, the accounting of every training started, stale seats freed
// and reports never folded past S, silent devices' seats expiring, both
// modes learning, outputs, and that the result depends on the seed alone.
func TestFedBuffSmall(t *testing.T) {
	cfg := smallFedBuff()
	cfg.OutDir = filepath.Join(t.TempDir(), "out") // made by FedBuff
	cfg.Workers = 3
	res, err := demo.FedBuff(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, a := res.Sync, res.Async
	for _, r := range []demo.FedBuffRun{s, a} {
		t.Logf("%-5s accuracy %.3f → %.3f, %d versions (%d abandoned), %d started, %d completed, %d used, %d dropped, %d stale, %d expired, %d unused, %d silent",
			r.Mode, r.Points[0].Accuracy, r.FinalAccuracy, r.Versions, r.Abandoned, r.Started, r.Completed, r.Used, r.Dropped, r.Stale, r.Expired,
			r.Unused, r.SilentSeats)
	}
	if want := cfg.Budget / cfg.Cohort * cfg.Cohort; s.Started != want {
		t.Errorf("sync started %d trainings, want %d (whole cohorts within the budget %d)", s.Started, want, cfg.Budget)
	}
	if a.Started != cfg.Budget {
		t.Errorf("async started %d trainings, want the budget %d", a.Started, cfg.Budget)
	}
	// Every training started ends one way.
	if s.Used+s.Dropped != s.Started || s.Versions+s.Abandoned != s.Started/cfg.Cohort {
		t.Errorf("sync: %d used + %d dropped of %d started; %d versions + %d abandoned", s.Used, s.Dropped, s.Started, s.Versions, s.Abandoned)
	}
	if a.Used+a.Unused+a.Stale+a.Expired != a.Started || a.Used != a.Versions*cfg.Buffer || a.Unused >= cfg.Buffer {
		t.Errorf("async: %d used + %d unused + %d stale + %d expired of %d started, %d versions", a.Used, a.Unused, a.Stale, a.Expired,
			a.Started, a.Versions)
	}
	if a.Stale == 0 || a.MaxStalenessSeen > cfg.MaxStaleness || !(a.MeanStaleness > 0) {
		t.Errorf("async with S = %d: %d stale, staleness folded up to %d (mean %v)", cfg.MaxStaleness, a.Stale, a.MaxStalenessSeen, a.MeanStaleness)
	}
	if s.SilentSeats == 0 || a.SilentSeats == 0 || s.Completed > s.Started-s.SilentSeats || a.Completed > a.Started-a.SilentSeats {
		t.Errorf("silent seats %d (sync) and %d (async); completed %d and %d", s.SilentSeats, a.SilentSeats, s.Completed, a.Completed)
	}
	for _, r := range []demo.FedBuffRun{s, a} {
		first := r.Points[0]
		if first.Time != 0 || first.Version != 0 || !(r.FinalAccuracy > first.Accuracy+0.2) || !r.Reached {
			t.Errorf("%s: accuracy %v → %v, reached %v", r.Mode, first.Accuracy, r.FinalAccuracy, r.Reached)
		}
		last := r.Points[len(r.Points)-1]
		if last.Version != r.Versions || last.Time != r.FinalTime || len(r.Points) != r.Versions+1 {
			t.Errorf("%s: %d points, last %+v, %d versions at %v", r.Mode, len(r.Points), last, r.Versions, r.FinalTime)
		}
		perTraining := float64(res.ModelBytes)
		if want := perTraining * float64(r.Started+r.Completed) / float64(cfg.Population); math.Abs(r.BytesMean-want) > 1e-6*want ||
			r.BytesMax < r.BytesMean {
			t.Errorf("%s: %v bytes a device (max %v), want %v", r.Mode, r.BytesMean, r.BytesMax, want)
		}
	}
	for _, name := range []string{"results.csv", "curve.csv", "accuracy.png"} {
		if st, err := os.Stat(filepath.Join(cfg.OutDir, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	if rows, err := readCSV(filepath.Join(cfg.OutDir, "results.csv")); err != nil || len(rows) != 3 {
		t.Errorf("results.csv: %d rows (%v), want 3", len(rows), err)
	}
	if rows, err := readCSV(filepath.Join(cfg.OutDir, "curve.csv")); err != nil || len(rows) != 1+len(s.Points)+len(a.Points) {
		t.Errorf("curve.csv: %d rows (%v), want %d", len(rows), err, 1+len(s.Points)+len(a.Points))
	}

	// The same seed gives the same runs on one worker.
	one := cfg
	one.Workers, one.OutDir = 1, ""
	again, err := demo.FedBuff(context.Background(), one)
	if err != nil {
		t.Fatal(err)
	}
	for i, pair := range [][2]demo.FedBuffRun{{s, again.Sync}, {a, again.Async}} {
		pair[0].Elapsed, pair[1].Elapsed = 0, 0
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("run %d differs with one worker:\n%+v\n%+v", i, pair[0], pair[1])
		}
	}
}

// TestFedBuffExpiry: with a timeout shorter than a slow training and S out
// of reach, every seat of a silent or slow device expires, and no report
// of theirs is folded.
func TestFedBuffExpiry(t *testing.T) {
	cfg := smallFedBuff()
	cfg.Only, cfg.MaxStaleness, cfg.Timeout = "async", 1000, 2*time.Minute
	res, err := demo.FedBuff(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := res.Async
	if a.Stale != 0 || a.Expired < a.SilentSeats || a.SilentSeats == 0 || a.Completed != a.Used+a.Unused {
		t.Errorf("%d expired, %d silent seats, %d stale, %d completed, %d used + %d unused", a.Expired, a.SilentSeats, a.Stale,
			a.Completed, a.Used, a.Unused)
	}
	// A fast training takes at most 1.25 min: those are the reports.
	if a.Started-a.Expired != a.Completed {
		t.Errorf("%d started, %d expired, %d completed", a.Started, a.Expired, a.Completed)
	}
}

// TestFedBuffFull is the full comparison (a few minutes): set
// FLEETLEARN_FEDBUFF=1, FLEETLEARN_FEDBUFF_OUT to keep its results (an
// absolute path: go test runs in demo/), and FLEETLEARN_FEDBUFF_SEED to
// repeat it with another seed (data split, speed classes, jitter, initial
// model, selection and shuffles; the tuned settings stay).
func TestFedBuffFull(t *testing.T) {
	if os.Getenv("FLEETLEARN_FEDBUFF") != "1" {
		t.Skip("the full FedBuff comparison takes minutes; set FLEETLEARN_FEDBUFF=1 to run it")
	}
	datatest.MNIST(t)
	cfg := demo.FedBuffDefaults
	cfg.OutDir = os.Getenv("FLEETLEARN_FEDBUFF_OUT")
	if cfg.OutDir == "" {
		cfg.OutDir = t.TempDir()
	}
	if s := os.Getenv("FLEETLEARN_FEDBUFF_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FLEETLEARN_FEDBUFF_SEED: %v", err)
		}
		cfg.Seed = seed
	}
	if s := os.Getenv("FLEETLEARN_FEDBUFF_ALPHA"); s != "" {
		// A Dirichlet label skew instead of the IID split; the settings
		// stay the IID grid's.
		alpha, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("FLEETLEARN_FEDBUFF_ALPHA: %v", err)
		}
		cfg.Alpha = alpha
	}
	cfg.Out = os.Stderr
	start := time.Now()
	res, err := demo.FedBuff(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: both modes in %s, written to %s", cfg.Seed, time.Since(start).Round(time.Second), cfg.OutDir)
	for _, r := range []demo.FedBuffRun{res.Sync, res.Async} {
		t.Logf("%-5s %.0f%% at %s (held from %s), final %.2f%% at %s; %d versions; %d started, %d completed, %d used; %.2f MB a device (max %.2f)",
			r.Mode, 100*cfg.Target, fbTime(r.Reached, r.TimeToTarget), fbTime(r.FinalAccuracy >= cfg.Target, r.HeldFrom),
			100*r.FinalAccuracy, fbTime(true, r.FinalTime), r.Versions, r.Started, r.Completed, r.Used, r.BytesMean/1e6, r.BytesMax/1e6)
	}
	t.Logf("async reaches %.0f%% %.2f× sooner than sync; final accuracy %+.2f points", 100*cfg.Target, res.Speedup,
		100*(res.Async.FinalAccuracy-res.Sync.FinalAccuracy))
}

func fbTime(ok bool, d time.Duration) string {
	if !ok {
		return "never"
	}
	return fmt.Sprintf("%.1f min", d.Minutes())
}

// TestFedBuffGrid repeats the tuning behind FedBuffDefaults (about 20
// minutes on two shared cores): set FLEETLEARN_FEDBUFF_GRID=1. Each point
// runs one mode of the defaults' fleet, with a budget of 24,000 trainings,
// until it first reaches the target or spends the budget, and logs a
// Markdown row: virtual time and trainings to the target. Sync, deadline
// 3 min: cohort target T ∈ {25, 50, 100, 200} seating M = 1.3·T with goal
// 0.8·T, × FedAvgM (β = 0.9) η ∈ {1, 2, 3, 5, 8} and FedAvg η ∈ {2, 3, 5};
// then, at the fastest point, M ∈ {T, 1.15·T, 1.5·T, 2·T} × deadline ∈
// {90 s, 3 min, 15 min}. Async, timeout 15 min and S = 100: C ∈ {130, 260}
// × K ∈ {10, 20, 40} × η ∈ {0.25, 0.5, 1, 2}; then, at the fastest point,
// timeouts of 2 and 5 min, S ∈ {10, 30}, and server momentum 0.9 with η ∈
// {0.05, 0.1, 0.2} (a check: FedBuff's step is plain SGD).
func TestFedBuffGrid(t *testing.T) {
	which := os.Getenv("FLEETLEARN_FEDBUFF_GRID")
	if which != "1" && which != "async" {
		t.Skip("the FedBuff tuning grid takes long; set FLEETLEARN_FEDBUFF_GRID=1 to run it (async: its async half only)")
	}
	datatest.MNIST(t)
	type best struct {
		cfg  demo.FedBuffConfig
		time time.Duration
		ok   bool
	}
	run := func(b *best, cfg demo.FedBuffConfig, desc string) {
		t.Helper()
		cfg.StopAtTarget = true
		res, err := demo.FedBuff(context.Background(), cfg)
		if err != nil {
			t.Fatalf("%s: %v", desc, err)
		}
		r := res.Sync
		if cfg.Only == "async" {
			r = res.Async
		}
		if r.Reached {
			t.Logf("| %s | %s | %.1f | %d | %d | %s |", cfg.Only, desc, r.TimeToTarget.Minutes(), r.TrainingsToTarget, r.Versions, r.Elapsed.Round(time.Second))
		} else {
			t.Logf("| %s | %s | – (%.2f%% at %.0f min) | – | %d | %s |", cfg.Only, desc, 100*r.FinalAccuracy, r.FinalTime.Minutes(), r.Versions,
				r.Elapsed.Round(time.Second))
		}
		if r.Reached && (!b.ok || r.TimeToTarget < b.time) {
			*b = best{cfg, r.TimeToTarget, true}
		}
	}
	t.Log("| mode | setting | minutes to target | trainings to target | versions | wall |")
	t.Log("|---|---|---|---|---|---|")
	// The grid's own fleet: the defaults' with the budget, deadline,
	// timeout and S it started from, so that its rows stay reproducible
	// whatever the defaults become.
	grid := demo.FedBuffDefaults
	grid.Budget, grid.Deadline, grid.Timeout, grid.MaxStaleness = 24000, 3*time.Minute, 15*time.Minute, 100

	var sync best
	for _, target := range []int{25, 50, 100, 200} {
		if which == "async" {
			break
		}
		for _, opt := range []struct{ lr, beta float64 }{{1, 0.9}, {2, 0.9}, {3, 0.9}, {5, 0.9}, {8, 0.9}, {2, 0}, {3, 0}, {5, 0}} {
			cfg := grid
			cfg.Only = "sync"
			cfg.CohortTarget, cfg.Cohort, cfg.ReportGoal = target, target*13/10, target*8/10
			cfg.SyncLR, cfg.SyncMomentum = opt.lr, opt.beta
			run(&sync, cfg, fmt.Sprintf("T=%d M=%d G=%d D=%s η=%g β=%g", target, cfg.Cohort, cfg.ReportGoal, cfg.Deadline, opt.lr, opt.beta))
		}
	}
	base := sync.cfg
	for _, m := range []int{base.CohortTarget, base.CohortTarget * 115 / 100, base.CohortTarget * 3 / 2, base.CohortTarget * 2} {
		if which == "async" {
			break
		}
		for _, d := range []time.Duration{90 * time.Second, 3 * time.Minute, 15 * time.Minute} {
			cfg := base
			cfg.Cohort, cfg.Deadline = m, d
			run(&sync, cfg, fmt.Sprintf("T=%d M=%d G=%d D=%s η=%g β=%g", cfg.CohortTarget, m, cfg.ReportGoal, d, cfg.SyncLR, cfg.SyncMomentum))
		}
	}
	s := sync.cfg
	t.Logf("best sync: T=%d M=%d G=%d D=%s η=%g β=%g: %.1f min", s.CohortTarget, s.Cohort, s.ReportGoal, s.Deadline, s.SyncLR, s.SyncMomentum,
		sync.time.Minutes())

	var async best
	for _, c := range []int{130, 260} {
		for _, k := range []int{10, 20, 40} {
			for _, lr := range []float64{0.25, 0.5, 1, 2, 4} {
				cfg := grid
				cfg.Only = "async"
				cfg.Concurrency, cfg.Buffer, cfg.AsyncLR = c, k, lr
				run(&async, cfg, fmt.Sprintf("C=%d K=%d S=%d timeout=%s η=%g", c, k, cfg.MaxStaleness, cfg.Timeout, lr))
			}
		}
	}
	base = async.cfg
	for _, v := range []struct {
		timeout time.Duration
		s       uint64
	}{{2 * time.Minute, 100}, {5 * time.Minute, 100}, {15 * time.Minute, 10}, {15 * time.Minute, 30}} {
		cfg := base
		cfg.Timeout, cfg.MaxStaleness = v.timeout, v.s
		run(&async, cfg, fmt.Sprintf("C=%d K=%d S=%d timeout=%s η=%g", cfg.Concurrency, cfg.Buffer, v.s, v.timeout, cfg.AsyncLR))
	}
	for _, lr := range []float64{0.05, 0.1, 0.2} {
		cfg := base
		cfg.AsyncLR, cfg.AsyncMomentum = lr, 0.9
		run(&best{}, cfg, fmt.Sprintf("C=%d K=%d S=%d timeout=%s η=%g β=0.9", cfg.Concurrency, cfg.Buffer, cfg.MaxStaleness, cfg.Timeout, lr))
	}
	a := async.cfg
	t.Logf("best async: C=%d K=%d S=%d timeout=%s η=%g: %.1f min", a.Concurrency, a.Buffer, a.MaxStaleness, a.Timeout, a.AsyncLR, async.time.Minutes())
}

// TestFedBuffConfigRefused: settings the simulation cannot run are refused
// before any training.
func TestFedBuffConfigRefused(t *testing.T) {
	for name, edit := range map[string]func(*demo.FedBuffConfig){
		"buffer over concurrency": func(c *demo.FedBuffConfig) { c.Buffer = c.Concurrency + 1 },
		"goal over target":        func(c *demo.FedBuffConfig) { c.ReportGoal = c.CohortTarget + 1 },
		"cohort over population":  func(c *demo.FedBuffConfig) { c.Cohort = c.Population + 1 },
		"jitter of 1":             func(c *demo.FedBuffConfig) { c.Jitter = 1 },
		"unknown mode":            func(c *demo.FedBuffConfig) { c.Only = "both" },
		"partial run written":     func(c *demo.FedBuffConfig) { c.Only, c.OutDir = "sync", t.TempDir() },
		"train without test":      func(c *demo.FedBuffConfig) { c.Test = nil },
	} {
		cfg := smallFedBuff()
		edit(&cfg)
		if _, err := demo.FedBuff(context.Background(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
