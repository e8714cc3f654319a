package kernel

import "fmt"

// AddScaled adds w·x[i] to sum[i] for every i, in float64: each product is
// rounded to float64 before its sum, so every path (SIMD or not, amd64 or
// arm64, where Go could otherwise fuse the two) gives the same bits. It is
// the aggregator's weighted sum of updates.
func AddScaled(sum []float64, x []float32, w float64) error {
	if len(sum) != len(x) {
		return fmt.Errorf("%w: add_scaled: %d sums, %d values", ErrShape, len(sum), len(x))
	}
	n := addScaledSIMD(sum, x, w)
	addScaledGo(sum[n:], x[n:], w)
	return nil
}

func addScaledGo(sum []float64, x []float32, w float64) {
	sum = sum[:len(x)]
	for i, v := range x {
		sum[i] += float64(w * float64(v))
	}
}
