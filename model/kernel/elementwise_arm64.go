//go:build !purego

package kernel

//go:noescape
func geluNEON(x, y []float32)

//go:noescape
func geluGradNEON(dy, x, dx []float32)

//go:noescape
func maxNEON(x []float32) float32

//go:noescape
func expSumNEON(x, y []float32, m float32, lanes *[16]float32)

//go:noescape
func divNEON(y []float32, s float32)

//go:noescape
func axpyNEON(alpha float32, x, y []float32)

//go:noescape
func addNEON(x, y []float32)

//go:noescape
func scaleNEON(alpha float32, x []float32)

//go:noescape
func reluNEON(x, y []float32)

//go:noescape
func reluGradNEON(dy, x, dx []float32)

//go:noescape
func adamwNEON(p, g, m, v []float32, c *adamConst)

//go:noescape
func lnNormNEON(x, gamma, beta, y []float32, mu, rs float64)

// simdImpl returns the NEON cores: Advanced SIMD is part of every arm64 CPU.
func simdImpl() (vecImpl, bool) {
	return vecImpl{
		name: "neon", gelu: geluNEON, geluGrad: geluGradNEON, maxv: maxNEON, expSum: expSumNEON,
		div: divNEON, axpy: axpyNEON, add: addNEON, scale: scaleNEON, relu: reluNEON,
		reluGrad: reluGradNEON, adamw: adamwNEON, lnNorm: lnNormNEON,
	}, true
}
