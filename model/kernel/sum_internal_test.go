package kernel

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAddScaledMatchesReference: the SIMD path and the pure-Go one give the
// same bits on every length, with special values mixed in.
func TestAddScaledMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-45, -3e-39, float32(math.Inf(1)), 3e38, -3e38}
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 100, 1029} {
		for _, w := range []float64{1, -0.3, 1e300, 7} {
			x := make([]float32, n)
			sum := make([]float64, n)
			for i := range x {
				x[i] = float32(r.NormFloat64())
				if r.IntN(10) == 0 {
					x[i] = special[r.IntN(len(special))]
				}
				sum[i] = r.NormFloat64() * 1e3
			}
			want := append([]float64(nil), sum...)
			addScaledGo(want, x, w)
			if err := AddScaled(sum, x, w); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float64bits(sum[i]) != math.Float64bits(want[i]) {
					t.Fatalf("n %d w %g: sum[%d] = %g, reference %g", n, w, i, sum[i], want[i])
				}
			}
		}
	}
	if err := AddScaled(make([]float64, 3), make([]float32, 4), 1); err == nil {
		t.Fatal("mismatched lengths accepted")
	}
}

func BenchmarkAddScaled(b *testing.B) {
	x := make([]float32, 101770) // the MNIST MLP's parameters
	sum := make([]float64, len(x))
	for i := range x {
		x[i] = float32(i%97) / 97
	}
	b.SetBytes(int64(len(x)) * 4)
	for b.Loop() {
		if err := AddScaled(sum, x, 0.5); err != nil {
			b.Fatal(err)
		}
	}
}
