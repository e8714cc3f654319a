package pld

import "math"

// zTail is how many standard deviations of x each step's loss range keeps:
// the P-mass beyond is Φ̄(10) ≈ e^{−53}, which goes to +∞ at the top and is
// folded into the lowest grid point at the bottom.
const zTail = 10

// mechanism is one step of the Gaussian mechanism (sensitivity 1, noise σ)
// on a Poisson sample of rate q, in one direction of add-or-remove
// adjacency. With X the mechanism's output, L(x) = log(1 − q + q·e^{w(x)})
// and w(x) = (2x − 1)/(2σ²):
//
//   - remove: P = (1−q)·N(0, σ²) + q·N(1, σ²) against Q = N(0, σ²), loss L(X);
//   - add: P = N(0, σ²) against Q = (1−q)·N(0, σ²) + q·N(1, σ²), loss −L(X).
type mechanism struct {
	q, sigma float64
	remove   bool
}

func (m mechanism) mu() float64 { return 1 / m.sigma }

// loss returns L(x) of the remove direction.
func (m mechanism) loss(x float64) float64 {
	w := (2*x - 1) / (2 * m.sigma * m.sigma)
	switch {
	case m.q == 1:
		return w
	case w > 30:
		return w + math.Log(m.q) + math.Log1p((1-m.q)/m.q*math.Exp(-w))
	}
	return math.Log1p(m.q * math.Expm1(w))
}

// lossRange returns the losses at the ends of the x range that holds all
// but e^{−53} of P.
func (m mechanism) lossRange() (lo, hi float64) {
	s := m.sigma
	if m.remove {
		xlo := -zTail * s
		if m.q == 1 {
			xlo = 1 - zTail*s
		}
		return m.loss(xlo), m.loss(1 + zTail*s)
	}
	return -m.loss(zTail * s), -m.loss(-zTail * s)
}

// indexRange returns the grid indices [lo, hi] of spacing step that cover
// the loss range.
func (m mechanism) indexRange(step float64) (lo, hi int64) {
	l, h := m.lossRange()
	lo, hi = int64(math.Floor(l/step)), int64(math.Ceil(h/step))
	if !m.remove && m.q < 1 {
		// The add loss never exceeds −log(1 − q), where δ reaches 0.
		hi = min(hi, int64(math.Ceil(-math.Log1p(-m.q)/step)))
	}
	return lo, max(lo, hi)
}

// w returns the Gaussian-mechanism loss w at which L = ε (remove) or
// L = −ε (add); −Inf where there is none.
func (m mechanism) w(eps float64) float64 {
	if !m.remove {
		eps = -eps
	}
	q := m.q
	switch {
	case q == 1:
		return eps
	case eps > 30:
		return eps - math.Log(q) + math.Log1p(-(1-q)*math.Exp(-eps))
	}
	v := math.Expm1(eps) / q
	if v <= -1 {
		return math.Inf(-1)
	}
	return math.Log1p(v)
}

// logDelta returns log δ(ε), δ(ε) = E_P[(1 − e^{ε−L})₊] the hockey-stick
// divergence of one step, exactly (to rounding):
//
//   - remove: δ(ε) = q·G_μ(w) for ε > log(1 − q), and 1 − e^ε below;
//   - add: δ(ε) = q·e^{ε+w}·G_μ(−w) for ε < −log(1 − q), and 0 above,
//
// with μ = 1/σ, w = m.w(ε) and G_μ the Gaussian mechanism's δ (logGauss).
// (For remove, (1−q)Φ̄(x*/σ) + qΦ̄((x*−1)/σ) − e^εΦ̄(x*/σ) with x* = σ²w + ½
// simplifies to q·G_μ(w); add is the mirror image.)
func (m mechanism) logDelta(eps float64) float64 {
	q, mu := m.q, m.mu()
	if m.remove {
		if q < 1 && eps <= math.Log1p(-q) {
			return math.Log(-math.Expm1(eps))
		}
		return math.Log(q) + logGauss(m.w(eps), mu)
	}
	if q < 1 && eps >= -math.Log1p(-q) {
		return math.Inf(-1)
	}
	w := m.w(eps)
	if q < 1 {
		// log(q·e^{ε+w}) = log(1 − (1−q)e^ε), exact also where w overflows.
		return math.Log(-math.Expm1(math.Log1p(-q)+eps)) + logGauss(-w, mu)
	}
	return logGauss(-w, mu)
}

// logLower returns log g(ε), g(ε) = δ(ε) − (1 − e^ε) = E_Q[(e^ε − e^L)₊]
// the lower hockey-stick divergence, exactly: the mirror image of
// logDelta,
//
//   - remove: g(ε) = q·e^w·G_μ(−w) for ε > log(1 − q), and 0 below;
//   - add: g(ε) = q·e^ε·G_μ(w) for ε < −log(1 − q), and e^ε − 1 above.
//
// Where δ is near 1 (low losses) δ itself carries no information about
// the loss distribution but g does; the discretization uses g there.
func (m mechanism) logLower(eps float64) float64 {
	q, mu := m.q, m.mu()
	if m.remove {
		if q < 1 && eps <= math.Log1p(-q) {
			return math.Inf(-1)
		}
		w := m.w(eps)
		return math.Log(q) + w + logGauss(-w, mu)
	}
	if q < 1 && eps >= -math.Log1p(-q) {
		return math.Log(math.Expm1(eps))
	}
	return math.Log(q) + eps + logGauss(m.w(eps), mu)
}

// logComp returns log(1 − δ(ε)), 1 − δ = P(L ≤ ε) + e^ε·Q(L > ε), as a
// sum of positive terms: the exact form where δ is near 1 and ε above 0
// (as below the loss range of a Gaussian of large μ), where neither δ nor
// g has digits to spare. With A = w/μ − μ/2 and B = w/μ + μ/2:
//
//   - remove: 1 − δ = (1 − q) + q·(Φ̄(−A) + e^w·Φ̄(B));
//   - add: 1 − δ = Φ̄(B) + e^ε·((1 − q)·Φ̄(−B) + q·Φ̄(−A)).
func (m mechanism) logComp(eps float64) float64 {
	q, mu := m.q, m.mu()
	if m.remove && q < 1 && eps <= math.Log1p(-q) {
		return eps
	}
	if !m.remove && q < 1 && eps >= -math.Log1p(-q) {
		return 0
	}
	w := m.w(eps)
	a, b := w/mu-mu/2, w/mu+mu/2
	if m.remove {
		g := logAdd(logSF(-a), w+logSF(b))
		if q == 1 {
			return g
		}
		return logAdd(math.Log1p(-q), math.Log(q)+g)
	}
	in := math.Log(q) + logSF(-a)
	if q < 1 {
		in = logAdd(math.Log1p(-q)+logSF(-b), in)
	}
	return logAdd(logSF(b), eps+in)
}

// logAdd returns log(e^a + e^b).
func logAdd(a, b float64) float64 {
	if a < b {
		a, b = b, a
	}
	if math.IsInf(a, -1) {
		return a
	}
	return a + math.Log1p(math.Exp(b-a))
}

// lossVariance returns Var_P of the remove direction's loss (Simpson's
// rule over the truncated x range); it sets how fine the grid must be.
func (m mechanism) lossVariance() float64 {
	if m.q == 1 {
		return 1 / (m.sigma * m.sigma)
	}
	s, q := m.sigma, m.q
	lo, hi := -zTail*s, 1+zTail*s
	n := int(min(1e5, max(2000, math.Ceil((hi-lo)/(s/20)))))
	n += n % 2
	h := (hi - lo) / float64(n)
	dens := func(x float64) float64 {
		a, b := x/s, (x-1)/s
		return ((1-q)*math.Exp(-a*a/2) + q*math.Exp(-b*b/2)) / (s * math.Sqrt(2*math.Pi))
	}
	var m0, m1, m2 float64
	for i := 0; i <= n; i++ {
		x := lo + float64(i)*h
		c := 2.0
		switch {
		case i == 0 || i == n:
			c = 1
		case i%2 == 1:
			c = 4
		}
		p, l := c*dens(x), m.loss(x)
		m0 += p
		m1 += p * l
		m2 += p * l * l
	}
	mean := m1 / m0
	return max(0, m2/m0-mean*mean)
}
