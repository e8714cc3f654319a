//go:build !purego

package kernel

//go:noescape
func addScaledAVX2(sum *float64, x *float32, n int, w float64)

// addScaledSIMD does the first multiple of 8 values of AddScaled, where
// the CPU has AVX2, and returns how many it did.
func addScaledSIMD(sum []float64, x []float32, w float64) int {
	n := len(x) &^ 7
	if n == 0 || !hasAVX2 || vec == &vecImpls[0] {
		return 0
	}
	addScaledAVX2(&sum[0], &x[0], n, w)
	return n
}
