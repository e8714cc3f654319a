// Package rdp computes Rényi differential privacy of the Poisson-subsampled
// Gaussian mechanism (Mironov, Talwar, Zhang 2019) and converts RDP curves to
// (ε, δ). The arithmetic follows the log-space series of TF-Privacy's
// rdp_accountant so that results agree with it to floating-point accuracy.
package rdp

import "math"

// logAdd returns log(exp(x) + exp(y)).
func logAdd(x, y float64) float64 {
	a, b := min(x, y), max(x, y)
	if math.IsInf(a, -1) {
		return b
	}
	return math.Log1p(math.Exp(a-b)) + b
}

// logSub returns log(exp(x) − exp(y)) for x ≥ y.
func logSub(x, y float64) float64 {
	switch {
	case math.IsInf(y, -1):
		return x
	case x <= y:
		return math.Inf(-1)
	}
	d := x - y
	if d > 700 {
		return x
	}
	return math.Log(math.Expm1(d)) + y
}

// logErfc returns log(erfc(x)) accurately for large x, where erfc
// underflows.
func logErfc(x float64) float64 {
	if x < 25 {
		return math.Log(math.Erfc(x))
	}
	// Asymptotic series of log(erfc(x)) + x² + log(x√π) at infinity.
	x2 := x * x
	return -math.Log(math.Pi)/2 - math.Log(x) - x2 - 0.5/x2 + 0.625/(x2*x2) -
		37.0/24.0/(x2*x2*x2) + 353.0/64.0/(x2*x2*x2*x2)
}

func logComb(n, k float64) float64 {
	a, _ := math.Lgamma(n + 1)
	b, _ := math.Lgamma(k + 1)
	c, _ := math.Lgamma(n - k + 1)
	return a - b - c
}

// logAInt is log A_α for integer α: the binomial expansion of
// E_{z~μ0}[(μ(z)/μ0(z))^α], all terms positive.
func logAInt(q, sigma float64, alpha int) float64 {
	logA := math.Inf(-1)
	lq, l1q := math.Log(q), math.Log1p(-q)
	a := float64(alpha)
	for i := 0; i <= alpha; i++ {
		fi := float64(i)
		s := logComb(a, fi) + fi*lq + (a-fi)*l1q + (fi*fi-fi)/(2*sigma*sigma)
		logA = logAdd(logA, s)
	}
	return logA
}

// logAFrac is log A_α for fractional α: the integral is split at z0 where
// the mixture's two components cross, and each half is a convergent series
// with binomial coefficients of alternating sign.
func logAFrac(q, sigma, alpha float64) float64 {
	logA0, logA1 := math.Inf(-1), math.Inf(-1)
	z0 := sigma*sigma*math.Log(1/q-1) + 0.5
	lq, l1q := math.Log(q), math.Log1p(-q)
	logHalf := math.Log(0.5)
	// Binomial coefficient C(α, i) carried as log-magnitude and sign.
	logCoef, positive := 0.0, true
	for i := 0; i < 100000; i++ {
		fi := float64(i)
		if i > 0 {
			f := (alpha - fi + 1) / fi
			if f < 0 {
				positive = !positive
			}
			logCoef += math.Log(math.Abs(f))
		}
		j := alpha - fi
		logT0 := logCoef + fi*lq + j*l1q
		logT1 := logCoef + j*lq + fi*l1q
		logE0 := logHalf + logErfc((fi-z0)/(math.Sqrt2*sigma))
		logE1 := logHalf + logErfc((z0-j)/(math.Sqrt2*sigma))
		logS0 := logT0 + (fi*fi-fi)/(2*sigma*sigma) + logE0
		logS1 := logT1 + (j*j-j)/(2*sigma*sigma) + logE1
		if positive {
			logA0 = logAdd(logA0, logS0)
			logA1 = logAdd(logA1, logS1)
		} else {
			logA0 = logSub(logA0, logS0)
			logA1 = logSub(logA1, logS1)
		}
		if max(logS0, logS1) < -30 {
			break
		}
	}
	return logAdd(logA0, logA1)
}

// SubsampledGaussian returns the RDP at order alpha > 1 of one step of the
// Gaussian mechanism with noise multiplier sigma on a Poisson sample of rate
// q ∈ (0, 1]. Callers validate their arguments.
func SubsampledGaussian(q, sigma, alpha float64) float64 {
	if q == 1 {
		return alpha / (2 * sigma * sigma)
	}
	if alpha == math.Trunc(alpha) && alpha < 1<<20 {
		return logAInt(q, sigma, int(alpha)) / (alpha - 1)
	}
	return logAFrac(q, sigma, alpha) / (alpha - 1)
}

// Epsilon converts an RDP curve to the smallest ε over the orders at which
// the mechanism is (ε, δ)-DP, using the conversion of Balle et al. 2020
// (Proposition 12 of arXiv:2004.00010v4) as TF-Privacy and Opacus do. It
// returns the ε and the order that attains it.
func Epsilon(orders, rdp []float64, delta float64) (eps, order float64) {
	eps, order = math.Inf(1), math.NaN()
	for i, a := range orders {
		r := rdp[i]
		var e float64
		switch {
		case r < 0 || math.IsNaN(r):
			continue
		case delta*delta+math.Expm1(-r) >= 0:
			// KL bound δ ≤ √(1 − e^{−r}) already gives ε = 0.
			e = 0
		case a > 1.01:
			e = r + math.Log1p(-1/a) - math.Log(delta*a)/(a-1)
		default:
			e = math.Inf(1)
		}
		if e < eps {
			eps, order = e, a
		}
	}
	return max(0, eps), order
}
