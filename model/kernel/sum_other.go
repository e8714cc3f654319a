//go:build !amd64 || purego

package kernel

// addScaledSIMD: this build has no SIMD path for AddScaled.
func addScaledSIMD(sum []float64, x []float32, w float64) int { return 0 }
