package aggregator

import (
	"fmt"
	"math"
)

// MaxWeight bounds a report's weight and a round's total weight. Example
// counts up to 2⁵³ add up exactly in float64, and the bound keeps every
// weighted sum at most 2⁵³·MaxFloat32, far from float64 overflow, so an
// accepted report can never break the round.
const MaxWeight = 1 << 53

// NormTolerance is the relative slack Validate allows over MaxNorm. A device
// that clips to the bound in float32 can land a few units in the last place
// above it; refusing those honest updates would waste their work.
const NormTolerance = 1e-5

// maxDim catches a corrupt dimension before it becomes a huge allocation;
// 2³¹ parameters is 8 GiB of float32, beyond any model served here.
const maxDim = 1 << 31

// ValidateOptions says what an update must look like.
type ValidateOptions struct {
	// Dim is the exact number of values, the model's parameter count.
	Dim int
	// MaxNorm bounds the update's L2 norm (the DP clip norm, or the task's
	// max_update_norm). Zero means no bound; negative or NaN is refused.
	MaxNorm float64
}

func (o ValidateOptions) check() error {
	// int64: maxDim does not fit a 32-bit int (linux/arm), where no Dim
	// can exceed it.
	if o.Dim <= 0 || int64(o.Dim) > maxDim {
		return fmt.Errorf("aggregator: dimension %d not in [1, %d]: %w", o.Dim, int64(maxDim), ErrConfig)
	}
	if !(o.MaxNorm >= 0) {
		return fmt.Errorf("aggregator: norm bound %v must be >= 0: %w", o.MaxNorm, ErrConfig)
	}
	return nil
}

// Validate checks one update before it counts: exactly opts.Dim values, all
// finite, L2 norm at most opts.MaxNorm (when set, with NormTolerance slack),
// and a weight in (0, MaxWeight]. Errors wrap ErrShape, ErrNonFinite,
// ErrNormBound or ErrWeight and name the offending index or value; invalid
// opts give ErrConfig.
func Validate(update []float32, weight float64, opts ValidateOptions) error {
	if err := opts.check(); err != nil {
		return err
	}
	return validate("validate", update, weight, opts.Dim, opts.MaxNorm)
}

func validate(op string, update []float32, weight float64, dim int, maxNorm float64) error {
	if err := checkWeight(op, weight); err != nil {
		return err
	}
	if len(update) != dim {
		return fmt.Errorf("aggregator: %s: update has %d values, want %d: %w", op, len(update), dim, ErrShape)
	}
	// One pass: the sum of squares is finite exactly when every value is,
	// because float32 squares cannot overflow float64.
	ss := sumSquares(update)
	if math.IsNaN(ss) || math.IsInf(ss, 0) {
		for i, x := range update {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("aggregator: %s: update[%d] = %v: %w", op, i, x, ErrNonFinite)
			}
		}
	}
	if maxNorm > 0 {
		if norm := math.Sqrt(ss); norm > maxNorm*(1+NormTolerance) {
			return fmt.Errorf("aggregator: %s: update norm %.6g exceeds bound %.6g: %w", op, norm, maxNorm, ErrNormBound)
		}
	}
	return nil
}

func checkWeight(op string, w float64) error {
	if !(w > 0 && w <= MaxWeight) {
		return fmt.Errorf("aggregator: %s: weight %v not in (0, 2^53]: %w", op, w, ErrWeight)
	}
	return nil
}

func finite32(x float32) bool {
	return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0)
}

// sumSquares keeps four partial sums so that the additions do not wait on
// each other; it is most of the cost of validating an update.
func sumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		a, b, c, d := float64(x[i]), float64(x[i+1]), float64(x[i+2]), float64(x[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(x); i++ {
		s0 += float64(x[i]) * float64(x[i])
	}
	return (s0 + s1) + (s2 + s3)
}
