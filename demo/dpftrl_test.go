package demo_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
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
// and FLEETLEARN_DPFTRL_OUT to keep its results.
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
	cfg.Out = os.Stderr
	start := time.Now()
	runs, err := demo.DPFTRL(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d runs in %s, written to %s", len(runs), time.Since(start).Round(time.Second), cfg.OutDir)
	for _, r := range runs {
		t.Logf("%-11s ε=%-3g z=%.4f accuracy %.4f", r.Mechanism, r.Epsilon, r.NoiseMultiplier, r.FinalAccuracy)
	}
}
