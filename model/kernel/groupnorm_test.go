package kernel_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// refGroupNorm is group normalisation in float64, as PyTorch's
// nn.GroupNorm defines it; it returns y and each group's mean and rstd.
func refGroupNorm(x, gamma, beta []float64, n, groups, channels int, eps float64) (y, mean, rstd []float64) {
	cols := len(x) / n
	hw, cg := cols/channels, channels/groups
	m := cg * hw
	y, mean, rstd = make([]float64, len(x)), make([]float64, n*groups), make([]float64, n*groups)
	for e := 0; e < n; e++ {
		for g := 0; g < groups; g++ {
			off := e*cols + g*m
			var s, q float64
			for _, v := range x[off : off+m] {
				s += v
			}
			mu := s / float64(m)
			for _, v := range x[off : off+m] {
				q += (v - mu) * (v - mu)
			}
			rs := 1 / math.Sqrt(q/float64(m)+eps)
			for j := 0; j < m; j++ {
				c := g*cg + j/hw
				y[off+j] = (x[off+j]-mu)*rs*gamma[c] + beta[c]
			}
			mean[e*groups+g], rstd[e*groups+g] = mu, rs
		}
	}
	return y, mean, rstd
}

var groupShapes = []struct{ n, groups, channels, hw int }{
	{2, 2, 4, 6},
	{3, 1, 3, 5},  // one group: layer norm over C·H·W with per-channel affine
	{1, 4, 4, 9},  // a group per channel: instance norm
	{2, 3, 6, 1},  // no spatial extent
	{1, 2, 8, 16}, // larger groups
}

func TestGroupNormForward(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, s := range groupShapes {
		cols := s.channels * s.hw
		x, gamma, beta := randMat(r, s.n, cols), randMat(r, 1, s.channels), randMat(r, 1, s.channels)
		// A group far from zero keeps its precision: statistics are float64.
		for j := range cols / s.groups {
			x.Data[j] = 1000 + x.Data[j]*1e-2
		}
		y, mean, rstd := randMat(r, s.n, cols), kernel.NewMat(s.n, s.groups), kernel.NewMat(s.n, s.groups)
		must(t, kernel.GroupNorm(x, gamma, beta, y, mean, rstd, s.groups, s.channels, 1e-5))
		wy, wm, wr := refGroupNorm(to64(x.Data), to64(gamma.Data), to64(beta.Data), s.n, s.groups, s.channels, 1e-5)
		for i := range wm {
			if math.Abs(float64(mean.Data[i])-wm[i]) > 1e-6*(1+math.Abs(wm[i])) || math.Abs(float64(rstd.Data[i])-wr[i]) > 1e-6*wr[i] {
				t.Fatalf("%+v: group %d mean %v rstd %v, want %v %v", s, i, mean.Data[i], rstd.Data[i], wm[i], wr[i])
			}
		}
		for i, w := range wy {
			if math.Abs(float64(y.Data[i])-w) > 1e-5*(1+math.Abs(w)) {
				t.Fatalf("%+v: y[%d] = %v, want %v", s, i, y.Data[i], w)
			}
		}
		// y may be x.
		in := cloneMat(x)
		must(t, kernel.GroupNorm(in, gamma, beta, in, kernel.NewMat(s.n, s.groups), kernel.NewMat(s.n, s.groups), s.groups, s.channels, 1e-5))
		if !floats.SameBits(in.Data, y.Data) {
			t.Fatalf("%+v: group norm in place differs", s)
		}
	}
}

// TestGroupNormGradient checks dx, dgamma and dbeta against central
// differences of L = Σ r·y on the float64 reference.
func TestGroupNormGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	for _, s := range groupShapes {
		cols := s.channels * s.hw
		x, gamma, beta, dy := randMat(r, s.n, cols), randMat(r, 1, s.channels), randMat(r, 1, s.channels), randMat(r, s.n, cols)
		y, mean, rstd := kernel.NewMat(s.n, cols), kernel.NewMat(s.n, s.groups), kernel.NewMat(s.n, s.groups)
		must(t, kernel.GroupNorm(x, gamma, beta, y, mean, rstd, s.groups, s.channels, 1e-5))
		dx := randMat(r, s.n, cols) // overwritten
		dg0, db0 := randMat(r, 1, s.channels), randMat(r, 1, s.channels)
		dgamma, dbeta := cloneMat(dg0), cloneMat(db0)
		must(t, kernel.GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, s.groups, s.channels))

		x64, g64, b64, r64 := to64(x.Data), to64(gamma.Data), to64(beta.Data), to64(dy.Data)
		loss := func() float64 {
			y, _, _ := refGroupNorm(x64, g64, b64, s.n, s.groups, s.channels, 1e-5)
			var l float64
			for i, v := range y {
				l += r64[i] * v
			}
			return l
		}
		for _, p := range []struct {
			name   string
			vals   []float64
			grad   []float32
			before []float32
		}{{"dx", x64, dx.Data, nil}, {"dgamma", g64, dgamma.Data, dg0.Data}, {"dbeta", b64, dbeta.Data, db0.Data}} {
			for i := range p.vals {
				orig, h := p.vals[i], 1e-6
				p.vals[i] = orig + h
				up := loss()
				p.vals[i] = orig - h
				down := loss()
				p.vals[i] = orig
				num := (up - down) / (2 * h)
				got := float64(p.grad[i])
				if p.before != nil {
					got -= float64(p.before[i]) // dgamma and dbeta accumulate
				}
				if math.Abs(got-num) > 1e-4*(1+math.Abs(num)) {
					t.Fatalf("%+v: %s[%d] = %v, central difference %v", s, p.name, i, got, num)
				}
			}
		}
		// dx may be dy.
		in := cloneMat(dy)
		must(t, kernel.GroupNormGrad(in, x, gamma, mean, rstd, in, kernel.NewMat(1, s.channels), kernel.NewMat(1, s.channels), s.groups, s.channels))
		if !floats.SameBits(in.Data, dx.Data) {
			t.Fatalf("%+v: group norm gradient in place differs", s)
		}
	}
}

// TestGroupNormIsLayerNorm: with one channel per column and one group,
// group norm is layer norm, and follows its arithmetic bit for bit.
func TestGroupNormIsLayerNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(55, 56))
	const n, d = 3, 40
	x, gamma, beta, dy := randMat(r, n, d), randMat(r, 1, d), randMat(r, 1, d), randMat(r, n, d)
	run := func(group bool) [][]float32 {
		y, mean, rstd := kernel.NewMat(n, d), kernel.NewMat(n, 1), kernel.NewMat(n, 1)
		dx, dg, db := kernel.NewMat(n, d), kernel.NewMat(1, d), kernel.NewMat(1, d)
		if group {
			must(t, kernel.GroupNorm(x, gamma, beta, y, mean, rstd, 1, d, 1e-5),
				kernel.GroupNormGrad(dy, x, gamma, mean, rstd, dx, dg, db, 1, d))
		} else {
			must(t, kernel.LayerNorm(x, gamma, beta, y, mean, rstd, 1e-5),
				kernel.LayerNormGrad(dy, x, gamma, mean, rstd, dx, dg, db))
		}
		return [][]float32{y.Data, mean.Data, rstd.Data, dx.Data, dg.Data, db.Data}
	}
	gn, ln := run(true), run(false)
	for i := range gn {
		if !floats.SameBits(gn[i], ln[i]) {
			t.Errorf("output %d: group norm %v, layer norm %v", i, gn[i][:3], ln[i][:3])
		}
	}
}

func TestGroupNormDeterminism(t *testing.T) {
	r := rand.New(rand.NewPCG(57, 58))
	const n, groups, channels, hw = 4, 8, 32, 49
	x, gamma, beta, dy := randMat(r, n, channels*hw), randMat(r, 1, channels), randMat(r, 1, channels), randMat(r, n, channels*hw)
	run := func() [][]float32 {
		y, mean, rstd := kernel.NewMat(n, x.Cols), kernel.NewMat(n, groups), kernel.NewMat(n, groups)
		dx, dg, db := kernel.NewMat(n, x.Cols), kernel.NewMat(1, channels), kernel.NewMat(1, channels)
		must(t, kernel.GroupNorm(x, gamma, beta, y, mean, rstd, groups, channels, 1e-5),
			kernel.GroupNormGrad(dy, x, gamma, mean, rstd, dx, dg, db, groups, channels))
		return [][]float32{y.Data, mean.Data, rstd.Data, dx.Data, dg.Data, db.Data}
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
	if got, want := kernel.GroupNormWork(n, x.Cols), int64(8*n*x.Cols); got != want {
		t.Errorf("GroupNormWork = %d, want %d", got, want)
	}
	if kernel.GroupNormWork(-1, 5) != 0 || kernel.GroupNormWork(math.MaxInt, math.MaxInt) != math.MaxInt64 {
		t.Errorf("GroupNormWork of a negative count or huge sizes wrong")
	}
}

func TestGroupNormErrors(t *testing.T) {
	m := kernel.NewMat
	const n, c, hw = 2, 4, 3
	x, gm, bt, y, st := m(n, c*hw), m(1, c), m(1, c), m(n, c*hw), m(n, 2)
	short := kernel.Mat{Rows: n, Cols: c * hw, Data: make([]float32, n*c*hw-1)}
	buf := make([]float32, 64)
	view := func(off, r, c int) kernel.Mat { return kernel.Mat{Rows: r, Cols: c, Data: buf[off : off+r*c]} }
	gn := func(x, gm, bt, y, mean, rstd kernel.Mat, groups, channels int, eps float32) error {
		return kernel.GroupNorm(x, gm, bt, y, mean, rstd, groups, channels, eps)
	}
	gg := func(dy, x, gm, mean, rstd, dx, dg, db kernel.Mat, groups, channels int) error {
		return kernel.GroupNormGrad(dy, x, gm, mean, rstd, dx, dg, db, groups, channels)
	}
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"groups 0", gn(x, gm, bt, y, m(n, 0), m(n, 0), 0, c, 1e-5), kernel.ErrShape},
		{"groups negative", gn(x, gm, bt, y, st, st, -2, c, 1e-5), kernel.ErrShape},
		{"groups not dividing", gn(x, gm, bt, y, m(n, 3), m(n, 3), 3, c, 1e-5), kernel.ErrShape},
		{"groups above channels", gn(x, gm, bt, y, m(n, 8), m(n, 8), 8, c, 1e-5), kernel.ErrShape},
		{"channels 0", gn(x, m(1, 0), m(1, 0), y, st, st, 2, 0, 1e-5), kernel.ErrShape},
		{"channels negative", gn(x, gm, bt, y, st, st, 2, -4, 1e-5), kernel.ErrShape},
		{"channels not dividing", gn(m(n, 10), gm, bt, m(n, 10), st, st, 2, c, 1e-5), kernel.ErrShape},
		{"huge groups", gn(x, gm, bt, y, st, st, 1<<40, 1<<40, 1e-5), kernel.ErrShape},
		{"huge rows of nothing", gn(kernel.Mat{Rows: math.MaxInt}, m(1, 1), m(1, 1), kernel.Mat{Rows: math.MaxInt}, m(1, 0), m(1, 0), 1, 1, 1e-5), kernel.ErrShape},
		// 2^62 rows of nothing by 4 groups: n·groups wraps to 0 in int.
		{"rows of nothing, statistics wrap", gn(kernel.Mat{Rows: 1 << 62}, gm, bt, kernel.Mat{Rows: 1 << 62}, kernel.Mat{}, kernel.Mat{}, 4, c, 1e-5), kernel.ErrShape},
		{"grad rows of nothing, statistics wrap", gg(kernel.Mat{Rows: 1 << 62}, kernel.Mat{Rows: 1 << 62}, gm, kernel.Mat{}, kernel.Mat{}, kernel.Mat{Rows: 1 << 62}, m(1, c), m(1, c), 4, c), kernel.ErrShape},
		{"x short", gn(short, gm, bt, y, st, st, 2, c, 1e-5), kernel.ErrShape},
		{"y shape", gn(x, gm, bt, m(n, c*hw+1), st, st, 2, c, 1e-5), kernel.ErrShape},
		{"gamma", gn(x, m(1, c+1), bt, y, st, st, 2, c, 1e-5), kernel.ErrShape},
		{"beta", gn(x, gm, m(1, c-1), y, st, st, 2, c, 1e-5), kernel.ErrShape},
		{"mean", gn(x, gm, bt, y, m(n, 1), st, 2, c, 1e-5), kernel.ErrShape},
		{"rstd", gn(x, gm, bt, y, st, m(n+1, 2), 2, c, 1e-5), kernel.ErrShape},
		{"y overlaps x", gn(view(0, n, c*hw), gm, bt, view(1, n, c*hw), st, st, 2, c, 1e-5), kernel.ErrShape},
		{"mean overlaps x", gn(view(0, n, c*hw), gm, bt, y, view(3, n, 2), st, 2, c, 1e-5), kernel.ErrShape},
		{"rstd overlaps y = x", gn(view(0, n, c*hw), gm, bt, view(0, n, c*hw), st, view(20, n, 2), 2, c, 1e-5), kernel.ErrShape},
		{"rstd overlaps mean", gn(x, gm, bt, y, view(0, n, 2), view(1, n, 2), 2, c, 1e-5), kernel.ErrShape},
		{"y overlaps gamma", gn(x, view(0, 1, c), bt, view(2, n, c*hw), st, st, 2, c, 1e-5), kernel.ErrShape},
		{"eps 0", gn(x, gm, bt, y, st, st, 2, c, 0), kernel.ErrArgument},
		{"eps negative", gn(x, gm, bt, y, st, st, 2, c, -1e-5), kernel.ErrArgument},
		{"eps above 1", gn(x, gm, bt, y, st, st, 2, c, 1.5), kernel.ErrArgument},
		{"eps NaN", gn(x, gm, bt, y, st, st, 2, c, nan), kernel.ErrArgument},
		{"eps Inf", gn(x, gm, bt, y, st, st, 2, c, float32(math.Inf(1))), kernel.ErrArgument},
		{"grad groups", gg(y, x, gm, st, st, m(n, c*hw), gm, bt, 3, c), kernel.ErrShape},
		{"grad dy shape", gg(m(n, c*hw+1), x, gm, st, st, m(n, c*hw), m(1, c), m(1, c), 2, c), kernel.ErrShape},
		{"grad dx shape", gg(y, x, gm, st, st, m(n+1, c*hw), m(1, c), m(1, c), 2, c), kernel.ErrShape},
		{"grad dgamma", gg(y, x, gm, st, st, m(n, c*hw), m(1, c+1), m(1, c), 2, c), kernel.ErrShape},
		{"grad dbeta", gg(y, x, gm, st, st, m(n, c*hw), m(1, c), m(1, 1), 2, c), kernel.ErrShape},
		{"grad mean", gg(y, x, gm, m(n, 3), st, m(n, c*hw), m(1, c), m(1, c), 2, c), kernel.ErrShape},
		{"grad dx is x", gg(y, x, gm, st, st, x, m(1, c), m(1, c), 2, c), kernel.ErrShape},
		{"grad dx overlaps dy", gg(view(0, n, c*hw), x, gm, st, st, view(1, n, c*hw), m(1, c), m(1, c), 2, c), kernel.ErrShape},
		{"grad dgamma overlaps dbeta", gg(y, x, gm, st, st, m(n, c*hw), view(0, 1, c), view(3, 1, c), 2, c), kernel.ErrShape},
		{"grad dbeta overlaps dx = dy", gg(view(0, n, c*hw), x, gm, st, st, view(0, n, c*hw), m(1, c), view(10, 1, c), 2, c), kernel.ErrShape},
		{"grad dgamma is gamma", gg(y, x, gm, st, st, m(n, c*hw), gm, m(1, c), 2, c), kernel.ErrShape},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	// No examples: nothing to do.
	if err := gn(m(0, c*hw), gm, bt, m(0, c*hw), m(0, 2), m(0, 2), 2, c, 1e-5); err != nil {
		t.Errorf("no examples: %v", err)
	}
}
