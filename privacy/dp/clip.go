package dp

import (
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/internal/floats"
)

// L2Norm returns the Euclidean norm of v, accumulated in float64, or an
// error if an element is NaN or infinite.
func L2Norm(v []float32) (float64, error) {
	// One branch-free scan for non-finite values, then a sum without tests:
	// every device clips every update, and the per-value tests cost more
	// than the sum.
	if i := floats.FirstNonFinite(v); i >= 0 {
		return 0, fmt.Errorf("dp: norm: %w: element %d is %v", ErrInvalid, i, v[i])
	}
	var s float64
	for _, x := range v {
		f := float64(x)
		s += f * f
	}
	return math.Sqrt(s), nil
}

// ClipL2 scales update in place so that its L2 norm is at most clipNorm and
// returns the norm it had. Updates are float32, the type models train in;
// norms and scale factors are computed in float64.
func ClipL2(update []float32, clipNorm float64) (float64, error) {
	if err := checkPositive("clip norm", clipNorm); err != nil {
		return 0, fmt.Errorf("dp: clip: %w", err)
	}
	norm, err := L2Norm(update)
	if err != nil {
		return 0, err
	}
	if norm > clipNorm {
		f := clipNorm / norm
		for i := range update {
			update[i] = float32(float64(update[i]) * f)
		}
	}
	return norm, nil
}

// AdaptiveClip tracks a target quantile of update norms with a privately
// estimated quantile (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially
// Private Learning with Adaptive Clipping", NeurIPS 2021). Each round every
// device reports one bit, whether its update norm was at most the current
// bound C; the server adds N(0, σ_b²) to the count, divides by the number of
// devices to get b̄, and updates C ← C·exp(−η·(b̄ − γ)).
//
// The bits cost privacy too. To keep the total at noise multiplier z, noise
// the updates with AdjustedNoiseMultiplier(z, σ_b) instead of z. The paper
// suggests σ_b ≈ (expected devices per round)/20, γ = 0.5, η = 0.2.
type AdaptiveClip struct {
	norm, quantile, rate, countStddev float64
}

// NewAdaptiveClip returns a tracker starting at initialNorm that aims to
// leave the fraction targetQuantile ∈ (0, 1) of updates unclipped.
func NewAdaptiveClip(initialNorm, targetQuantile, learningRate, countStddev float64) (*AdaptiveClip, error) {
	bad := func(err error) (*AdaptiveClip, error) {
		return nil, fmt.Errorf("dp: adaptive clip: %w", err)
	}
	if err := checkPositive("initial clip norm", initialNorm); err != nil {
		return bad(err)
	}
	if !(targetQuantile > 0 && targetQuantile < 1) {
		return bad(fmt.Errorf("%w: target quantile %v, want (0, 1)", ErrInvalid, targetQuantile))
	}
	if err := checkPositive("learning rate", learningRate); err != nil {
		return bad(err)
	}
	if !(countStddev >= 0) || math.IsInf(countStddev, 0) {
		return bad(fmt.Errorf("%w: count noise stddev %v", ErrInvalid, countStddev))
	}
	return &AdaptiveClip{norm: initialNorm, quantile: targetQuantile, rate: learningRate, countStddev: countStddev}, nil
}

// Norm returns the clip bound for the current round.
func (a *AdaptiveClip) Norm() float64 { return a.norm }

// Unclipped is the bit a device reports for an update of the given norm.
func (a *AdaptiveClip) Unclipped(updateNorm float64) bool { return updateNorm <= a.norm }

// Update takes the number of devices whose bit was set among those that
// reported, noises the count, moves the bound geometrically and returns the
// noised fraction b̄ it used.
func (a *AdaptiveClip) Update(unclipped, reported int, src *Source) (float64, error) {
	if reported < 1 || unclipped < 0 || unclipped > reported {
		return 0, fmt.Errorf("dp: adaptive clip: %w: %d of %d unclipped", ErrInvalid, unclipped, reported)
	}
	if src == nil {
		return 0, fmt.Errorf("dp: adaptive clip: %w: nil source", ErrInvalid)
	}
	b := (float64(unclipped) + a.countStddev*src.Normal()) / float64(reported)
	a.norm *= math.Exp(-a.rate * (b - a.quantile))
	return b, nil
}

// AdjustedNoiseMultiplier returns z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), the
// multiplier for the update noise such that updates and clipping bits
// together cost as much as one Gaussian mechanism with multiplier z. It
// needs 2σ_b > z: the bits alone must not exceed the budget.
func AdjustedNoiseMultiplier(z, countStddev float64) (float64, error) {
	if err := checkPositive("noise multiplier", z); err != nil {
		return 0, fmt.Errorf("dp: adjusted noise multiplier: %w", err)
	}
	if err := checkPositive("count noise stddev", countStddev); err != nil {
		return 0, fmt.Errorf("dp: adjusted noise multiplier: %w", err)
	}
	inv := 1/(z*z) - 1/(4*countStddev*countStddev)
	if !(inv > 0) {
		return 0, fmt.Errorf("dp: adjusted noise multiplier: %w: count noise stddev %v must exceed z/2 = %v",
			ErrInvalid, countStddev, z/2)
	}
	return 1 / math.Sqrt(inv), nil
}

func checkPositive(what string, v float64) error {
	if !(v > 0) || math.IsInf(v, 0) {
		return fmt.Errorf("%w: %s %v, want a finite value > 0", ErrInvalid, what, v)
	}
	return nil
}
