package hadamard

import (
	"math"
	"testing"
)

func TestRotationIsOrthonormalAndInvertible(t *testing.T) {
	for _, n := range []int{1, 2, 8, 1024} {
		signs := Signs([32]byte{byte(n)}, n)
		x := make([]float64, n)
		var norm float64
		for i := range x {
			x[i] = math.Sin(float64(3*i + 1))
			norm += x[i] * x[i]
		}
		y := append([]float64(nil), x...)
		Rotate(y, signs)
		var ynorm float64
		for _, v := range y {
			ynorm += v * v
		}
		if math.Abs(ynorm-norm) > 1e-9*norm {
			t.Errorf("n=%d: norm² %v → %v", n, norm, ynorm)
		}
		Unrotate(y, signs)
		for i := range x {
			if math.Abs(y[i]-x[i]) > 1e-12 {
				t.Fatalf("n=%d: element %d %v → %v", n, i, x[i], y[i])
			}
		}
	}
	// A spike spreads evenly: every rotated coordinate has magnitude 1/√n.
	x := make([]float64, 64)
	x[5] = 1
	Rotate(x, Signs([32]byte{}, 64))
	for i, v := range x {
		if math.Abs(math.Abs(v)-1.0/8) > 1e-12 {
			t.Fatalf("coordinate %d is %v", i, v)
		}
	}
	if PaddedDim(1000) != 1024 || PaddedDim(1024) != 1024 || PaddedDim(1) != 1 {
		t.Error("PaddedDim")
	}
}
