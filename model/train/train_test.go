package train_test

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
)

// TestMNISTAccuracy is the reference result the WASM module is checked against:
// 784-128-10 on all 60k training images, evaluated on the 10k test set.
func TestMNISTAccuracy(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on all of MNIST")
	}
	tr, te := datatest.MNIST(t)
	m, err := train.InitMLP([]int{784, 128, 10}, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := sgd.Hyper{Epochs: 2, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 1000}
	got, met, err := train.Train(m, tr, h, 42)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := train.Evaluate(got, te, 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("train loss %.4f acc %.4f; test loss %.4f acc %.4f", met.Loss, met.Accuracy, ev.Loss, ev.Accuracy)
	if ev.Accuracy < 0.95 {
		t.Fatalf("test accuracy %.4f < 0.95", ev.Accuracy)
	}
}

func TestInitMLP(t *testing.T) {
	a, err := train.InitMLP([]int{4, 3, 2}, 9)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := train.InitMLP([]int{4, 3, 2}, 9)
	c, _ := train.InitMLP([]int{4, 3, 2}, 10)
	if a.HashHex() != b.HashHex() || a.HashHex() == c.HashHex() {
		t.Fatal("init must depend on the seed alone")
	}
	names := []string{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
	for i, tn := range a.Tensors {
		if tn.Name != names[i] {
			t.Fatalf("tensor %d is %q, want %q", i, tn.Name, names[i])
		}
	}
	for _, bad := range [][]int{nil, {4}, {4, 0, 2}, {-1, 2}} {
		if _, err := train.InitMLP(bad, 1); !errors.Is(err, train.ErrArch) {
			t.Errorf("sizes %v: got %v", bad, err)
		}
	}
}

func TestArchitectureErrors(t *testing.T) {
	d := datatest.Synthetic(10, 4, 2, 1)
	good, _ := train.InitMLP([]int{4, 3, 2}, 1)
	wide, _ := train.InitMLP([]int{5, 3, 2}, 1)
	three, _ := train.InitMLP([]int{4, 3, 3}, 1)
	renamed := good.Clone()
	renamed.Tensors[0].Name = "layer.weight"
	for name, m := range map[string]*model.Model{"input width": wide, "classes": three, "names": renamed} {
		if _, _, err := train.Train(m, d, sgd.Defaults, 1); !errors.Is(err, train.ErrArch) {
			t.Errorf("%s: Train got %v", name, err)
		}
		if _, err := train.Evaluate(m, d, 8); !errors.Is(err, train.ErrArch) {
			t.Errorf("%s: Evaluate got %v", name, err)
		}
	}
	if sizes, err := train.Layers(good, 4, 2); err != nil || len(sizes) != 3 || sizes[1] != 3 {
		t.Fatalf("Layers %v %v", sizes, err)
	}
	if _, _, err := train.Train(good, &data.Dataset{Dim: 4, NumClasses: 2}, sgd.Defaults, 1); err == nil {
		t.Fatal("empty dataset accepted")
	}
	if _, _, err := train.Train(good, d, sgd.Hyper{Epochs: 1, BatchSize: 0, LearningRate: 1, EvalBatchSize: 1}, 1); !errors.Is(err, sgd.ErrHyper) {
		t.Fatalf("bad hyper: %v", err)
	}
}

func TestTrainLearnsAndIsDeterministic(t *testing.T) {
	d := datatest.Synthetic(2000, 8, 3, 5)
	m, _ := train.InitMLP([]int{8, 16, 3}, 2)
	h := sgd.Hyper{Epochs: 20, BatchSize: 16, LearningRate: 0.5, EvalBatchSize: 100}
	before, err := train.Evaluate(m, d, 100)
	if err != nil {
		t.Fatal(err)
	}
	a, met, err := train.Train(m, d, h, 1)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := train.Evaluate(a, d, 100)
	if after.Accuracy < 0.9 || after.Loss >= before.Loss {
		t.Fatalf("accuracy %.3f (was %.3f), loss %.3f (was %.3f)", after.Accuracy, before.Accuracy, after.Loss, before.Loss)
	}
	if met.Examples != d.Len() {
		t.Fatalf("examples %d", met.Examples)
	}
	b, _, _ := train.Train(m, d, h, 1)
	if a.HashHex() != b.HashHex() {
		t.Fatal("same inputs gave different weights")
	}
	if m.HashHex() == a.HashHex() {
		t.Fatal("Train modified its input model or did nothing")
	}
}

// TestFedProxPullsTowardsStart checks the proximal term: with a large mu the
// trained weights stay closer to the starting point.
func TestFedProxPullsTowardsStart(t *testing.T) {
	d := datatest.Synthetic(500, 8, 3, 7)
	m, _ := train.InitMLP([]int{8, 16, 3}, 3)
	dist := func(mu float32) float64 {
		out, _, err := train.Train(m, d, sgd.Hyper{Epochs: 3, BatchSize: 10, LearningRate: 0.3, Mu: mu, EvalBatchSize: 10}, 1)
		if err != nil {
			t.Fatal(err)
		}
		var s float64
		a, b := out.Flatten(), m.Flatten()
		for i := range a {
			s += float64(a[i]-b[i]) * float64(a[i]-b[i])
		}
		return math.Sqrt(s)
	}
	if plain, prox := dist(0), dist(1); prox >= plain*0.9 {
		t.Fatalf("FedProx distance %.4f not clearly below plain %.4f", prox, plain)
	}
}

func TestDivergenceIsAnError(t *testing.T) {
	d := datatest.Synthetic(200, 8, 3, 7)
	m, _ := train.InitMLP([]int{8, 16, 3}, 3)
	_, _, err := train.Train(m, d, sgd.Hyper{Epochs: 5, BatchSize: 10, LearningRate: 1e30, EvalBatchSize: 10}, 1)
	if !errors.Is(err, train.ErrDiverged) {
		t.Fatalf("got %v, want ErrDiverged", err)
	}
}
