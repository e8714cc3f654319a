package dp

import (
	"bytes"
	"math"
	"testing"
)

// Sending the same vector from every device makes each coordinate of the
// aggregate, before the modular reduction, close to Gaussian with exactly
// the variance the wrap-around heuristic assumes, so the observed wrap
// frequency must match it.
func TestWrapFrequencyMatchesHeuristic(t *testing.T) {
	const dim, n, bits = 4096, 4, 8
	d, err := NewDistributed(DiscreteGaussian, dim, bits, n, 1, 1, WithScale(63.8), WithBeta(0))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := d.WrapProbability()
	if p < 0.02 || p > 0.08 {
		t.Fatalf("setup: per-coordinate wrap probability %v", p)
	}
	seedBytes := make([]byte, 48)
	src, _ := NewSource(bytes.NewReader(seedBytes))
	wraps, total := 0, 0
	for rep := range 5 {
		update := make([]float32, dim)
		var s float64
		for i := range update {
			x := src.Normal()
			update[i] = float32(x)
			s += x * x
		}
		for i := range update {
			update[i] = float32(float64(update[i]) / math.Sqrt(s) * 0.999)
		}
		seed := [32]byte{byte(rep)}
		agg := make([]int64, d.PaddedDim())
		for c := range n {
			seedBytes[0], seedBytes[1] = byte(rep), byte(c)
			dsrc, _ := NewSource(bytes.NewReader(seedBytes))
			enc, err := d.NewEncoder(seed, dsrc)
			if err != nil {
				t.Fatal(err)
			}
			v, _, err := enc.encodeInts(update)
			if err != nil {
				t.Fatal(err)
			}
			for i, x := range v {
				agg[i] += x
			}
		}
		for _, x := range agg {
			if x >= int64(d.half) || x < -int64(d.half) {
				wraps++
			}
			total++
		}
	}
	want := p * float64(total)
	t.Logf("%d of %d coordinates wrapped, heuristic %.1f", wraps, total, want)
	if sd := math.Sqrt(want * (1 - p)); math.Abs(float64(wraps)-want) > 5*sd+0.05*want {
		t.Errorf("%d of %d coordinates wrapped, heuristic expects %.1f", wraps, total, want)
	}
}
