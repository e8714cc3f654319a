package aggregator

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DiLoCo's outer optimizer defaults (Douillard et al. 2023, arXiv
// 2311.08105): SGD with Nesterov momentum, learning rate 0.7, momentum 0.9.
const (
	DefaultOuterLR       = 0.7
	DefaultOuterMomentum = 0.9
)

// Outer is DiLoCo's outer optimizer: SGD with Nesterov momentum applied to
// the pseudo-gradient Δ = θ − mean(θᵢ), θ the outer parameters and θᵢ the
// islands' parameters after their inner steps. Each step is PyTorch's
// torch.optim.SGD(nesterov=True) with no dampening or weight decay:
//
//	b = μ·b + Δ
//	θ = θ − lr·(Δ + μ·b)
//
// b starts at 0, so the first step has b = Δ as in PyTorch. Note the sign:
// Δ points away from where the islands went, like a gradient, whereas Rule
// takes updates pointing towards them. With μ = 0 and lr = 1 the step lands
// on the islands' mean.
//
// The arithmetic is float64 in coordinate order; the momentum buffer is
// kept, and persisted, as float32, so a step after a restore is bit for bit
// the step without one. An Outer is not safe for concurrent use.
type Outer struct {
	dim      int
	lr       float64
	momentum float64
	steps    uint64
	buf      []float32
}

// NewOuter returns an outer optimizer for dim parameters with a zero
// momentum buffer. It honours WithServerLR (the outer learning rate,
// positive and finite; DefaultOuterLR when not given) and WithMomentum (μ in
// [0, 1); DefaultOuterMomentum when not given) and ignores the other
// options, as NewRule ignores those a rule does not use.
func NewOuter(dim int, opts ...Option) (*Outer, error) {
	if err := (ValidateOptions{Dim: dim}).check(); err != nil {
		return nil, err
	}
	c := config{momentum: DefaultOuterMomentum}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if !c.lrSet {
		c.serverLR = DefaultOuterLR
	}
	switch {
	case !(c.serverLR > 0) || math.IsInf(c.serverLR, 0):
		return nil, fmt.Errorf("aggregator: new outer: learning rate %v must be positive and finite: %w", c.serverLR, ErrConfig)
	case !(c.momentum >= 0 && c.momentum < 1):
		return nil, fmt.Errorf("aggregator: new outer: momentum %v not in [0, 1): %w", c.momentum, ErrConfig)
	}
	return &Outer{dim: dim, lr: c.serverLR, momentum: c.momentum, buf: make([]float32, dim)}, nil
}

// Dim returns the number of parameters.
func (o *Outer) Dim() int { return o.dim }

// LR returns the outer learning rate.
func (o *Outer) LR() float64 { return o.lr }

// Momentum returns the Nesterov momentum μ.
func (o *Outer) Momentum() float64 { return o.momentum }

// Steps returns how many outer steps have succeeded, across restarts when
// the state is persisted.
func (o *Outer) Steps() uint64 { return o.steps }

// Step performs one outer step on theta in place from the islands'
// parameters: Δ = θ − WeightedMean(islands, weights), then the Nesterov
// update. Weights are the islands' example counts (each in (0, MaxWeight]);
// nil weighs every island equally. The difference θ − mean is taken in
// float64, so with μ = 0 and lr = 1 theta becomes exactly the mean whenever
// that difference is exact (whenever a coordinate of θ and of the mean are
// within a factor 2²⁸ of each other, or either is 0).
//
// On error neither theta nor the state change: wrong lengths give ErrShape,
// a non-finite value or a step that would overflow float32 ErrNonFinite, a
// bad weight ErrWeight, no islands ErrEmpty.
func (o *Outer) Step(theta []float32, islands [][]float32, weights []float64) error {
	if len(theta) != o.dim {
		return fmt.Errorf("aggregator: outer step: theta has %d values, want %d: %w", len(theta), o.dim, ErrShape)
	}
	for i, v := range islands {
		if len(v) != o.dim {
			return fmt.Errorf("aggregator: outer step: island %d has %d values, want %d: %w", i, len(v), o.dim, ErrShape)
		}
	}
	if weights == nil {
		weights = make([]float64, len(islands))
		for i := range weights {
			weights[i] = 1
		}
	}
	mean, err := WeightedMean(islands, weights)
	if err != nil {
		return fmt.Errorf("aggregator: outer step: %w", err)
	}
	return o.apply("outer step", theta, func(i int) float64 { return float64(theta[i]) - float64(mean[i]) })
}

// Apply performs one outer step on theta in place from a ready
// pseudo-gradient delta = θ − mean(θᵢ), for instance the weighted mean of
// the islands' dequantized int8 pseudo-gradients (package quant): the mean
// is linear, so averaging the islands' θ − θᵢ gives θ − mean(θᵢ). Errors are
// those of Step, and leave theta and the state unchanged.
func (o *Outer) Apply(theta, delta []float32) error {
	if len(theta) != o.dim || len(delta) != o.dim {
		return fmt.Errorf("aggregator: outer apply: theta has %d values and delta %d, want %d: %w",
			len(theta), len(delta), o.dim, ErrShape)
	}
	for i, d := range delta {
		if !finite32(d) {
			return fmt.Errorf("aggregator: outer apply: delta[%d] = %v: %w", i, d, ErrNonFinite)
		}
	}
	return o.apply("outer apply", theta, func(i int) float64 { return float64(delta[i]) })
}

// apply checks every coordinate's step before writing any, so that a
// failure leaves theta and the buffer as they were; the step is cheap next
// to the islands' inner steps, so it is simply computed twice.
func (o *Outer) apply(op string, theta []float32, delta func(int) float64) error {
	for i, t := range theta {
		if !finite32(t) {
			return fmt.Errorf("aggregator: %s: theta[%d] = %v: %w", op, i, t, ErrNonFinite)
		}
		if b, t2 := o.step(i, t, delta(i)); !finite32(b) || !finite32(t2) {
			return fmt.Errorf("aggregator: %s: step at %d (theta %v, delta %v) is not finite: %w",
				op, i, t, delta(i), ErrNonFinite)
		}
	}
	for i, t := range theta {
		o.buf[i], theta[i] = o.step(i, t, delta(i))
	}
	o.steps++
	return nil
}

// step returns coordinate i's new momentum buffer and parameter. The
// parameter uses the unrounded buffer, as the rules' steps do. The explicit
// float64 conversions round each product, which stops the compiler from
// fusing it with the following addition (the Go spec allows FMA on arm64,
// ppc64le and s390x), so every architecture computes the same bits.
func (o *Outer) step(i int, theta float32, d float64) (buf32, theta32 float32) {
	b := float64(o.momentum*float64(o.buf[i])) + d
	next := float64(theta) - float64(o.lr*(d+float64(o.momentum*b)))
	return float32(b), float32(next)
}

// Outer state encoding, version 1, little-endian:
//
//	[0:4]    magic "FLDO"
//	[4]      version (1)
//	[5:13]   dim, uint64
//	[13:21]  steps, uint64
//	[21:]    the momentum buffer, dim float32
//
// As for Rule, the learning rate and momentum are not stored: they belong to
// the job's configuration, and the optimizer they restore into carries them.
const (
	outerMagic   = "FLDO"
	outerVersion = 1
	outerHeader  = 21
)

// MarshalBinary encodes the momentum buffer and the step count for the
// service to store next to θ (see UnmarshalBinary).
func (o *Outer) MarshalBinary() ([]byte, error) {
	b := make([]byte, outerHeader, outerHeader+4*o.dim)
	copy(b, outerMagic)
	b[4] = outerVersion
	binary.LittleEndian.PutUint64(b[5:], uint64(o.dim))
	binary.LittleEndian.PutUint64(b[13:], o.steps)
	for _, x := range o.buf {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b, nil
}

// UnmarshalBinary restores state written by MarshalBinary of an Outer of
// the same dimension. It refuses, with ErrState and no change, another
// magic or version, another dimension, a wrong length and non-finite
// buffer values.
func (o *Outer) UnmarshalBinary(b []byte) error {
	if len(b) < outerHeader {
		return fmt.Errorf("aggregator: outer state: %d bytes, shorter than the %d-byte header: %w", len(b), outerHeader, ErrState)
	}
	if string(b[:4]) != outerMagic {
		return fmt.Errorf("aggregator: outer state: magic %q, want %q (not outer optimizer state): %w", b[:4], outerMagic, ErrState)
	}
	if b[4] != outerVersion {
		return fmt.Errorf("aggregator: outer state: version %d, want %d: %w", b[4], outerVersion, ErrState)
	}
	if dim := binary.LittleEndian.Uint64(b[5:]); dim != uint64(o.dim) {
		return fmt.Errorf("aggregator: outer state: dimension %d, want %d: %w", dim, o.dim, ErrState)
	}
	if want := outerHeader + 4*o.dim; len(b) != want {
		return fmt.Errorf("aggregator: outer state: %d bytes, want %d: %w", len(b), want, ErrState)
	}
	buf := make([]float32, o.dim)
	p := b[outerHeader:]
	for i := range buf {
		x := math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:]))
		if !finite32(x) {
			return fmt.Errorf("aggregator: outer state: momentum [%d] = %v is not finite: %w", i, x, ErrState)
		}
		buf[i] = x
	}
	o.steps = binary.LittleEndian.Uint64(b[13:])
	o.buf = buf
	return nil
}
