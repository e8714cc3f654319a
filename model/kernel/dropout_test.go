package kernel_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// splitMix64 is Vigna's reference generator, written from its definition
// rather than from dropout.go, to pin the documented mask.
type splitMix64 struct{ state uint64 }

func (s *splitMix64) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// refMask is the documented mask of (p, seed) over n values.
func refMask(n int, p float32, seed uint64) []bool {
	g := splitMix64{seed}
	keep := make([]bool, n)
	for i := range keep {
		u := float64(g.next()>>40) / (1 << 24)
		keep[i] = u >= float64(p)
	}
	return keep
}

func TestDropout(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	const n, d = 7, 33
	x := randMat(r, n, d)
	for _, p := range []float32{0.1, 0.5, 0.9, 0.999} {
		for _, seed := range []uint64{0, 1, math.MaxUint64} {
			y := randMat(r, n, d)
			must(t, kernel.Dropout(x, y, p, seed))
			s := float32(1 / (1 - float64(p)))
			for i, k := range refMask(n*d, p, seed) {
				want := float32(0)
				if k {
					want = x.Data[i] * s
				}
				if math.Float32bits(y.Data[i]) != math.Float32bits(want) {
					t.Fatalf("p %v seed %d: y[%d] = %v, want %v", p, seed, i, y.Data[i], want)
				}
			}
			// In place, and the gradient with the same mask.
			in := cloneMat(x)
			must(t, kernel.Dropout(in, in, p, seed))
			if !floats.SameBits(in.Data, y.Data) {
				t.Fatalf("p %v seed %d: dropout in place differs", p, seed)
			}
			dx := randMat(r, n, d)
			must(t, kernel.DropoutGrad(x, dx, p, seed))
			if !floats.SameBits(dx.Data, y.Data) {
				t.Fatalf("p %v seed %d: gradient of dy = x differs from dropout of x", p, seed)
			}
		}
	}
	// p = 0 copies, bits included.
	nan := math.Float32frombits(0x7fc00123)
	x.Data[3] = nan
	y := kernel.NewMat(n, d)
	must(t, kernel.Dropout(x, y, 0, 9))
	if !floats.SameBits(x.Data, y.Data) {
		t.Fatalf("p = 0 did not copy")
	}
	// A dropped value is +0 whatever it held.
	for i := range x.Data {
		x.Data[i] = []float32{nan, float32(math.Inf(-1))}[i%2]
	}
	must(t, kernel.Dropout(x, y, 0.5, 9))
	for i, k := range refMask(n*d, 0.5, 9) {
		if !k && math.Float32bits(y.Data[i]) != 0 || k && !math.IsNaN(float64(y.Data[i])) && !math.IsInf(float64(y.Data[i]), -1) {
			t.Fatalf("x[%d] = %v, kept %v: y = %v", i, x.Data[i], k, y.Data[i])
		}
	}
}

// TestDropoutRate: over 2^17 values, the share kept is 1−p within five
// standard deviations, and different seeds give different masks.
func TestDropoutRate(t *testing.T) {
	const size = 1 << 17
	ones := kernel.NewMat(1, size)
	for i := range ones.Data {
		ones.Data[i] = 1
	}
	y := kernel.NewMat(1, size)
	for _, p := range []float32{0.05, 0.25, 0.5, 0.75} {
		must(t, kernel.Dropout(ones, y, p, 12345))
		kept := 0
		for _, v := range y.Data {
			if v != 0 {
				kept++
			}
		}
		want, sd := size*(1-float64(p)), math.Sqrt(size*float64(p)*(1-float64(p)))
		if math.Abs(float64(kept)-want) > 5*sd {
			t.Errorf("p %v: kept %d of %d, want about %.0f", p, kept, size, want)
		}
	}
	a, b := kernel.NewMat(1, size), kernel.NewMat(1, size)
	must(t, kernel.Dropout(ones, a, 0.5, 1), kernel.Dropout(ones, b, 0.5, 2))
	same := 0
	for i := range a.Data {
		if a.Data[i] == b.Data[i] {
			same++
		}
	}
	if same > size*6/10 {
		t.Errorf("seeds 1 and 2 agree on %d of %d values", same, size)
	}
}

// TestDropoutGradient checks DropoutGrad against central differences of
// L = Σ r·y with y the float64 reference dropout.
func TestDropoutGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	const n, d, p, seed = 3, 10, float32(0.4), 77
	x, dy := randMat(r, n, d), randMat(r, n, d)
	dx := kernel.NewMat(n, d)
	must(t, kernel.DropoutGrad(dy, dx, p, seed))
	keep := refMask(n*d, p, seed)
	x64, r64 := to64(x.Data), to64(dy.Data)
	loss := func() float64 {
		var l float64
		for i, v := range x64 {
			if keep[i] {
				l += r64[i] * v / (1 - float64(p))
			}
		}
		return l
	}
	for i := range x64 {
		orig, h := x64[i], 1e-3
		x64[i] = orig + h
		up := loss()
		x64[i] = orig - h
		down := loss()
		x64[i] = orig
		num := (up - down) / (2 * h)
		if got := float64(dx.Data[i]); math.Abs(got-num) > 1e-6*(1+math.Abs(num)) {
			t.Fatalf("dx[%d] = %v, central difference %v", i, got, num)
		}
	}
	// dx may be dy; twice gives the same bits.
	in := cloneMat(dy)
	must(t, kernel.DropoutGrad(in, in, p, seed))
	if !floats.SameBits(in.Data, dx.Data) {
		t.Fatalf("dropout gradient in place differs")
	}
}

func TestDropoutErrors(t *testing.T) {
	m := kernel.NewMat
	buf := make([]float32, 16)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"shape", kernel.Dropout(m(2, 3), m(3, 2), 0.5, 1), kernel.ErrShape},
		{"short", kernel.Dropout(kernel.Mat{Rows: 2, Cols: 3, Data: make([]float32, 5)}, m(2, 3), 0.5, 1), kernel.ErrShape},
		{"negative rows", kernel.Dropout(kernel.Mat{Rows: -1, Cols: 3}, kernel.Mat{Rows: -1, Cols: 3}, 0.5, 1), kernel.ErrShape},
		{"overlap", kernel.Dropout(kernel.Mat{Rows: 2, Cols: 4, Data: buf[:8]}, kernel.Mat{Rows: 2, Cols: 4, Data: buf[1:9]}, 0.5, 1), kernel.ErrShape},
		{"grad shape", kernel.DropoutGrad(m(2, 3), m(2, 4), 0.5, 1), kernel.ErrShape},
		{"grad overlap", kernel.DropoutGrad(kernel.Mat{Rows: 2, Cols: 4, Data: buf[4:12]}, kernel.Mat{Rows: 2, Cols: 4, Data: buf[:8]}, 0.5, 1), kernel.ErrShape},
		{"p NaN", kernel.Dropout(m(2, 3), m(2, 3), nan, 1), kernel.ErrArgument},
		{"p Inf", kernel.Dropout(m(2, 3), m(2, 3), inf, 1), kernel.ErrArgument},
		{"p -Inf", kernel.Dropout(m(2, 3), m(2, 3), -inf, 1), kernel.ErrArgument},
		{"p negative", kernel.Dropout(m(2, 3), m(2, 3), -0.1, 1), kernel.ErrArgument},
		{"p 1", kernel.Dropout(m(2, 3), m(2, 3), 1, 1), kernel.ErrArgument},
		{"grad p 2", kernel.DropoutGrad(m(2, 3), m(2, 3), 2, 1), kernel.ErrArgument},
		{"grad p NaN", kernel.DropoutGrad(m(2, 3), m(2, 3), nan, 1), kernel.ErrArgument},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	// Rows of nothing do no work.
	empty := kernel.Mat{Rows: math.MaxInt}
	if err := kernel.Dropout(empty, empty, 0.5, 1); err != nil {
		t.Errorf("empty rows: %v", err)
	}
}
