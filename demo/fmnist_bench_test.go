package demo

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
)

// fmnistCNN is the LEAF FEMNIST CNN for 28×28 gray images and 10 classes.
const fmnistCNN = "seq:input(1,28,28),conv(32,5,pad=2),relu,maxpool(2),conv(64,5,pad=2),relu,maxpool(2),dense(2048),relu,dense(10)"

// fmnistRun is one model's federated run.
type fmnistRun struct {
	name     string
	rounds   []int
	accuracy []float64
	perRound []time.Duration // the devices' training, all ten in turn
	final    float64
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkFashionMNIST trains the LEAF-style CNN (package seq) and the
// demo's MLP (784-128-10) by FedAvg on Fashion-MNIST as Debian's
// dataset-fashion-mnist ships it: 60,000 training images split over 100
// devices by Dirichlet(α = 0.5) on the labels, 10 devices drawn at random
// each round, each training E local epochs (batch 32) on the native
// trainer, whose weights are the seq and mlp modules' bit for bit
// (wasm.TestSeqMatchesNative); the server steps by the example-weighted
// mean of the updates with the aggregator's FedAvgM (server lr 1, momentum
// FLEETLEARN_FMNIST_MOMENTUM/100, 0.9 by default; 0 is FedAvg), as a task
// with --aggregation fedavgm does. Test accuracy is on the 10,000 test
// images. It prints a table and writes fmnist.png to FLEETLEARN_FMNIST_OUT
// (a temporary directory by default). FLEETLEARN_FMNIST_ROUNDS (50),
// FLEETLEARN_FMNIST_EPOCHS (2), FLEETLEARN_FMNIST_EVERY (5, rounds between
// evaluations) and FLEETLEARN_FMNIST_DIR
// (/usr/share/datasets/fashion-mnist) change it.
func BenchmarkFashionMNIST(b *testing.B) {
	dir := os.Getenv("FLEETLEARN_FMNIST_DIR")
	if dir == "" {
		dir = "/usr/share/datasets/fashion-mnist"
	}
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte.gz")); err != nil {
		b.Skipf("Fashion-MNIST not found in %s (apt-get install dataset-fashion-mnist, or set FLEETLEARN_FMNIST_DIR): %v", dir, err)
	}
	trainSet, testSet, err := data.LoadMNIST(dir)
	if err != nil {
		b.Fatal(err)
	}
	rounds := envInt("FLEETLEARN_FMNIST_ROUNDS", 50)
	momentum := float64(envInt("FLEETLEARN_FMNIST_MOMENTUM", 90)) / 100
	if os.Getenv("FLEETLEARN_FMNIST_MOMENTUM") == "0" {
		momentum = 0
	}
	epochs := envInt("FLEETLEARN_FMNIST_EPOCHS", 2)
	every := envInt("FLEETLEARN_FMNIST_EVERY", 5)
	parts, err := data.Dirichlet(trainSet.Labels, 10, 100, 0.5, 1)
	if err != nil {
		b.Fatal(err)
	}
	devices := make([]*data.Dataset, len(parts))
	for i, p := range parts {
		devices[i] = trainSet.Subset(p)
	}
	out := os.Getenv("FLEETLEARN_FMNIST_OUT")
	if out == "" {
		out = b.TempDir()
	}
	for i := 0; i < b.N; i++ {
		var runs []fmnistRun
		for _, name := range []string{"cnn", "mlp"} {
			var m *model.Model
			h := sgd.Hyper{Epochs: epochs, BatchSize: 32, EvalBatchSize: 500, LearningRate: 0.05}
			if name == "cnn" {
				a, err := seq.Parse(fmnistCNN)
				if err != nil {
					b.Fatal(err)
				}
				m, err = train.InitSeq(a, 1)
				if err != nil {
					b.Fatal(err)
				}
			} else {
				h.LearningRate = 0.1
				if m, err = train.InitMLP([]int{784, 128, 10}, 1); err != nil {
					b.Fatal(err)
				}
			}
			run := fmnistFederate(b, name, m, devices, testSet, h, rounds, every, momentum)
			runs = append(runs, run)
		}
		fmt.Printf("\nFashion-MNIST, 100 devices Dirichlet(0.5), 10 per round, %d local epochs, batch 32, FedAvgM momentum %g\n", epochs, momentum)
		fmt.Printf("%-5s %6s %10s %12s\n", "model", "round", "accuracy", "s/round")
		for _, r := range runs {
			for j, rd := range r.rounds {
				var sum time.Duration
				for _, d := range r.perRound[:rd] {
					sum += d
				}
				fmt.Printf("%-5s %6d %9.2f%% %12.2f\n", r.name, rd, 100*r.accuracy[j], sum.Seconds()/float64(rd))
			}
		}
		if err := plotFMNIST(filepath.Join(out, "fmnist.png"), runs, epochs); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("plot: %s\n", filepath.Join(out, "fmnist.png"))
		b.ReportMetric(100*runs[0].final, "cnn-%")
		b.ReportMetric(100*runs[1].final, "mlp-%")
	}
}

func fmnistFederate(b *testing.B, name string, m *model.Model, devices []*data.Dataset, test *data.Dataset, h sgd.Hyper, rounds, every int, momentum float64) fmnistRun {
	run := fmnistRun{name: name}
	rng := rand.New(rand.NewPCG(7, 7))
	lay := m.Layout()
	global := m.Flatten()
	rule, err := aggregator.NewRule(aggregator.FedAvgM, len(global), aggregator.WithServerLR(1), aggregator.WithMomentum(momentum))
	if err != nil {
		b.Fatal(err)
	}
	evaluate := func(round int) {
		gm, err := lay.Unflatten(global)
		if err != nil {
			b.Fatal(err)
		}
		gm.Arch = m.Arch
		var acc float64
		if train.IsSeq(gm) {
			met, err := train.EvaluateSeq(gm, test, 500)
			if err != nil {
				b.Fatal(err)
			}
			acc = met.Accuracy
		} else {
			met, err := train.Evaluate(gm, test, 500)
			if err != nil {
				b.Fatal(err)
			}
			acc = met.Accuracy
		}
		run.rounds = append(run.rounds, round)
		run.accuracy = append(run.accuracy, acc)
		run.final = acc
		b.Logf("%s round %d: test accuracy %.2f%%", name, round, 100*acc)
	}
	for r := 1; r <= rounds; r++ {
		gm, err := lay.Unflatten(global)
		if err != nil {
			b.Fatal(err)
		}
		gm.Arch = m.Arch
		acc, err := aggregator.NewAccumulator(len(global), 0)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for _, dev := range rng.Perm(len(devices))[:10] {
			d := devices[dev]
			seed := uint64(r)<<16 | uint64(dev)
			var trained *model.Model
			if train.IsSeq(gm) {
				trained, _, err = train.TrainSeq(gm, d, h, seed, nil)
			} else {
				trained, _, err = train.Train(gm, d, h, seed)
			}
			if err != nil {
				b.Fatal(err)
			}
			update := trained.Flatten()
			for j := range update {
				update[j] -= global[j]
			}
			if err := acc.Add(update, float64(d.Len())); err != nil {
				b.Fatal(err)
			}
		}
		run.perRound = append(run.perRound, time.Since(start))
		mean, err := acc.MeanInPlace()
		if err != nil {
			b.Fatal(err)
		}
		if err := rule.Apply(global, mean); err != nil {
			b.Fatal(err)
		}
		if r%every == 0 || r == rounds {
			evaluate(r)
		}
	}
	return run
}

func plotFMNIST(path string, runs []fmnistRun, epochs int) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Fashion-MNIST: 100 devices, Dir(0.5), 10 a round, E=%d", epochs)
	p.X.Label.Text = "round"
	p.Y.Label.Text = "test accuracy (%)"
	for i, r := range runs {
		xy := make(plotter.XYs, len(r.rounds))
		for j := range r.rounds {
			xy[j] = plotter.XY{X: float64(r.rounds[j]), Y: 100 * r.accuracy[j]}
		}
		line, points, err := plotter.NewLinePoints(xy)
		if err != nil {
			return err
		}
		if i == 1 {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		}
		p.Add(line, points)
		label := "LEAF CNN (seq module)"
		if r.name == "mlp" {
			label = "MLP 784-128-10 (mlp module)"
		}
		p.Legend.Add(label, line, points)
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = false // the curves rise to the top right
	p.Legend.Left = false
	return savePNG(p, path)
}
