package pld

import (
	"fmt"
	"testing"
)

// 10,000 steps at the grid's corners: the typical DP-FedAvg setting
// (q = 0.01, σ = 1), the widest windows (σ = 0.5), and the finest grid
// (q = 0.001, σ = 3); and the slowest cell of the reference table.
func BenchmarkEpsilon(b *testing.B) {
	for _, c := range []struct {
		q, sigma float64
		steps    int
	}{
		{0.01, 1, 10000},
		{0.001, 0.5, 10000},
		{0.01, 0.5, 10000},
		{0.1, 0.5, 10000},
		{0.5, 0.5, 10000},
		{0.001, 3, 10000},
		{0.1, 0.5, 10},
	} {
		b.Run(fmt.Sprintf("q=%g/sigma=%g/steps=%d", c.q, c.sigma, c.steps), func(b *testing.B) {
			ev := []Event{{Q: c.q, Sigma: c.sigma, Count: c.steps}}
			for b.Loop() {
				if _, err := Epsilon(ev, 1e-5, 1e-4); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
