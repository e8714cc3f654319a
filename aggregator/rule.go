package aggregator

import (
	"encoding"
	"fmt"
	"math"
)

// Collector gathers one round's reports for a Rule.
type Collector interface {
	// Add validates one device update (see Validate) and counts it with
	// the given weight, normally its example count. On error the collector
	// is unchanged and the report can simply be refused.
	Add(update []float32, weight float64) error
	// AddSum counts a pre-summed batch Σ wₖ·updateₖ of count updates with
	// total weight totalWeight, as secure aggregation reveals it (see
	// Accumulator.AddSum). Rules that are not Streaming refuse it with
	// ErrUnsupported.
	AddSum(weightedSum []float64, totalWeight float64, count int) error
	// Begin starts adding one update of the given weight in pieces (see
	// Part); the update must have passed a Check with the collector's
	// dimension and bound.
	Begin(weight float64) (Part, error)
	// Count returns the number of updates counted.
	Count() int
	// TotalWeight returns the sum of their weights.
	TotalWeight() float64
	// Aggregate returns the round's combined update: the weighted mean for
	// the FedAvg family, the coordinate-wise median or trimmed mean for the
	// robust rules. ErrEmpty if nothing was counted. The FedAvg family
	// returns it in the collector's own memory, which it then no longer
	// needs: a collector aggregates once.
	Aggregate() ([]float32, error)
}

// Rule turns each round's combined update into a step of the global model
// and keeps the server optimizer state between rounds. A round goes:
//
//	c, err := rule.NewCollector(maxNorm)
//	for each report: c.Add(delta, examples) // refuse the report on error
//	agg, err := c.Aggregate()
//	err = rule.Apply(global, agg)
//	state, err := rule.MarshalBinary() // persist with the new model
//
// A Rule is not safe for concurrent use.
type Rule interface {
	// Kind returns the rule's kind.
	Kind() Kind
	// Dim returns the number of model parameters.
	Dim() int
	// Steps returns how many times Apply has succeeded, across restarts
	// when the state is persisted.
	Steps() uint64
	// NewCollector returns an empty collector for one round whose updates
	// must have an L2 norm of at most maxNorm (0: no bound).
	NewCollector(maxNorm float64) (Collector, error)
	// Apply updates global in place with the round's combined update (the
	// pseudo-gradient, pointing the way the devices moved) and advances the
	// optimizer state. On error neither global nor the state change: wrong
	// lengths give ErrShape; a non-finite value in delta or global, or a
	// step that would overflow float32, gives ErrNonFinite.
	Apply(global, delta []float32) error
	// ApplyParts is Apply to a global vector held in parts, laid end to end
	// (a model's tensors), updated in place.
	ApplyParts(parts [][]float32, delta []float32) error
	// MarshalBinary encodes the optimizer state (see UnmarshalBinary).
	encoding.BinaryMarshaler
	// UnmarshalBinary restores state written by MarshalBinary of a rule of
	// the same kind and dimension. It refuses, with ErrState and no change,
	// an unknown version, another kind or dimension, a wrong length, and
	// non-finite or (for second moments) negative values.
	encoding.BinaryUnmarshaler
}

// NewRule returns the rule of the given kind for a model of dim parameters.
// Defaults (see the Default constants) apply to options not given. The
// adaptive rules start with first moment 0 and second moment τ².
func NewRule(kind Kind, dim int, opts ...Option) (Rule, error) {
	if !kind.valid() {
		return nil, fmt.Errorf("aggregator: new rule: unknown kind %v: %w", kind, ErrConfig)
	}
	if err := (ValidateOptions{Dim: dim}).check(); err != nil {
		return nil, err
	}
	cfg, err := newConfig(kind, opts)
	if err != nil {
		return nil, err
	}
	r := &rule{kind: kind, dim: dim, cfg: cfg}
	switch kind.vectors() {
	case 2:
		r.v = make([]float32, dim)
		v0 := float32(cfg.tau * cfg.tau)
		for i := range r.v {
			r.v[i] = v0
		}
		fallthrough
	case 1:
		r.m = make([]float32, dim)
	}
	return r, nil
}

type rule struct {
	kind  Kind
	dim   int
	cfg   config
	steps uint64
	m     []float32 // FedAvgM momentum, or the adaptive rules' first moment
	v     []float32 // the adaptive rules' second moment
}

func (r *rule) Kind() Kind    { return r.kind }
func (r *rule) Dim() int      { return r.dim }
func (r *rule) Steps() uint64 { return r.steps }

func (r *rule) NewCollector(maxNorm float64) (Collector, error) {
	if r.kind.Streaming() {
		a, err := NewAccumulator(r.dim, maxNorm)
		if err != nil {
			return nil, err
		}
		return meanCollector{a}, nil
	}
	if err := (ValidateOptions{Dim: r.dim, MaxNorm: maxNorm}).check(); err != nil {
		return nil, err
	}
	return &sampleCollector{kind: r.kind, dim: r.dim, maxNorm: maxNorm, trim: r.cfg.trim}, nil
}

type meanCollector struct{ *Accumulator }

// Aggregate returns the mean in the accumulator's memory (MeanInPlace):
// a collector serves one round.
func (c meanCollector) Aggregate() ([]float32, error) { return c.MeanInPlace() }

func (r *rule) Apply(global, delta []float32) error {
	return r.ApplyParts([][]float32{global}, delta)
}

func (r *rule) ApplyParts(parts [][]float32, delta []float32) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n != r.dim || len(delta) != r.dim {
		return fmt.Errorf("aggregator: apply: global has %d values and delta %d, want %d: %w",
			n, len(delta), r.dim, ErrShape)
	}
	// Check every coordinate before writing any, so that a failure leaves
	// the model and the optimizer state as they were. The step is cheap
	// next to collecting a round, so it is simply computed twice.
	i := 0
	for _, global := range parts {
		for j := range global {
			if !finite32(delta[i]) {
				return fmt.Errorf("aggregator: apply: delta[%d] = %v: %w", i, delta[i], ErrNonFinite)
			}
			if m, v, g := r.step(i, global[j], delta[i]); !finite32(m) || !finite32(v) || !finite32(g) {
				return fmt.Errorf("aggregator: apply: %v step at %d (global %v, delta %v) is not finite: %w",
					r.kind, i, global[j], delta[i], ErrNonFinite)
			}
			i++
		}
	}
	i = 0
	for _, global := range parts {
		for j := range global {
			m, v, g := r.step(i, global[j], delta[i])
			global[j] = g
			if r.m != nil {
				r.m[i] = m
			}
			if r.v != nil {
				r.v[i] = v
			}
			i++
		}
	}
	r.steps++
	return nil
}

// step returns coordinate i's new first moment (or momentum), second moment
// and global weight; moments a rule does not keep come back as 0. The
// arithmetic is float64 and the weight uses the unrounded moments.
func (r *rule) step(i int, g, d float32) (m32, v32, g32 float32) {
	c := &r.cfg
	delta := float64(d)
	var m, v, step float64
	switch r.kind {
	case FedAvgM:
		m = c.momentum*float64(r.m[i]) + delta
		step = c.serverLR * m
	case FedAdam, FedYogi, FedAdagrad:
		m = c.beta1*float64(r.m[i]) + (1-c.beta1)*delta
		v = float64(r.v[i])
		d2 := delta * delta
		switch r.kind {
		case FedAdam:
			v = c.beta2*v + (1-c.beta2)*d2
		case FedYogi:
			v -= (1 - c.beta2) * d2 * sign(v-d2)
		case FedAdagrad:
			v += d2
		}
		step = c.serverLR * m / (math.Sqrt(v) + c.tau)
	default: // FedAvg and the robust rules
		step = c.serverLR * delta
	}
	return float32(m), float32(v), float32(float64(g) + step)
}

func sign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}
