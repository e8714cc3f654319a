package kernel_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// refPool is direct pooling in float64: the maximum (a NaN winning) or the
// mean of each window.
func refPool(p kernel.Pool2D, n int, x []float64, isMax bool) []float64 {
	oh, ow := p.OutH(), p.OutW()
	y := make([]float64, n*p.C*oh*ow)
	for e := 0; e < n; e++ {
		for c := 0; c < p.C; c++ {
			for i := 0; i < oh; i++ {
				for j := 0; j < ow; j++ {
					m, s := math.Inf(-1), 0.0
					for kh := 0; kh < p.K; kh++ {
						for kw := 0; kw < p.K; kw++ {
							v := x[((e*p.C+c)*p.H+i*p.Stride+kh)*p.W+j*p.Stride+kw]
							if v > m || math.IsNaN(v) {
								m = v
							}
							s += v
						}
					}
					if !isMax {
						m = s / float64(p.K*p.K)
					}
					y[((e*p.C+c)*oh+i)*ow+j] = m
				}
			}
		}
	}
	return y
}

func randPool(r *rand.Rand) kernel.Pool2D {
	for {
		p := kernel.Pool2D{C: 1 + r.IntN(3), H: 1 + r.IntN(9), W: 1 + r.IntN(9), K: 1 + r.IntN(4), Stride: 1 + r.IntN(3)}
		if p.Check() == nil {
			return p
		}
	}
}

func TestPool2DForward(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for it := 0; it < 60; it++ {
		p := randPool(r)
		n := 1 + r.IntN(3)
		x := randMat(r, n, p.C*p.H*p.W)
		ymax, yavg := randMat(r, n, p.C*p.OutH()*p.OutW()), randMat(r, n, p.C*p.OutH()*p.OutW())
		must(t, kernel.MaxPool2D(p, x, ymax), kernel.AvgPool2D(p, x, yavg))
		for i, v := range refPool(p, n, to64(x.Data), true) {
			if float64(ymax.Data[i]) != v {
				t.Fatalf("%+v: max[%d] = %v, want %v", p, i, ymax.Data[i], v)
			}
		}
		mag := refPool(p, n, abs64(to64(x.Data)), false)
		closeTo(t, "avg", yavg.Data, refPool(p, n, to64(x.Data), false), mag, 1e-7)
	}
}

// TestMaxPool2DTies: the first maximum in row-major order takes the
// gradient, and the first NaN wins over any number; -Inf windows work.
func TestMaxPool2DTies(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	p := kernel.Pool2D{C: 1, H: 2, W: 8, K: 2, Stride: 2}
	x := kernel.Mat{Rows: 1, Cols: 16, Data: []float32{
		1, 3, 5, -inf, 2, nan, 0, 7,
		3, 3, 5, 4, nan, 9, 7, 0,
	}}
	y := kernel.NewMat(1, 4)
	must(t, kernel.MaxPool2D(p, x, y))
	if y.Data[0] != 3 || y.Data[1] != 5 || !math.IsNaN(float64(y.Data[2])) || y.Data[3] != 7 {
		t.Fatalf("y = %v", y.Data)
	}
	dy := kernel.Mat{Rows: 1, Cols: 4, Data: []float32{10, 20, 30, 40}}
	dx := kernel.Mat{Rows: 1, Cols: 16, Data: slices.Repeat([]float32{nan}, 16)} // overwritten
	must(t, kernel.MaxPool2DGrad(p, dy, x, dx))
	want := []float32{
		0, 10, 20, 0, 0, 30, 0, 40,
		0, 0, 0, 0, 0, 0, 0, 0,
	}
	if !floats.SameBits(dx.Data, want) {
		t.Fatalf("dx = %v, want %v", dx.Data, want)
	}
	// A window of -Inf has the maximum -Inf and its first position.
	ninf := kernel.Mat{Rows: 1, Cols: 4, Data: []float32{-inf, -inf, -inf, -inf}}
	p = kernel.Pool2D{C: 1, H: 2, W: 2, K: 2, Stride: 1}
	y, dx = kernel.NewMat(1, 1), kernel.NewMat(1, 4)
	must(t, kernel.MaxPool2D(p, ninf, y), kernel.MaxPool2DGrad(p, kernel.Mat{Rows: 1, Cols: 1, Data: []float32{1}}, ninf, dx))
	if y.Data[0] != -inf || !slices.Equal(dx.Data, []float32{1, 0, 0, 0}) {
		t.Fatalf("-Inf window: y %v dx %v", y.Data, dx.Data)
	}
}

// TestPool2DGradient checks both gradients against central differences of
// L = Σ r·y on the float64 reference, overlapping windows included.
func TestPool2DGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for it := 0; it < 12; it++ {
		p := randPool(r)
		if it < 3 {
			p = kernel.Pool2D{C: 2, H: 5, W: 6, K: 3, Stride: 1} // every value in several windows
		}
		n := 1 + r.IntN(2)
		x, dy := randMat(r, n, p.C*p.H*p.W), randMat(r, n, p.C*p.OutH()*p.OutW())
		x64, r64 := to64(x.Data), to64(dy.Data)
		dmax, davg := randMat(r, n, x.Cols), randMat(r, n, x.Cols) // overwritten
		must(t, kernel.MaxPool2DGrad(p, dy, x, dmax), kernel.AvgPool2DGrad(p, dy, davg))
		for _, k := range []struct {
			name  string
			isMax bool
			grad  []float32
		}{{"max", true, dmax.Data}, {"avg", false, davg.Data}} {
			loss := func() float64 {
				var s float64
				for i, v := range refPool(p, n, x64, k.isMax) {
					s += r64[i] * v
				}
				return s
			}
			for i := range x64 {
				orig, h := x64[i], 1e-7
				x64[i] = orig + h
				up := loss()
				x64[i] = orig - h
				down := loss()
				x64[i] = orig
				num := (up - down) / (2 * h)
				if got := float64(k.grad[i]); math.Abs(got-num) > 1e-5*(1+math.Abs(num)) {
					t.Fatalf("%+v: %s dx[%d] = %v, central difference %v", p, k.name, i, got, num)
				}
			}
		}
	}
}

func TestPool2DDeterminism(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 46))
	p := kernel.Pool2D{C: 32, H: 28, W: 28, K: 3, Stride: 2}
	const n = 4
	x, dy := randMat(r, n, p.C*p.H*p.W), randMat(r, n, p.C*p.OutH()*p.OutW())
	run := func() [][]float32 {
		ym, ya := kernel.NewMat(n, dy.Cols), kernel.NewMat(n, dy.Cols)
		dm, da := kernel.NewMat(n, x.Cols), kernel.NewMat(n, x.Cols)
		must(t, kernel.MaxPool2D(p, x, ym), kernel.AvgPool2D(p, x, ya),
			kernel.MaxPool2DGrad(p, dy, x, dm), kernel.AvgPool2DGrad(p, dy, da))
		return [][]float32{ym.Data, ya.Data, dm.Data, da.Data}
	}
	defer kernel.SetThreads(kernel.SetThreads(1))
	one, again := run(), run()
	kernel.SetThreads(4)
	four := run()
	for i := range one {
		if !floats.SameBits(one[i], again[i]) || !floats.SameBits(one[i], four[i]) {
			t.Fatalf("output %d differs between runs or thread counts", i)
		}
	}
}

func TestPool2DShapeErrors(t *testing.T) {
	for _, p := range []kernel.Pool2D{
		{},
		{C: -1, H: 4, W: 4, K: 2, Stride: 2},
		{C: 1, H: 0, W: 4, K: 1, Stride: 1},
		{C: 1, H: 4, W: -4, K: 1, Stride: 1},
		{C: 1, H: 4, W: 4, K: 0, Stride: 1},
		{C: 1, H: 4, W: 4, K: 2, Stride: 0},
		{C: 1, H: 4, W: 4, K: 2, Stride: -1},
		{C: 1, H: 4, W: 3, K: 4, Stride: 1}, // window wider than the input
		{C: 1, H: 2, W: 4, K: 3, Stride: 1}, // window taller than the input
		{C: 1 << 40, H: 4, W: 4, K: 2, Stride: 2},
		{C: 1, H: 4, W: 4, K: 2, Stride: 1 << 40},
		{C: math.MaxInt, H: math.MaxInt, W: 2, K: 1, Stride: 1},
		{C: 1 << 21, H: 1 << 21, W: 1 << 21, K: 1, Stride: 1}, // product 2^63
		{C: 2, H: 1 << 14, W: 1 << 14, K: 1, Stride: 1},       // input 2^29
		{C: 1, H: 1 << 13, W: 1 << 13, K: 1 << 12, Stride: 1}, // windows 2^50
	} {
		if err := p.Check(); !errors.Is(err, kernel.ErrShape) {
			t.Errorf("%+v: Check %v, want ErrShape", p, err)
		}
		if p.Work(1) != 0 {
			t.Errorf("%+v: a refused geometry has work", p)
		}
		m := kernel.NewMat(1, 16)
		for name, err := range map[string]error{
			"max":      kernel.MaxPool2D(p, m, kernel.NewMat(1, 4)),
			"avg":      kernel.AvgPool2D(p, m, kernel.NewMat(1, 4)),
			"max_grad": kernel.MaxPool2DGrad(p, kernel.NewMat(1, 4), m, kernel.NewMat(1, 16)),
			"avg_grad": kernel.AvgPool2DGrad(p, kernel.NewMat(1, 4), kernel.NewMat(1, 16)),
		} {
			if !errors.Is(err, kernel.ErrShape) {
				t.Errorf("%+v: %s %v, want ErrShape", p, name, err)
			}
		}
	}
	p := kernel.Pool2D{C: 2, H: 4, W: 6, K: 2, Stride: 2}
	if got, want := p.Work(3), int64(3*2*2*3*4); got != want {
		t.Errorf("Work = %d, want %d", got, want)
	}
	const n, xc, yc = 2, 48, 12
	m := kernel.NewMat
	x, y := m(n, xc), m(n, yc)
	buf := make([]float32, n*xc+n*yc)
	short := kernel.Mat{Rows: n, Cols: xc, Data: make([]float32, n*xc-1)}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"x cols", kernel.MaxPool2D(p, m(n, xc+1), y)},
		{"x short", kernel.AvgPool2D(p, short, y)},
		{"x huge rows", kernel.MaxPool2D(p, kernel.Mat{Rows: 1 << 40, Cols: xc, Data: make([]float32, xc)}, m(1<<10, yc))},
		{"x negative rows", kernel.AvgPool2D(p, kernel.Mat{Rows: -1, Cols: xc}, y)},
		{"y rows", kernel.MaxPool2D(p, x, m(n+1, yc))},
		{"y cols", kernel.AvgPool2D(p, x, m(n, yc-1))},
		{"y overlaps x", kernel.MaxPool2D(p, kernel.Mat{Rows: n, Cols: xc, Data: buf[:n*xc]}, kernel.Mat{Rows: n, Cols: yc, Data: buf[n*xc-1:][:n*yc]})},
		{"avg y is x", kernel.AvgPool2D(p, kernel.Mat{Rows: n, Cols: xc, Data: buf[:n*xc]}, kernel.Mat{Rows: n, Cols: yc, Data: buf[:n*yc]})},
		{"max_grad dx shape", kernel.MaxPool2DGrad(p, y, x, m(n, xc-1))},
		{"max_grad x shape", kernel.MaxPool2DGrad(p, y, m(n+1, xc), m(n, xc))},
		{"max_grad dy shape", kernel.MaxPool2DGrad(p, m(n, yc+1), x, m(n, xc))},
		{"max_grad dx is x", kernel.MaxPool2DGrad(p, y, x, x)},
		{"max_grad dx overlaps dy", kernel.MaxPool2DGrad(p, kernel.Mat{Rows: n, Cols: yc, Data: buf[n*xc-3:][:n*yc]}, x, kernel.Mat{Rows: n, Cols: xc, Data: buf[:n*xc]})},
		{"avg_grad dy rows", kernel.AvgPool2DGrad(p, m(n+1, yc), m(n, xc))},
		{"avg_grad dx short", kernel.AvgPool2DGrad(p, y, short)},
		{"avg_grad dx overlaps dy", kernel.AvgPool2DGrad(p, kernel.Mat{Rows: n, Cols: yc, Data: buf[:n*yc]}, kernel.Mat{Rows: n, Cols: xc, Data: buf[:n*xc]})},
	} {
		if !errors.Is(tc.err, kernel.ErrShape) {
			t.Errorf("%s: got %v, want ErrShape", tc.name, tc.err)
		}
	}
}
