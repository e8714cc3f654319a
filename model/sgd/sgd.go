// Package sgd defines the mini-batch SGD recipe shared by Fleetlearn's native
// reference trainer and its WASM example modules: the hyper-parameters a task
// sends, their defaults and limits, and the deterministic example order. Both
// sides import this package, so a module and the native trainer given the same
// weights, data, seed and hyper-parameters visit the same batches in the same order.
//
// The package has no dependencies beyond the standard library so that it
// compiles small for GOOS=wasip1.
package sgd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// ErrHyper reports invalid hyper-parameters.
var ErrHyper = errors.New("sgd: invalid hyper-parameters")

// Hyper are the training hyper-parameters a task passes to a module as JSON.
type Hyper struct {
	Epochs       int     `json:"epochs"`
	BatchSize    int     `json:"batch_size"`
	LearningRate float32 `json:"learning_rate"`
	// Mu is the FedProx proximal coefficient (Li et al. 2020); 0 is plain FedAvg SGD.
	Mu float32 `json:"mu,omitempty"`
	// EvalBatchSize bounds the rows of one forward pass during evaluation.
	EvalBatchSize int `json:"eval_batch_size,omitempty"`
}

// Defaults are used for fields a task leaves out.
var Defaults = Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.05, EvalBatchSize: 512}

// Limits bound what a task may ask for, so a hostile or mistaken task cannot
// make a device allocate without bound.
const (
	MaxEpochs    = 1000
	MaxBatchSize = 1 << 16
)

// ParseHyper decodes JSON hyper-parameters over Defaults and validates them.
// Empty input yields Defaults. Unknown fields are refused so typos surface.
func ParseHyper(b []byte) (Hyper, error) {
	h := Defaults
	if len(b) > 0 {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&h); err != nil {
			return Hyper{}, fmt.Errorf("%w: %v", ErrHyper, err)
		}
	}
	return h, h.Validate()
}

// Validate checks ranges.
func (h Hyper) Validate() error {
	switch {
	case h.Epochs < 1 || h.Epochs > MaxEpochs:
		return fmt.Errorf("%w: epochs %d not in [1,%d]", ErrHyper, h.Epochs, MaxEpochs)
	case h.BatchSize < 1 || h.BatchSize > MaxBatchSize:
		return fmt.Errorf("%w: batch_size %d not in [1,%d]", ErrHyper, h.BatchSize, MaxBatchSize)
	case h.EvalBatchSize < 1 || h.EvalBatchSize > MaxBatchSize:
		return fmt.Errorf("%w: eval_batch_size %d not in [1,%d]", ErrHyper, h.EvalBatchSize, MaxBatchSize)
	case !(h.LearningRate > 0) || math.IsInf(float64(h.LearningRate), 0):
		return fmt.Errorf("%w: learning_rate %v must be finite and > 0", ErrHyper, h.LearningRate)
	case !(h.Mu >= 0) || math.IsInf(float64(h.Mu), 0):
		return fmt.Errorf("%w: mu %v must be finite and >= 0", ErrHyper, h.Mu)
	}
	return nil
}

// Order returns the example order for one epoch: a Fisher–Yates shuffle of
// [0,n) driven by SplitMix64 seeded from (seed, epoch). The generator is spelled
// out here rather than taken from math/rand so that the order is part of the
// recipe and cannot change with a Go release.
func Order(n int, seed uint64, epoch int) []int32 {
	idx := make([]int32, n)
	for i := range idx {
		idx[i] = int32(i)
	}
	s := splitMix{state: seed ^ (uint64(epoch)+1)*0x9e3779b97f4a7c15}
	for i := n - 1; i > 0; i-- {
		j := int(s.below(uint64(i + 1)))
		idx[i], idx[j] = idx[j], idx[i]
	}
	return idx
}

type splitMix struct{ state uint64 }

func (s *splitMix) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// below returns a uniform value in [0,n) by rejection, without modulo bias.
func (s *splitMix) below(n uint64) uint64 {
	limit := -n % n // = 2^64 mod n
	for {
		v := s.next()
		if v >= limit {
			return v % n
		}
	}
}

// Batches splits an order into consecutive batches of at most size examples;
// the last batch may be short so that every example is seen once per epoch.
func Batches(order []int32, size int) [][]int32 {
	var out [][]int32
	for len(order) > 0 {
		k := min(size, len(order))
		out = append(out, order[:k])
		order = order[k:]
	}
	return out
}
