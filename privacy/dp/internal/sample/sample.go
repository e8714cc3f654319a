// Package sample draws integer noise for distributed DP: the exact discrete
// Gaussian sampler of Canonne, Kamath and Steinke (NeurIPS 2020,
// Algorithm 3) and Skellam noise as the difference of two Poisson variates.
//
// The discrete Gaussian uses only uniform integers and exact rational
// arithmetic (Bernoulli(exp(−γ)) by the series method of the paper's
// Algorithm 1), so its distribution is exactly N_Z(0, σ²) for the σ² given,
// whatever the floating-point behaviour of the platform.
package sample

import (
	"math"
	"math/big"
	"math/bits"
)

// Rand is a source of uniform 64-bit words, such as an AES-CTR stream.
type Rand interface {
	Uint64() uint64
}

// Uniform returns a uniform integer in [0, n), n > 0, by rejection (no
// modulo bias).
func Uniform(r Rand, n uint64) uint64 {
	if n&(n-1) == 0 {
		return r.Uint64() & (n - 1)
	}
	// Lemire's multiply-shift with rejection of the biased low range.
	hi, lo := bits.Mul64(r.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(r.Uint64(), n)
		}
	}
	return hi
}

// Float64 returns a uniform float64 in [0, 1) with 53 random bits.
func Float64(r Rand) float64 {
	return float64(r.Uint64()>>11) / (1 << 53)
}

// bernoulli reports true with probability num/den, 0 ≤ num ≤ den, den > 0.
func bernoulli(r Rand, num, den uint64) bool {
	return Uniform(r, den) < num
}

// bernoulliExpNegSmall reports true with probability exp(−num/den) for
// 0 ≤ num ≤ den (Algorithm 1 of Canonne et al.): with A_k ~
// Bernoulli(γ/k), the first k with A_k = 0 is odd with probability e^{−γ}.
func bernoulliExpNegSmall(r Rand, num, den uint64) bool {
	k := uint64(1)
	for {
		hi, lo := bits.Mul64(den, k)
		if hi != 0 {
			// den·k no longer fits in 64 bits: continue in big integers.
			return bernoulliExpNegBig(r, new(big.Int).SetUint64(num), new(big.Int).SetUint64(den), k)
		}
		if !bernoulli(r, num, lo) {
			break
		}
		k++
	}
	return k%2 == 1
}

// bernoulliExpNegBig continues Algorithm 1 at index k with γ = p/q ≤ 1 in
// big integers.
func bernoulliExpNegBig(r Rand, p, q *big.Int, k uint64) bool {
	var qk, u big.Int
	for {
		qk.Mul(q, new(big.Int).SetUint64(k))
		uniformBig(r, &qk, &u)
		if u.Cmp(p) >= 0 {
			break
		}
		k++
	}
	return k%2 == 1
}

// bernoulliExpNeg1 reports true with probability e^{−1}.
func bernoulliExpNeg1(r Rand) bool { return bernoulliExpNegSmall(r, 1, 1) }

// uniformBig sets z to a uniform integer in [0, n), n > 0.
func uniformBig(r Rand, n, z *big.Int) {
	if n.IsUint64() {
		z.SetUint64(Uniform(r, n.Uint64()))
		return
	}
	nb := n.BitLen()
	words := make([]big.Word, (nb+63)/64)
	for {
		for i := range words {
			words[i] = big.Word(r.Uint64())
		}
		if extra := len(words)*64 - nb; extra > 0 {
			words[len(words)-1] &= big.Word(^uint64(0) >> extra)
		}
		z.SetBits(words)
		if z.Cmp(n) < 0 {
			return
		}
		words = make([]big.Word, len(words))
	}
}

// DiscreteGaussian samples N_Z(0, σ²): P(x) ∝ exp(−x²/(2σ²)) on the
// integers. Not safe for concurrent use.
type DiscreteGaussian struct {
	n, d *big.Int // σ² = n/d exactly
	t    uint64   // ⌊σ⌋ + 1, the discrete Laplace scale
	// Scratch for γ = (|y|·d·t − n)² / (2·d·t²·n).
	p, q, y, u, rem big.Int
}

// NewDiscreteGaussian returns a sampler for the finite positive sigma2,
// taken exactly as the float64 it is.
func NewDiscreteGaussian(sigma2 float64) *DiscreteGaussian {
	s := new(big.Rat).SetFloat64(sigma2)
	g := &DiscreteGaussian{n: new(big.Int).Set(s.Num()), d: new(big.Int).Set(s.Denom())}
	// ⌊σ⌋ = ⌊√⌊σ²⌋⌋ exactly.
	fl := new(big.Int).Quo(g.n, g.d)
	g.t = new(big.Int).Sqrt(fl).Uint64() + 1
	t := new(big.Int).SetUint64(g.t)
	g.q.Mul(g.d, t)
	g.q.Mul(&g.q, t)
	g.q.Mul(&g.q, g.n)
	g.q.Lsh(&g.q, 1)
	return g
}

// Sample returns one draw.
func (g *DiscreteGaussian) Sample(r Rand) int64 {
	t := g.t
	for {
		// Discrete Laplace with scale t (Algorithm 2).
		u := Uniform(r, t)
		if !bernoulliExpNegSmall(r, u, t) {
			continue
		}
		v := uint64(0)
		for bernoulliExpNeg1(r) {
			v++
		}
		y := u + t*v
		neg := r.Uint64()&1 == 1
		if neg && y == 0 {
			continue
		}
		// Accept with probability exp(−(|y| − σ²/t)² / (2σ²)).
		g.y.SetUint64(y)
		g.p.Mul(&g.y, g.d)
		g.p.Mul(&g.p, g.u.SetUint64(t))
		g.p.Sub(&g.p, g.n)
		g.p.Mul(&g.p, &g.p)
		if g.acceptExpNeg(r) {
			if neg {
				return -int64(y)
			}
			return int64(y)
		}
	}
}

// acceptExpNeg reports true with probability exp(−p/q) for the scratch p, q.
func (g *DiscreteGaussian) acceptExpNeg(r Rand) bool {
	var whole big.Int
	whole.QuoRem(&g.p, &g.q, &g.rem)
	if !whole.IsUint64() {
		return false // exp(−2^64) is 0 in any arithmetic that matters
	}
	for i := whole.Uint64(); i > 0; i-- {
		if !bernoulliExpNeg1(r) {
			return false
		}
	}
	if g.rem.Sign() == 0 {
		return true
	}
	return bernoulliExpNegBig(r, &g.rem, &g.q, 1)
}

// Poisson returns a Poisson(lambda) variate, lambda ≥ 0: by sequential
// multiplication of uniforms below 10 and Hörmann's transformed rejection
// (PTRS, 1993) above. Both are exact algorithms; they are evaluated in
// float64 arithmetic on 53-bit uniforms.
func Poisson(r Rand, lambda float64) int64 {
	if lambda == 0 {
		return 0
	}
	if lambda < 10 {
		limit := math.Exp(-lambda)
		var k int64
		prod := Float64(r)
		for prod > limit {
			k++
			prod *= Float64(r)
		}
		return k
	}
	slam := math.Sqrt(lambda)
	loglam := math.Log(lambda)
	b := 0.931 + 2.53*slam
	a := -0.059 + 0.02483*b
	invAlpha := 1.1239 + 1.1328/(b-3.4)
	vr := 0.9277 - 3.6224/(b-2)
	for {
		u := Float64(r) - 0.5
		v := Float64(r)
		us := 0.5 - math.Abs(u)
		k := math.Floor((2*a/us+b)*u + lambda + 0.43)
		if us >= 0.07 && v <= vr {
			return int64(k)
		}
		if k < 0 || (us < 0.013 && v > us) {
			continue
		}
		lg, _ := math.Lgamma(k + 1)
		if math.Log(v)+math.Log(invAlpha)-math.Log(a/(us*us)+b) <= -lambda+k*loglam-lg {
			return int64(k)
		}
	}
}

// Skellam returns a symmetric Skellam variate with the given variance: the
// difference of two independent Poisson(variance/2) variates.
func Skellam(r Rand, variance float64) int64 {
	return Poisson(r, variance/2) - Poisson(r, variance/2)
}
