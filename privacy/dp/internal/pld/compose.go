package pld

import (
	"math"

	"gonum.org/v1/gonum/dsp/fourier"
)

// term is a discretized step composed count times.
type term struct {
	d     pmf
	count int
}

// tilt returns log Σ_j p_j·e^{λk} and the tilted mean Σ k·p_j·e^{λk}/Σ p_j·e^{λk},
// with k = j (down false) or k = len(p)−1−j (down true), for 0 ≤ λ ≤ maxTilt.
// The powers e^{λk} come from one running product, so a pass costs a few
// multiplications per point; each time the product would overflow it is
// rescaled and the sums so far are set aside with their scale, to be
// combined in log space at the end.
func tilt(p []float64, lam float64, down bool) (logm, mean float64) {
	const big = 1e200
	lbig := math.Log(big)
	n := len(p)
	r, f := 1.0, math.Exp(lam)
	var s, s1 float64
	type part struct{ s, s1, scale float64 }
	var parts []part
	scale := 0.0
	for k := range n {
		j := k
		if down {
			j = n - 1 - k
		}
		v := p[j] * r
		s += v
		s1 += v * float64(k)
		if r *= f; r > big {
			if s > 0 {
				parts = append(parts, part{s, s1, scale})
			}
			r /= big
			s, s1 = 0, 0
			scale += lbig
		}
	}
	if s > 0 {
		parts = append(parts, part{s, s1, scale})
	}
	if len(parts) == 0 {
		return math.Inf(-1), 0
	}
	top := parts[len(parts)-1].scale
	var ts, ts1 float64
	for _, pt := range parts {
		w := math.Exp(pt.scale - top)
		ts += pt.s * w
		ts1 += pt.s1 * w
	}
	return math.Log(ts) + top, ts1 / ts
}

// maxTilt bounds λ (per grid index) in the Chernoff search.
const maxTilt = 100

// tailIndex returns, in grid indices, a Chernoff bound past which the
// composed finite mass is at most e^{−c}: an upper bound h with
// P(S > h) ≤ e^{−c} (down false), or a lower bound l with P(S < l) ≤ e^{−c}
// (down true), where S is the sum of the composed losses. Any λ gives a
// valid bound, P(S ≥ h) ≤ e^{M(λ) − λh}; λ is chosen near the optimum,
// where λM'(λ) − M(λ) = c.
func tailIndex(ts []term, c float64, down bool) int64 {
	var base, extent, variance float64
	for _, t := range ts {
		n := float64(len(t.d.p))
		k := float64(t.count)
		if down {
			base += k * float64(t.d.lo+int64(len(t.d.p))-1)
		} else {
			base += k * float64(t.d.lo)
		}
		extent += k * (n - 1)
		var m0, m1, m2 float64
		for j, v := range t.d.p {
			m0 += v
			m1 += v * float64(j)
			m2 += v * float64(j) * float64(j)
		}
		if m0 > 0 {
			mean := m1 / m0
			variance += k * max(0, m2/m0-mean*mean)
		}
	}
	bound := func(lam float64) (h, g float64) {
		var mm, md float64
		for _, t := range ts {
			lm, mean := tilt(t.d.p, lam, down)
			mm += float64(t.count) * lm
			md += float64(t.count) * mean
		}
		return (mm + c) / lam, lam*md - mm
	}
	best := extent
	try := func(lam float64) float64 {
		h, g := bound(lam)
		if !math.IsNaN(h) {
			best = min(best, h)
		}
		return g
	}
	if variance > 0 {
		lam := math.Sqrt(2 * c / variance)
		lo, hi := lam, lam
		for i := 0; i < 60 && try(lo) > c; i++ {
			lo /= 2
		}
		for i := 0; i < 60 && hi < maxTilt && try(hi) < c; i++ {
			hi = min(2*hi, maxTilt)
		}
		for range 16 {
			mid := math.Sqrt(lo * hi)
			if try(mid) < c {
				lo = mid
			} else {
				hi = mid
			}
		}
	}
	off := int64(math.Ceil(min(best, extent)))
	if down {
		return int64(base) - off
	}
	return int64(base) + off
}

// composed is the T-fold composition on one grid: mass p[j] at loss
// (lo + j)·step and inf at +∞.
type composed struct {
	lo  int64
	p   []float64
	inf float64
}

// compose convolves the terms (each step to its count) with one real FFT
// of size n = fft.Len() over the window [wlo, whi] (whi − wlo < n). The cyclic
// convolution folds the mass outside the window onto it, which can only
// add mass: the caller charges the mass above the window to δ.
func compose(ts []term, wlo, whi int64, fft *fourier.FFT) composed {
	n := fft.Len()
	buf := make([]float64, n)
	coef := make([]complex128, n/2+1)
	var prod []complex128
	var offset int64
	logFinite := 0.0
	for _, t := range ts {
		clear(buf)
		for j, v := range t.d.p {
			buf[j%n] += v
		}
		fft.Coefficients(coef, buf)
		if prod == nil {
			prod = make([]complex128, len(coef))
			for k, v := range coef {
				prod[k] = cpow(v, t.count)
			}
		} else {
			for k, v := range coef {
				prod[k] *= cpow(v, t.count)
			}
		}
		offset += int64(t.count) * t.d.lo
		logFinite += float64(t.count) * math.Log1p(-t.d.inf)
	}
	seq := fft.Sequence(buf, prod)
	w := int(whi - wlo + 1)
	out := make([]float64, w)
	nn := int64(n)
	r := ((wlo-offset)%nn + nn) % nn
	for s := range out {
		out[s] = max(0, seq[r]/float64(n))
		if r++; r == nn {
			r = 0
		}
	}
	return composed{lo: wlo, p: out, inf: -math.Expm1(logFinite)}
}

func cpow(c complex128, n int) complex128 {
	r := complex(1, 0)
	for n > 0 {
		if n&1 == 1 {
			r *= c
		}
		c *= c
		n >>= 1
	}
	return r
}

// epsilon returns the least ε with δ(ε) ≤ target for the composed
// distribution, exact within the piecewise-smooth curve
// δ(ε) = inf + Σ_{l > ε} p_l·(1 − e^{ε−l}), or +Inf if inf alone exceeds
// target. Walking down from the top, a = Σ_{k≥j} p_k and
// b = Σ_{k≥j} p_k·e^{l_j − l_k} (rescaled at each step, so nothing under-
// or overflows however large the losses) give δ(ε) = inf + a − e^{ε−l_j}·b
// on [l_{j−1}, l_j].
func (c composed) epsilon(step, target float64) float64 {
	if c.inf > target {
		return math.Inf(1)
	}
	down := math.Exp(-step)
	var a, b float64
	for j := len(c.p) - 1; j >= 0; j-- {
		b = b*down + c.p[j]
		a += c.p[j]
		if b == 0 {
			continue
		}
		if j == 0 && c.inf+a <= target {
			return math.Inf(-1)
		}
		if j == 0 || c.inf+a-down*b > target {
			l := float64(c.lo+int64(j)) * step
			return l + math.Log((c.inf+a-target)/b)
		}
	}
	return float64(c.lo) * step
}
