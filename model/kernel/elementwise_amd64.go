//go:build !purego

package kernel

//go:noescape
func geluAVX2(x, y []float32)

//go:noescape
func geluGradAVX2(dy, x, dx []float32)

//go:noescape
func maxAVX2(x []float32) float32

//go:noescape
func expSumAVX2(x, y []float32, m float32, lanes *[16]float32)

//go:noescape
func divAVX2(y []float32, s float32)

//go:noescape
func axpyAVX2(alpha float32, x, y []float32)

//go:noescape
func addAVX2(x, y []float32)

//go:noescape
func scaleAVX2(alpha float32, x []float32)

//go:noescape
func reluAVX2(x, y []float32)

//go:noescape
func reluGradAVX2(dy, x, dx []float32)

//go:noescape
func adamwAVX2(p, g, m, v []float32, c *adamConst)

//go:noescape
func lnNormAVX2(x, gamma, beta, y []float32, mu, rs float64)

func simdImpl() (vecImpl, bool) {
	if !hasAVX2 {
		return vecImpl{}, false
	}
	return vecImpl{
		name: "avx2", gelu: geluAVX2, geluGrad: geluGradAVX2, maxv: maxAVX2, expSum: expSumAVX2,
		div: divAVX2, axpy: axpyAVX2, add: addAVX2, scale: scaleAVX2, relu: reluAVX2,
		reluGrad: reluGradAVX2, adamw: adamwAVX2, lnNorm: lnNormAVX2,
	}, true
}
