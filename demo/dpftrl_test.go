package demo_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/demo"
)

func firstN(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// TestDPFTRLSmall checks the plumbing at a scale of seconds: calibration
// to the ε target, outputs, accuracy ranges, that noise costs accuracy,
// and that parallelism does not change the result.
func TestDPFTRLSmall(t *testing.T) {
	trainSet, testSet := datatest.MNIST(t)
	cfg := demo.DPFTRLDefaults
	cfg.Train, cfg.Test = trainSet.Subset(firstN(6000)), testSet.Subset(firstN(2000))
	cfg.Population, cfg.Cohort, cfg.Rounds, cfg.EvalEvery = 200, 20, 10, 5
	// ε = 0.2 over one participation needs z near 30 for a cohort of 20: noise that
	// must swamp the signal.
	cfg.Epsilons = []float64{8, 0.2}
	cfg.Hyper.Epochs = 1
	cfg.OutDir = filepath.Join(t.TempDir(), "out") // made by DPFTRL
	runs, err := demo.DPFTRL(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + 3*len(cfg.Epsilons); len(runs) != want {
		t.Fatalf("%d runs, want %d", len(runs), want)
	}
	plain := runs[0]
	if plain.Mechanism != demo.NonPrivate {
		t.Fatalf("first run is %s, want the non-private baseline", plain.Mechanism)
	}
	for _, r := range runs {
		if len(r.Points) != 2 || r.Points[1].Round != cfg.Rounds || r.FinalAccuracy != r.Points[1].Accuracy {
			t.Errorf("%s ε=%g: points %+v", r.Mechanism, r.Epsilon, r.Points)
		}
		for _, p := range r.Points {
			if !(p.Accuracy >= 0 && p.Accuracy <= 1) {
				t.Errorf("%s ε=%g: accuracy %v outside [0, 1]", r.Mechanism, r.Epsilon, p.Accuracy)
			}
		}
		if r.Mechanism == demo.NonPrivate {
			continue
		}
		if math.Abs(r.AchievedEpsilon-r.Epsilon) > 1e-3*r.Epsilon || !(r.NoiseMultiplier > 0) {
			t.Errorf("%s: z = %v gives ε = %v, want %v", r.Mechanism, r.NoiseMultiplier, r.AchievedEpsilon, r.Epsilon)
		}
		if r.Epsilon == 0.2 && !(plain.FinalAccuracy > r.FinalAccuracy+0.1) {
			t.Errorf("non-private accuracy %v does not beat %s at ε = 0.2 (%v)", plain.FinalAccuracy, r.Mechanism, r.FinalAccuracy)
		}
	}
	if !(plain.FinalAccuracy > 0.6) {
		t.Errorf("non-private accuracy %v after %d rounds, want > 0.6", plain.FinalAccuracy, cfg.Rounds)
	}
	for _, name := range []string{"results.csv", "accuracy.png"} {
		if st, err := os.Stat(filepath.Join(cfg.OutDir, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	rows, err := readCSV(filepath.Join(cfg.OutDir, "results.csv"))
	if err != nil || len(rows) != 1+len(runs) {
		t.Errorf("results.csv: %d rows (%v), want %d", len(rows), err, 1+len(runs))
	}

	one := cfg
	one.Workers, one.OutDir = 1, ""
	one.Epsilons, one.Mechanisms = []float64{8}, []demo.Mechanism{demo.BLT}
	again, err := demo.DPFTRL(context.Background(), one)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.Mechanism == demo.BLT && r.Epsilon == 8 && r.FinalAccuracy != again[1].FinalAccuracy {
			t.Errorf("BLT at ε = 8: accuracy %v with %d workers, %v with one", r.FinalAccuracy, cfg.Workers, again[1].FinalAccuracy)
		}
	}
}

// TestDPFTRLFull is the full comparison (minutes): set FLEETLEARN_DPFTRL=1,
// FLEETLEARN_DPFTRL_OUT to keep its results, and FLEETLEARN_DPFTRL_SEED to
// repeat it with another seed (data split, schedule, initial model, local
// shuffles and noise; the tuned settings stay).
func TestDPFTRLFull(t *testing.T) {
	if os.Getenv("FLEETLEARN_DPFTRL") != "1" {
		t.Skip("the full DP-FTRL comparison takes minutes; set FLEETLEARN_DPFTRL=1 to run it")
	}
	datatest.MNIST(t)
	cfg := demo.DPFTRLDefaults
	cfg.OutDir = os.Getenv("FLEETLEARN_DPFTRL_OUT")
	if cfg.OutDir == "" {
		cfg.OutDir = t.TempDir()
	}
	if s := os.Getenv("FLEETLEARN_DPFTRL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FLEETLEARN_DPFTRL_SEED: %v", err)
		}
		cfg.Seed = seed
	}
	cfg.Out = os.Stderr
	start := time.Now()
	runs, err := demo.DPFTRL(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %d runs in %s, written to %s", cfg.Seed, len(runs), time.Since(start).Round(time.Second), cfg.OutDir)
	for _, r := range runs {
		t.Logf("%-11s ε=%-3g z=%.4f accuracy %.4f", r.Mechanism, r.Epsilon, r.NoiseMultiplier, r.FinalAccuracy)
	}
}

// TestDPFTRLGrid repeats the tuning behind DPFTRLDefaults (78 runs, about
// six minutes on two cores): set FLEETLEARN_DPFTRL_GRID=1. Every mechanism,
// the non-private run included, gets the same grid at ε = 2, C ∈ {0.1,
// 0.5} × η·C ∈ {0.0125, 0.025, …, 3.2}; it logs a Markdown table of final
// accuracies, then, as checks that the baseline is not held back by the
// grid's edge or by clipping, non-private runs at larger η for C = 0.5 and
// with C = 100, in effect no clipping.
func TestDPFTRLGrid(t *testing.T) {
	if os.Getenv("FLEETLEARN_DPFTRL_GRID") != "1" {
		t.Skip("the DP-FTRL tuning grid takes minutes; set FLEETLEARN_DPFTRL_GRID=1 to run it")
	}
	datatest.MNIST(t)
	type point struct {
		clip, eta float64
		private   bool
	}
	var points []point
	// η is a power of two times a base, so every value is the float its
	// decimal names (0.025·2⁸ is 6.4 exactly as parsed).
	for _, g := range []struct{ clip, base float64 }{{0.1, 0.125}, {0.5, 0.025}} {
		for i := range 9 {
			points = append(points, point{g.clip, g.base * float64(int(1)<<i), true})
		}
	}
	for _, p := range []point{{0.5, 12.8, false}, {0.5, 25.6, false}, {100, 1.6, false}, {100, 3.2, false}, {100, 6.4, false}, {100, 12.8, false}} {
		points = append(points, p)
	}
	type best struct {
		acc, clip, eta float64
	}
	bests := map[demo.Mechanism]best{}
	mechs := []demo.Mechanism{demo.NonPrivate, demo.Independent, demo.Tree, demo.BLT}
	t.Log("| C | η | non-private | independent | tree | BLT |")
	t.Log("|---|---|---|---|---|---|")
	for _, p := range points {
		cfg := demo.DPFTRLDefaults
		cfg.ClipNorm, cfg.ServerLearningRate, cfg.LearningRates = p.clip, p.eta, nil
		cfg.Epsilons, cfg.EvalEvery = []float64{2}, cfg.Rounds
		if !p.private {
			cfg.Epsilons = nil
		}
		runs, err := demo.DPFTRL(context.Background(), cfg)
		if err != nil {
			t.Fatalf("C = %g, η = %g: %v", p.clip, p.eta, err)
		}
		acc := map[demo.Mechanism]float64{}
		for _, r := range runs {
			acc[r.Mechanism] = r.FinalAccuracy
			if b, ok := bests[r.Mechanism]; p.private && (!ok || r.FinalAccuracy > b.acc) {
				bests[r.Mechanism] = best{r.FinalAccuracy, p.clip, p.eta}
			}
		}
		line := fmt.Sprintf("| %g | %g |", p.clip, p.eta)
		for _, m := range mechs {
			if a, ok := acc[m]; ok {
				line += fmt.Sprintf(" %.2f%% |", 100*a)
			} else {
				line += " – |"
			}
		}
		t.Log(line)
	}
	for _, m := range mechs {
		b := bests[m]
		t.Logf("best on the grid, %-11s C = %g, η = %g: %.2f%%", m, b.clip, b.eta, 100*b.acc)
	}
}
