package pld

// An independent reference for the tests, written from the definitions
// rather than from pld's code: the hockey-stick divergence of one step
// straight from the mixture densities (P(L > ε) − e^ε·Q(L > ε) with the
// threshold x* solved from the loss), its exact root for one step, the
// closed form of the Gaussian mechanism by its own bisection in log space
// (its own log Φ̄: a continued fraction), and a two-sided PLD bracket:
//
//   - lower: a discrete loss distribution whose δ-curve (as a function of
//     x = e^ε) lies BELOW the true one. On each grid cell [x_i, x_{i+1}] a
//     tangent of the convex true curve is taken (at the cell's midpoint, or
//     at an end where the midpoint's tangent would leave the feasible band
//     max(0, 1 − x) ≤ δ ≤ 1), and the curve through y_i = the lower of the
//     two tangents meeting at x_i is below the true curve (each chord lies
//     under its cell's tangent). It is convex up to rounding, starts at
//     (0, 1) with slope −1 and stays at least 1 − x, so it is the curve of
//     a pair of distributions that the true pair dominates (Blackwell), and
//     its compositions are dominated by the true compositions. The curve is
//     flat at y_n beyond the top point; that is below the curve with every
//     loss above ε_n sent to +∞, which costs at most T·P(L > ε_n) in δ.
//   - upper: the chords through the true curve's values (connect the dots),
//     which lie above it.
//
// Both are composed with one FFT over a window from a Chernoff bound (any
// tilt is a valid bound), the mass outside it charged in the safe
// direction: for the lower bound the cyclic fold can only add the outside
// mass, so the target is raised by it; for the upper bound the mass above
// the window is added to δ. ε is then read off each composed curve, and the
// true ε lies in [lower, upper], up to floating-point rounding in the FFT
// (charged as 1e-13 of δ-units either way, far above what the transforms
// lose).

import (
	"fmt"
	"math"
	"sort"

	"gonum.org/v1/gonum/dsp/fourier"
)

func refSF(z float64) float64  { return 0.5 * math.Erfc(z/math.Sqrt2) }
func refCDF(z float64) float64 { return 0.5 * math.Erfc(-z/math.Sqrt2) }

// refLogSF is log Φ̄(z): erfc below 8, else the continued fraction
// Φ̄(z) = φ(z)/(z + 1/(z + 2/(z + 3/(z + …)))) evaluated bottom-up.
func refLogSF(z float64) float64 {
	if z < 8 {
		return math.Log(refSF(z))
	}
	f := z
	for k := 300; k >= 1; k-- {
		f = z + float64(k)/f
	}
	return -z*z/2 - 0.5*math.Log(2*math.Pi) - math.Log(f)
}

// refGaussEps is the exact ε of the Gaussian mechanism with μ = √T/σ:
// δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2), solved by bisection in log
// space to the last bit.
func refGaussEps(mu, delta float64) float64 {
	logd := func(e float64) float64 {
		la := refLogSF(e/mu - mu/2)
		lb := e + refLogSF(e/mu+mu/2)
		if lb >= la {
			return math.Inf(-1)
		}
		return la + math.Log1p(-math.Exp(lb-la))
	}
	ld := math.Log(delta)
	if logd(0) <= ld {
		return 0
	}
	lo, hi := 0.0, 1.0
	for logd(hi) > ld {
		lo, hi = hi, hi*2
	}
	for range 200 {
		mid := (lo + hi) / 2
		if mid == lo || mid == hi {
			break
		}
		if logd(mid) > ld {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// refMech is one step of the subsampled Gaussian in one direction.
type refMech struct {
	q, sigma float64
	remove   bool
}

// tails returns, at loss threshold eps, P(L > ε), Q(L > ε), P(L ≤ ε) and
// Q(L ≤ ε), from the densities: the remove loss log(1 − q + q·e^{(2x−1)/(2σ²)})
// is increasing in x, so {L > ε} is {x > x*} (remove) or {x < x*(−ε)} (add).
func (m refMech) tails(eps float64) (pgt, qgt, ple, qle float64) {
	s, q := m.sigma, m.q
	l := eps
	if !m.remove {
		l = -eps
	}
	v := (math.Exp(l) - (1 - q)) / q
	if !(v > 0) { // the loss never reaches l: x* = −∞
		if m.remove {
			return 1, 1, 0, 0
		}
		return 0, 0, 1, 1
	}
	x := s*s*math.Log(v) + 0.5
	mixAbove := (1-q)*refSF(x/s) + q*refSF((x-1)/s)
	mixBelow := (1-q)*refCDF(x/s) + q*refCDF((x-1)/s)
	if m.remove { // P is the mixture, Q = N(0, σ²); L > ε ⇔ x > x*
		return mixAbove, refSF(x / s), mixBelow, refCDF(x / s)
	}
	// P = N(0, σ²), Q the mixture; L > ε ⇔ x < x*
	return refCDF(x / s), mixBelow, refSF(x / s), mixAbove
}

// curve returns δ(ε) = P(L>ε) − e^ε·Q(L>ε), g(ε) = δ(ε) − (1 − e^ε) =
// e^ε·Q(L≤ε) − P(L≤ε), and the tangent slope −Q(L > ε) (in x = e^ε).
func (m refMech) curve(eps float64) (d, g, qgt, qle float64) {
	pgt, qgt, ple, qle := m.tails(eps)
	x := math.Exp(eps)
	return max(0, pgt-x*qgt), max(0, x*qle-ple), qgt, qle
}

func (m refMech) loss(x float64) float64 {
	w := (2*x - 1) / (2 * m.sigma * m.sigma)
	return math.Log(1 - m.q + m.q*math.Exp(w))
}

// sd returns the standard deviation of the remove loss under P (trapezoid
// rule on a fine grid) and the loss range holding all but Φ̄(11) of P.
func (m refMech) sd() float64 {
	s, q := m.sigma, m.q
	lo, hi := -12*s, 1+12*s
	const n = 200000
	h := (hi - lo) / n
	var m0, m1, m2 float64
	for i := 0; i <= n; i++ {
		x := lo + float64(i)*h
		a, b := x/s, (x-1)/s
		p := (1-q)*math.Exp(-a*a/2) + q*math.Exp(-b*b/2)
		l := m.loss(x)
		m0 += p
		m1 += p * l
		m2 += p * l * l
	}
	mean := m1 / m0
	return math.Sqrt(max(0, m2/m0-mean*mean))
}

func (m refMech) lossRange() (lo, hi float64) {
	s := m.sigma
	if m.remove {
		xlo := -11 * s
		if m.q == 1 {
			xlo = 1 - 11*s
		}
		return m.loss(xlo), m.loss(1 + 11*s)
	}
	lo, hi = -m.loss(11*s), -m.loss(-11*s)
	if m.q < 1 {
		hi = min(hi, -math.Log1p(-m.q))
	}
	return lo, hi
}

// refPMF is mass p[j] at loss (lo + j)·step and inf at +∞.
type refPMF struct {
	lo  int64
	p   []float64
	inf float64
}

// upper returns the connect-the-dots PMF on the grid i·step: the chord
// through (0, 1) and the true (e^{ε_i}, δ(ε_i)), flat after the top point.
// Its masses are the slope changes, x_i·(s_{i+1} − s_i); they are formed
// from whichever of δ and g = δ − (1 − x) is smaller over the three points
// (the two differ by a linear function, which has no mass), so that
// neither cancels.
func (m refMech) upper(step float64) (refPMF, error) {
	llo, lhi := m.lossRange()
	lo := int64(math.Floor(llo/step)) - 1
	hi := int64(math.Ceil(lhi/step)) + 1
	n := int(hi - lo)
	if n+1 > 1<<23 {
		return refPMF{}, fmt.Errorf("grid of %d points", n+1)
	}
	y := make([]float64, n+1)
	g := make([]float64, n+1)
	for i := range y {
		y[i], g[i], _, _ = m.curve(float64(lo+int64(i)) * step)
	}
	eD := math.Exp(step)
	em1 := math.Expm1(step)
	// mass at i from r = y or g: ((r_{i+1} − r_i) − e^Δ(r_i − r_{i−1}))/(e^Δ − 1)
	p := make([]float64, n+1)
	// Before x_0 the curve is the chord from (0, 1), g-slope g_0/x_0.
	p[0] = (g[1]-g[0])/em1 - g[0]
	for i := 1; i < n; i++ {
		r := y
		if max(g[i-1], g[i], g[i+1]) < max(y[i-1], y[i], y[i+1]) {
			r = g
		}
		p[i] = ((r[i+1] - r[i]) - eD*(r[i]-r[i-1])) / em1
	}
	p[n] = (y[n-1] - y[n]) * eD / em1
	for i, v := range p {
		p[i] = max(0, v) // clamping adds mass: still pessimistic
	}
	return refPMF{lo: lo, p: p, inf: y[n]}, nil
}

// binMass returns P(a < L ≤ b) and Q(a < L ≤ b), each from the tails on
// the side where they are small.
func binMass(ta, tb [4]float64) (p, q float64) {
	// t = P(L>·), Q(L>·), P(L≤·), Q(L≤·)
	if tb[2] <= 0.5 {
		p = tb[2] - ta[2]
	} else {
		p = ta[0] - tb[0]
	}
	if tb[3] <= 0.5 {
		q = tb[3] - ta[3]
	} else {
		q = ta[1] - tb[1]
	}
	return max(0, p), max(0, q)
}

func (m refMech) tail4(eps float64) [4]float64 {
	a, b, c, d := m.tails(eps)
	return [4]float64{a, b, c, d}
}

// lower returns an optimistic PMF on the grid i·step, by post-processing
// and rounding down, so that its compositions are below the true ones:
// the loss range is cut into bins (a, b] each of whose likelihood ratio
// P(bin)/Q(bin) is at least e^{ε_j} for the first grid point ε_j above a,
// with b as small as that allows (a root of P(a, b] = e^{ε_j}·Q(a, b]);
// merging outcomes into bins is a post-processing of the pair, which the
// true pair therefore dominates, and placing each bin's P-mass at ε_j ≤ its
// loss only lowers every composed δ(ε) (δ = E_P[(1 − e^{ε − ΣL})₊] is
// non-decreasing in each loss). The mass outside the loss range is
// dropped, which also only lowers δ. All masses are probabilities, so
// nothing needs clamping.
func (m refMech) lower(step float64) (refPMF, error) {
	llo, lhi := m.lossRange()
	lo := int64(math.Floor(llo / step))
	hi := int64(math.Ceil(lhi / step))
	if hi-lo+1 > 1<<23 {
		return refPMF{}, fmt.Errorf("grid of %d points", hi-lo+1)
	}
	p := make([]float64, hi-lo+1)
	tol := step * 1e-6
	a := llo
	ta := m.tail4(a)
	tTop := m.tail4(lhi)
	for a < lhi {
		j := int64(math.Floor(a/step)) + 1
		ej := float64(j) * step
		R := math.Exp(ej) * (1 + 1e-10)
		pp, qq := binMass(ta, tTop)
		if !(pp > R*qq) || ej >= lhi {
			// The rest cannot reach e^{ε_j}: one last bin at the grid
			// point below its loss.
			if pp > 0 {
				l := lhi
				if qq > 0 {
					l = min(lhi, math.Log(pp/qq))
				}
				k := int64(math.Floor(max(a, l)/step)) - 1
				if k >= lo {
					p[k-lo] += pp
				}
			}
			break
		}
		F := func(b float64) (float64, [4]float64) {
			tb := m.tail4(b)
			pb, qb := binMass(ta, tb)
			return pb - R*qb, tb
		}
		// Secant from the mirror image of a in ε_j, where the root is to
		// second order; then one point just above the estimate.
		b0 := min(lhi, 2*ej-a)
		f0, _ := F(b0)
		b1 := b0 + 0.01*(ej-a+step)
		if f0 > 0 {
			b1 = max(ej+tol, b0-0.01*(ej-a+step))
		}
		b1 = min(b1, lhi)
		f1, _ := F(b1)
		for it := 0; it < 8 && f1 != f0 && math.Abs(b1-b0) > tol/4; it++ {
			b2 := b1 - f1*(b1-b0)/(f1-f0)
			b2 = max(ej+tol/4, min(lhi, b2))
			b0, f0 = b1, f1
			b1 = b2
			f1, _ = F(b1)
		}
		bh := min(lhi, b1+tol)
		fh, th := F(bh)
		if fh < 0 {
			// Fall back to bisection over a bracket.
			bl := bh
			for fh < 0 && bh < lhi {
				bl, bh = bh, min(lhi, bh+2*(bh-ej)+step)
				fh, th = F(bh)
			}
			for bh-bl > tol {
				mid := (bl + bh) / 2
				if fm, tm := F(mid); fm < 0 {
					bl = mid
				} else {
					bh, fh, th = mid, fm, tm
				}
			}
		}
		pb, qb := binMass(ta, th)
		if pb > 0 {
			if !(pb >= math.Exp(ej)*qb) {
				return refPMF{}, fmt.Errorf("bin (%v, %v] ratio below e^%v", a, bh, ej)
			}
			p[j-lo] += pb
		}
		a, ta = bh, th
	}
	return refPMF{lo: lo, p: p}, nil
}

// refLogMGF returns log Σ p_j e^{λj}, given lp_j = log p_j.
func refLogMGF(lp []float64, lam float64) float64 {
	mx := math.Inf(-1)
	for j, v := range lp {
		mx = max(mx, v+lam*float64(j))
	}
	s := 0.0
	for j, v := range lp {
		s += math.Exp(v + lam*float64(j) - mx)
	}
	return mx + math.Log(s)
}

func reverse(p []float64) []float64 {
	r := make([]float64, len(p))
	for i, v := range p {
		r[len(p)-1-i] = v
	}
	return r
}

// refChernoff returns an index offset h (from the composed minimum) with
// P(Σ ≥ h) ≤ e^{−c}: (count·log M(λ) + c)/λ minimized over λ by golden
// section in log λ (the bound is quasi-convex in λ; any λ is valid).
func refChernoff(p []float64, count int, c float64) int64 {
	lp := make([]float64, len(p))
	var m0, m1, m2 float64
	for j, v := range p {
		lp[j] = math.Log(v)
		m0 += v
		m1 += v * float64(j)
		m2 += v * float64(j) * float64(j)
	}
	mean := m1 / m0
	v := max(m2/m0-mean*mean, 1e-12)
	lam0 := math.Sqrt(2 * c / (float64(count) * v))
	h := func(u float64) float64 {
		lam := lam0 * math.Exp(u)
		return (float64(count)*refLogMGF(lp, lam) + c) / lam
	}
	a, b := -24*math.Ln2, min(4*math.Ln2, math.Log(200/lam0))
	const r = 0.6180339887498949
	x1, x2 := b-r*(b-a), a+r*(b-a)
	h1, h2 := h(x1), h(x2)
	for range 40 {
		if h1 <= h2 {
			b, x2, h2 = x2, x1, h1
			x1 = b - r*(b-a)
			h1 = h(x1)
		} else {
			a, x1, h1 = x1, x2, h2
			x2 = a + r*(b-a)
			h2 = h(x2)
		}
	}
	best := min(h1, h2, float64(count)*float64(len(p)-1))
	return int64(math.Ceil(best))
}

// refCompose composes d count times over a Chernoff window and returns ε
// at each δ (lower: least ε where the lower curve, less its slack, is at
// most δ; upper: least ε where the upper curve plus the window's missing
// top is at most δ).
func refCompose(d refPMF, count int, deltas []float64, step float64, lower bool) ([]float64, error) {
	const tau = 1e-18
	c := -math.Log(tau)
	n := int64(len(d.p))
	hiOff := refChernoff(d.p, count, c)
	loOff := refChernoff(reverse(d.p), count, c)
	minIdx := int64(count) * d.lo
	maxIdx := int64(count) * (d.lo + n - 1)
	wlo := max(minIdx, maxIdx-loOff)
	whi := min(maxIdx, minIdx+hiOff)
	if whi < wlo {
		whi = wlo
	}
	w := whi - wlo + 1
	size := int64(2)
	for size < w {
		size *= 2
	}
	if size > 1<<22 {
		return nil, fmt.Errorf("window of %d points", w)
	}
	fft := fourier.NewFFT(int(size))
	buf := make([]float64, size)
	for j, v := range d.p {
		buf[int64(j)%size] += v
	}
	coef := fft.Coefficients(nil, buf)
	for k := range coef {
		coef[k] = cpowRef(coef[k], count)
	}
	seq := fft.Sequence(nil, coef)
	comp := make([]float64, w)
	off := minIdx
	for s := range comp {
		idx := wlo + int64(s)
		r := ((idx-off)%size + size) % size
		comp[s] = max(0, seq[r]/float64(size))
	}
	inf := -math.Expm1(float64(count) * math.Log1p(-d.inf))
	out := make([]float64, len(deltas))
	for k, delta := range deltas {
		var target float64
		if lower {
			target = delta + 2*tau + 1e-13
		} else {
			target = delta - tau - 1e-13
		}
		out[k] = max(0, refReadEps(comp, wlo, step, inf, target))
	}
	return out, nil
}

func cpowRef(c complex128, n int) complex128 {
	if n == 1 {
		return c
	}
	h := cpowRef(c, n/2)
	if n%2 == 0 {
		return h * h
	}
	return h * h * c
}

// refReadEps returns the least ε with inf + Σ_{l>ε} p_l(1 − e^{ε−l}) ≤ target.
// With A_j = Σ_{k≥j} p_k and B_j = Σ_{k≥j} p_k·e^{l_j − l_k} (one pass from
// the top), δ(l_j) = inf + A_j − B_j; the least grid point under target is
// found, and the root in the cell below it is e^{ε − l_j} = (inf + A_j − target)/B_j.
func refReadEps(p []float64, lo int64, step, inf, target float64) float64 {
	if inf > target {
		return math.Inf(1)
	}
	n := len(p)
	A := make([]float64, n+1)
	B := make([]float64, n+1)
	for k := n - 1; k >= 0; k-- {
		A[k] = A[k+1] + p[k]
		B[k] = B[k+1]*math.Exp(-step) + p[k]
	}
	j := sort.Search(n, func(j int) bool { return inf+A[j]-B[j] <= target })
	if j == n {
		return float64(lo+int64(n)-1) * step
	}
	if inf+A[j] <= target {
		return math.Inf(-1)
	}
	return float64(lo+int64(j))*step + math.Log((inf+A[j]-target)/B[j])
}

// refBracket returns the reference lower and upper ε for count steps of
// (q, σ) at each δ, on grid spacing step.
func refBracket(q, sigma float64, count int, deltas []float64, step float64) (lower, upper []float64, err error) {
	lower = make([]float64, len(deltas))
	upper = make([]float64, len(deltas))
	for _, remove := range []bool{true, false} {
		m := refMech{q: q, sigma: sigma, remove: remove}
		for _, lw := range []bool{true, false} {
			var d refPMF
			var err error
			if lw {
				d, err = m.lower(step)
			} else {
				d, err = m.upper(step)
			}
			if err != nil {
				return nil, nil, err
			}
			e, err := refCompose(d, count, deltas, step, lw)
			if err != nil {
				return nil, nil, err
			}
			for k := range deltas {
				if lw {
					lower[k] = max(lower[k], e[k])
				} else {
					upper[k] = max(upper[k], e[k])
				}
			}
		}
	}
	return lower, upper, nil
}

// refSingleStep is the exact ε of one step: the largest root over both
// directions of δ(ε) = P(L > ε) − e^ε·Q(L > ε), by bisection.
func refSingleStep(q, sigma, delta float64) float64 {
	eps := 0.0
	for _, remove := range []bool{true, false} {
		m := refMech{q: q, sigma: sigma, remove: remove}
		d := func(e float64) float64 { v, _, _, _ := m.curve(e); return v }
		if d(0) <= delta {
			continue
		}
		lo, hi := 0.0, 1.0
		for d(hi) > delta {
			lo, hi = hi, hi*2
		}
		for range 200 {
			mid := (lo + hi) / 2
			if mid == lo || mid == hi {
				break
			}
			if d(mid) > delta {
				lo = mid
			} else {
				hi = mid
			}
		}
		eps = max(eps, hi)
	}
	return eps
}

// refStep returns the reference grid spacing for count steps of (q, σ): a
// fiftieth of one step's loss deviation (at most 5e-5), widened only as far
// as the composed window (about 22 deviations of the sum) and one step's
// range need to fit 2²¹ and 2²² points.
func refStep(q, sigma float64, count int) float64 {
	sd := refMech{q: q, sigma: sigma, remove: true}.sd()
	step := min(sd/50, 5e-5)
	step = max(step, 22*math.Sqrt(float64(count))*sd/(1<<21))
	for _, remove := range []bool{true, false} {
		lo, hi := refMech{q: q, sigma: sigma, remove: remove}.lossRange()
		step = max(step, (hi-lo)/(1<<22))
	}
	return step
}

// refRow is one reference figure.
type refRow struct {
	q, sigma     float64
	steps        int
	delta        float64
	kind         string // "exact" or "bracket"
	lower, upper float64
	step         float64 // reference grid spacing; 0 for exact
}

// refRows computes the reference figures for count steps of (q, σ) at
// each δ: the closed form for q = 1, the exact root for one step, the PLD
// bracket otherwise (its grid widened if a window does not fit).
func refRows(q, sigma float64, count int, deltas []float64) ([]refRow, error) {
	rows := make([]refRow, len(deltas))
	for k, d := range deltas {
		rows[k] = refRow{q: q, sigma: sigma, steps: count, delta: d, kind: "exact"}
		switch {
		case q == 1:
			rows[k].lower = refGaussEps(math.Sqrt(float64(count))/sigma, d)
		case count == 1:
			rows[k].lower = refSingleStep(q, sigma, d)
		}
		rows[k].upper = rows[k].lower
	}
	if q == 1 || count == 1 {
		return rows, nil
	}
	step := refStep(q, sigma, count)
	var err error
	for range 6 {
		var lo, hi []float64
		if lo, hi, err = refBracket(q, sigma, count, deltas, step); err == nil {
			for k := range rows {
				rows[k].kind, rows[k].lower, rows[k].upper, rows[k].step = "bracket", lo[k], hi[k], step
			}
			return rows, nil
		}
		step *= 2
	}
	return nil, err
}
