package lm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// Hyper are the hyper-parameters a task passes to the language-model module
// as JSON. Unknown fields are refused.
type Hyper struct {
	Epochs        int `json:"epochs"`
	BatchSize     int `json:"batch_size"`
	EvalBatchSize int `json:"eval_batch_size"`
	// MaxSteps stops training after this many optimizer steps (0: none), so a
	// device with much data still finishes in the round's time.
	MaxSteps     int     `json:"max_steps"`
	LearningRate float32 `json:"learning_rate"`
	// Warmup steps raise the learning rate linearly from lr/Warmup to lr.
	Warmup      int     `json:"warmup"`
	Beta1       float32 `json:"beta1"`
	Beta2       float32 `json:"beta2"`
	Eps         float32 `json:"eps"`
	WeightDecay float32 `json:"weight_decay"`
	// GradClip rescales the gradient to this global L2 norm when it is
	// larger (0: no clipping).
	GradClip float32 `json:"grad_clip"`
	// Heads is the number of attention heads; 0 means Dim/32 (at least 1).
	// It is not visible in the tensor shapes, so pretraining and fine-tuning
	// must use the same value.
	Heads int `json:"heads"`
}

// Defaults are used for fields a task leaves out.
var Defaults = Hyper{Epochs: 1, BatchSize: 16, EvalBatchSize: 64, LearningRate: 1e-3,
	Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, GradClip: 1}

// Limits a task may not exceed, so it cannot make a device allocate or loop
// without bound.
const (
	MaxEpochs    = 1000
	MaxBatchSize = 4096
	MaxSteps     = 1 << 24
)

// ParseHyper decodes JSON hyper-parameters over Defaults and validates them.
// Empty input yields Defaults.
func ParseHyper(b []byte) (Hyper, error) {
	h := Defaults
	if len(bytes.TrimSpace(b)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&h); err != nil {
			return Hyper{}, fmt.Errorf("%w: %v", ErrHyper, err)
		}
		if dec.More() {
			return Hyper{}, fmt.Errorf("%w: trailing data after the object", ErrHyper)
		}
	}
	return h, h.Validate()
}

func finite(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

// Validate checks ranges.
func (h Hyper) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrHyper}, a...)...) }
	switch {
	case h.Epochs < 1 || h.Epochs > MaxEpochs:
		return bad("epochs %d, want 1..%d", h.Epochs, MaxEpochs)
	case h.BatchSize < 1 || h.BatchSize > MaxBatchSize:
		return bad("batch_size %d, want 1..%d", h.BatchSize, MaxBatchSize)
	case h.EvalBatchSize < 1 || h.EvalBatchSize > MaxBatchSize:
		return bad("eval_batch_size %d, want 1..%d", h.EvalBatchSize, MaxBatchSize)
	case h.MaxSteps < 0 || h.MaxSteps > MaxSteps:
		return bad("max_steps %d, want 0..%d", h.MaxSteps, MaxSteps)
	case h.Warmup < 0 || h.Warmup > MaxSteps:
		return bad("warmup %d, want 0..%d", h.Warmup, MaxSteps)
	case !finite(h.LearningRate) || h.LearningRate <= 0 || h.LearningRate > 1:
		return bad("learning_rate %v, want in (0, 1]", h.LearningRate)
	case !finite(h.Beta1) || h.Beta1 < 0 || h.Beta1 >= 1, !finite(h.Beta2) || h.Beta2 < 0 || h.Beta2 >= 1:
		return bad("beta1 %v, beta2 %v, want each in [0, 1)", h.Beta1, h.Beta2)
	case !finite(h.Eps) || h.Eps <= 0 || h.Eps > 1:
		return bad("eps %v, want in (0, 1]", h.Eps)
	case !finite(h.WeightDecay) || h.WeightDecay < 0 || h.WeightDecay > 1:
		return bad("weight_decay %v, want in [0, 1]", h.WeightDecay)
	case !finite(h.GradClip) || h.GradClip < 0:
		return bad("grad_clip %v, want finite and ≥ 0", h.GradClip)
	case h.Heads < 0 || h.Heads > 1024:
		return bad("heads %d, want 0..1024", h.Heads)
	}
	return nil
}

// lr is the learning rate of optimizer step t (from 1).
func (h Hyper) lr(t int) float32 {
	if h.Warmup > 0 && t < h.Warmup {
		return float32(float64(h.LearningRate) * float64(t) / float64(h.Warmup))
	}
	return h.LearningRate
}
