package aggregator

import (
	"fmt"
	"slices"
)

// WeightedMean is FedAvg's mean of whole vectors rather than deltas: the
// sum of weights[i]·vectors[i] over the sum of weights, accumulated in
// float64 in index order, so the result depends on the inputs and their
// order alone. A pool job's ranks average their parameters with it (the
// one-pool case of DiLoCo's outer step with plain averaging).
func WeightedMean(vectors [][]float32, weights []float64) ([]float32, error) {
	switch {
	case len(vectors) == 0:
		return nil, fmt.Errorf("aggregator: weighted mean: %w", ErrEmpty)
	case len(vectors) != len(weights):
		return nil, fmt.Errorf("aggregator: weighted mean: %d vectors, %d weights: %w", len(vectors), len(weights), ErrConfig)
	}
	for i, v := range vectors {
		if len(v) != len(vectors[0]) {
			return nil, fmt.Errorf("aggregator: weighted mean: vector %d has %d values, vector 0 %d: %w", i, len(v), len(vectors[0]), ErrShape)
		}
	}
	rule, err := NewRule(FedAvg, len(vectors[0]))
	if err != nil {
		return nil, err
	}
	c, err := rule.NewCollector(0)
	if err != nil {
		return nil, err
	}
	for i, v := range vectors {
		// Cloned: a collector may scale what it is given in place.
		if err := c.Add(slices.Clone(v), weights[i]); err != nil {
			return nil, fmt.Errorf("aggregator: weighted mean: vector %d: %w", i, err)
		}
	}
	return c.Aggregate()
}
