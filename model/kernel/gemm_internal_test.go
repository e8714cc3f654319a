package kernel

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// refGemm is Gemm's definition written out: one fma chain per element.
func refGemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := range m {
		for j := range n {
			var acc float32
			if beta != 0 {
				acc = float32(beta * c[i*ldc+j])
			}
			for l := range k {
				var av float32
				if transA {
					av = a[l*lda+i]
				} else {
					av = a[i*lda+l]
				}
				if alpha != 1 {
					av = float32(alpha * av)
				}
				var bv float32
				if transB {
					bv = b[j*ldb+l]
				} else {
					bv = b[l*ldb+j]
				}
				acc = fma32(av, bv, acc)
			}
			c[i*ldc+j] = acc
		}
	}
}

// withKernel runs f with kernels[i] selected.
func withKernel(t testing.TB, i int, f func()) {
	old := kernelSel.Swap(int32(i))
	defer kernelSel.Store(old)
	f()
}

func randVals(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// TestFMA32 checks the pure-Go fused multiply-add against exact arithmetic,
// including sums that sit a hair off a float32 rounding midpoint, where
// rounding twice (to float64, then to float32) goes wrong.
func TestFMA32(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	exact := func(a, b, c float32) float32 {
		x := new(big.Float).SetPrec(400).SetFloat64(float64(a))
		x.Mul(x, new(big.Float).SetPrec(400).SetFloat64(float64(b)))
		x.Add(x, new(big.Float).SetPrec(400).SetFloat64(float64(c)))
		f, _ := x.Float32()
		return f
	}
	check := func(a, b, c float32) {
		t.Helper()
		if got, want := fma32(a, b, c), exact(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", a, b, c, got, want)
		}
	}
	// 1+2^-24 is the midpoint between 1 and its successor; a tiny c decides.
	check(1+1.0/(1<<12), 1+1.0/(1<<12), 1e-30) // (1+2^-12)^2 = 1 + 2^-11 + 2^-24
	check(1+1.0/(1<<12), 1+1.0/(1<<12), -1e-30)
	check(-(1 + 1.0/(1<<12)), 1+1.0/(1<<12), 1e-30)
	check(math.MaxFloat32, 2, -math.MaxFloat32)
	check(1e-30, 1e-20, 1e-45)
	for range 200000 {
		a, b := float32(r.NormFloat64()), float32(r.NormFloat64())
		c := float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(80)-40)))
		check(a, b, c)
		// Products whose low bits decide the rounding of a near-equal sum.
		check(a, b, -a*b)
	}
}

// gemmCase is one product for the differential tests.
type gemmCase struct {
	m, n, k        int
	transA, transB bool
	alpha, beta    float32
}

func (g gemmCase) String() string {
	return fmt.Sprintf("%dx%dx%d/tA=%v/tB=%v/alpha=%g/beta=%g", g.m, g.n, g.k, g.transA, g.transB, g.alpha, g.beta)
}

func gemmCases(r *rand.Rand) []gemmCase {
	cs := []gemmCase{
		{1, 1, 1, false, false, 1, 0},
		{1, 300, 17, false, false, 1, 0},
		{300, 1, 17, false, true, 1, 1},
		{17, 33, 1, true, false, 2, 0.5},
		{64, 784, 128, false, false, 1, 0},
		{16, 128, 784, false, true, 1, 0},
		{13, 35, 513, true, true, -0.5, 1},
		{97, 129, 300, false, false, 1, -1},
	}
	for range 24 {
		dim := func() int {
			if r.IntN(4) == 0 {
				return 1 + r.IntN(3)
			}
			return 1 + r.IntN(90)
		}
		alpha := []float32{1, 1, -1, 0.3}[r.IntN(4)]
		beta := []float32{0, 0, 1, 0.7}[r.IntN(4)]
		cs = append(cs, gemmCase{dim(), dim(), dim() * (1 + r.IntN(5)), r.IntN(2) == 0, r.IntN(2) == 0, alpha, beta})
	}
	return cs
}

// TestGemmEveryKernelMatchesReference runs every microkernel this CPU has on
// random shapes (1×N, N×1, odd sizes, k past the cache block, transposes,
// alpha and beta) and wants the reference's exact bits.
func TestGemmEveryKernelMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range gemmCases(r) {
		ar, ac := tc.m, tc.k
		if tc.transA {
			ar, ac = ac, ar
		}
		br, bc := tc.k, tc.n
		if tc.transB {
			br, bc = bc, br
		}
		a := Mat{Rows: ar, Cols: ac, Data: randVals(r, ar*ac)}
		b := Mat{Rows: br, Cols: bc, Data: randVals(r, br*bc)}
		c0 := randVals(r, tc.m*tc.n)
		want := append([]float32(nil), c0...)
		refGemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a.Data, ac, b.Data, bc, tc.beta, want, tc.n)
		for ki, kn := range kernels {
			for _, th := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/%v/threads=%d", kn.name, tc, th), func(t *testing.T) {
					got := Mat{Rows: tc.m, Cols: tc.n, Data: append([]float32(nil), c0...)}
					withKernel(t, ki, func() {
						defer SetThreads(SetThreads(th))
						if err := Gemm(tc.transA, tc.transB, tc.alpha, a, b, tc.beta, got); err != nil {
							t.Fatal(err)
						}
					})
					for i := range want {
						if math.Float32bits(got.Data[i]) != math.Float32bits(want[i]) {
							t.Fatalf("element %d (%d,%d): %g, reference %g", i, i/tc.n, i%tc.n, got.Data[i], want[i])
						}
					}
				})
			}
		}
	}
}

// TestGemmThreadsAgree multiplies products large enough to be split across
// threads on one and on many threads: the bits must not change.
func TestGemmThreadsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range [][3]int{{300, 200, 600}, {16, 1000, 784}, {1024, 64, 300}} {
		m, n, k := s[0], s[1], s[2]
		a := Mat{Rows: m, Cols: k, Data: randVals(r, m*k)}
		b := Mat{Rows: k, Cols: n, Data: randVals(r, k*n)}
		for ki, kn := range kernels {
			if kn.name == "go" && testing.Short() {
				continue
			}
			var first []float32
			for _, th := range []int{1, 2, 7} {
				c := NewMat(m, n)
				withKernel(t, ki, func() {
					defer SetThreads(SetThreads(th))
					if err := Gemm(false, false, 1, a, b, 0, c); err != nil {
						t.Fatal(err)
					}
				})
				if first == nil {
					first = c.Data
					continue
				}
				for i := range first {
					if math.Float32bits(first[i]) != math.Float32bits(c.Data[i]) {
						t.Fatalf("%s %v: element %d differs on %d threads", kn.name, s, i, th)
					}
				}
			}
		}
	}
}

// TestGemmCheckStops: the check runs between blocks, and its error stops
// the product.
func TestGemmCheckStops(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	const m, n, k = 2048, 512, 512 // 2^29 multiply-adds: many blocks
	a := Mat{Rows: m, Cols: k, Data: randVals(r, m*k)}
	b := Mat{Rows: k, Cols: n, Data: randVals(r, k*n)}
	c := NewMat(m, n)
	for _, th := range []int{1, 2} {
		calls := 0
		stop := fmt.Errorf("deadline")
		err := func() error {
			defer SetThreads(SetThreads(th))
			return GemmCheck(false, false, 1, a, b, 0, c, func() error {
				calls++
				if calls == 3 {
					return stop
				}
				return nil
			})
		}()
		if err == nil || calls != 3 {
			t.Fatalf("threads %d: err %v after %d checks, want the check's error on the third", th, err, calls)
		}
		calls = 0
		err = func() error {
			defer SetThreads(SetThreads(th))
			return GemmCheck(false, false, 1, a, b, 0, c, func() error { calls++; return nil })
		}()
		if err != nil || calls < int(GemmFLOPs(m, n, k)/2/blockWork) {
			t.Fatalf("threads %d: err %v, %d checks for %d multiply-adds", th, err, calls, m*n*k)
		}
	}
}

// TestGemmRefusesOverflowingShapes: shapes whose product overflows int are
// refused before any kernel reads through a pointer.
func TestGemmRefusesOverflowingShapes(t *testing.T) {
	huge := Mat{Rows: 1 << 33, Cols: 1 << 31, Data: make([]float32, 4)} // 2^64 wraps to 0
	small := Mat{Rows: 1 << 31, Cols: 1, Data: make([]float32, 4)}
	c := Mat{Rows: 1 << 33, Cols: 1, Data: make([]float32, 4)}
	if err := Gemm(false, false, 1, huge, small, 0, c); !errors.Is(err, ErrShape) {
		t.Fatalf("err %v, want ErrShape", err)
	}
}

// TestGemmAllocations: a product on one thread takes its panels from a pool
// and keeps its state on the stack; a heap allocation per block (a partial
// tile's buffer did) costs every device's training in garbage collection.
func TestGemmAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops panels at random")
	}
	a, b, c := NewMat(32, 784), NewMat(128, 784), NewMat(45, 128)
	a2 := NewMat(45, 784)
	defer SetThreads(SetThreads(1))
	// A pool emptied by a collection during the run costs a few extra
	// allocations once; a leak per block costs tens per call.
	if n := testing.AllocsPerRun(50, func() {
		_ = Gemm(false, true, 1, a, b, 0, rowsOf(c, 32))
		_ = Gemm(false, true, 1, a2, b, 0, c)
	}); n > 3 {
		t.Fatalf("%v allocations per pair of products", n)
	}
}

// rowsOf is a view of the first rows rows of m.
func rowsOf(m Mat, rows int) Mat { return Mat{Rows: rows, Cols: m.Cols, Data: m.Data[:rows*m.Cols]} }
