package kernel

// The element-wise cores of the kernels, in pure Go and in SIMD assembly
// (elementwise_amd64.s: AVX2; elementwise_arm64.s: NEON), chosen once from
// the CPU's features. Every path gives the same float32 bits for the same
// input, so training does not depend on the machine and the WASM sandbox
// (which calls these kernels as host functions) agrees with native code:
//
//   - each operation is a correctly rounded IEEE operation (add, sub, mul,
//     div, sqrt, conversions) done in the same order on every path; the Go
//     code rounds every product with an explicit conversion, which the Go
//     spec says prevents fusing x*y+z into one FMA (arm64 and GOAMD64=v3
//     would otherwise fuse), and the assembly uses no FMA;
//   - exp is a polynomial on a reduced argument (exp32), the same formula in
//     Go and assembly, not math.Exp;
//   - sums over a row use 16 virtual lanes (value j goes to lane j mod 16)
//     and then a fixed tree (sum16): AVX2 holds the lanes in two ymm
//     registers, NEON in four q registers;
//   - the assembly handles whole blocks of 16 values and the Go code the
//     tail, so the lanes line up on every path.
//
// NaN inputs give NaN outputs on every path, but the bits of a NaN (its
// sign and payload) are the CPU's and are not part of the guarantee.
// Operands that partially overlap (y starting inside x but not at x[0])
// give results that depend on the path; exact aliasing (y is x) is fine.

import (
	"math"

	"golang.org/x/sys/cpu"
)

// vecBlock is the number of values the assembly cores take at a time.
const vecBlock = 16

// adamConst are AdamWStep's per-call scalars in the layout the assembly
// reads: b1, 1−b1, b2, 1−b2, c1, c2, lr, eps, wd.
type adamConst struct {
	b1, ob1, b2, ob2, c1, c2, lr, eps, wd float64
}

// vecImpl is one implementation of the element-wise cores. Every function
// takes slices of equal length, a multiple of vecBlock; the Go wrappers
// below do the rest of a slice with the pure-Go reference.
type vecImpl struct {
	name string
	// gelu writes GELU(x) into y; geluGrad dy·GELU'(x) into dx.
	gelu     func(x, y []float32)
	geluGrad func(dy, x, dx []float32)
	// maxv returns the largest value of x (x not empty); which of ±0 or
	// which NaN it returns is left open: Softmax's output does not depend
	// on it.
	maxv func(x []float32) float32
	// expSum writes exp32(x[j]−m) into y[j] and adds it to lanes[j%16].
	expSum func(x, y []float32, m float32, lanes *[16]float32)
	// div divides y by s.
	div func(y []float32, s float32)
	// axpy adds alpha·x to y; add adds x to y; scale multiplies x by alpha.
	axpy  func(alpha float32, x, y []float32)
	add   func(x, y []float32)
	scale func(alpha float32, x []float32)
	// relu writes max(x, 0) into y; reluGrad dy where x > 0, else 0.
	relu     func(x, y []float32)
	reluGrad func(dy, x, dx []float32)
	// adamw is AdamWStep's update of p, m and v from g.
	adamw func(p, g, m, v []float32, c *adamConst)
	// lnNorm writes float32(((x−mu)·rs)·gamma + beta) into y in float64.
	lnNorm func(x, gamma, beta, y []float32, mu, rs float64)
}

// goImpl is the reference every other implementation must match bit for bit.
var goImpl = vecImpl{
	name: "go",
	gelu: func(x, y []float32) {
		for i, v := range x {
			y[i] = gelu32(v)
		}
	},
	geluGrad: func(dy, x, dx []float32) {
		for i, g := range dy {
			dx[i] = float32(g * geluDeriv32(x[i]))
		}
	},
	maxv: func(x []float32) float32 {
		m := x[0]
		for _, v := range x[1:] {
			m = max(m, v)
		}
		return m
	},
	expSum: func(x, y []float32, m float32, lanes *[16]float32) {
		for j, v := range x {
			e := exp32(v - m)
			y[j] = e
			lanes[j%16] += e
		}
	},
	div: func(y []float32, s float32) {
		for j, v := range y {
			y[j] = v / s
		}
	},
	axpy: func(alpha float32, x, y []float32) {
		for i, v := range x {
			y[i] += float32(alpha * v)
		}
	},
	add: func(x, y []float32) {
		for i, v := range x {
			y[i] += v
		}
	},
	scale: func(alpha float32, x []float32) {
		for i, v := range x {
			x[i] = v * alpha
		}
	},
	relu: func(x, y []float32) {
		for i, v := range x {
			if v > 0 {
				y[i] = v
			} else {
				y[i] = 0
			}
		}
	},
	reluGrad: func(dy, x, dx []float32) {
		for i, g := range dy {
			if x[i] > 0 {
				dx[i] = g
			} else {
				dx[i] = 0
			}
		}
	},
	adamw: func(p, g, m, v []float32, c *adamConst) {
		for i, gi := range g {
			gf := float64(gi)
			mi := float64(float32(float64(c.b1*float64(m[i])) + float64(c.ob1*gf)))
			vi := float64(float32(float64(c.b2*float64(v[i])) + float64(c.ob2*float64(gf*gf))))
			m[i], v[i] = float32(mi), float32(vi)
			pi := float64(p[i])
			upd := float64(mi*c.c1)/(math.Sqrt(float64(vi*c.c2))+c.eps) + float64(c.wd*pi)
			p[i] = float32(pi - float64(c.lr*upd))
		}
	},
	lnNorm: func(x, gamma, beta, y []float32, mu, rs float64) {
		for j, v := range x {
			xh := float64((float64(v) - mu) * rs)
			y[j] = float32(float64(xh*float64(gamma[j])) + float64(beta[j]))
		}
	},
}

// vecImpls lists the implementations this CPU can run, the reference first;
// vec is the one the kernels use, the last (fastest) of the list.
var (
	vecImpls = availableImpls()
	vec      = &vecImpls[len(vecImpls)-1]
)

func availableImpls() []vecImpl {
	impls := []vecImpl{goImpl}
	if simd, ok := simdImpl(); ok {
		impls = append(impls, simd)
	}
	return impls
}

// hasAVX2 is read by simdImpl on amd64.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasAVX

// The cores' wrappers: the first whole blocks go to the chosen
// implementation, the tail to the reference.

func blocks16(n int) int { return n &^ (vecBlock - 1) }

func geluVec(x, y []float32) {
	y = y[:len(x)]
	n := blocks16(len(x))
	if n > 0 {
		vec.gelu(x[:n], y[:n])
	}
	goImpl.gelu(x[n:], y[n:])
}

func geluGradVec(dy, x, dx []float32) {
	x, dx = x[:len(dy)], dx[:len(dy)]
	n := blocks16(len(dy))
	if n > 0 {
		vec.geluGrad(dy[:n], x[:n], dx[:n])
	}
	goImpl.geluGrad(dy[n:], x[n:], dx[n:])
}

func axpyVec(alpha float32, x, y []float32) {
	y = y[:len(x)]
	n := blocks16(len(x))
	if n > 0 {
		vec.axpy(alpha, x[:n], y[:n])
	}
	goImpl.axpy(alpha, x[n:], y[n:])
}

func addVec(x, y []float32) {
	y = y[:len(x)]
	n := blocks16(len(x))
	if n > 0 {
		vec.add(x[:n], y[:n])
	}
	goImpl.add(x[n:], y[n:])
}

func scaleVec(alpha float32, x []float32) {
	n := blocks16(len(x))
	if n > 0 {
		vec.scale(alpha, x[:n])
	}
	goImpl.scale(alpha, x[n:])
}

func reluVec(x, y []float32) {
	y = y[:len(x)]
	n := blocks16(len(x))
	if n > 0 {
		vec.relu(x[:n], y[:n])
	}
	goImpl.relu(x[n:], y[n:])
}

func reluGradVec(dy, x, dx []float32) {
	x, dx = x[:len(dy)], dx[:len(dy)]
	n := blocks16(len(dy))
	if n > 0 {
		vec.reluGrad(dy[:n], x[:n], dx[:n])
	}
	goImpl.reluGrad(dy[n:], x[n:], dx[n:])
}

func adamwVec(p, g, m, v []float32, c *adamConst) {
	p, m, v = p[:len(g)], m[:len(g)], v[:len(g)]
	n := blocks16(len(g))
	if n > 0 {
		vec.adamw(p[:n], g[:n], m[:n], v[:n], c)
	}
	goImpl.adamw(p[n:], g[n:], m[n:], v[n:], c)
}

func lnNormVec(x, gamma, beta, y []float32, mu, rs float64) {
	gamma, beta, y = gamma[:len(x)], beta[:len(x)], y[:len(x)]
	n := blocks16(len(x))
	if n > 0 {
		vec.lnNorm(x[:n], gamma[:n], beta[:n], y[:n], mu, rs)
	}
	goImpl.lnNorm(x[n:], gamma[n:], beta[n:], y[n:], mu, rs)
}

// softmaxRow writes the softmax of x into y (len(y) ≥ len(x) > 0): exp32 of
// each value less the row's maximum, over their sum in 16 lanes.
func softmaxRow(x, y []float32) {
	y = y[:len(x)]
	n := blocks16(len(x))
	var m float32
	if n > 0 {
		m = vec.maxv(x[:n])
		if n < len(x) {
			m = max(m, goImpl.maxv(x[n:]))
		}
	} else {
		m = goImpl.maxv(x)
	}
	var lanes [16]float32
	if n > 0 {
		vec.expSum(x[:n], y[:n], m, &lanes)
	}
	// The tail starts at a multiple of 16, so its value j is in lane j%16.
	goImpl.expSum(x[n:], y[n:], m, &lanes)
	s := sum16(&lanes)
	if n > 0 {
		vec.div(y[:n], s)
	}
	goImpl.div(y[n:], s)
}

// sum16 adds the 16 lanes in the fixed tree every path uses: lanes i and
// i+8, then i and i+4, then i and i+2, then the last two.
func sum16(l *[16]float32) float32 {
	var a [8]float32
	for i := range a {
		a[i] = l[i] + l[i+8]
	}
	b := [4]float32{a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]}
	return (b[0] + b[2]) + (b[1] + b[3])
}

// exp32 and the GELU below in float32.
//
// exp32 is Cephes' expf: x = n·ln2 + r with n = round(x·log2 e) and
// |r| ≤ ln2/2 (ln2 split in two so that n·c1 is exact), exp r by a degree-7
// polynomial, then 2^n applied as 2^(n>>1)·2^(n−n>>1) so that results
// between 2^-149 and 2^-126 come out as correctly rounded subnormals and
// n = 128 still reaches the top binade. x is clamped to [−104, 89] first:
// exp(−104) rounds to 0 and exp(89) overflows to +Inf, so the clamp changes
// no result. Against math.Exp it is within 2 ulp on [−87, 88] (tested).
const (
	expLo    = -104
	expHi    = 89
	expLog2e = 1.44269504088896341
	expC1    = 0.693359375
	expC2    = -2.12194440e-4
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
)

func exp32(x float32) float32 {
	// Comparisons leave a NaN as it is, as the SIMD clamps do.
	if x < expLo {
		x = expLo
	}
	if x > expHi {
		x = expHi
	}
	n := int32(math.RoundToEven(float64(float32(x * expLog2e))))
	nf := float32(n)
	r := x - float32(nf*expC1)
	r -= float32(nf * expC2)
	z := float32(r * r)
	p := float32(expP0*r) + expP1
	p = float32(p*r) + expP2
	p = float32(p*r) + expP3
	p = float32(p*r) + expP4
	p = float32(p*r) + expP5
	y := float32(float32(p*z)+r) + 1
	n1 := n >> 1
	return float32(y*pow2(n1)) * pow2(n-n1)
}

// pow2 is 2^k for k in [−126, 127].
func pow2(k int32) float32 { return math.Float32frombits(uint32(k+127) << 23) }

// GELU's tanh form, 0.5·x·(1 + tanh(u)) with u = sqrt(2/π)·(x + 0.044715·x³),
// is computed as x·σ(2u) (σ the logistic function, since 0.5·(1+tanh u) =
// σ(2u)), which needs one exp and no cancellation in the negative tail:
// with e = exp(−|2u|) ≤ 1 and d = 1 + e, σ(2u) = 1/d for u ≥ 0 and e/d for
// u < 0. The derivative is σ + x·σ'(2u)·2·du/dx with σ' = e/d².
const (
	gelu2C  = 2 * 0.7978845608028654 // 2·sqrt(2/π)
	gelu3K  = 3 * 0.044715
	geluMax = 1e4 // beyond, GELU' is 0 or 1 in float32 (see geluDeriv32)
)

// gelu2u returns 2u for x in float32.
func gelu2u(x float32) float32 {
	x3 := float32(float32(x*x) * x)
	return float32(gelu2C * float32(x+float32(geluK*x3)))
}

// sigmoidParts returns σ(a) and e/d² for a = 2u.
func sigmoidParts(a float32) (s, ed2 float32) {
	e := exp32(-math.Float32frombits(math.Float32bits(a) &^ (1 << 31)))
	d := 1 + e
	num := float32(1)
	if math.Float32bits(a)>>31 != 0 {
		num = e
	}
	rd := 1 / d
	return num / d, float32(float32(e*rd) * rd)
}

func gelu32(x float32) float32 {
	s, _ := sigmoidParts(gelu2u(x))
	return float32(x * s)
}

// geluDeriv32 is GELU'(x). x is clamped to ±geluMax first: beyond it e is
// 0, so the derivative is exactly σ (1 or 0), and the clamp keeps 0·x·du
// from becoming 0·Inf = NaN for huge or infinite x.
func geluDeriv32(x float32) float32 {
	if x < -geluMax {
		x = -geluMax
	}
	if x > geluMax {
		x = geluMax
	}
	s, ed2 := sigmoidParts(gelu2u(x))
	x2 := float32(x * x)
	du := float32(gelu2C * float32(1+float32(gelu3K*x2)))
	return s + float32(float32(ed2*x)*du)
}
