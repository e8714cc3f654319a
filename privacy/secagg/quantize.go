package secagg

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Quantizer maps weighted float updates into Z_{2^b} and the secure sum
// back. A quantized vector has one value per update element followed by
// the weight, so the sum carries Σ wₖ·Δₖ and Σ wₖ together, which is what
// weighted FedAvg needs (aggregator.Collector.AddSum).
//
// Scaling leaves headroom for the whole cohort: every element w·clip(Δ) is
// in [−c·W, c·W] (c the clip range, W the weight bound), so with
// scale = (2^(b−1) − 1 − n) / (n·c·W) the sum of n stochastically rounded
// values stays within ±(2^(b−1) − 1) and decodes without wrapping. The
// weight uses scale_w = (2^(b−1) − 1 − n) / (n·W). The resolution of the
// decoded weighted sum is 1/scale per client.
type Quantizer struct {
	bits          int
	clip, maxW    float64
	n             int
	scale, wscale float64
	mask, half    uint32
}

// NewQuantizer returns a quantizer for sums of n updates in Z_{2^bits},
// elements clipped to [−clip, clip] and weights in (0, maxWeight].
func NewQuantizer(bits int, clip float64, n int, maxWeight float64) (*Quantizer, error) {
	bad := func(f string, a ...any) (*Quantizer, error) {
		return nil, fmt.Errorf("secagg: quantizer: %w: "+f, append([]any{ErrConfig}, a...)...)
	}
	switch {
	case bits < 1 || bits > 32:
		return bad("bits %d, want 1..32", bits)
	case !(clip > 0) || math.IsInf(clip, 0):
		return bad("clip range %v", clip)
	case n < 1 || n > MaxParticipants:
		return bad("%d participants", n)
	case !(maxWeight > 0) || math.IsInf(maxWeight, 0):
		return bad("weight bound %v", maxWeight)
	}
	headroom := math.Ldexp(1, bits-1) - 1 - float64(n)
	if headroom < 1 {
		return bad("%d bits cannot hold a sum of %d values", bits, n)
	}
	return &Quantizer{bits: bits, clip: clip, maxW: maxWeight, n: n,
		scale: headroom / (float64(n) * clip * maxWeight), wscale: headroom / (float64(n) * maxWeight),
		mask: uint32(1<<bits - 1), half: uint32(1) << (bits - 1)}, nil
}

// Step is the quantization step of one weighted element: the decoded
// weighted sum is exact up to ±Step per client, and unbiased.
func (q *Quantizer) Step() float64 { return 1 / q.scale }

// Quantize clips each element of update to [−clip, clip], multiplies it by
// weight, scales it and rounds stochastically (up with probability equal to
// the fractional part, so the expectation is exact), then appends the
// weight the same way. rng supplies the rounding randomness.
func (q *Quantizer) Quantize(update []float32, weight float64, rng *rand.Rand) ([]uint32, error) {
	return q.QuantizeResidual(update, weight, rng, nil)
}

// QuantizeResidual is Quantize that also writes, when residual is not
// nil, what rounding lost of each clipped element, in update units:
// residual[i] = clip(update[i]) − code[i]/(weight·scale), under one Step/weight
// in magnitude. A device adds it to its next update (error feedback), so
// the coarse steps of a small ring delay resolution instead of losing it.
// What clipping cut off is not in it: the bound is the point of the clip.
// residual must have len(update) values.
func (q *Quantizer) QuantizeResidual(update []float32, weight float64, rng *rand.Rand, residual []float32) ([]uint32, error) {
	if residual != nil && len(residual) != len(update) {
		return nil, fmt.Errorf("secagg: quantize: %w: residual of %d elements for %d", ErrConfig, len(residual), len(update))
	}
	if rng == nil {
		return nil, fmt.Errorf("secagg: quantize: %w: nil rng", ErrConfig)
	}
	if len(update) == 0 || len(update) >= MaxDim {
		return nil, fmt.Errorf("secagg: quantize: %w: %d elements, want 1..%d", ErrRange, len(update), MaxDim-1)
	}
	if !(weight > 0) || weight > q.maxW {
		return nil, fmt.Errorf("secagg: quantize: %w: weight %v, want (0, %v]", ErrRange, weight, q.maxW)
	}
	out := make([]uint32, len(update)+1)
	f := weight * q.scale
	for i, u := range update {
		v := float64(u)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("secagg: quantize: %w: element %d is %v", ErrRange, i, v)
		}
		v = max(-q.clip, min(q.clip, v))
		c := stochasticRound(v*f, rng)
		out[i] = q.encode(c)
		if residual != nil {
			residual[i] = float32(v - float64(c)/f)
		}
	}
	out[len(update)] = q.encode(stochasticRound(weight*q.wscale, rng))
	return out, nil
}

func stochasticRound(x float64, rng *rand.Rand) int64 {
	f := math.Floor(x)
	if rng.Float64() < x-f {
		f++
	}
	return int64(f)
}

func (q *Quantizer) encode(v int64) uint32 { return uint32(v) & q.mask }

func (q *Quantizer) decode(v uint32) float64 {
	if v >= q.half {
		return float64(int64(v) - int64(q.mask) - 1)
	}
	return float64(v)
}

// Dequantize decodes a secure sum of at most n quantized vectors into the
// weighted sum Σ wₖ·clip(Δₖ) and the total weight Σ wₖ.
func (q *Quantizer) Dequantize(sum []uint32) (weightedSum []float64, totalWeight float64, err error) {
	if len(sum) < 2 || len(sum) > MaxDim {
		return nil, 0, fmt.Errorf("secagg: dequantize: %w: %d values", ErrRange, len(sum))
	}
	out := make([]float64, len(sum)-1)
	for i, v := range sum {
		if v > q.mask {
			return nil, 0, fmt.Errorf("secagg: dequantize: %w: value %d = %d is not below 2^%d", ErrRange, i, v, q.bits)
		}
		if i < len(out) {
			out[i] = q.decode(v) / q.scale
		}
	}
	total := q.decode(sum[len(sum)-1]) / q.wscale
	if !(total > 0) {
		return nil, 0, fmt.Errorf("secagg: dequantize: %w: total weight %v", ErrRange, total)
	}
	return out, total, nil
}

// QuantizeCount encodes c ∈ [0, maxWeight] as Quantize encodes the weight,
// as one more element after the weight: adaptive clipping's bit (0 or 1,
// weights being 1 under DP) goes through the secure sum this way, so the
// server learns the number of unclipped updates and not whose.
func (q *Quantizer) QuantizeCount(c float64, rng *rand.Rand) (uint32, error) {
	if rng == nil {
		return 0, fmt.Errorf("secagg: quantize count: %w: nil rng", ErrConfig)
	}
	if !(c >= 0) || c > q.maxW {
		return 0, fmt.Errorf("secagg: quantize count: %w: %v, want [0, %v]", ErrRange, c, q.maxW)
	}
	return q.encode(stochasticRound(c*q.wscale, rng)), nil
}

// DequantizeCount decodes the secure sum of at most n QuantizeCount
// elements: their total, exact up to n/scale_w (below 1 unless the weight
// bound is near the ring's capacity).
func (q *Quantizer) DequantizeCount(sum uint32) (float64, error) {
	if sum > q.mask {
		return 0, fmt.Errorf("secagg: dequantize count: %w: %d is not below 2^%d", ErrRange, sum, q.bits)
	}
	c := q.decode(sum) / q.wscale
	if c < -1 || c > float64(q.n)*q.maxW+1 {
		return 0, fmt.Errorf("secagg: dequantize count: %w: %v for %d participants", ErrRange, c, q.n)
	}
	return c, nil
}
