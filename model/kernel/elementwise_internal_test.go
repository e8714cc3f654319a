package kernel

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// withImpl runs f with the kernels on implementation impl.
func withImpl(impl *vecImpl, f func()) {
	saved := vec
	vec = impl
	defer func() { vec = saved }()
	f()
}

// sameFloats reports whether a and b hold the same bits, counting any two
// NaNs as equal (their bits are the CPU's, see elementwise.go).
func sameFloats(a, b []float32) (int, bool) {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(a[i] != a[i] && b[i] != b[i]) {
			return i, false
		}
	}
	return -1, len(a) == len(b)
}

var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 0x1p-149, -0x1p-149, 0x1p-130, -0x1.8p-127,
	math.MaxFloat32, -math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
	1e4, -1e4, 1e5, -1e5, 1e19, -1e19, 88.7, -87.4, 89.5, -104.5, 10, -10, 20, -20, 1e-20, -1e-20}

// testVector is n values: normal ones of scale scale, with the special
// values sprinkled in when special is set.
func testVector(r *rand.Rand, n int, scale float64, special bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
		if special && r.IntN(5) == 0 {
			x[i] = specials[r.IntN(len(specials))]
		}
	}
	return x
}

var testLengths = []int{0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 100, 129, 256, 1000, 4099}

// TestVecImplsMatchReference runs every kernel with element-wise cores on
// every implementation this CPU has and checks each against the pure-Go
// reference bit for bit, on lengths around the block size and with zeros,
// subnormals, infinities, NaNs and huge values.
func TestVecImplsMatchReference(t *testing.T) {
	if len(vecImpls) == 1 {
		t.Logf("only the pure-Go path runs on this CPU")
	}
	ref := &vecImpls[0]
	for ii := range vecImpls[1:] {
		impl := &vecImpls[ii+1]
		t.Run(impl.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(31, 32))
			for _, n := range testLengths {
				for _, special := range []bool{false, true} {
					for _, scale := range []float64{1, 8, 100} {
						compareImpls(t, r, ref, impl, n, scale, special)
					}
				}
			}
		})
	}
}

// run is one kernel call on fresh copies of its inputs; it returns every
// output.
type run func() [][]float32

func compareImpls(t *testing.T, r *rand.Rand, ref, impl *vecImpl, n int, scale float64, special bool) {
	t.Helper()
	x, y2 := testVector(r, n, scale, special), testVector(r, n, scale, special)
	x3, x4 := testVector(r, n, scale, special), testVector(r, n, 1, false)
	alpha := float32(r.NormFloat64())
	cols, rows := min(n, max(1, n/3)), 0
	if cols > 0 {
		rows = n / cols
	}
	mat := func(v []float32) Mat { return Mat{Rows: 1, Cols: len(v), Data: slices.Clone(v)} }
	cases := map[string]run{
		"gelu": func() [][]float32 {
			out := NewMat(1, n)
			_ = GELU(mat(x), out)
			return [][]float32{out.Data}
		},
		"gelu_grad": func() [][]float32 {
			out := NewMat(1, n)
			_ = GELUGrad(mat(y2), mat(x), out)
			return [][]float32{out.Data}
		},
		"softmax": func() [][]float32 {
			xs := Mat{Rows: rows, Cols: cols, Data: slices.Clone(x[:rows*cols])}
			out := NewMat(rows, cols)
			_ = Softmax(xs, out, 0)
			return [][]float32{out.Data}
		},
		"softmax_causal": func() [][]float32 {
			xs := Mat{Rows: 3 * cols, Cols: cols, Data: testVector(rand.New(rand.NewPCG(uint64(n), 1)), 3*cols*cols, scale, special)}
			out := NewMat(xs.Rows, cols)
			_ = Softmax(xs, out, cols)
			return [][]float32{out.Data}
		},
		"axpy": func() [][]float32 {
			out := mat(y2)
			_ = Axpy(alpha, mat(x), out)
			return [][]float32{out.Data}
		},
		"scale": func() [][]float32 {
			out := mat(x)
			Scale(alpha, out)
			return [][]float32{out.Data}
		},
		"bias_add": func() [][]float32 {
			xs := Mat{Rows: rows, Cols: cols, Data: slices.Clone(x[:rows*cols])}
			_ = BiasAdd(xs, mat(y2[:cols]))
			return [][]float32{xs.Data}
		},
		"col_sum": func() [][]float32 {
			xs := Mat{Rows: rows, Cols: cols, Data: slices.Clone(x[:rows*cols])}
			out := NewMat(1, cols)
			_ = ColSum(xs, out)
			return [][]float32{out.Data}
		},
		"relu": func() [][]float32 {
			out := NewMat(1, n)
			_ = ReLU(mat(x), out)
			return [][]float32{out.Data}
		},
		"relu_grad": func() [][]float32 {
			out := NewMat(1, n)
			_ = ReLUGrad(mat(y2), mat(x), out)
			return [][]float32{out.Data}
		},
		"adamw": func() [][]float32 {
			p, m, v := mat(x), mat(x3), mat(x4)
			for i := range v.Data {
				v.Data[i] *= v.Data[i] // a second moment is a square
			}
			_ = AdamWStep(p, mat(y2), m, v, AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 7})
			return [][]float32{p.Data, m.Data, v.Data}
		},
		"layer_norm": func() [][]float32 {
			xs := Mat{Rows: rows, Cols: cols, Data: slices.Clone(x[:rows*cols])}
			out, mean, rstd := NewMat(rows, cols), NewMat(rows, 1), NewMat(rows, 1)
			if n == 0 {
				return nil
			}
			_ = LayerNorm(xs, mat(y2[:cols]), mat(x3[:cols]), out, mean, rstd, 1e-5)
			return [][]float32{out.Data, mean.Data, rstd.Data}
		},
		"embedding_grad": func() [][]float32 {
			d := cols
			ids := Mat{Rows: rows, Cols: 1, Data: make([]float32, rows)}
			for i := range ids.Data {
				ids.Data[i] = float32(i % 3)
			}
			dt := NewMat(3, d)
			_ = EmbeddingGrad(Mat{Rows: rows, Cols: d, Data: slices.Clone(x[:rows*d])}, ids, dt)
			return [][]float32{dt.Data}
		},
	}
	for name, f := range cases {
		var want, got [][]float32
		withImpl(ref, func() { want = f() })
		withImpl(impl, func() { got = f() })
		for k := range want {
			if i, ok := sameFloats(want[k], got[k]); !ok {
				t.Fatalf("%s, n=%d scale=%v special=%v: output %d differs at %d: go %v (%#x), %s %v (%#x)",
					name, n, scale, special, k, i, want[k][i], math.Float32bits(want[k][i]),
					impl.name, got[k][i], math.Float32bits(got[k][i]))
			}
		}
	}
}

// ulps is the distance between a float32 and an exact value in units of
// the float32's last place.
func ulps(got float32, want float64) float64 {
	if want == 0 {
		return math.Abs(float64(got)) / 0x1p-149
	}
	e := math.Ilogb(want)
	return math.Abs(float64(got)-want) / math.Ldexp(1, max(e, -126)-23)
}

// TestExp32 checks exp32 against math.Exp: within 2 ulp wherever the
// result is normal, and at the limits and special values exactly.
func TestExp32(t *testing.T) {
	worst, at := 0.0, float32(0)
	check := func(x float32) {
		if d := ulps(exp32(x), math.Exp(float64(x))); d > worst {
			worst, at = d, x
		}
	}
	// A grid over the normal range, then small arguments of every magnitude.
	for i := range 2_000_000 {
		check(-87.3 + 176*float32(i)/2e6)
	}
	for m := float32(1e-30); m < 1; m *= 1.01 {
		check(m)
		check(-m)
	}
	t.Logf("exp32: worst %.2f ulp at %v", worst, at)
	if worst > 2 {
		t.Errorf("exp32: %.2f ulp at %v, want at most 2", worst, at)
	}
	for x := float32(-103.9); x < -87.3; x += 0.01 {
		if d := math.Abs(float64(exp32(x)) - math.Exp(float64(x))); d > 0x1p-149 {
			t.Errorf("exp32(%v) = %v, math.Exp %v: subnormal off by more than 1 unit", x, exp32(x), math.Exp(float64(x)))
		}
	}
	for _, c := range []struct{ x, want float32 }{
		{0, 1}, {float32(math.Copysign(0, -1)), 1}, {float32(math.Inf(-1)), 0}, {-104.5, 0}, {-1e30, 0},
		{float32(math.Inf(1)), float32(math.Inf(1))}, {89, float32(math.Inf(1))}, {1e30, float32(math.Inf(1))},
	} {
		if got := exp32(c.x); math.Float32bits(got) != math.Float32bits(c.want) {
			t.Errorf("exp32(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if got := exp32(float32(math.NaN())); got == got {
		t.Errorf("exp32(NaN) = %v", got)
	}
}

// geluExact is GELU's tanh form in float64, as x·σ(2u): 1 + tanh(u)
// cancels to nothing in float64 as well once u < −19.
func geluExact(x float64) float64 {
	return x / (1 + math.Exp(-2*0.7978845608028654*(x+0.044715*x*x*x)))
}

// TestGELUAccuracy bounds the float32 GELU against its float64 value and
// checks its limits: x for large x, −0 for large negative x, NaN at NaN.
// Relative error grows in the negative tail, where GELU ≈ x·exp(2u) and u,
// rounded to float32, carries an error of about |2u|·2⁻²⁴ into the result;
// there the values are tiny, so the test bounds their absolute error.
func TestGELUAccuracy(t *testing.T) {
	worst, at, worstAbs, atAbs := 0.0, float32(0), 0.0, float32(0)
	for x := float32(-12); x < 12; x += 1.0 / 4096 {
		want := geluExact(float64(x))
		got := gelu32(x)
		if x >= -3 {
			if d := ulps(got, want); d > worst {
				worst, at = d, x
			}
		} else if d := math.Abs(float64(got) - want); d > worstAbs {
			worstAbs, atAbs = d, x
		}
	}
	t.Logf("gelu32: worst %.2f ulp at %v on [-3, 12), %.3g absolute at %v below", worst, at, worstAbs, atAbs)
	if worst > 16 || worstAbs > 4e-9 {
		t.Errorf("gelu32: %.2f ulp at %v, want at most 16; %.3g absolute at %v, want at most 4e-9", worst, at, worstAbs, atAbs)
	}
	for _, c := range []struct{ x, want float32 }{
		{0, 0}, {1e4, 1e4}, {1e30, 1e30}, {float32(math.Inf(1)), float32(math.Inf(1))},
		{-1e4, float32(math.Copysign(0, -1))}, {-1e30, float32(math.Copysign(0, -1))},
	} {
		if got := gelu32(c.x); math.Float32bits(got) != math.Float32bits(c.want) {
			t.Errorf("gelu32(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	for _, x := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		if got := gelu32(x); got == got {
			t.Errorf("gelu32(%v) = %v, want NaN", x, got)
		}
	}
	// The derivative saturates to exactly 1 and 0, infinities included.
	for _, c := range []struct{ x, want float32 }{
		{20, 1}, {1e4, 1}, {1e30, 1}, {float32(math.Inf(1)), 1}, {-20, 0}, {-1e30, 0}, {float32(math.Inf(-1)), 0},
	} {
		if got := geluDeriv32(c.x); got != c.want {
			t.Errorf("gelu'(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}

// goldenBits is the SHA-256 of TestGoldenBits' outputs, recorded on amd64:
// the same value on arm64 (under qemu-user in CI) shows that the reference
// itself, not only each CPU's SIMD against it, is machine-independent.
const goldenBits = "5e1c6ee58d2888df9d823c22d4c21550d4ffd2db515b62a9120df9c2734a04c5"

// TestGoldenBits hashes every element-wise kernel's outputs on fixed
// inputs, on every implementation, against goldenBits.
func TestGoldenBits(t *testing.T) {
	for i := range vecImpls {
		impl := &vecImpls[i]
		h := sha256.New()
		withImpl(impl, func() {
			r := rand.New(rand.NewPCG(41, 42))
			for _, n := range testLengths {
				compareImplsHash(h, r, n)
			}
		})
		if got := hex.EncodeToString(h.Sum(nil)); got != goldenBits {
			t.Errorf("%s: outputs hash to %s, want %s", impl.name, got, goldenBits)
		}
	}
}

func compareImplsHash(h hash.Hash, r *rand.Rand, n int) {
	x, y2 := testVector(r, n, 4, true), testVector(r, n, 4, false)
	out := func(v []float32) {
		for _, f := range v {
			b := math.Float32bits(f)
			if f != f {
				b = 0x7fc00000 // NaN bits are the CPU's
			}
			_ = binary.Write(h, binary.LittleEndian, b)
		}
	}
	o := NewMat(1, n)
	_ = GELU(Mat{Rows: 1, Cols: n, Data: x}, o)
	out(o.Data)
	_ = GELUGrad(Mat{Rows: 1, Cols: n, Data: y2}, Mat{Rows: 1, Cols: n, Data: x}, o)
	out(o.Data)
	if n > 0 {
		_ = Softmax(Mat{Rows: 1, Cols: n, Data: y2}, o, 0)
		out(o.Data)
	}
	p, m, v := slices.Clone(y2), slices.Clone(x), make([]float32, n)
	_ = AdamWStep(Mat{Rows: 1, Cols: n, Data: p}, Mat{Rows: 1, Cols: n, Data: x}, Mat{Rows: 1, Cols: n, Data: m},
		Mat{Rows: 1, Cols: n, Data: v}, AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 2})
	out(p)
	_ = Axpy(0.3, Mat{Rows: 1, Cols: n, Data: x}, Mat{Rows: 1, Cols: n, Data: y2})
	out(y2)
}
