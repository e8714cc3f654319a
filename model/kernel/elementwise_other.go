//go:build (!amd64 && !arm64) || purego

package kernel

// simdImpl reports no SIMD cores: this architecture (or a purego build)
// runs the pure-Go reference.
func simdImpl() (vecImpl, bool) { return vecImpl{}, false }
