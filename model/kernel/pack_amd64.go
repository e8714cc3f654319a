//go:build !purego

package kernel

//go:noescape
func transpose4(dst *float32, w int, src *float32, ld int, groups int)

// interleave4 writes dst[p·w+i] = src[i·ld+p] for four rows i and n steps.
func interleave4(dst []float32, w, n int, src []float32, ld int) {
	_ = dst[(n-1)*w+3]
	_ = src[3*ld+n-1]
	g := n / 4
	if g > 0 {
		transpose4(&dst[0], w, &src[0], ld, g)
	}
	if g*4 < n {
		interleave4Go(dst[g*4*w:], w, n-g*4, src[g*4:], ld)
	}
}
