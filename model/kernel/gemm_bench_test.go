package kernel

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// gemmShapes are the products of docs/BENCHMARKS.md's GEMM table, m×n×k:
// square, a transformer projection, the MLP's forward pass on a batch, and
// a small batch through a 784-input layer.
var gemmShapes = []struct{ m, n, k int }{
	{512, 512, 512},
	{1024, 128, 512},
	{64, 784, 128},
	{16, 128, 784},
}

// BenchmarkGemm reports C = A·B in GFLOP/s for each shape, on one thread
// (GOMAXPROCS 1) and on all of them.
func BenchmarkGemm(b *testing.B) {
	for _, s := range gemmShapes {
		for _, threads := range []int{1, runtime.NumCPU()} {
			b.Run(fmt.Sprintf("%dx%dx%d/threads=%d", s.m, s.n, s.k, threads), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
				rng := rand.New(rand.NewPCG(1, 2))
				fill := func(m Mat) Mat {
					for i := range m.Data {
						m.Data[i] = rng.Float32()*2 - 1
					}
					return m
				}
				x, y, c := fill(NewMat(s.m, s.k)), fill(NewMat(s.k, s.n)), NewMat(s.m, s.n)
				b.ResetTimer()
				for b.Loop() {
					if err := Gemm(false, false, 1, x, y, 0, c); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(GemmFLOPs(s.m, s.n, s.k))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkGemmStep reports the products of one training step of the MLP's
// first layer on a batch of 32 (one thread): the forward pass X·Wᵀ and the
// weight gradient Gᵀ·X, whose transposed operands the packing absorbs.
func BenchmarkGemmStep(b *testing.B) {
	for _, s := range []struct {
		name           string
		m, n, k        int
		transA, transB bool
	}{
		{"forward-32x128x784-tB", 32, 128, 784, false, true},
		{"wgrad-128x784x32-tA", 128, 784, 32, true, false},
	} {
		b.Run(s.name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			rng := rand.New(rand.NewPCG(1, 2))
			fill := func(r, c int) Mat {
				m := NewMat(r, c)
				for i := range m.Data {
					m.Data[i] = rng.Float32()*2 - 1
				}
				return m
			}
			ar, ac := s.m, s.k
			if s.transA {
				ar, ac = ac, ar
			}
			br, bc := s.k, s.n
			if s.transB {
				br, bc = bc, br
			}
			x, y, c := fill(ar, ac), fill(br, bc), NewMat(s.m, s.n)
			for b.Loop() {
				if err := Gemm(s.transA, s.transB, 1, x, y, 0, c); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(GemmFLOPs(s.m, s.n, s.k))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
