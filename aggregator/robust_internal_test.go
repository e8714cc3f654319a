package aggregator

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSelectK checks quickselect against sorting on random data, heavy
// duplicates and the orderings that break naive pivots.
func TestSelectK(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	patterns := map[string]func(n int) []float32{
		"random": func(n int) []float32 {
			a := make([]float32, n)
			for i := range a {
				a[i] = float32(rng.NormFloat64())
			}
			return a
		},
		"few values": func(n int) []float32 {
			a := make([]float32, n)
			for i := range a {
				a[i] = float32(rng.IntN(3))
			}
			return a
		},
		"equal":    func(n int) []float32 { return slices.Repeat([]float32{4}, n) },
		"sorted":   func(n int) []float32 { return ramp(n, 1) },
		"reversed": func(n int) []float32 { return ramp(n, -1) },
		"organ pipe": func(n int) []float32 {
			a := ramp(n, 1)
			for i := n / 2; i < n; i++ {
				a[i] = float32(n - i)
			}
			return a
		},
	}
	for name, gen := range patterns {
		for _, n := range []int{1, 2, 3, 10, 101, 1000} {
			a := gen(n)
			sorted := slices.Sorted(slices.Values(a))
			for _, k := range []int{0, n / 3, n / 2, n - 1, n} {
				b := slices.Clone(a)
				selectK(b, k)
				if k == n {
					continue
				}
				if b[k] != sorted[k] {
					t.Fatalf("%s n=%d: selectK k=%d put %v, want %v", name, n, k, b[k], sorted[k])
				}
				if slices.Max(b[:k+1]) != b[k] || slices.Min(b[k:]) != b[k] {
					t.Fatalf("%s n=%d k=%d: not partitioned around %v", name, n, k, b[k])
				}
				if !slices.Equal(slices.Sorted(slices.Values(b)), sorted) {
					t.Fatalf("%s n=%d k=%d: values lost", name, n, k)
				}
			}
			// The statistics against their sort-based definitions.
			med := float64(sorted[n/2])
			if n%2 == 0 {
				med = (float64(sorted[n/2-1]) + med) / 2
			}
			if got := median(slices.Clone(a)); got != float32(med) {
				t.Fatalf("%s n=%d: median %v, want %v", name, n, got, med)
			}
			for _, k := range []int{0, 1, (n - 1) / 2} {
				if 2*k >= n {
					continue
				}
				var s float64
				for _, x := range sorted[k : n-k] {
					s += float64(x)
				}
				want := float32(s / float64(n-2*k))
				// Summation order differs, so allow float32 rounding.
				if got := trimmedMean(slices.Clone(a), k); math.Abs(float64(got-want)) > 1e-6*max(1, math.Abs(float64(want))) {
					t.Fatalf("%s n=%d k=%d: trimmed mean %v, want %v", name, n, k, got, want)
				}
			}
		}
	}
}

func ramp(n int, dir float32) []float32 {
	a := make([]float32, n)
	for i := range a {
		a[i] = dir * float32(i)
	}
	return a
}
