package pld

import "math"

// pmf is one step's discretized privacy loss: mass p[j] at loss
// (lo + j)·step and mass inf at +∞.
type pmf struct {
	lo  int64
	p   []float64
	inf float64
}

// discretize returns the "connect the dots" loss distribution of one step
// (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022) on the grid
// ε_i = i·step, i ∈ [lo, hi]. As a function of x = e^ε a hockey-stick
// curve δ is convex and decreasing with δ(0) = 1, and the δ-curve of a
// discrete loss distribution is piecewise linear with kinks at its atoms.
// The distribution built here is the one whose curve is the chord through
// (0, 1), (e^{ε_lo}, δ(ε_lo)), …, (e^{ε_hi}, δ(ε_hi)), flat beyond: chords
// of a convex curve lie above it, so the step is dominated (δ is
// overestimated at every ε, by O(step²) rather than the O(step) of
// rounding losses up), and dominance survives composition.
//
// Each mass is a second difference of the curve, far smaller than the
// curve's values, so it is formed from whichever of three forms of the
// curve is smallest over its three points: δ itself (high losses),
// g = δ − (1 − e^ε) (below ε = 0, where δ is near 1 − e^ε), or
// c = 1 − δ (where δ is near 1 above ε = 0). They differ by linear
// functions of x = e^ε, which carry no mass, and only the smallest is
// computed exactly at each point (the others follow from it). With
// u_i = r_i − r_{i−1} and Δ = step, the slope changes give
//
//	p_lo = (g_{lo+1} − g_lo)/(e^Δ − 1) − g_lo,  or c_lo − (c_{lo+1} − c_lo)/(e^Δ − 1)
//	p_i  = ±((u_{i+1} − u_i)/(e^Δ − 1) − u_i)   (− for r = c)
//	p_hi = (δ_{hi−1} − δ_hi)·e^Δ/(e^Δ − 1)
//	p_∞  = δ_hi
//
// which sum to 1.
func (m mechanism) discretize(step float64) pmf {
	lo, hi := m.indexRange(step)
	n := int(hi - lo)
	em1 := math.Expm1(step)
	type point struct{ d, g, c float64 }
	at := func(i int) point {
		eps := float64(lo+int64(i)) * step
		xm1 := math.Expm1(eps) // x − 1
		if eps < 0 {
			g := math.Exp(m.logLower(eps))
			d := g - xm1
			if d > 0.5 && 1-d < g {
				c := math.Exp(m.logComp(eps))
				return point{1 - c, g, c}
			}
			return point{d, g, 1 - d}
		}
		d := math.Exp(m.logDelta(eps))
		if d > 0.5 {
			c := math.Exp(m.logComp(eps))
			return point{1 - c, (1 - c) + xm1, c}
		}
		return point{d, d + xm1, 1 - d}
	}
	// pick returns the values of the smallest form over three points, and
	// its sign (−1 for c).
	pick := func(a, b, c point) (r0, r1, r2, sign float64) {
		md, mg, mc := max(a.d, b.d, c.d), max(a.g, b.g, c.g), max(a.c, b.c, c.c)
		switch {
		case mg <= md && mg <= mc:
			return a.g, b.g, c.g, 1
		case mc < md:
			return a.c, b.c, c.c, -1
		}
		return a.d, b.d, c.d, 1
	}
	p := make([]float64, n+1)
	p0 := at(0)
	if n == 0 {
		p[0] = p0.c
		return pmf{lo: lo, p: p, inf: p0.d}
	}
	p1 := at(1)
	if max(p0.g, p1.g) <= max(p0.c, p1.c) {
		p[0] = (p1.g-p0.g)/em1 - p0.g
	} else {
		p[0] = p0.c - (p1.c-p0.c)/em1
	}
	for i := 1; i < n; i++ {
		p2 := at(i + 1)
		r0, r1, r2, sign := pick(p0, p1, p2)
		u0, u1 := r1-r0, r2-r1
		p[i] = sign * ((u1-u0)/em1 - u0)
		p0, p1 = p1, p2
	}
	p[n] = (p0.d - p1.d) * (1 + em1) / em1
	inf := p1.d
	// Rounding leaves the total a few ulps per point off 1, and can leave
	// tiny negative masses: clamp them, and settle the difference at the
	// largest mass, where it moves the curve least.
	total, mode := inf, 0
	for i, v := range p {
		p[i] = max(0, v)
		total += p[i]
		if p[i] > p[mode] {
			mode = i
		}
	}
	p[mode] = max(0, p[mode]+(1-total))
	return pmf{lo: lo, p: p, inf: inf}
}
