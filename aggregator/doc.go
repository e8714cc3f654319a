// Package aggregator is Fleetlearn's aggregation math: it checks device
// updates, combines a round's updates and steps the global model with the
// server optimizer. It does no I/O; the aggregator service calls it from its
// round loop and persists what it returns.
//
// Vectors are flat []float32 in the model's canonical order (model.Layout).
// An update, or delta, is a device's trained weights minus the round's
// weights, and its weight is the device's example count.
//
// # A round
//
//	rule, err := aggregator.NewRule(aggregator.FedAdam, dim, aggregator.WithServerLR(0.03))
//	err = rule.UnmarshalBinary(saved) // when resuming a task
//
//	c, err := rule.NewCollector(maxNorm) // once per round
//	for _, r := range reports {
//		if err := c.Add(r.Delta, float64(r.NumExamples)); err != nil {
//			// refuse the report; errors.Is tells ErrShape, ErrNonFinite,
//			// ErrNormBound and ErrWeight apart
//		}
//	}
//	agg, err := c.Aggregate() // ErrEmpty when nothing was accepted
//	err = rule.Apply(global, agg)
//	saved, err = rule.MarshalBinary()
//
// A refused report leaves the collector as it was, and a failed Apply leaves
// the model and the optimizer state as they were, so the service can refuse
// or retry without bookkeeping. Validate checks an update on its own, for
// instance before queueing it.
//
// # Rules
//
// Kind values equal the wire enum fleetlearn.v1.AggregationRule. With Δ the
// round's combined update and lr the server learning rate:
//
//   - FedAvg (McMahan et al. 2017): global += lr·Δ, Δ the example-weighted
//     mean of the updates. lr = 1 is plain averaging.
//   - FedAvgM (Hsu et al. 2019): m = β·m + Δ; global += lr·m, β = 0.9 by
//     default. In steady state the effective rate is lr/(1−β), ten times
//     FedAvg's; lower lr when switching from FedAvg.
//   - FedAdam, FedYogi, FedAdagrad (Reddi et al., "Adaptive Federated
//     Optimization", ICLR 2021, Algorithm 2), Δ the weighted mean as the
//     pseudo-gradient: m = β₁·m + (1−β₁)·Δ, then
//     Adagrad v = v + Δ², Yogi v = v − (1−β₂)·Δ²·sign(v − Δ²),
//     Adam v = β₂·v + (1−β₂)·Δ², and global += η·m/(√v + τ), coordinate-wise.
//     Defaults are the paper's: β₁ = 0.9, β₂ = 0.99, τ = 10⁻³; η
//     (WithServerLR) defaults to 10⁻², but the paper tunes it per task.
//     State starts at m = 0 and v = τ², the smallest value Algorithm 2
//     allows (v₋₁ ≥ τ²); Flower starts v at 0. As in the paper there is no
//     bias correction, so m and v lean towards their starting values in
//     the first rounds. FedAdagrad keeps the paper's β₁ momentum; WithBeta1(0) gives plain
//     Adagrad.
//   - Median and TrimmedMean (Yin et al. 2018): Δ is the coordinate-wise
//     median, or the mean after dropping ⌊β·n⌋ of the n values at each end
//     of every coordinate (β = 0.1 by default, WithTrimFraction, β < 0.5);
//     then global += lr·Δ. With fewer than 1/β reports nothing is trimmed.
//
// # Memory and numerics
//
// The FedAvg family aggregates in a stream: its collector holds one float64
// sum per parameter (8·dim bytes) however many reports arrive. The sums are
// plain float64 rather than compensated: float64 has 29 bits more than the
// float32 inputs, so accumulated rounding stays below float32 resolution for
// any realistic round (see Accumulator).
//
// Median and TrimmedMean need every update of the round, so their collector
// keeps a copy of each: 4·dim bytes per report, 400 MB for 1000 reports of
// a 100k-parameter model; the service caps the cohort accordingly. They are
// unweighted, since a device's claimed example count must not give it more
// say over the robust statistic, and they refuse AddSum with ErrUnsupported.
// Each coordinate costs expected O(n) (quickselect) and at worst
// O(n log n): inputs that defeat the pivot choice fall back to sorting.
//
// # Validation
//
// An update counts only if it has exactly dim values, all finite, an L2 norm
// within the round's bound (when set; NormTolerance allows float32 rounding
// above it) and a weight in (0, MaxWeight]. Errors name the offending index
// or value.
//
// # Secure aggregation
//
// With secure aggregation the server learns only Σ wₖ·Δₖ and Σ wₖ.
// Collector.AddSum (Accumulator.AddSum) takes that sum, the total weight and
// the number of updates, and gives the same mean as adding the updates one
// by one. Individual norms cannot be checked there; a norm bound is checked
// in aggregate (‖Σ wₖ·Δₖ‖ ≤ Σ wₖ·bound).
//
// # Persisting state
//
// Rule.MarshalBinary encodes the optimizer state (momentum and moments as
// float32, a version byte, the kind, the dimension and the step count) for
// the service to store next to the model, and UnmarshalBinary restores it
// into a rule built from the same task configuration, refusing anything
// malformed with ErrState.
package aggregator
