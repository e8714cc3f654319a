// Package pld bounds ε of composed Poisson-subsampled Gaussian mechanisms
// with privacy loss distributions (Koskela, Jälkö, Honkela 2020; Google's
// dp_accounting). Each mechanism's privacy loss L is discretized on a grid
// of spacing Δ with pessimistic rounding (L rounded up; the upper tail sent
// to +∞, the lower tail to the lowest grid point), the T-fold composition
// is one FFT power, and ε is read off δ(ε) = E[(1 − e^{ε−ΣL})₊].
//
// Rounding up adds up to Δ per step, a bias that grows linearly with the
// number of steps. The rounding errors U_i = ⌈L_i⌉ − L_i are independent
// and in [0, Δ], so by Hoeffding ΣU_i ≥ T·E[U] − Δ·√(T·ln(1/η)/2) except
// with probability η. The bound therefore subtracts the known mean rounding
// error, adds the deviation term and charges η to δ; this keeps the result
// a certified upper bound while removing most of the linear bias. FFT
// wrap-around outside a Chernoff window is charged to δ the same way.
package pld

import (
	"errors"
	"math"

	"gonum.org/v1/gonum/dsp/fourier"
)

// Event is count identical steps of the Gaussian mechanism with noise
// multiplier Sigma on a Poisson sample of rate Q ∈ (0, 1].
type Event struct {
	Q, Sigma float64
	Count    int
}

// zTail is the number of standard deviations kept of each Gaussian; the
// mass beyond (about 1e-21) is rounded pessimistically.
const zTail = 9.5

// maxFFT bounds the composed grid; beyond it the interval is widened.
const maxFFT = 1 << 21

// ErrTooWide reports a composition whose loss range cannot be held at any
// usable discretization.
var ErrTooWide = errors.New("privacy loss range too wide to discretize")

// Epsilon returns an upper bound on ε such that the composition of events
// is (ε, δ)-DP under add-or-remove adjacency. interval is the initial grid
// spacing; it is widened when the composed range would need more than
// maxFFT grid points.
func Epsilon(events []Event, delta, interval float64) (float64, error) {
	eps := 0.0
	for _, remove := range []bool{false, true} {
		e, err := epsilonDirection(events, delta, interval, remove)
		if err != nil {
			return 0, err
		}
		eps = max(eps, e)
	}
	return eps, nil
}

func epsilonDirection(events []Event, delta, interval float64, remove bool) (float64, error) {
	for tries := 0; tries < 40; tries++ {
		e, grow, err := tryEpsilon(events, delta, interval, remove)
		if err != nil {
			return 0, err
		}
		if grow == 0 {
			return e, nil
		}
		interval *= max(1.25, grow)
	}
	return 0, ErrTooWide
}

// dist is one step's discretized privacy loss: mass p[j] at loss
// (lo+j)·Δ, mass inf at +∞, and slack = E[U·1{L within the grid}], the mean
// rounding error over the grid.
type dist struct {
	lo    int64
	p     []float64
	inf   float64
	slack float64
}

// tryEpsilon returns ε, or a factor by which to widen the interval.
func tryEpsilon(events []Event, delta, interval float64, remove bool) (eps, grow float64, err error) {
	ds := make([]dist, len(events))
	total := 0
	for i, ev := range events {
		ds[i] = discretize(ev.Q, ev.Sigma, interval, remove)
		total += ev.Count
	}
	etaH := delta / 100
	tau := delta * 1e-6
	target := delta - etaH - 2*tau

	// Chernoff window for the composed finite part, in shifted indices.
	lo, hi := chernoffWindow(ds, events, tau)
	n := hi - lo + 1
	size := 1
	for size < n {
		size <<= 1
	}
	if size > maxFFT {
		return 0, float64(size) / maxFFT, nil
	}
	if size < 2 {
		size = 2
	}
	fft := fourier.NewFFT(size)
	var prod []complex128
	var offset int64
	pinfFinite := 1.0
	for i, d := range ds {
		buf := make([]float64, size)
		for j, v := range d.p {
			buf[j%size] += v
		}
		c := fft.Coefficients(nil, buf)
		for k := range c {
			c[k] = cpow(c[k], events[i].Count)
		}
		if prod == nil {
			prod = c
		} else {
			for k := range prod {
				prod[k] *= c[k]
			}
		}
		offset += d.lo * int64(events[i].Count)
		pinfFinite *= math.Pow(1-d.inf, float64(events[i].Count))
	}
	seq := fft.Sequence(nil, prod)
	// Composed mass at shifted index s ∈ [lo, lo+size) sits at position s mod size.
	comp := make([]float64, size)
	for r := range seq {
		s := lo + ((r-lo)%size+size)%size
		comp[s-lo] = max(0, seq[r]/float64(size))
	}
	pinf := 1 - pinfFinite
	epsT := epsilonFromDist(comp, (offset + int64(lo)), interval, pinf, target)

	slack := 0.0
	for i, d := range ds {
		slack += float64(events[i].Count) * d.slack
	}
	slack -= interval * math.Sqrt(float64(total)*math.Log(1/etaH)/2)
	return max(0, epsT-slack), 0, nil
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

// epsilonFromDist returns the smallest ε with δ(ε) ≤ target for mass
// comp[j] at loss (first+j)·Δ plus pinf at +∞.
func epsilonFromDist(comp []float64, first int64, delta, pinf, target float64) float64 {
	if pinf >= target {
		return math.Inf(1)
	}
	var a, b float64 // Σ c and Σ c·e^{−l} over bins above ε
	for j := len(comp) - 1; j >= 0; j-- {
		l := float64(first+int64(j)) * delta
		c := comp[j]
		if c == 0 {
			continue
		}
		a += c
		b += c * math.Exp(-l)
		// On [l − Δ, l): δ(ε) = pinf + a − e^ε·b.
		lower := l - delta
		if j > 0 {
			lower = float64(first+int64(j-1)) * delta
		}
		if pinf+a-math.Exp(lower)*b > target {
			return math.Log((pinf + a - target) / b)
		}
	}
	return float64(first) * delta
}

// chernoffWindow returns shifted-index bounds [lo, hi] outside which the
// composed finite mass is at most tau on each side.
func chernoffWindow(ds []dist, events []Event, tau float64) (lo, hi int) {
	const blocks = 2048
	type coarse struct {
		up, down []float64 // log-mass at block maxima / minima
		f        int
	}
	cs := make([]coarse, len(ds))
	maxIdx := 0
	for i, d := range ds {
		f := (len(d.p) + blocks - 1) / blocks
		nb := (len(d.p) + f - 1) / f
		m := make([]float64, nb)
		for j, v := range d.p {
			m[j/f] += v
		}
		for j := range m {
			m[j] = math.Log(m[j])
		}
		cs[i] = coarse{up: m, f: f}
		maxIdx += (len(d.p) - 1) * events[i].Count
	}
	logMGF := func(c coarse, lambda float64, upper bool) float64 {
		mx := math.Inf(-1)
		for j, lm := range c.up {
			x := j * c.f
			if upper {
				x = (j+1)*c.f - 1
			}
			mx = max(mx, lm+lambda*float64(x))
		}
		s := 0.0
		for j, lm := range c.up {
			x := j * c.f
			if upper {
				x = (j+1)*c.f - 1
			}
			s += math.Exp(lm + lambda*float64(x) - mx)
		}
		return mx + math.Log(s)
	}
	hiF, loF := float64(maxIdx), 0.0
	lt := math.Log(tau)
	for k := 0; k <= 240; k++ {
		lambda := math.Pow(10, -14+float64(k)/15)
		up, down := 0.0, 0.0
		for i, c := range cs {
			up += float64(events[i].Count) * logMGF(c, lambda, true)
			down += float64(events[i].Count) * logMGF(c, -lambda, false)
		}
		hiF = min(hiF, math.Ceil((up-lt)/lambda))
		loF = max(loF, math.Floor((lt-down)/lambda))
	}
	lo, hi = int(loF), int(hiF)
	if lo > hi {
		lo = hi
	}
	return lo, hi
}

// lossFn returns log(1 − q + q·e^w), w = (2x − 1)/(2σ²): the privacy loss
// of the remove direction at x (the add direction is its negation).
func lossFn(q, sigma float64) func(x float64) float64 {
	s2 := sigma * sigma
	return func(x float64) float64 {
		w := (2*x - 1) / (2 * s2)
		switch {
		case q == 1:
			return w
		case w > 30:
			return w + math.Log(q) + math.Log1p((1-q)/q*math.Exp(-w))
		default:
			return math.Log1p(q * math.Expm1(w))
		}
	}
}

// lossInv inverts lossFn: the x with log(1 − q + q·e^w) = l, or ±Inf.
func lossInv(q, sigma float64) func(l float64) float64 {
	s2 := sigma * sigma
	return func(l float64) float64 {
		if q == 1 {
			return s2*l + 0.5
		}
		v := math.Expm1(l) + q
		if v <= 0 {
			return math.Inf(-1)
		}
		return s2*(math.Log(v)-math.Log(q)) + 0.5
	}
}

// gauss is N(mu, σ²) with tail-accurate interval probabilities.
type gauss struct{ mu, sigma float64 }

func (g gauss) cdf(x float64) float64 { return 0.5 * math.Erfc(-(x-g.mu)/(g.sigma*math.Sqrt2)) }
func (g gauss) sf(x float64) float64  { return 0.5 * math.Erfc((x-g.mu)/(g.sigma*math.Sqrt2)) }
func (g gauss) pdf(x float64) float64 {
	z := (x - g.mu) / g.sigma
	return math.Exp(-z*z/2) / (g.sigma * math.Sqrt(2*math.Pi))
}

// mass returns P(a < X ≤ b).
func (g gauss) mass(a, b float64) float64 {
	switch {
	case b <= a:
		return 0
	case a >= g.mu:
		return max(0, g.sf(a)-g.sf(b))
	case b <= g.mu:
		return max(0, g.cdf(b)-g.cdf(a))
	default:
		return max(0, 1-g.cdf(a)-g.sf(b))
	}
}

// discretize builds one step's pessimistic loss distribution. For remove
// adjacency X ~ (1−q)N(0,σ²) + qN(1,σ²) and L = g(X); for add adjacency
// X ~ N(0,σ²) and L = −g(X), with g = lossFn.
func discretize(q, sigma, delta float64, remove bool) dist {
	g, ginv := lossFn(q, sigma), lossInv(q, sigma)
	type comp struct {
		w float64
		n gauss
	}
	var comps []comp
	var xlo, xhi float64
	if remove {
		comps = []comp{{1 - q, gauss{0, sigma}}, {q, gauss{1, sigma}}}
		if q == 1 {
			comps = comps[1:]
		}
		xlo, xhi = -zTail*sigma, 1+zTail*sigma
	} else {
		comps = []comp{{1, gauss{0, sigma}}}
		xlo, xhi = -zTail*sigma, zTail*sigma
	}
	mass := func(a, b float64) float64 {
		m := 0.0
		for _, c := range comps {
			m += c.w * c.n.mass(a, b)
		}
		return m
	}
	pdf := func(x float64) float64 {
		p := 0.0
		for _, c := range comps {
			p += c.w * c.n.pdf(x)
		}
		return p
	}
	below, above := mass(math.Inf(-1), xlo), mass(xhi, math.Inf(1))

	// Loss as a function of x, increasing for remove, decreasing for add.
	loss := g
	if !remove {
		loss = func(x float64) float64 { return -g(x) }
	}
	llo, lhi := loss(xlo), loss(xhi)
	if !remove {
		llo, lhi = lhi, llo
	}
	kmin := int64(math.Ceil(llo / delta))
	kmax := int64(math.Ceil(lhi / delta))
	p := make([]float64, kmax-kmin+1)
	// edge(k) is the x where the loss equals k·Δ, clipped to [xlo, xhi].
	edge := func(k int64) float64 {
		l := float64(k) * delta
		var x float64
		if remove {
			x = ginv(l)
		} else {
			x = ginv(-l)
		}
		return max(xlo, min(xhi, x))
	}
	sumKL := 0.0
	prev := xhi
	if remove {
		prev = xlo
	}
	for k := kmin; k <= kmax; k++ {
		var m float64
		if k == kmax {
			if remove {
				m = mass(prev, xhi)
			} else {
				m = mass(xlo, prev)
			}
		} else {
			e := edge(k)
			if remove {
				m = mass(prev, e)
			} else {
				m = mass(e, prev)
			}
			prev = e
		}
		p[k-kmin] = m
		sumKL += float64(k) * delta * m
	}
	d := dist{lo: kmin, p: p}
	// The low-loss tail is rounded up to the lowest grid point; the high-loss
	// tail becomes +∞.
	if remove {
		p[0] += below
		d.inf = above
	} else {
		p[0] += above
		d.inf = below
	}
	// slack = Σ k·Δ·m_k − ∫ L dP over [xlo, xhi], by composite Simpson.
	const steps = 40000
	h := (xhi - xlo) / steps
	integral := 0.0
	for i := 0; i <= steps; i++ {
		x := xlo + float64(i)*h
		w := 2.0
		switch {
		case i == 0 || i == steps:
			w = 1
		case i%2 == 1:
			w = 4
		}
		integral += w * loss(x) * pdf(x)
	}
	integral *= h / 3
	d.slack = max(0, sumKL-integral)
	return d
}
