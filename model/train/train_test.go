package train_test

import (
	"errors"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
)

func mnist(t testing.TB) (tr, te *data.Dataset) {
	t.Helper()
	dir, err := data.MNISTDir()
	if errors.Is(err, data.ErrMNISTNotFound) {
		t.Skipf("MNIST not in the module cache: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	tr, te, err = data.LoadMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tr, te
}

// TestMNISTAccuracy is the reference result the WASM module is checked against:
// 784-128-10 on all 60k training images, evaluated on the 10k test set.
func TestMNISTAccuracy(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on all of MNIST")
	}
	tr, te := mnist(t)
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
