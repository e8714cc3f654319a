package demo

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
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
	"strconv"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// Mechanism names the noise a DPFTRL run adds to each round's sum of
// clipped updates.
type Mechanism string

// The mechanisms DPFTRL compares.
const (
	// NonPrivate adds no noise (updates are still clipped, so the run
	// differs from the private ones by the noise alone).
	NonPrivate Mechanism = "nonprivate"
	// Independent adds fresh N(0, (zC)²) noise every round (DP-FedAvg
	// without sampling), accounted as k Gaussian mechanisms.
	Independent Mechanism = "independent"
	// Tree adds the increments of the online binary-tree mechanism
	// (DP-FTRL, Kairouz et al. 2021), accounted with TreeZCDP.
	Tree Mechanism = "tree"
	// BLT adds the correlated noise of a fitted buffered linear Toeplitz
	// factorization (McMahan, Xu, Zhang 2024), accounted with BLT.ZCDP.
	BLT Mechanism = "blt"
)

// DPFTRLConfig sizes the DP-FTRL comparison. Devices take part in fixed
// round-robin groups of Cohort, so each participates every
// Population/Cohort rounds and at most ⌈Rounds/(Population/Cohort)⌉ times;
// the privacy accounting of every mechanism uses exactly that schedule and
// claims no amplification by sampling.
type DPFTRLConfig struct {
	Population int     // simulated devices; a multiple of Cohort
	Cohort     int     // devices per round
	Rounds     int     // federated rounds T, the same for every run
	Alpha      float64 // Dirichlet label-skew concentration
	// Epsilons are the ε targets at Delta; each private mechanism runs
	// once per target with the noise multiplier that spends exactly it.
	Epsilons []float64
	Delta    float64
	// Mechanisms are the private mechanisms to compare; nil is all three.
	// The non-private baseline always runs.
	Mechanisms []Mechanism
	Seed       uint64
	// Sizes are the MLP's layer sizes, 784 first and 10 last; {784, 10}
	// is softmax regression.
	Sizes []int
	Hyper sgd.Hyper // devices' local training, the same for every run
	// ClipNorm is C, the L2 bound on each device's update.
	ClipNorm float64
	// ServerLearningRate η scales the mean noisy update; ServerMomentum
	// (0 for none) is heavy-ball momentum on it. Both apply to every run
	// alike unless LearningRates overrides η for a mechanism.
	ServerLearningRate float64
	ServerMomentum     float64
	LearningRates      map[Mechanism]float64
	// EvalEvery is how often, in rounds, the test set is evaluated; the
	// last round always is.
	EvalEvery int
	// Workers train devices in parallel; 0 is GOMAXPROCS.
	Workers int
	// OutDir receives results.csv and accuracy.png; "" writes nothing.
	OutDir string
	// Out receives one line per finished run; nil discards them.
	Out io.Writer
	// Train and Test replace MNIST, for tests; both nil loads MNIST.
	Train, Test *data.Dataset
}

// DPFTRLRun is one training run of DPFTRL.
type DPFTRLRun struct {
	Mechanism       Mechanism
	Epsilon         float64 // target ε; 0 for NonPrivate
	AchievedEpsilon float64 // ε the accountant gives for NoiseMultiplier
	NoiseMultiplier float64 // z; 0 for NonPrivate
	LearningRate    float64 // server η used
	FinalAccuracy   float64
	Points          []AccuracyPoint // every EvalEvery rounds and the last
	Elapsed         time.Duration
}

// AccuracyPoint is the test accuracy after a round.
type AccuracyPoint struct {
	Round    int
	Accuracy float64
}

// DPFTRLDefaults are the full experiment's settings: 6,000 devices, 600 a
// round, so each device takes part every 10 rounds and 10 times in 100.
// Softmax regression (7,850 parameters) because noise grows with the
// dimension. C = 0.1 and the server learning rates are the best of one grid
// given to every mechanism alike at ε = 2, the non-private run included:
// C ∈ {0.1, 0.5} × η·C ∈ {0.0125, 0.025, …, 3.2} (doubling), from 100-round
// runs of this configuration. C = 0.1 won for all four; η is 16
// non-private, 1 independent, 2 tree, 4 BLT.
var DPFTRLDefaults = DPFTRLConfig{
	Population: 6000, Cohort: 600, Rounds: 100, Alpha: 0.5,
	Epsilons: []float64{8, 2}, Delta: 1e-6, Seed: 1,
	Sizes:    []int{784, 10},
	Hyper:    sgd.Hyper{Epochs: 2, BatchSize: 16, LearningRate: 0.1, EvalBatchSize: 1000},
	ClipNorm: 0.1, ServerLearningRate: 16, ServerMomentum: 0.9, EvalEvery: 5,
	LearningRates: map[Mechanism]float64{Independent: 1, Tree: 2, BLT: 4},
}

// DPFTRL trains the non-private baseline and, for each ε target, each
// private mechanism at the noise multiplier that spends exactly that ε,
// all from the same initial model, data split and schedule, and writes
// the table and plot to cfg.OutDir. It is an in-process simulation of the
// rounds' arithmetic with the native trainer: no server, network or
// secure aggregation. The result depends on cfg alone, not on Workers.
// Its errors start with "demo: dpftrl: ".
func DPFTRL(ctx context.Context, cfg DPFTRLConfig) ([]DPFTRLRun, error) {
	runs, err := dpftrl(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("demo: dpftrl: %w", err)
	}
	return runs, nil
}

func dpftrl(ctx context.Context, cfg DPFTRLConfig) ([]DPFTRLRun, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Mechanisms == nil {
		cfg.Mechanisms = []Mechanism{Independent, Tree, BLT}
	}
	trainSet, testSet, err := orMNIST(cfg.Train, cfg.Test)
	if err != nil {
		return nil, err
	}
	sim, err := newFedSim(cfg, trainSet, testSet)
	if err != nil {
		return nil, err
	}
	b := cfg.Population / cfg.Cohort
	k := (cfg.Rounds + b - 1) / b

	// The noise multipliers are found before any training, so a schedule
	// the accountants refuse fails in milliseconds, not after minutes.
	type job struct {
		mech Mechanism
		eps  float64
		z    float64
		got  float64
		blt  dp.BLT
	}
	jobs := []job{{mech: NonPrivate}}
	var fitted *dp.BLT
	for _, eps := range cfg.Epsilons {
		for _, mech := range cfg.Mechanisms {
			j := job{mech: mech, eps: eps}
			if mech == BLT && fitted == nil {
				c, err := dp.FitBLT(cfg.Rounds, k, b, 4)
				if err != nil {
					return nil, err
				}
				fitted = &c
			}
			if fitted != nil {
				j.blt = *fitted
			}
			acct := accountant(mech, cfg.Rounds, k, b, cfg.Delta, j.blt)
			if acct == nil {
				return nil, fmt.Errorf("unknown mechanism %q", mech)
			}
			if j.z, j.got, err = calibrate(acct, eps); err != nil {
				return nil, fmt.Errorf("%s at ε = %g: %w", mech, eps, err)
			}
			jobs = append(jobs, j)
		}
	}
	runs := make([]DPFTRLRun, 0, len(jobs))
	for _, j := range jobs {
		start := time.Now()
		eta := cfg.ServerLearningRate
		if v, ok := cfg.LearningRates[j.mech]; ok {
			eta = v
		}
		var noise noiser
		if j.mech != NonPrivate {
			if noise, err = newNoiser(j.mech, cfg, j.eps, j.z, sim.dim, j.blt); err != nil {
				return nil, err
			}
		}
		pts, err := sim.run(ctx, noise, eta)
		if err != nil {
			return nil, fmt.Errorf("%s at ε = %g: %w", j.mech, j.eps, err)
		}
		r := DPFTRLRun{Mechanism: j.mech, Epsilon: j.eps, AchievedEpsilon: j.got, NoiseMultiplier: j.z,
			LearningRate: eta, FinalAccuracy: pts[len(pts)-1].Accuracy, Points: pts, Elapsed: time.Since(start)}
		runs = append(runs, r)
		fmt.Fprintf(cfg.Out, "dpftrl: %-11s ε=%-3g z=%-8.4f η=%g accuracy %.4f (%s)\n", r.Mechanism, r.Epsilon,
			r.NoiseMultiplier, eta, r.FinalAccuracy, r.Elapsed.Round(time.Second))
	}
	if cfg.OutDir != "" {
		if err := writeDPFTRL(cfg, runs); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

func (cfg *DPFTRLConfig) validate() error {
	switch {
	case cfg.Cohort < 1 || cfg.Population < cfg.Cohort || cfg.Population%cfg.Cohort != 0:
		// Round-robin groups must be whole for every device to have the
		// same separation the accountants assume.
		return fmt.Errorf("population %d must be a positive multiple of cohort %d", cfg.Population, cfg.Cohort)
	case cfg.Rounds < 1:
		return fmt.Errorf("rounds %d, want ≥ 1", cfg.Rounds)
	case !(cfg.Delta > 0 && cfg.Delta < 1):
		return fmt.Errorf("delta %v, want (0, 1)", cfg.Delta)
	case !(cfg.ClipNorm > 0) || math.IsInf(cfg.ClipNorm, 0):
		return fmt.Errorf("clip norm %v, want a finite value > 0", cfg.ClipNorm)
	case !(cfg.ServerLearningRate > 0):
		return fmt.Errorf("server learning rate %v, want > 0", cfg.ServerLearningRate)
	case !(cfg.ServerMomentum >= 0 && cfg.ServerMomentum < 1):
		return fmt.Errorf("server momentum %v, want [0, 1)", cfg.ServerMomentum)
	case cfg.EvalEvery < 1:
		return fmt.Errorf("eval every %d rounds, want ≥ 1", cfg.EvalEvery)
	case len(cfg.Sizes) < 2:
		return fmt.Errorf("model sizes %v, want input, hidden…, classes", cfg.Sizes)
	case (cfg.Train == nil) != (cfg.Test == nil):
		return errors.New("give both train and test sets, or neither")
	}
	for _, e := range cfg.Epsilons {
		if !(e > 0) || math.IsInf(e, 0) {
			return fmt.Errorf("epsilon %v, want a finite value > 0", e)
		}
	}
	return cfg.Hyper.Validate()
}

// accountant returns ε at δ as a function of z for mech on the
// round-robin schedule: T rounds, at most k participations, b apart.
func accountant(mech Mechanism, T, k, b int, delta float64, c dp.BLT) func(z float64) (float64, error) {
	fromRho := func(rho float64, err error) (float64, error) {
		if err != nil {
			return 0, err
		}
		eps, _, err := dp.EpsilonFromZCDP(rho, delta, nil)
		return eps, err
	}
	switch mech {
	case Independent:
		return func(z float64) (float64, error) {
			return dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: z, Steps: k}}, delta)
		}
	case Tree:
		// TreeZCDP counts the rounds strictly between two participations.
		return func(z float64) (float64, error) { return fromRho(dp.TreeZCDP(z, T, k, b-1)) }
	case BLT:
		return func(z float64) (float64, error) { return fromRho(c.ZCDP(z, T, k, b)) }
	}
	return nil
}

// calibrate finds by bisection on log z the noise multiplier at which
// eps(z), decreasing in z, equals target, and returns it and its ε.
func calibrate(eps func(float64) (float64, error), target float64) (z, got float64, err error) {
	lo, hi := 1e-3, 1.0
	for {
		e, err := eps(hi)
		if err != nil {
			return 0, 0, err
		}
		if e <= target {
			break
		}
		if lo, hi = hi, 2*hi; hi > 1e6 {
			return 0, 0, fmt.Errorf("no noise multiplier up to %g reaches ε = %g", hi, target)
		}
	}
	if e, err := eps(lo); err != nil {
		return 0, 0, err
	} else if e <= target {
		return 0, 0, fmt.Errorf("ε = %g needs a noise multiplier below %g", target, lo)
	}
	for i := 0; i < 100 && hi/lo > 1+1e-12; i++ {
		mid := math.Sqrt(lo * hi)
		e, err := eps(mid)
		if err != nil {
			return 0, 0, err
		}
		if e > target {
			lo = mid
		} else {
			hi = mid
		}
	}
	// hi is the side that never overspends.
	got, err = eps(hi)
	return hi, got, err
}

// noiser adds one round's noise to the sum of clipped updates.
type noiser interface{ Next(dst []float64) error }

// centralNoise is Independent's noiser.
type centralNoise struct {
	src     *dp.Source
	clip, z float64
}

func (n centralNoise) Next(dst []float64) error { return dp.AddCentralNoise(dst, n.clip, n.z, n.src) }

func newNoiser(mech Mechanism, cfg DPFTRLConfig, eps, z float64, dim int, c dp.BLT) (noiser, error) {
	// A fixed secret per (seed, mechanism, ε) keeps runs reproducible; a
	// deployment would draw it from crypto/rand.
	h := sha256.New()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], cfg.Seed)
	h.Write(seed[:])
	fmt.Fprintf(h, "/dpftrl/%s/%g", mech, eps)
	secret := h.Sum(nil)
	std := z * cfg.ClipNorm
	switch mech {
	case Independent:
		src, err := dp.DerivedSource(secret, "independent")
		if err != nil {
			return nil, err
		}
		return centralNoise{src: src, clip: cfg.ClipNorm, z: z}, nil
	case Tree:
		return dp.NewTreeNoise(secret, dim, std, 0)
	case BLT:
		return dp.NewBLTNoise(c, secret, dim, std)
	}
	return nil, fmt.Errorf("unknown mechanism %q", mech)
}

// fedSim holds what every run shares: devices' data, the schedule and the
// initial model.
type fedSim struct {
	cfg     DPFTRLConfig
	devices []*data.Dataset
	groups  [][]int // groups[t mod b] are round t's devices
	test    *data.Dataset
	init    *model.Model
	layout  model.Layout
	dim     int
	workers int
}

func newFedSim(cfg DPFTRLConfig, trainSet, testSet *data.Dataset) (*fedSim, error) {
	if cfg.Sizes[0] != trainSet.Dim || cfg.Sizes[len(cfg.Sizes)-1] != trainSet.NumClasses {
		return nil, fmt.Errorf("model sizes %v do not fit %d features and %d classes", cfg.Sizes, trainSet.Dim, trainSet.NumClasses)
	}
	parts, err := data.Dirichlet(trainSet.Labels, trainSet.NumClasses, cfg.Population, cfg.Alpha, cfg.Seed)
	if err != nil {
		return nil, err
	}
	devices := make([]*data.Dataset, len(parts))
	for i, idx := range parts {
		devices[i] = trainSet.Subset(idx)
	}
	// Groups are a seeded shuffle, not index ranges, so that no group
	// inherits an ordering the partitioner may leave in device indices.
	b := cfg.Population / cfg.Cohort
	perm := rand.New(rand.NewPCG(cfg.Seed, 0x6470667472)).Perm(cfg.Population)
	groups := make([][]int, b)
	for g := range groups {
		groups[g] = perm[g*cfg.Cohort : (g+1)*cfg.Cohort]
	}
	init, err := train.InitMLP(cfg.Sizes, cfg.Seed)
	if err != nil {
		return nil, err
	}
	workers := cfg.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return &fedSim{cfg: cfg, devices: devices, groups: groups, test: testSet, init: init,
		layout: init.Layout(), dim: init.Layout().Size(), workers: workers}, nil
}

// run trains from the initial model for cfg.Rounds rounds, adding noise's
// terms (none when nil) to each round's sum, and evaluates on the test set.
func (s *fedSim) run(ctx context.Context, noise noiser, eta float64) ([]AccuracyPoint, error) {
	cfg := s.cfg
	global := s.init.Flatten()
	velocity := make([]float64, s.dim)
	sum := make([]float64, s.dim)
	updates := make([][]float32, cfg.Cohort)
	var pts []AccuracyPoint
	for t := 0; t < cfg.Rounds; t++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m, err := s.layout.Unflatten(global)
		if err != nil {
			return nil, err
		}
		if err := s.localRound(m, global, t, updates); err != nil {
			return nil, err
		}
		// Summed in device order, after the parallel part, so the result
		// does not depend on which worker finished first.
		clear(sum)
		for _, u := range updates {
			for i, v := range u {
				sum[i] += float64(v)
			}
		}
		if noise != nil {
			if err := noise.Next(sum); err != nil {
				return nil, err
			}
		}
		for i := range global {
			velocity[i] = cfg.ServerMomentum*velocity[i] + sum[i]/float64(cfg.Cohort)
			global[i] += float32(eta * velocity[i])
		}
		if (t+1)%cfg.EvalEvery == 0 || t+1 == cfg.Rounds {
			m, err := s.layout.Unflatten(global)
			if err != nil {
				return nil, err
			}
			met, err := train.Evaluate(m, s.test, max(1, cfg.Hyper.EvalBatchSize))
			if err != nil {
				return nil, err
			}
			if math.IsNaN(met.Loss) {
				return nil, fmt.Errorf("round %d: %w", t+1, train.ErrDiverged)
			}
			pts = append(pts, AccuracyPoint{Round: t + 1, Accuracy: met.Accuracy})
		}
	}
	return pts, nil
}

// localRound trains round t's cohort from m on s.workers goroutines and
// stores each device's clipped update (new − global) in updates.
func (s *fedSim) localRound(m *model.Model, global []float32, t int, updates [][]float32) error {
	group := s.groups[t%len(s.groups)]
	next := make(chan int)
	errs := make([]error, len(group))
	var wg sync.WaitGroup
	for w := 0; w < s.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				dev := group[i]
				// The seed depends on the round and device only, not on the
				// worker, so shuffles are the same at any parallelism.
				seed := s.cfg.Seed ^ uint64(t)<<32 ^ uint64(dev)
				trained, _, err := train.Train(m, s.devices[dev], s.cfg.Hyper, seed)
				if err != nil {
					errs[i] = fmt.Errorf("round %d device %d: %w", t+1, dev, err)
					continue
				}
				u := trained.Flatten()
				for j := range u {
					u[j] -= global[j]
				}
				if _, err := dp.ClipL2(u, s.cfg.ClipNorm); err != nil {
					errs[i] = err
					continue
				}
				updates[i] = u
			}
		}()
	}
	for i := range group {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// writeDPFTRL writes results.csv (one row per run, accuracy at every
// evaluated round) and accuracy.png.
func writeDPFTRL(cfg DPFTRLConfig, runs []DPFTRLRun) error {
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return err
	}
	f, err := atomicfile.Create(filepath.Join(cfg.OutDir, "results.csv"), 0o644)
	if err != nil {
		return err
	}
	defer f.Abort()
	w := csv.NewWriter(f)
	head := []string{"mechanism", "epsilon", "delta", "noise_multiplier", "achieved_epsilon", "server_lr", "final_accuracy"}
	for _, p := range runs[0].Points {
		head = append(head, "acc_round_"+strconv.Itoa(p.Round))
	}
	w.Write(head)
	ff := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	for _, r := range runs {
		row := []string{string(r.Mechanism), ff(r.Epsilon, -1), ff(cfg.Delta, -1), ff(r.NoiseMultiplier, 6),
			ff(r.AchievedEpsilon, 6), ff(r.LearningRate, -1), ff(r.FinalAccuracy, 4)}
		if r.Mechanism == NonPrivate {
			row[1], row[2], row[3], row[4] = "inf", "", "0", "inf"
		}
		for _, p := range r.Points {
			row = append(row, ff(p.Accuracy, 4))
		}
		w.Write(row)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	if err := f.Commit(); err != nil {
		return err
	}
	return plotDPFTRL(filepath.Join(cfg.OutDir, "accuracy.png"), cfg, runs)
}

// plotDPFTRL draws test accuracy against round: colour is the mechanism,
// dash pattern the ε.
func plotDPFTRL(path string, cfg DPFTRLConfig, runs []DPFTRLRun) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("MNIST, %d devices, %d per round, delta %g", cfg.Population, cfg.Cohort, cfg.Delta)
	p.X.Label.Text = "round"
	p.Y.Label.Text = "test accuracy (%)"
	colors := map[Mechanism]color.Color{
		NonPrivate:  color.Black,
		Independent: color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		Tree:        color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		BLT:         color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	}
	dashes := [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)}}
	epsIndex := map[float64]int{}
	for _, e := range cfg.Epsilons {
		if _, ok := epsIndex[e]; !ok {
			epsIndex[e] = len(epsIndex)
		}
	}
	p.Add(plotter.NewGrid())
	for _, r := range runs {
		xy := make(plotter.XYs, len(r.Points))
		for i, pt := range r.Points {
			xy[i] = plotter.XY{X: float64(pt.Round), Y: 100 * pt.Accuracy}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = colors[r.Mechanism]
		l.Width = vg.Points(1.5)
		name := "non-private"
		if r.Mechanism != NonPrivate {
			l.Dashes = dashes[epsIndex[r.Epsilon]%len(dashes)]
			name = fmt.Sprintf("%s, eps %g", r.Mechanism, r.Epsilon)
		}
		p.Add(l)
		p.Legend.Add(name, l)
	}
	// The axis starts 10 points below the lowest final accuracy (rounded
	// down to a multiple of 5), so that the final differences, a point or
	// two, stay visible; the first rounds of slow runs fall below it.
	lowest := 1.0
	for _, r := range runs {
		lowest = min(lowest, r.FinalAccuracy)
	}
	p.Y.Min = max(0, 5*math.Floor((100*lowest-10)/5))
	// Accuracy rises with rounds: the lower right is free for the legend.
	p.Legend.Top = false
	p.Legend.Left = false
	return savePNG(p, path)
}
