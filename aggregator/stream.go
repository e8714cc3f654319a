package aggregator

import (
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// Updates in pieces. A server that folds each report into the round's sum as
// its bytes arrive never holds a whole update: it reads the report twice,
// once through a Check and, if that passes, once through a Part. A Check
// sees the values in order and decides what Validate decides for the whole
// vector, with the same sum of squares to the bit however the vector is cut;
// a Part then adds them without looking at them again.

// Check validates one update seen in pieces, in coordinate order, as
// Validate validates a whole one.
type Check struct {
	dim, tail int
	maxNorm   float64
	n         int
	s         [4]float64
}

// NewCheck returns a check for an update of dim values whose L2 norm must
// not exceed maxNorm (0: no bound).
func NewCheck(dim int, maxNorm float64) (*Check, error) {
	if err := (ValidateOptions{Dim: dim, MaxNorm: maxNorm}).check(); err != nil {
		return nil, err
	}
	return &Check{dim: dim, tail: dim &^ 3, maxNorm: maxNorm}, nil
}

// Write checks the next values: all finite, and no more than the update's
// dimension in all.
func (c *Check) Write(values []float32) error {
	if len(values) > c.dim-c.n {
		return fmt.Errorf("aggregator: check: more than %d values: %w", c.dim, ErrShape)
	}
	// The sums take value i into s[i%4], and the values past the last whole
	// group of four into s[0], as sumSquares does with the whole vector.
	i, n := 0, c.n
	for ; i < len(values) && n < c.tail && n%4 != 0; i, n = i+1, n+1 {
		c.s[n%4] += float64(values[i]) * float64(values[i])
	}
	for ; i+4 <= len(values) && n+4 <= c.tail; i, n = i+4, n+4 {
		a, b, x, d := float64(values[i]), float64(values[i+1]), float64(values[i+2]), float64(values[i+3])
		c.s[0] += a * a
		c.s[1] += b * b
		c.s[2] += x * x
		c.s[3] += d * d
	}
	for ; i < len(values); i, n = i+1, n+1 {
		v := float64(values[i]) * float64(values[i])
		if n < c.tail {
			c.s[n%4] += v
		} else {
			c.s[0] += v
		}
	}
	ss := (c.s[0] + c.s[1]) + (c.s[2] + c.s[3])
	if math.IsNaN(ss) || math.IsInf(ss, 0) {
		for j, x := range values {
			if !finite32(x) {
				return fmt.Errorf("aggregator: check: update[%d] = %v: %w", c.n+j, x, ErrNonFinite)
			}
		}
	}
	c.n = n
	return nil
}

// Close checks that the update had all its values and that its norm is
// within the bound.
func (c *Check) Close() error {
	if c.n != c.dim {
		return fmt.Errorf("aggregator: check: update has %d values, want %d: %w", c.n, c.dim, ErrShape)
	}
	if c.maxNorm > 0 {
		if norm := c.Norm(); norm > c.maxNorm*(1+NormTolerance) {
			return fmt.Errorf("aggregator: check: update norm %.6g exceeds bound %.6g: %w", norm, c.maxNorm, ErrNormBound)
		}
	}
	return nil
}

// Norm is the L2 norm of the values written so far.
func (c *Check) Norm() float64 { return math.Sqrt((c.s[0] + c.s[1]) + (c.s[2] + c.s[3])) }

// Part adds one update to a collector in pieces, in coordinate order:
// Write each piece, then Close. The update must have passed a Check; a Part
// adds what it is given. Until Close the update does not count, and a Part
// left unclosed after a Write leaves its collector incomplete: Aggregate
// then fails with ErrIncomplete rather than return a partial sum.
type Part interface {
	Write(values []float32) error
	Close() error
}

// Begin starts adding one update of the given weight in pieces. One Part
// may be open at a time.
func (a *Accumulator) Begin(weight float64) (Part, error) {
	if err := checkWeight("begin", weight); err != nil {
		return nil, err
	}
	if err := a.checkTotal("begin", weight); err != nil {
		return nil, err
	}
	if a.open {
		return nil, fmt.Errorf("aggregator: begin: another update is being added: %w", ErrIncomplete)
	}
	a.open = true
	return &accPart{a: a, weight: weight}, nil
}

type accPart struct {
	a      *Accumulator
	weight float64
	n      int
	done   bool
}

func (p *accPart) Write(values []float32) error {
	if p.done {
		return fmt.Errorf("aggregator: part: write after close: %w", ErrIncomplete)
	}
	if len(values) > p.a.dim-p.n {
		return fmt.Errorf("aggregator: part: more than %d values: %w", p.a.dim, ErrShape)
	}
	if len(values) == 0 {
		return nil
	}
	p.a.torn = true // until Close
	if err := kernel.AddScaled(p.a.sum[p.n:p.n+len(values)], values, p.weight); err != nil {
		return fmt.Errorf("aggregator: part: %w", err)
	}
	p.n += len(values)
	return nil
}

func (p *accPart) Close() error {
	if p.done {
		return nil
	}
	if p.n != p.a.dim {
		return fmt.Errorf("aggregator: part: %d values of %d added: %w", p.n, p.a.dim, ErrIncomplete)
	}
	p.done = true
	p.a.open, p.a.torn = false, false
	p.a.total += p.weight
	p.a.count++
	return nil
}

// Begin for the robust rules fills a new row: they hold every update anyway.
func (c *sampleCollector) Begin(weight float64) (Part, error) {
	if err := checkWeight("begin", weight); err != nil {
		return nil, err
	}
	if weight > MaxWeight-c.total {
		return nil, fmt.Errorf("aggregator: begin: total weight %v + %v exceeds 2^53: %w", c.total, weight, ErrWeight)
	}
	return &rowPart{c: c, weight: weight, row: make([]float32, 0, c.dim)}, nil
}

type rowPart struct {
	c      *sampleCollector
	weight float64
	row    []float32
	done   bool
}

func (p *rowPart) Write(values []float32) error {
	if p.done {
		return fmt.Errorf("aggregator: part: write after close: %w", ErrIncomplete)
	}
	if len(values) > p.c.dim-len(p.row) {
		return fmt.Errorf("aggregator: part: more than %d values: %w", p.c.dim, ErrShape)
	}
	p.row = append(p.row, values...)
	return nil
}

func (p *rowPart) Close() error {
	if p.done {
		return nil
	}
	if len(p.row) != p.c.dim {
		return fmt.Errorf("aggregator: part: %d values of %d added: %w", len(p.row), p.c.dim, ErrIncomplete)
	}
	p.done = true
	p.c.rows = append(p.c.rows, p.row)
	p.c.total += p.weight
	return nil
}
