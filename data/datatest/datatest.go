// Package datatest makes small datasets for tests.
package datatest

import (
	"errors"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
)

// MNIST returns MNIST's training and test sets from the module cache, and
// skips the test, saying why, where they are absent.
func MNIST(t testing.TB) (train, test *data.Dataset) {
	t.Helper()
	dir, err := data.MNISTDir()
	if errors.Is(err, data.ErrMNISTNotFound) {
		t.Skipf("MNIST not in the module cache: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	train, test, err = data.LoadMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	return train, test
}

// Synthetic is a small learnable dataset of n examples with dim features in
// [0, 1) from a fixed generator: the label is the arg-max of the first
// classes features. The same seed gives the same dataset.
func Synthetic(n, dim, classes int, seed uint64) *data.Dataset {
	d := &data.Dataset{Dim: dim, NumClasses: classes, Features: make([]float32, n*dim), Labels: make([]uint8, n)}
	s := seed
	for i := range d.Features {
		s = s*6364136223846793005 + 1442695040888963407
		d.Features[i] = float32(s>>40) / float32(1<<24)
	}
	for i := range d.Labels {
		best := 0
		for c := 1; c < classes; c++ {
			if d.Features[i*dim+c] > d.Features[i*dim+best] {
				best = c
			}
		}
		d.Labels[i] = uint8(best)
	}
	return d
}
