package kernel_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// refConv is the direct convolution, seven loops deep: y (n × OutC·OutH·OutW)
// = conv(x, w) + b, b nil for none. T = float64 is the tests' reference,
// T = float32 the direct kernel BenchmarkConv2D compares im2col with.
func refConv[T float32 | float64](g kernel.Conv2D, n int, x, w, b, y []T) {
	oh, ow := g.OutH(), g.OutW()
	for e := 0; e < n; e++ {
		for o := 0; o < g.OutC; o++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					var s T
					if b != nil {
						s = b[o]
					}
					for c := 0; c < g.InC; c++ {
						for kh := 0; kh < g.KH; kh++ {
							ih := i*g.Stride - g.Pad + kh
							if ih < 0 || ih >= g.InH {
								continue
							}
							for kw := 0; kw < g.KW; kw++ {
								iw := j*g.Stride - g.Pad + kw
								if iw < 0 || iw >= g.InW {
									continue
								}
								s += w[((o*g.InC+c)*g.KH+kh)*g.KW+kw] * x[((e*g.InC+c)*g.InH+ih)*g.InW+iw]
							}
						}
					}
					y[((e*g.OutC+o)*oh+i)*ow+j] = s
				}
			}
		}
	}
}

// refConvGrad is the direct gradient of refConv: dx overwritten, dw and db
// accumulated, each skipped when nil.
func refConvGrad[T float32 | float64](g kernel.Conv2D, n int, dy, x, w, dx, dw, db []T) {
	oh, ow := g.OutH(), g.OutW()
	clear(dx)
	for e := 0; e < n; e++ {
		for o := 0; o < g.OutC; o++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					d := dy[((e*g.OutC+o)*oh+i)*ow+j]
					if db != nil {
						db[o] += d
					}
					for c := 0; c < g.InC; c++ {
						for kh := 0; kh < g.KH; kh++ {
							ih := i*g.Stride - g.Pad + kh
							if ih < 0 || ih >= g.InH {
								continue
							}
							for kw := 0; kw < g.KW; kw++ {
								iw := j*g.Stride - g.Pad + kw
								if iw < 0 || iw >= g.InW {
									continue
								}
								wi, xi := ((o*g.InC+c)*g.KH+kh)*g.KW+kw, ((e*g.InC+c)*g.InH+ih)*g.InW+iw
								if dx != nil {
									dx[xi] += d * w[wi]
								}
								if dw != nil {
									dw[wi] += d * x[xi]
								}
							}
						}
					}
				}
			}
		}
	}
}

func to64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func abs64(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Abs(x)
	}
	return out
}

// randConv draws a geometry with stride 1–3, pad 0–2, non-square inputs
// and kernels and a few channels.
func randConv(r *rand.Rand) kernel.Conv2D {
	for {
		g := kernel.Conv2D{
			InC: 1 + r.IntN(3), InH: 1 + r.IntN(9), InW: 1 + r.IntN(9), OutC: 1 + r.IntN(4),
			KH: 1 + r.IntN(4), KW: 1 + r.IntN(4), Stride: 1 + r.IntN(3), Pad: r.IntN(3),
		}
		if g.Check() == nil {
			return g
		}
	}
}

// closeTo checks got against want, each within tol of the scale of the
// terms summed into it (mag), so that cancellation does not fail it.
func closeTo(t *testing.T, name string, got []float32, want, mag []float64, tol float64) {
	t.Helper()
	for i, w := range want {
		if d := math.Abs(float64(got[i]) - w); !(d <= tol*(mag[i]+1e-30)) {
			t.Fatalf("%s[%d] = %v, want %v (scale %v)", name, i, got[i], w, mag[i])
		}
	}
}

func TestConv2DForward(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for it := 0; it < 60; it++ {
		g := randConv(r)
		n := 1 + r.IntN(3)
		x, w := randMat(r, n, g.InC*g.InH*g.InW), randMat(r, g.OutC, g.InC*g.KH*g.KW)
		b := randMat(r, 1, g.OutC)
		if it%3 == 0 {
			b = kernel.Mat{}
		}
		y := randMat(r, n, g.OutC*g.OutH()*g.OutW()) // overwritten
		if err := kernel.Conv2DForward(g, x, w, b, y, nil); err != nil {
			t.Fatalf("%+v: %v", g, err)
		}
		want, mag := make([]float64, y.Len()), make([]float64, y.Len())
		var b64, babs []float64
		if b.Data != nil {
			b64 = to64(b.Data)
			babs = abs64(b64)
		}
		refConv(g, n, to64(x.Data), to64(w.Data), b64, want)
		refConv(g, n, abs64(to64(x.Data)), abs64(to64(w.Data)), babs, mag)
		closeTo(t, fmt.Sprintf("%+v y", g), y.Data, want, mag, 1e-6)
	}
}

// TestConv2DKnown is an example worked by hand: a 2×3 input, a 2×2 kernel
// of ones, stride 2, pad 1, bias 10.
func TestConv2DKnown(t *testing.T) {
	g := kernel.Conv2D{InC: 1, InH: 2, InW: 3, OutC: 1, KH: 2, KW: 2, Stride: 2, Pad: 1}
	x := kernel.Mat{Rows: 1, Cols: 6, Data: []float32{1, 2, 3, 4, 5, 6}}
	w := kernel.Mat{Rows: 1, Cols: 4, Data: []float32{1, 1, 1, 1}}
	y := kernel.NewMat(1, g.OutH()*g.OutW())
	if g.OutH() != 2 || g.OutW() != 2 {
		t.Fatalf("output %dx%d, want 2x2", g.OutH(), g.OutW())
	}
	if err := kernel.Conv2DForward(g, x, w, kernel.Mat{Rows: 1, Cols: 1, Data: []float32{10}}, y, nil); err != nil {
		t.Fatal(err)
	}
	// Windows at rows {-1,0} and {1,2}, columns {-1,0} and {1,2}.
	if want := []float32{11, 15, 14, 21}; !slices.Equal(y.Data, want) {
		t.Fatalf("y = %v, want %v", y.Data, want)
	}
}

// TestConv2DGradient checks dx, dw and db against central differences of
// L = Σ r·y on the float64 reference, where float32 noise cannot drown
// the quotient.
func TestConv2DGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	for it := 0; it < 8; it++ {
		g := randConv(r)
		n := 1 + r.IntN(2)
		x, w, b := randMat(r, n, g.InC*g.InH*g.InW), randMat(r, g.OutC, g.InC*g.KH*g.KW), randMat(r, 1, g.OutC)
		dy := randMat(r, n, g.OutC*g.OutH()*g.OutW())
		x64, w64, b64, r64 := to64(x.Data), to64(w.Data), to64(b.Data), to64(dy.Data)
		y64 := make([]float64, dy.Len())
		loss := func() float64 {
			refConv(g, n, x64, w64, b64, y64)
			var s float64
			for i, v := range y64 {
				s += r64[i] * v
			}
			return s
		}
		dx := randMat(r, n, x.Cols) // overwritten
		dw0, db0 := randMat(r, g.OutC, w.Cols), randMat(r, 1, g.OutC)
		dw, db := cloneMat(dw0), cloneMat(db0)
		if err := kernel.Conv2DGrad(g, dy, x, w, dx, dw, db, nil); err != nil {
			t.Fatalf("%+v: %v", g, err)
		}
		for _, p := range []struct {
			name   string
			vals   []float64
			grad   []float32
			before []float32
		}{{"dx", x64, dx.Data, nil}, {"dw", w64, dw.Data, dw0.Data}, {"db", b64, db.Data, db0.Data}} {
			for i := range p.vals {
				orig, h := p.vals[i], 1e-3
				p.vals[i] = orig + h
				up := loss()
				p.vals[i] = orig - h
				down := loss()
				p.vals[i] = orig
				num := (up - down) / (2 * h)
				got := float64(p.grad[i])
				if p.before != nil {
					got -= float64(p.before[i]) // dw and db accumulate
				}
				if math.Abs(got-num) > 1e-4*(1+math.Abs(num)) {
					t.Fatalf("%+v n=%d: %s[%d] = %v, central difference %v", g, n, p.name, i, got, num)
				}
			}
		}
		// Each output is computed alone as with the others, bit for bit.
		dxOnly := kernel.NewMat(n, x.Cols)
		dwOnly, dbOnly := cloneMat(dw0), cloneMat(db0)
		must(t, kernel.Conv2DGrad(g, dy, x, w, dxOnly, kernel.Mat{}, kernel.Mat{}, nil),
			kernel.Conv2DGrad(g, dy, x, w, kernel.Mat{}, dwOnly, kernel.Mat{}, nil),
			kernel.Conv2DGrad(g, dy, x, w, kernel.Mat{}, kernel.Mat{}, dbOnly, nil))
		if !floats.SameBits(dxOnly.Data, dx.Data) || !floats.SameBits(dwOnly.Data, dw.Data) || !floats.SameBits(dbOnly.Data, db.Data) {
			t.Fatalf("%+v: outputs computed alone differ from outputs computed together", g)
		}
	}
}

// femnist are the two convolutions of the LEAF FEMNIST CNN.
var femnist = []struct {
	name string
	g    kernel.Conv2D
}{
	{"conv1", kernel.Conv2D{InC: 1, InH: 28, InW: 28, OutC: 32, KH: 5, KW: 5, Stride: 1, Pad: 2}},
	{"conv2", kernel.Conv2D{InC: 32, InH: 14, InW: 14, OutC: 64, KH: 5, KW: 5, Stride: 1, Pad: 2}},
}

// convRun runs the forward and the full gradient and returns their outputs.
func convRun(t testing.TB, g kernel.Conv2D, x, w, b, dy kernel.Mat) [][]float32 {
	n := x.Rows
	y := kernel.NewMat(n, g.OutC*g.OutH()*g.OutW())
	dx, dw, db := kernel.NewMat(n, x.Cols), kernel.NewMat(w.Rows, w.Cols), kernel.NewMat(1, g.OutC)
	if err := errors.Join(kernel.Conv2DForward(g, x, w, b, y, nil),
		kernel.Conv2DGrad(g, dy, x, w, dx, dw, db, nil)); err != nil {
		t.Fatal(err)
	}
	return [][]float32{y.Data, dx.Data, dw.Data, db.Data}
}

// TestConv2DDeterminism: the products of conv2 are large enough for Gemm
// to split them over threads; the bits must not depend on it, nor on the
// GEMM microkernel, nor change between equal calls.
func TestConv2DDeterminism(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	g := femnist[1].g
	const n = 2
	x, w, b := randMat(r, n, g.InC*g.InH*g.InW), randMat(r, g.OutC, g.InC*g.KH*g.KW), randMat(r, 1, g.OutC)
	dy := randMat(r, n, g.OutC*g.OutH()*g.OutW())
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	defer kernel.SetThreads(kernel.SetThreads(1))
	one := convRun(t, g, x, w, b, dy)
	again := convRun(t, g, x, w, b, dy)
	kernel.SetThreads(4)
	four := convRun(t, g, x, w, b, dy)
	for i := range one {
		if !floats.SameBits(one[i], again[i]) || !floats.SameBits(one[i], four[i]) {
			t.Fatalf("output %d differs between runs or thread counts", i)
		}
	}
	// Every GEMM microkernel, on a smaller layer (the pure-Go one is slow).
	g = kernel.Conv2D{InC: 4, InH: 9, InW: 11, OutC: 8, KH: 3, KW: 4, Stride: 2, Pad: 1}
	x, w, b = randMat(r, n, g.InC*g.InH*g.InW), randMat(r, g.OutC, g.InC*g.KH*g.KW), randMat(r, 1, g.OutC)
	dy = randMat(r, n, g.OutC*g.OutH()*g.OutW())
	want := convRun(t, g, x, w, b, dy)
	for _, name := range kernel.Kernels() {
		got := func() [][]float32 {
			old, err := kernel.UseKernel(name)
			if err != nil {
				t.Fatal(err)
			}
			defer kernel.UseKernel(old)
			return convRun(t, g, x, w, b, dy)
		}()
		for i := range want {
			if !floats.SameBits(got[i], want[i]) {
				t.Fatalf("kernel %s: output %d differs", name, i)
			}
		}
	}
}

var errStop = errors.New("deadline")

// TestConv2DCheck: check is called regularly, does not change the result,
// and its error stops the call and is returned wrapped.
func TestConv2DCheck(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 38))
	for _, tc := range []struct {
		name string
		g    kernel.Conv2D
		n    int
	}{
		// 2·10^7 flops per example: checks between examples.
		{"small products", femnist[1].g, 4},
		// 8·10^7 flops per example: checks inside Gemm.
		{"large products", kernel.Conv2D{InC: 32, InH: 28, InW: 28, OutC: 64, KH: 5, KW: 5, Stride: 1, Pad: 2}, 1},
	} {
		g, n := tc.g, tc.n
		x, w, b := randMat(r, n, g.InC*g.InH*g.InW), randMat(r, g.OutC, g.InC*g.KH*g.KW), randMat(r, 1, g.OutC)
		dy := randMat(r, n, g.OutC*g.OutH()*g.OutW())
		want := convRun(t, g, x, w, b, dy)
		calls := 0
		count := func() error { calls++; return nil }
		y := kernel.NewMat(n, dy.Cols)
		dx, dw, db := kernel.NewMat(n, x.Cols), kernel.NewMat(w.Rows, w.Cols), kernel.NewMat(1, g.OutC)
		must(t, kernel.Conv2DForward(g, x, w, b, y, count))
		fwd := calls
		must(t, kernel.Conv2DGrad(g, dy, x, w, dx, dw, db, count))
		for i, got := range [][]float32{y.Data, dx.Data, dw.Data, db.Data} {
			if !floats.SameBits(got, want[i]) {
				t.Fatalf("%s: output %d differs with a check", tc.name, i)
			}
		}
		// At least one call per 10^8 flops (the bound is 3·10^7, Gemm's
		// blocks up to 6.7·10^7).
		if min := g.FLOPs(n) / 1e8; fwd < 1 || int64(fwd) < min {
			t.Errorf("%s: forward of %d flops called check %d times", tc.name, g.FLOPs(n), fwd)
		}
		if min := g.GradFLOPs(n, true, true) / 1e8; int64(calls-fwd) < max(1, min) {
			t.Errorf("%s: gradient of %d flops called check %d times", tc.name, g.GradFLOPs(n, true, true), calls-fwd)
		}
		for stopAt := 1; stopAt <= 2; stopAt++ {
			calls = 0
			stop := func() error {
				calls++
				if calls >= stopAt {
					return errStop
				}
				return nil
			}
			if err := kernel.Conv2DForward(g, x, w, b, y, stop); !errors.Is(err, errStop) || calls != stopAt {
				t.Errorf("%s: forward stopped at check %d: err %v after %d calls", tc.name, stopAt, err, calls)
			}
			calls = 0
			if err := kernel.Conv2DGrad(g, dy, x, w, dx, dw, db, stop); !errors.Is(err, errStop) || calls != stopAt {
				t.Errorf("%s: gradient stopped at check %d: err %v after %d calls", tc.name, stopAt, err, calls)
			}
		}
	}
}

func TestConv2DFLOPs(t *testing.T) {
	g := femnist[0].g // K = 25, P = 784, OutC = 32
	if got, want := g.FLOPs(32), int64(32*(2*32*25*784+25*784)); got != want {
		t.Errorf("FLOPs = %d, want %d", got, want)
	}
	if got, want := g.GradFLOPs(32, true, true), int64(32*(2*(2*32*25*784+25*784)+32*784)); got != want {
		t.Errorf("GradFLOPs = %d, want %d", got, want)
	}
	if got, want := g.GradFLOPs(32, false, true), int64(32*(2*32*25*784+25*784+32*784)); got != want {
		t.Errorf("GradFLOPs(weight only) = %d, want %d", got, want)
	}
	// OutC·K, K·P and OutC·P at the bound: 2^37 flops per example, which
	// over 2^31−1 examples saturate.
	big := kernel.Conv2D{InC: 1 << 12, InH: 1 << 6, InW: 1 << 6, OutC: 1 << 12, KH: 1, KW: 1, Stride: 1}
	if err := big.Check(); err != nil {
		t.Fatal(err)
	}
	if got := big.FLOPs(math.MaxInt32); got != math.MaxInt64 {
		t.Errorf("huge FLOPs = %d, want saturated", got)
	}
	if got := big.GradFLOPs(math.MaxInt32, true, true); got != math.MaxInt64 {
		t.Errorf("huge GradFLOPs = %d, want saturated", got)
	}
	if big.FLOPs(1) != 2*(1<<36)+1<<24 || (kernel.Conv2D{}).FLOPs(5) != 0 || g.FLOPs(-1) != 0 {
		t.Errorf("FLOPs of one example, of a refused geometry or of n < 0 wrong")
	}
}

// hostileConvs are geometries Check must refuse.
var hostileConvs = []kernel.Conv2D{
	{},
	{InC: -1, InH: 4, InW: 4, OutC: 1, KH: 1, KW: 1, Stride: 1},
	{InC: 1, InH: 0, InW: 4, OutC: 1, KH: 1, KW: 1, Stride: 1},
	{InC: 1, InH: 4, InW: -4, OutC: 1, KH: 1, KW: 1, Stride: 1},
	{InC: 1, InH: 4, InW: 4, OutC: 0, KH: 1, KW: 1, Stride: 1},
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 0, KW: 1, Stride: 1},
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 1, KW: -3, Stride: 1},
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 1, KW: 1, Stride: 0},
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 1, KW: 1, Stride: -2},
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 3, KW: 3, Stride: 1, Pad: -1},
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 3, KW: 3, Stride: 1, Pad: 3},       // pad = kernel
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 3, KW: 2, Stride: 1, Pad: 2},       // pad = min kernel
	{InC: 1, InH: 2, InW: 4, OutC: 1, KH: 5, KW: 1, Stride: 1, Pad: 0},       // kernel > input
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 9, KW: 3, Stride: 1, Pad: 2},       // kernel > padded input
	{InC: 1 << 40, InH: 4, InW: 4, OutC: 1, KH: 1, KW: 1, Stride: 1},         // huge
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 1, KW: 1, Stride: 1 << 40},         // huge stride
	{InC: 1, InH: 4, InW: 4, OutC: 1, KH: 1, KW: 1, Stride: 1, Pad: 1 << 40}, // huge pad
	{InC: math.MaxInt, InH: math.MaxInt, InW: 2, OutC: 1, KH: 1, KW: 1, Stride: 1},
	{InC: 1 << 21, InH: 1 << 21, InW: 1 << 21, OutC: 1, KH: 1, KW: 1, Stride: 1},       // product 2^63
	{InC: 1 << 15, InH: 1 << 14, InW: 1, OutC: 1, KH: 1, KW: 1, Stride: 1},             // input 2^29
	{InC: 1, InH: 1 << 14, InW: 1 << 14, OutC: 2, KH: 1, KW: 1, Stride: 1},             // output 2^29
	{InC: 1 << 10, InH: 1, InW: 1, OutC: 1 << 19, KH: 1, KW: 1, Stride: 1},             // weight 2^29
	{InC: 1 << 10, InH: 1 << 8, InW: 1 << 8, OutC: 1, KH: 5, KW: 5, Stride: 1, Pad: 2}, // im2col 2^34
	{InC: 1, InH: math.MaxInt, InW: 1, OutC: 1, KH: 1, KW: 1, Stride: 1},
}

func TestConv2DCheckRefuses(t *testing.T) {
	for _, g := range hostileConvs {
		if err := g.Check(); !errors.Is(err, kernel.ErrShape) {
			t.Errorf("%+v: Check %v, want ErrShape", g, err)
		}
		m := kernel.NewMat(1, 16)
		if err := kernel.Conv2DForward(g, m, kernel.NewMat(1, 1), kernel.Mat{}, kernel.NewMat(1, 16), nil); !errors.Is(err, kernel.ErrShape) {
			t.Errorf("%+v: forward %v, want ErrShape", g, err)
		}
		if err := kernel.Conv2DGrad(g, kernel.NewMat(1, 16), m, kernel.NewMat(1, 1), kernel.NewMat(1, 16), kernel.Mat{}, kernel.Mat{}, nil); !errors.Is(err, kernel.ErrShape) {
			t.Errorf("%+v: grad %v, want ErrShape", g, err)
		}
		if g.FLOPs(1) != 0 || g.GradFLOPs(1, true, true) != 0 {
			t.Errorf("%+v: a refused geometry has work", g)
		}
	}
	// The limits themselves are accepted.
	for _, g := range []kernel.Conv2D{
		{InC: 1, InH: 1 << 12, InW: 1 << 12, OutC: 1, KH: 1, KW: 1, Stride: 1},
		{InC: 1, InH: 1, InW: 1, OutC: 1, KH: 3, KW: 3, Stride: kernel.MaxConvValues, Pad: 1},
	} {
		if err := g.Check(); err != nil {
			t.Errorf("%+v: %v", g, err)
		}
	}
}

func TestConv2DShapeErrors(t *testing.T) {
	g := kernel.Conv2D{InC: 2, InH: 5, InW: 4, OutC: 3, KH: 3, KW: 2, Stride: 1, Pad: 1}
	const n = 2
	xc, wc, yc := g.InC*g.InH*g.InW, g.InC*g.KH*g.KW, g.OutC*g.OutH()*g.OutW()
	m := kernel.NewMat
	x, w, b, y := m(n, xc), m(g.OutC, wc), m(1, g.OutC), m(n, yc)
	short := kernel.Mat{Rows: n, Cols: xc, Data: make([]float32, n*xc-1)}
	huge := kernel.Mat{Rows: 1 << 40, Cols: xc, Data: make([]float32, xc)}
	neg := kernel.Mat{Rows: -1, Cols: xc}
	none := kernel.Mat{}
	// Views of one buffer, to alias.
	buf := make([]float32, 4*n*yc+4*n*xc)
	view := func(off, r, c int) kernel.Mat { return kernel.Mat{Rows: r, Cols: c, Data: buf[off : off+r*c]} }
	fwd := func(x, w, b, y kernel.Mat) error { return kernel.Conv2DForward(g, x, w, b, y, nil) }
	grad := func(dy, x, w, dx, dw, db kernel.Mat) error { return kernel.Conv2DGrad(g, dy, x, w, dx, dw, db, nil) }
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"x cols", fwd(m(n, xc+1), w, b, y)},
		{"x short", fwd(short, w, b, y)},
		{"x huge rows", fwd(huge, w, b, m(1<<10, yc))},
		{"x negative rows", fwd(neg, w, b, y)},
		{"w rows", fwd(x, m(g.OutC+1, wc), b, y)},
		{"w cols", fwd(x, m(g.OutC, wc-1), b, y)},
		{"w transposed", fwd(x, m(wc, g.OutC), b, y)},
		{"b values", fwd(x, w, m(1, g.OutC+1), y)},
		{"b empty but present", fwd(x, w, kernel.Mat{Data: []float32{}}, y)},
		{"y rows", fwd(x, w, b, m(n+1, yc))},
		{"y cols", fwd(x, w, b, m(n, yc+1))},
		{"y is x", fwd(view(0, n, xc), w, b, kernel.Mat{Rows: n, Cols: yc, Data: buf[:n*yc]})},
		{"y overlaps x", fwd(view(0, n, xc), w, b, view(n*xc-1, n, yc))},
		{"y overlaps w", fwd(x, view(10, g.OutC, wc), b, view(0, n, yc))},
		{"y overlaps b", fwd(x, w, view(n*yc-1, 1, g.OutC), view(0, n, yc))},
		{"grad all absent", grad(y, x, w, none, none, none)},
		{"grad dy cols", grad(m(n, yc+1), x, w, m(n, xc), none, none)},
		{"grad dy rows", grad(m(n+1, yc), x, w, m(n, xc), none, none)},
		{"grad x rows", grad(y, m(n+1, xc), w, none, m(g.OutC, wc), none)},
		{"grad dx shape", grad(y, x, w, m(n, xc-1), none, none)},
		{"grad dw shape", grad(y, x, w, none, m(wc, g.OutC), none)},
		{"grad db shape", grad(y, x, w, none, none, m(1, g.OutC-1))},
		{"grad dx short", grad(y, x, w, short, none, none)},
		{"grad dx overlaps dy", grad(view(0, n, yc), x, w, view(n*yc-1, n, xc), none, none)},
		{"grad dx overlaps x", grad(y, view(0, n, xc), w, view(0, n, xc), none, none)},
		{"grad dw overlaps w", grad(y, x, view(0, g.OutC, wc), none, view(1, g.OutC, wc), none)},
		{"grad db overlaps dw", grad(y, x, w, none, view(0, g.OutC, wc), view(2, 1, g.OutC))},
		{"grad dx overlaps db", grad(y, x, w, view(0, n, xc), none, view(n*xc-1, 1, g.OutC))},
		{"grad negative dy", grad(kernel.Mat{Rows: -1, Cols: yc}, x, w, m(n, xc), none, none)},
	} {
		if !errors.Is(tc.err, kernel.ErrShape) {
			t.Errorf("%s: got %v, want ErrShape", tc.name, tc.err)
		}
	}
	// No examples: shapes checked, nothing done.
	if err := errors.Join(fwd(m(0, xc), w, none, m(0, yc)), grad(m(0, yc), m(0, xc), w, m(0, xc), m(g.OutC, wc), none)); err != nil {
		t.Errorf("no examples: %v", err)
	}
}

// FuzzConvShapes drives every kernel of conv.go, pool.go, groupnorm.go and
// dropout.go with geometries from fuzzed ints, the way a WASM module can.
// No call may panic; a refusal must wrap ErrShape or ErrArgument; a call on
// a geometry its Check accepts, with operands of the right shapes, must
// succeed, and its outputs must then be finite (the inputs are), the
// convolution matching the reference.
//
// mode's bits: 0–2 pick an operand to spoil (0: none), 3 how (short data
// or a wrong shape), 4 and 5 leave out b and db, and dx, 6 and 7 make eps
// and p invalid.
func FuzzConvShapes(f *testing.F) {
	f.Add(1, 6, 5, 2, 3, 2, 1, 1, 2, uint8(0), uint64(1))
	f.Add(3, 7, 9, 4, 2, 3, 2, 0, 1, uint8(16), uint64(2))
	f.Add(2, 4, 4, 2, 2, 2, 2, 1, 3, uint8(34), uint64(3))
	f.Add(-1, 1<<40, 4, 0, 1, 1, 1, 0, 1, uint8(5), uint64(4))
	f.Add(1<<21, 1<<21, 1<<21, 1, 1, 1, 1, 0, 1, uint8(1), uint64(5))
	f.Fuzz(func(t *testing.T, inC, inH, inW, outC, k1, k2, stride, pad, n int, mode uint8, seed uint64) {
		r := rand.New(rand.NewPCG(seed, uint64(mode)))
		bad := int(mode % 8)
		const maxVals = 1 << 12
		// mk builds a rows×cols operand of random values; ok is false when
		// it is too large to build (it then claims its shape over three
		// values) or is the one spoiled (which = bad ≠ 0).
		mk := func(rows, cols, which int) (kernel.Mat, bool) {
			if rows < 0 || cols < 0 || rows > maxVals || cols > maxVals || rows*cols > maxVals {
				return kernel.Mat{Rows: rows, Cols: cols, Data: make([]float32, 3)}, false
			}
			if which != 0 && which == bad {
				switch {
				case rows*cols > 0 && mode&8 == 0:
					return kernel.Mat{Rows: rows, Cols: cols, Data: make([]float32, rows*cols-1)}, false
				case rows > 0:
					return kernel.NewMat(rows, cols+1), false
				default:
					return kernel.Mat{Rows: -1, Cols: cols}, false
				}
			}
			m := kernel.NewMat(rows, cols)
			for i := range m.Data {
				m.Data[i] = float32(r.NormFloat64())
			}
			return m, true
		}
		finite := func(name string, ms ...kernel.Mat) {
			for _, m := range ms {
				if i := floats.FirstNonFinite(m.Vals()); i >= 0 {
					t.Fatalf("%s: output value %d is %v", name, i, m.Data[i])
				}
			}
		}
		// ran reports whether a call succeeded, failing the test on a
		// refusal of operands that fit or on an error of another kind.
		ran := func(name string, err error, fits bool) bool {
			if err == nil {
				return true
			}
			if !errors.Is(err, kernel.ErrShape) && !errors.Is(err, kernel.ErrArgument) {
				t.Fatalf("%s: error %v wraps neither ErrShape nor ErrArgument", name, err)
			}
			if fits {
				t.Fatalf("%s: operands that fit refused: %v", name, err)
			}
			return false
		}

		g := kernel.Conv2D{InC: inC, InH: inH, InW: inW, OutC: outC, KH: k1, KW: k2, Stride: stride, Pad: pad}
		cn, gok := n, g.Check() == nil
		if gok && g.FLOPs(max(n, 1)) > 1e7 {
			cn, gok = -1, false // too slow to run: refused for x's negative rows
		}
		x, okx := mk(cn, inC*inH*inW, 1)
		w, okw := mk(outC, inC*k1*k2, 2)
		b, okb := mk(1, outC, 3)
		if mode&16 != 0 {
			b, okb = kernel.Mat{}, true
		}
		y, oky := mk(cn, outC*g.OutH()*g.OutW(), 4)
		fits := gok && okx && okw && okb && oky
		if ran("conv2d", kernel.Conv2DForward(g, x, w, b, y, nil), fits) {
			finite("conv2d", y)
			want, mag := make([]float64, y.Len()), make([]float64, y.Len())
			var b64, babs []float64
			if b.Data != nil {
				b64 = to64(b.Data)
				babs = abs64(b64)
			}
			refConv(g, cn, to64(x.Data), to64(w.Data), b64, want)
			refConv(g, cn, abs64(to64(x.Data)), abs64(to64(w.Data)), babs, mag)
			closeTo(t, "conv2d y", y.Data, want, mag, float64(inC*k1*k2+2)*0x1p-24)
		}
		dx, okdx := mk(cn, inC*inH*inW, 5)
		dw, okdw := mk(outC, inC*k1*k2, 6)
		db, okdb := mk(1, outC, 7)
		if mode&16 != 0 {
			db, okdb = kernel.Mat{}, true
		}
		if mode&32 != 0 {
			dx, okdx = kernel.Mat{}, true
		}
		fits = gok && okx && okw && oky && okdx && okdw && okdb
		if ran("conv2d_grad", kernel.Conv2DGrad(g, y, x, w, dx, dw, db, func() error { return nil }), fits) {
			finite("conv2d_grad", dx, dw, db)
		}

		p := kernel.Pool2D{C: inC, H: inH, W: inW, K: k1, Stride: stride}
		pn, pok := n, p.Check() == nil
		if pok && p.Work(max(n, 1)) > 1e7 {
			pn, pok = -1, false
		}
		px, okpx := mk(pn, inC*inH*inW, 1)
		py, okpy := mk(pn, inC*p.OutH()*p.OutW(), 2)
		pdx, okpdx := mk(pn, inC*inH*inW, 3)
		fits = pok && okpx && okpy
		if ran("max_pool2d", kernel.MaxPool2D(p, px, py), fits) {
			finite("max_pool2d", py)
		}
		if ran("avg_pool2d", kernel.AvgPool2D(p, px, py), fits) {
			finite("avg_pool2d", py)
		}
		if ran("max_pool2d_grad", kernel.MaxPool2DGrad(p, py, px, pdx), fits && okpdx) {
			finite("max_pool2d_grad", pdx)
		}
		if ran("avg_pool2d_grad", kernel.AvgPool2DGrad(p, py, pdx), okpy && pok && okpdx) {
			finite("avg_pool2d_grad", pdx)
		}

		// Group norm: outC groups of inC channels over inC·inH·inW columns.
		groups, channels, cols := outC, inC, inC*inH*inW
		nst := -1 // n·groups, the statistics' size, where it can be built
		switch {
		case n == 0:
			nst = 0
		case n > 0 && groups >= 0 && n <= maxVals && groups <= maxVals:
			nst = n * groups
		}
		gx, okgx := mk(n, cols, 1)
		gamma, okgm := mk(1, channels, 2)
		beta, okbt := mk(1, channels, 3)
		mean, okmn := mk(1, nst, 4)
		rstd, okrs := mk(nst, 1, 5)
		gy, okgy := mk(n, cols, 0)
		gok = groups >= 1 && channels >= 1 && channels%groups == 0 && cols >= 0 && cols%channels == 0 && (n == 0 || cols > 0)
		eps, epsOK := float32(1e-5), true
		if mode&64 != 0 {
			eps = []float32{0, -1, 2, float32(math.NaN()), float32(math.Inf(1)), 1}[seed%6]
			epsOK = eps == 1
		}
		fits = gok && okgx && okgm && okbt && okmn && okrs && okgy && epsOK
		if ran("group_norm", kernel.GroupNorm(gx, gamma, beta, gy, mean, rstd, groups, channels, eps), fits) {
			finite("group_norm", gy, mean, rstd)
		}
		gdx, okgdx := mk(n, cols, 6)
		dgamma, okdg := mk(channels, 1, 7)
		dbeta, okdbt := mk(1, channels, 0)
		fits = gok && okgx && okgm && okmn && okrs && okgy && okgdx && okdg && okdbt
		if ran("group_norm_grad", kernel.GroupNormGrad(gy, gx, gamma, mean, rstd, gdx, dgamma, dbeta, groups, channels), fits) {
			finite("group_norm_grad", gdx, dgamma, dbeta)
		}

		// Dropout over n rows of inC·inH values.
		dp, pOK := float32(seed%64)/64, true
		if mode&128 != 0 {
			dp, pOK = []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), -0.5, 1, 1.5}[seed%6], false
		}
		dx2, okd := mk(n, inC*inH, 1)
		dy2, okd2 := mk(n, inC*inH, 0)
		if ran("dropout", kernel.Dropout(dy2, dx2, dp, seed), okd && okd2 && pOK) {
			finite("dropout", dx2)
			must(t, kernel.DropoutGrad(dx2, dx2, dp, seed))
			finite("dropout_grad", dx2)
		}
	})
}

// directConv is a direct convolution with the bounds of each kernel tap
// hoisted out of the loops over output positions: the fairest direct
// kernel to set against im2col, y = conv(x, w) + b.
func directConv(g kernel.Conv2D, n int, x, w, b, y []float32) {
	oh, ow, s := g.OutH(), g.OutW(), g.Stride
	hw, p := g.InH*g.InW, oh*ow
	for e := 0; e < n; e++ {
		for o := 0; o < g.OutC; o++ {
			out := y[(e*g.OutC+o)*p : (e*g.OutC+o+1)*p]
			for i := range out {
				out[i] = b[o]
			}
			for c := 0; c < g.InC; c++ {
				xc := x[(e*g.InC+c)*hw : (e*g.InC+c+1)*hw]
				for kh := 0; kh < g.KH; kh++ {
					hlo, hhi := tapRange(g.InH, oh, s, g.Pad, kh)
					for kw := 0; kw < g.KW; kw++ {
						wlo, whi := tapRange(g.InW, ow, s, g.Pad, kw)
						wv := w[((o*g.InC+c)*g.KH+kh)*g.KW+kw]
						for i := hlo; i < hhi; i++ {
							row := xc[(i*s-g.Pad+kh)*g.InW:]
							dst := out[i*ow : (i+1)*ow]
							for j := wlo; j < whi; j++ {
								dst[j] += wv * row[j*s-g.Pad+kw]
							}
						}
					}
				}
			}
		}
	}
}

// directConvGrad is directConv's gradient, the same loops: dx overwritten,
// dw and db accumulated.
func directConvGrad(g kernel.Conv2D, n int, dy, x, w, dx, dw, db []float32) {
	oh, ow, s := g.OutH(), g.OutW(), g.Stride
	hw, p := g.InH*g.InW, oh*ow
	clear(dx)
	for e := 0; e < n; e++ {
		for o := 0; o < g.OutC; o++ {
			d := dy[(e*g.OutC+o)*p : (e*g.OutC+o+1)*p]
			for _, v := range d {
				db[o] += v
			}
			for c := 0; c < g.InC; c++ {
				xc := x[(e*g.InC+c)*hw : (e*g.InC+c+1)*hw]
				dxc := dx[(e*g.InC+c)*hw : (e*g.InC+c+1)*hw]
				for kh := 0; kh < g.KH; kh++ {
					hlo, hhi := tapRange(g.InH, oh, s, g.Pad, kh)
					for kw := 0; kw < g.KW; kw++ {
						wlo, whi := tapRange(g.InW, ow, s, g.Pad, kw)
						wi := ((o*g.InC+c)*g.KH+kh)*g.KW + kw
						wv, acc := w[wi], float32(0)
						for i := hlo; i < hhi; i++ {
							off := (i*s - g.Pad + kh) * g.InW
							row, drow := xc[off:off+g.InW], dxc[off:off+g.InW]
							src := d[i*ow : (i+1)*ow]
							for j := wlo; j < whi; j++ {
								iw := j*s - g.Pad + kw
								acc += src[j] * row[iw]
								drow[iw] += wv * src[j]
							}
						}
						dw[wi] += acc
					}
				}
			}
		}
	}
}

// tapRange is the range of output positions whose input position
// o·stride − pad + off lies in [0, in).
func tapRange(in, out, stride, pad, off int) (lo, hi int) {
	for lo = 0; lo < out && lo*stride-pad+off < 0; lo++ {
	}
	for hi = out; hi > lo && (hi-1)*stride-pad+off >= in; hi-- {
	}
	return lo, hi
}

// TestDirectConv keeps the benchmark's direct kernels honest.
func TestDirectConv(t *testing.T) {
	r := rand.New(rand.NewPCG(39, 40))
	for it := 0; it < 20; it++ {
		g := randConv(r)
		n := 1 + r.IntN(2)
		x, w, b := randMat(r, n, g.InC*g.InH*g.InW), randMat(r, g.OutC, g.InC*g.KH*g.KW), randMat(r, 1, g.OutC)
		dy := randMat(r, n, g.OutC*g.OutH()*g.OutW())
		want := convRun(t, g, x, w, b, dy)
		y, dx, dw, db := make([]float32, dy.Len()), make([]float32, x.Len()), make([]float32, w.Len()), make([]float32, g.OutC)
		directConv(g, n, x.Data, w.Data, b.Data, y)
		directConvGrad(g, n, dy.Data, x.Data, w.Data, dx, dw, db)
		for i, got := range [][]float32{y, dx, dw, db} {
			for j, v := range got {
				if math.Abs(float64(v-want[i][j])) > 1e-4*(1+math.Abs(float64(v))) {
					t.Fatalf("%+v: output %d[%d] = %v, im2col %v", g, i, j, v, want[i][j])
				}
			}
		}
	}
}

// BenchmarkConv2D sets im2col against direct kernels on the convolutions
// of the LEAF FEMNIST CNN over a batch of 32: "naive" is the seven-loop
// reference, "direct" the same arithmetic with the bounds hoisted. Each
// direct run reports its time over im2col's as direct/im2col. grad
// computes dx, dw and db.
func BenchmarkConv2D(b *testing.B) {
	const n = 32
	r := rand.New(rand.NewPCG(1, 1))
	for _, layer := range femnist {
		g := layer.g
		x, w, bias := randMat(r, n, g.InC*g.InH*g.InW), randMat(r, g.OutC, g.InC*g.KH*g.KW), randMat(r, 1, g.OutC)
		y, dy := kernel.NewMat(n, g.OutC*g.OutH()*g.OutW()), randMat(r, n, g.OutC*g.OutH()*g.OutW())
		dx, dw, db := kernel.NewMat(n, x.Cols), kernel.NewMat(w.Rows, w.Cols), kernel.NewMat(1, g.OutC)
		for _, pass := range []struct {
			name  string
			flops int64
			run   map[string]func() error
		}{
			{"forward", g.FLOPs(n), map[string]func() error{
				"im2col": func() error { return kernel.Conv2DForward(g, x, w, bias, y, nil) },
				"direct": func() error { directConv(g, n, x.Data, w.Data, bias.Data, y.Data); return nil },
				"naive":  func() error { refConv(g, n, x.Data, w.Data, bias.Data, y.Data); return nil },
			}},
			{"grad", g.GradFLOPs(n, true, true), map[string]func() error{
				"im2col": func() error { return kernel.Conv2DGrad(g, dy, x, w, dx, dw, db, nil) },
				"direct": func() error {
					directConvGrad(g, n, dy.Data, x.Data, w.Data, dx.Data, dw.Data, db.Data)
					return nil
				},
				"naive": func() error {
					refConvGrad(g, n, dy.Data, x.Data, w.Data, dx.Data, dw.Data, db.Data)
					return nil
				},
			}},
		} {
			var base float64
			for _, kind := range []string{"im2col", "direct", "naive"} {
				b.Run(layer.name+"/"+pass.name+"/"+kind, func(b *testing.B) {
					run := pass.run[kind]
					for b.Loop() {
						if err := run(); err != nil {
							b.Fatal(err)
						}
					}
					ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
					b.ReportMetric(float64(pass.flops)/ns, "GFLOP/s")
					if kind == "im2col" {
						base = ns
					} else if base > 0 {
						b.ReportMetric(ns/base, kind+"/im2col")
					}
				})
			}
		}
	}
}
