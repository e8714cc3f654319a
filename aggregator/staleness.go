package aggregator

import "fmt"

// Staleness collects an asynchronous buffer's updates for a streaming rule
// (FedBuff: Nguyen et al., AISTATS 2022). Each update comes with its
// weight wₖ (its example count, or 1 under DP) and a staleness factor
// sₖ in (0, 1]; Aggregate returns Σ sₖwₖuₖ / Σ wₖ. Dividing by the weights
// alone, not by Σ sₖwₖ, makes staleness shrink an update's part of the
// step rather than only its share against the buffer's others, and keeps
// one device's effect on the step within its norm bound over Σ wₖ, which
// TotalWeight reports and central DP noise is scaled to.
type Staleness struct {
	c   Collector
	raw float64
}

// NewStaleness wraps a streaming rule's collector (Rule.NewCollector).
func NewStaleness(c Collector) *Staleness { return &Staleness{c: c} }

func checkFactor(op string, s float64) error {
	if !(s > 0 && s <= 1) {
		return fmt.Errorf("aggregator: %s: staleness factor %v, want (0, 1]: %w", op, s, ErrWeight)
	}
	return nil
}

// Add counts update with weight and staleness factor s.
func (st *Staleness) Add(update []float32, weight, s float64) error {
	if err := checkFactor("add", s); err != nil {
		return err
	}
	if err := st.c.Add(update, weight*s); err != nil {
		return err
	}
	st.raw += weight
	return nil
}

// Begin starts adding one update in pieces (Collector.Begin) with weight
// and staleness factor s. The weight counts from here: a Part that fails
// leaves the buffer with part of an update, which the caller must drop.
func (st *Staleness) Begin(weight, s float64) (Part, error) {
	if err := checkFactor("begin", s); err != nil {
		return nil, err
	}
	p, err := st.c.Begin(weight * s)
	if err != nil {
		return nil, err
	}
	st.raw += weight
	return p, nil
}

// Count is the number of updates counted.
func (st *Staleness) Count() int { return st.c.Count() }

// TotalWeight is Σ wₖ, the step's denominator.
func (st *Staleness) TotalWeight() float64 { return st.raw }

// Aggregate returns the buffer's step, Σ sₖwₖuₖ / Σ wₖ, in the wrapped
// collector's memory (it aggregates once).
func (st *Staleness) Aggregate() ([]float32, error) {
	mean, err := st.c.Aggregate()
	if err != nil {
		return nil, err
	}
	if !(st.raw > 0) {
		return nil, fmt.Errorf("aggregator: staleness: no weight: %w", ErrEmpty)
	}
	f := st.c.TotalWeight() / st.raw
	for i := range mean {
		mean[i] = float32(float64(mean[i]) * f)
	}
	return mean, nil
}
