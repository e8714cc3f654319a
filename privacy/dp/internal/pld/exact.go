package pld

import "math"

// gaussianEpsilon returns the ε of the Gaussian mechanism of sensitivity
// μ at δ: the root of G_μ(ε) = δ (logGauss), rounded up.
func gaussianEpsilon(mu, delta float64) float64 {
	ld := math.Log(delta)
	hint := mu*math.Sqrt(2*math.Log(1/delta)) + mu*mu/2
	return leastUp(func(e float64) bool { return logGauss(e, mu) <= ld }, hint)
}

// singleStepEpsilon returns the ε of one step of the subsampled Gaussian:
// the larger of the roots of the exact hockey-stick divergences of the
// two directions, rounded up.
func singleStepEpsilon(q, sigma, delta float64) float64 {
	ld := math.Log(delta)
	eps := 0.0
	for _, remove := range []bool{true, false} {
		m := mechanism{q: q, sigma: sigma, remove: remove}
		eps = max(eps, leastUp(func(e float64) bool { return m.logDelta(e) <= ld }, 1))
	}
	return eps
}

// leastUp returns the least ε ≥ 0 with ok(ε), for ok false below a point
// and true above it, by bisection to a relative 1e-14, then raised by a
// relative 1e-10 so that rounding in ok cannot put it below the root.
func leastUp(ok func(float64) bool, hint float64) float64 {
	if ok(0) {
		return 0
	}
	lo, hi := 0.0, max(hint, 1e-12)
	for i := 0; !ok(hi); i++ {
		if i == 2000 {
			return math.Inf(1)
		}
		lo, hi = hi, 2*hi
	}
	for range 400 {
		if hi-lo <= 1e-14*hi {
			break
		}
		if mid := lo + (hi-lo)/2; ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi * (1 + 1e-10)
}
