//go:build !amd64 || purego

package kernel

// interleave4 writes dst[p·w+i] = src[i·ld+p] for four rows i and n steps.
func interleave4(dst []float32, w, n int, src []float32, ld int) {
	interleave4Go(dst, w, n, src, ld)
}
