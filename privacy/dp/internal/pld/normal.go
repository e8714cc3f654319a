package pld

import "math"

// logSF returns log Φ̄(z) = log P(N(0, 1) > z) to a few ulps for every z.
// Below z = 25 erfc is exact enough; beyond, where erfc heads for
// underflow (it is subnormal past z ≈ 37.5), the asymptotic series
// Φ̄(z) = φ(z)/z · Σ_k (−1)^k (2k−1)!!/z^{2k}, whose terms there fall below
// 1e-19 within twelve, takes over.
func logSF(z float64) float64 {
	if z < 25 || math.IsNaN(z) {
		return math.Log(0.5 * math.Erfc(z/math.Sqrt2))
	}
	z2 := z * z
	s, t := 1.0, 1.0
	for k := 1; k <= 12; k++ {
		t *= -float64(2*k-1) / z2
		s += t
	}
	return -z2/2 - math.Log(z) - 0.5*math.Log(2*math.Pi) + math.Log(s)
}

// logGauss returns log G_μ(w), where
//
//	G_μ(w) = Φ̄(w/μ − μ/2) − e^w·Φ̄(w/μ + μ/2)
//
// is the hockey-stick divergence at e^w of N(μ, 1) against N(0, 1) (Balle
// and Wang 2018): the δ(w) of one Gaussian mechanism of sensitivity μ.
// Both terms are formed in log space, so w may be far beyond the range of
// math.Exp. For large w the second term is about (w/μ − μ/2)/(w/μ + μ/2)
// of the first, so their difference loses only a few digits.
func logGauss(w, mu float64) float64 {
	switch {
	case math.IsInf(w, -1):
		return 0
	case math.IsInf(w, 1):
		return math.Inf(-1)
	}
	la := logSF(w/mu - mu/2)
	lb := w + logSF(w/mu+mu/2)
	if lb >= la {
		return math.Inf(-1)
	}
	return la + math.Log(-math.Expm1(lb-la))
}
