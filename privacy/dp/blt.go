package dp

import (
	"bytes"
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/gonum/mat"
)

// BLT is a Buffered Linear Toeplitz matrix C (Dvijotham, McMahan,
// Pillutla, Steinke, Thakurta 2024, "Efficient and Near-Optimal Noise
// Generation for Streaming Differential Privacy", arXiv:2404.16706;
// McMahan, Xu, Zhang 2024, "A Hassle-free Algorithm for Private Learning in
// Practice: Don't Use Tree Aggregation, Use BLTs", arXiv:2408.08868): the
// T×T lower-triangular Toeplitz matrix with coefficients
//
//	c_0 = 1,  c_k = Σ_i Omega[i]·Theta[i]^(k−1)  (k ≥ 1),
//
// one buffer per decay Theta[i] ∈ (0, 1) with output weight Omega[i].
//
// It is the strategy of a matrix-factorization mechanism (DP-FTRL) for
// the prefix-sum workload A (all ones on and below the diagonal): A = B·C
// with B = A·C⁻¹, and releasing A·x + B·z for rounds' aggregates x and
// Gaussian z is the same as adding the noise (C⁻¹z)_t to round t's
// aggregate, which BLTNoise streams. A BLT with no buffers is the
// identity: independent noise every round.
//
// Every method validates the fields, so a BLT may be written as a literal
// or decoded from JSON.
type BLT struct {
	Theta []float64 `json:"theta"`
	Omega []float64 `json:"omega"`
}

// bltMaxBuffers bounds d. The buffers that matter number a handful (the
// fitted loss stops improving by 4), and the bound keeps the O(d³)
// eigensolve and a serialised state's header small.
const bltMaxBuffers = 64

// Validate reports whether the parameters describe a BLT: as many weights
// as decays, at most 64 buffers, every decay in (0, 1) and every weight
// finite.
func (c BLT) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("dp: blt: %w", err)
	}
	return nil
}

func (c BLT) validate() error {
	if len(c.Theta) != len(c.Omega) {
		return fmt.Errorf("%w: %d decays and %d weights", ErrInvalid, len(c.Theta), len(c.Omega))
	}
	if len(c.Theta) > bltMaxBuffers {
		return fmt.Errorf("%w: %d buffers, want at most %d", ErrInvalid, len(c.Theta), bltMaxBuffers)
	}
	for i, th := range c.Theta {
		if !(th > 0 && th < 1) {
			return fmt.Errorf("%w: decay %d is %v, want a value in (0, 1)", ErrInvalid, i, th)
		}
		if w := c.Omega[i]; math.IsNaN(w) || math.IsInf(w, 0) {
			return fmt.Errorf("%w: weight %d is %v, want a finite value", ErrInvalid, i, w)
		}
	}
	return nil
}

// Coefficients returns c_0, …, c_(n−1), the first column of C.
func (c BLT) Coefficients(n int) ([]float64, error) {
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("dp: blt coefficients: %w", err)
	}
	if n < 1 {
		return nil, fmt.Errorf("dp: blt coefficients: %w: n = %d, want at least 1", ErrInvalid, n)
	}
	return c.coefficients(n), nil
}

// coefficients expands validated parameters. Powers are carried
// multiplicatively so the cost is O(n·d).
func (c BLT) coefficients(n int) []float64 {
	coef := make([]float64, n)
	coef[0] = 1
	pow := make([]float64, len(c.Theta))
	for i := range pow {
		pow[i] = 1
	}
	for k := 1; k < n; k++ {
		var s float64
		for i, w := range c.Omega {
			s += w * pow[i]
			pow[i] *= c.Theta[i]
		}
		coef[k] = s
	}
	return coef
}

// Inverse returns the parameters of C⁻¹, again a BLT by Dvijotham et al.
// 2024, Lemma 5.2: its coefficients are 1 and Σ_j omega[j]·theta[j]^(k−1).
// They come back as slices, not as a BLT, because a decay of C⁻¹ may be
// negative.
//
// C multiplies by the state-space system with state matrix Θ and input
// and output vectors 1 and ω; solving C·w = z for w gives the system with
// state matrix M = Θ − 1ωᵀ and output −ω (McMahan, Xu, Zhang 2024, Alg.
// 3). The decays of C⁻¹ are the eigenvalues λ of M, the roots of the
// secular equation Σ_i ω_i/(θ_i − λ) = 1, with right eigenvector
// (θ_i − λ)⁻¹ and left eigenvector ω_i/(θ_i − λ), so the weights are
// −1/Σ_i ω_i/(θ_i − λ)² in closed form.
//
// Equal decays are merged and zero weights dropped first, so fewer than d
// buffers may come back. With positive weights the roots interlace the
// decays, λ_1 < θ_1 < λ_2 < … < λ_d < θ_d, and are found by bisection from
// the nearer pole, which is accurate to rounding however close they come
// to it; the inverse's weights are then negative and its smallest decay
// is negative unless Σ ω_i/θ_i < 1. With weights of both signs the roots
// come from a general eigensolver, polished by Newton's method, and a
// complex or repeated root is refused with ErrInvalid: C⁻¹ is then not a
// BLT with real parameters (BLTNoise does not need it to be).
func (c BLT) Inverse() (theta, omega []float64, err error) {
	if err := c.validate(); err != nil {
		return nil, nil, fmt.Errorf("dp: blt inverse: %w", err)
	}
	th, om := bltMerge(c.Theta, c.Omega)
	if len(th) == 0 {
		return []float64{}, []float64{}, nil
	}
	positive := true
	for _, w := range om {
		positive = positive && w > 0
	}
	if positive {
		theta, omega = bltSecularRoots(th, om)
		return theta, omega, nil
	}
	theta, omega, err = bltEigenRoots(th, om)
	if err != nil {
		return nil, nil, fmt.Errorf("dp: blt inverse: %w", err)
	}
	return theta, omega, nil
}

// bltMerge sorts the buffers by decay, adds the weights of equal decays
// and drops zero weights: the rational generating function is unchanged,
// and the secular equation needs distinct poles with non-zero residues.
func bltMerge(theta, omega []float64) ([]float64, []float64) {
	idx := make([]int, len(theta))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(theta[a], theta[b]) })
	var th, om []float64
	for _, i := range idx {
		if n := len(th); n > 0 && th[n-1] == theta[i] {
			om[n-1] += omega[i]
			continue
		}
		th = append(th, theta[i])
		om = append(om, omega[i])
	}
	var ths, oms []float64
	for i := range th {
		if om[i] != 0 {
			ths = append(ths, th[i])
			oms = append(oms, om[i])
		}
	}
	return ths, oms
}

// bltSecularRoots solves Σ_i ω_i/(θ_i − λ) = 1 for sorted, distinct θ and
// positive ω. Each root is bisected as an offset δ from the pole nearer to
// it, with the differences θ_i − pole computed once: near a pole λ itself
// would carry too few significant digits of θ_i − λ.
func bltSecularRoots(th, om []float64) (theta, omega []float64) {
	d := len(th)
	var sum float64
	for _, w := range om {
		sum += w
	}
	theta = make([]float64, d)
	omega = make([]float64, d)
	diff := make([]float64, d)
	f := func(delta float64) float64 {
		var s float64
		for i, w := range om {
			s += w / (diff[i] - delta)
		}
		return s
	}
	for j := 0; j < d; j++ {
		var pole, lo, hi float64
		switch {
		case j == 0:
			// Below θ_1 the sum is increasing and at most Σω/(θ_1 − λ),
			// so it reaches 1 no lower than θ_1 − Σω.
			pole, lo, hi = th[0], -sum, 0
		default:
			// The sum at the midpoint tells which half holds the root;
			// measure from that half's pole.
			mid := th[j-1] + (th[j]-th[j-1])/2
			for i := range diff {
				diff[i] = th[i] - mid
			}
			if f(0) >= 1 {
				pole, lo, hi = th[j-1], 0, mid-th[j-1]
			} else {
				pole, lo, hi = th[j], mid-th[j], 0
			}
		}
		for i := range diff {
			diff[i] = th[i] - pole
		}
		for it := 0; it < 2000; it++ {
			m := lo + (hi-lo)/2
			if m <= lo || m >= hi {
				break
			}
			if f(m) < 1 {
				lo = m
			} else {
				hi = m
			}
		}
		// The endpoint that is not a pole keeps the sum finite.
		delta := lo
		if delta == 0 {
			delta = hi
		}
		var deriv float64
		for i, w := range om {
			r := diff[i] - delta
			deriv += w / (r * r)
		}
		theta[j] = pole + delta
		omega[j] = -1 / deriv
	}
	return theta, omega
}

// bltEigenRoots finds the inverse's parameters for weights of mixed signs,
// where the roots of the secular equation need not interlace the poles
// and may be complex.
func bltEigenRoots(th, om []float64) (theta, omega []float64, err error) {
	d := len(th)
	m := mat.NewDense(d, d, nil)
	for i := 0; i < d; i++ {
		for l := 0; l < d; l++ {
			v := -om[l]
			if i == l {
				v += th[i]
			}
			m.Set(i, l, v)
		}
	}
	var eig mat.Eigen
	if !eig.Factorize(m, mat.EigenNone) {
		return nil, nil, fmt.Errorf("%w: the eigenvalues of Θ − 1ωᵀ did not converge", ErrInvalid)
	}
	vals := eig.Values(nil)
	var scale float64
	for _, v := range vals {
		scale = math.Max(scale, math.Abs(real(v)))
	}
	scale = math.Max(scale, 1)
	theta = make([]float64, d)
	omega = make([]float64, d)
	for j, v := range vals {
		if math.Abs(imag(v)) > 1e-9*scale {
			return nil, nil, fmt.Errorf("%w: C⁻¹ has the complex decay %v, so it is no BLT with real parameters", ErrInvalid, v)
		}
		lam := real(v)
		g, dg := bltSecular(th, om, lam)
		for it := 0; it < 50 && dg != 0; it++ {
			next := lam - g/dg
			gn, dgn := bltSecular(th, om, next)
			if !(math.Abs(gn) < math.Abs(g)) {
				break
			}
			lam, g, dg = next, gn, dgn
		}
		if dg == 0 || math.IsNaN(dg) || math.IsInf(dg, 0) {
			return nil, nil, fmt.Errorf("%w: C⁻¹'s decay %v is defective", ErrInvalid, lam)
		}
		theta[j] = lam
		omega[j] = -1 / dg
	}
	for j := range theta {
		for l := j + 1; l < d; l++ {
			if math.Abs(theta[j]-theta[l]) <= 1e-9*scale {
				return nil, nil, fmt.Errorf("%w: C⁻¹ has the repeated decay %v, so it is no BLT", ErrInvalid, theta[j])
			}
		}
	}
	return theta, omega, nil
}

// bltSecular returns Σ_i ω_i/(θ_i − λ) − 1 and its derivative in λ.
func bltSecular(th, om []float64, lam float64) (g, dg float64) {
	g = -1
	for i, w := range om {
		r := th[i] - lam
		g += w / r
		dg += w / (r * r)
	}
	return g, dg
}

// bltCheckParticipation validates a horizon T, a cap k on participations
// and their minimum separation b, and returns how many participations fit,
// min(k, ⌈T/b⌉).
func bltCheckParticipation(T, k, b int) (int, error) {
	if T < 1 || k < 1 || b < 1 {
		return 0, fmt.Errorf("%w: T = %d, k = %d, b = %d, want each at least 1", ErrInvalid, T, k, b)
	}
	return min(k, (T-1)/b+1), nil
}

// bltLemmaApplies reports whether c_0, …, c_(T−1) are non-negative and
// c_1, …, c_(T−1) non-increasing, the condition under which participating
// as early as possible is worst (see Sensitivity).
func (c BLT) bltLemmaApplies(T int) bool {
	nonneg := true
	for _, w := range c.Omega {
		nonneg = nonneg && w >= 0
	}
	if nonneg {
		// c_k, k ≥ 1, is then a non-negative mixture of decreasing
		// geometric sequences.
		return true
	}
	pow := make([]float64, len(c.Theta))
	for i := range pow {
		pow[i] = 1
	}
	prev := math.Inf(1)
	for k := 1; k < T; k++ {
		var s float64
		for i, w := range c.Omega {
			s += w * pow[i]
			pow[i] *= c.Theta[i]
		}
		if s < 0 || s > prev {
			return false
		}
		prev = s
	}
	return true
}

// bltMaxEnumeration bounds the work, patterns × T, of the exact
// sensitivity of a BLT the lemma does not cover.
const bltMaxEnumeration = 1 << 26

// Sensitivity is the L2 sensitivity of C·x under (k, b)-participation with
// add/remove-one-device adjacency and clip norm 1: the largest
// ‖Σ_(j∈π) C[:, j]·g_jᵀ‖_F over patterns π of at most k rounds in [0, T),
// pairwise at least b apart, and contributions ‖g_j‖ ≤ 1. Multiply by the
// clip norm for other norms.
//
// Where CᵀC has no negative entry, equal contributions are worst and the
// sensitivity is max_π ‖Σ_(j∈π) C[:, j]‖ (Choquette-Choo, McMahan, Rush,
// Thakurta 2023, "Multi-Epoch Matrix Factorization Mechanisms for Private
// Machine Learning"). Where moreover C's coefficients are non-negative and
// non-increasing, the maximum is attained by participating as early and as
// often as allowed, π = {0, b, 2b, …} with min(k, ⌈T/b⌉) rounds (Kalinin,
// Lampert 2024, "Banded Square Root Matrix Factorization for
// Differentially Private Model Training", arXiv:2405.13763, Theorem 2;
// used for BLTs by McMahan, Xu, Zhang 2024). The proof needs less, and
// this package uses less: c_k ≥ 0 for all k and c_1 ≥ c_2 ≥ … (c_0 free),
// which every BLT with non-negative weights meets. For i < j,
// (CᵀC)_ij = Σ_(s=0)^(T−1−j) c_s·c_(s+j−i) is non-increasing in j − i ≥ 1
// (c_0 enters only as a multiplier) and in j, the diagonal is
// non-increasing in j, and moving the r-th participation of any pattern to
// (r−1)·b shrinks every pairwise distance and every index, while adding a
// participation adds non-negative terms. That case costs O(T·d) time and
// O(d) memory; the tests check it against every pattern for T ≤ 12.
//
// Otherwise Sensitivity is exact by other means: with k = 1 (or room for
// one round only) it is ‖C[:, 0]‖; else, when every coefficient is
// non-negative (so is CᵀC), it enumerates every pattern, refusing with
// ErrInvalid when that would take more than about 2²⁶ steps
// (T·patterns). A negative coefficient c_j makes (CᵀC)_(T−1−j, T−1) = c_j
// negative, and the sensitivity a semidefinite program this package does
// not solve: refused with ErrInvalid.
func (c BLT) Sensitivity(T, k, b int) (float64, error) {
	sq, err := c.sensitivitySq(T, k, b)
	if err != nil {
		return 0, fmt.Errorf("dp: blt sensitivity: %w", err)
	}
	return math.Sqrt(sq), nil
}

func (c BLT) sensitivitySq(T, k, b int) (float64, error) {
	if err := c.validate(); err != nil {
		return 0, err
	}
	m, err := bltCheckParticipation(T, k, b)
	if err != nil {
		return 0, err
	}
	s := make([]float64, len(c.Theta))
	if m == 1 || c.bltLemmaApplies(T) {
		return bltEarlySensSq(c.Theta, c.Omega, T, m, b, s), nil
	}
	return c.bltEnumerateSensSq(T, m, b)
}

// bltEarlySensSq is ‖C·u‖² for u the indicator of 0, b, …, (m−1)·b,
// streamed through C's buffers (McMahan, Xu, Zhang 2024, Alg. 2). s is
// scratch of length d.
func bltEarlySensSq(theta, omega []float64, T, m, b int, s []float64) float64 {
	clear(s)
	last := (m - 1) * b
	var sq float64
	for t := 0; t < T; t++ {
		var u float64
		if t <= last && t%b == 0 {
			u = 1
		}
		y := u
		for i, w := range omega {
			y += w * s[i]
			s[i] = theta[i]*s[i] + u
		}
		sq += y * y
	}
	return sq
}

// bltEnumerateSensSq is the exact sensitivity² for m ≥ 2 participations
// when the lemma does not apply.
func (c BLT) bltEnumerateSensSq(T, m, b int) (float64, error) {
	if T > bltMaxEnumeration/T {
		return 0, fmt.Errorf("%w: C's coefficients are not non-negative and non-increasing after c_0, and T = %d is too long to enumerate participation patterns", ErrInvalid, T)
	}
	coef := c.coefficients(T)
	for j, v := range coef {
		if v < 0 {
			// (CᵀC)_(T−1−j, T−1) = c_0·c_j: opposite contributions in those
			// two rounds are worse than equal ones.
			return 0, fmt.Errorf("%w: C has the negative coefficient c_%d = %v, so CᵀC has a negative entry and the sensitivity is a semidefinite program", ErrInvalid, j, v)
		}
	}
	if patterns := bltCountPatterns(T, m, b, bltMaxEnumeration/T); patterns > bltMaxEnumeration/T {
		return 0, fmt.Errorf("%w: C's coefficients are not non-negative and non-increasing after c_0, and T = %d, %d participations %d apart give more than %d participation patterns to enumerate", ErrInvalid, T, m, b, bltMaxEnumeration/T)
	}
	e := bltEnum{coef: coef, T: T, m: m, b: b, levels: make([][]float64, m+1)}
	for i := range e.levels {
		e.levels[i] = make([]float64, T)
	}
	e.walk(0, 0)
	return e.best, nil
}

// bltCountPatterns counts the non-empty patterns of at most m rounds in
// [0, T) pairwise at least b apart, saturating just past limit. After
// step r, prev[s] counts those of at most r rounds that start at s or
// later: either they skip s, or they take s and continue from s + b.
func bltCountPatterns(T, m, b, limit int) int {
	prev := make([]int, T+1)
	cur := make([]int, T+1)
	for r := 1; r <= m; r++ {
		cur[T] = 0
		for s := T - 1; s >= 0; s-- {
			v := cur[s+1] + 1
			if s+b < T {
				v += prev[s+b]
			}
			cur[s] = min(v, limit+1)
		}
		if cur[0] > limit {
			return cur[0]
		}
		prev, cur = cur, prev
	}
	return prev[0]
}

// bltEnum walks every participation pattern depth-first, keeping the sum
// of the chosen columns of C for each depth.
type bltEnum struct {
	coef    []float64
	T, m, b int
	levels  [][]float64
	best    float64
}

func (e *bltEnum) walk(depth, start int) {
	prev, cur := e.levels[depth], e.levels[depth+1]
	for p := start; p < e.T; p++ {
		var sq float64
		for t := 0; t < p; t++ {
			cur[t] = prev[t]
			sq += cur[t] * cur[t]
		}
		for t := p; t < e.T; t++ {
			cur[t] = prev[t] + e.coef[t-p]
			sq += cur[t] * cur[t]
		}
		e.best = math.Max(e.best, sq)
		if depth+1 < e.m && p+e.b < e.T {
			e.walk(depth+1, p+e.b)
		}
	}
}

// MeanSquaredError is the loss FitBLT minimises: sens(C)²·‖A·C⁻¹‖²_F/T,
// the variance of a coordinate of the prefix-sum error, averaged over the
// T rounds, per unit of noise multiplier² and clip norm² (the mean loss
// of McMahan, Xu, Zhang 2024, who also optimise the max-over-rounds one).
// Every round's model is released and used, not only the last, so the
// mean over rounds is the objective; the max variant would weigh only the
// final round's error, since the rows of the Toeplitz A·C⁻¹ grow with t.
// The error term is streamed through C⁻¹ in O(T·d); the sensitivity is
// Sensitivity's.
func (c BLT) MeanSquaredError(T, k, b int) (float64, error) {
	sq, err := c.sensitivitySq(T, k, b)
	if err != nil {
		return 0, fmt.Errorf("dp: blt mean squared error: %w", err)
	}
	return sq * bltMeanError(c.Theta, c.Omega, T, make([]float64, len(c.Theta))), nil
}

// bltMeanError is ‖A·C⁻¹‖²_F/T. The impulse response of C⁻¹ streamed
// through C's own buffers gives its coefficients c'_s; A·C⁻¹ is Toeplitz
// with coefficients r_s = c'_0 + … + c'_s, and r_s appears in T − s rows.
func bltMeanError(theta, omega []float64, T int, s []float64) float64 {
	clear(s)
	var r, acc float64
	for t := 0; t < T; t++ {
		var w float64
		if t == 0 {
			w = 1
		}
		for i, om := range omega {
			w -= om * s[i]
		}
		for i, th := range theta {
			s[i] = th*s[i] + w
		}
		r += w
		acc += float64(T-t) * r * r
	}
	return acc / float64(T)
}

// ZCDP returns the ρ of ρ-zCDP of the BLT mechanism over T rounds under
// (k, b)-participation when the noise z_t has standard deviation
// z·clipNorm: the Gaussian mechanism's ρ = Δ²/(2z²) (Bun, Steinke 2016,
// Proposition 1.6) with Δ the Sensitivity. It composes over all T rounds
// at once: the whole stream is one Gaussian mechanism on C·x. Convert with
// EpsilonFromZCDP. No amplification by sampling is claimed.
func (c BLT) ZCDP(z float64, T, k, b int) (rho float64, err error) {
	if err := checkPositive("noise multiplier", z); err != nil {
		return 0, fmt.Errorf("dp: blt zcdp: %w", err)
	}
	sq, err := c.sensitivitySq(T, k, b)
	if err != nil {
		return 0, fmt.Errorf("dp: blt zcdp: %w", err)
	}
	return sq / (2 * z * z), nil
}

// bltMaxFitBuffers bounds FitBLT's buffers: the optimiser's simplex has
// 2d+1 vertices, and beyond a few buffers the loss stops improving.
const bltMaxFitBuffers = 8

// Nelder–Mead budget and tolerances for FitBLT, in evaluations of the
// O(T·d) loss and in its logarithm.
const (
	bltFitEvalsPerDim = 600
	bltFitTolerance   = 1e-10
	bltFitRestarts    = 8
	bltFitRuns        = 2
)

// FitBLT chooses a BLT with the given number of buffers (1 to 8) for T
// rounds under (k, b)-participation by minimising MeanSquaredError, the
// loss McMahan, Xu, Zhang 2024 optimise (with L-BFGS and penalties; here
// derivative-free).
//
// The optimiser is Nelder–Mead with the dimension-adapted coefficients of
// Gao and Han 2012, restarted from its best point until restarts stop
// paying, on the unconstrained parameters θ_i = sigmoid(x_i) and
// ω_i = softplus(y_i). Points with Σ ω_i > 1 get infinite loss: that keeps
// c_1 ≤ c_0 as in the papers and every decay of C⁻¹ above −1, since
// Σ ω_i/(1 + θ_i) < 1 (see Inverse). The first buffer starts from
// least-squares fits to the square-root factorisation's coefficients
// c_k = binom(2k, k)/4^k (Fichtenberger, Henzinger, Upadhyay 2023, near
// optimal among Toeplitz strategies for one participation), with decays
// spread geometrically in 1 − θ; each further buffer starts from the same
// fits and from the previous fit plus a light buffer placed between or
// beyond its decays, so more buffers never start worse. Each evaluation
// of the loss streams through C and C⁻¹ in O(T·d). Everything is
// deterministic; T = 2,000 with 4 buffers takes a fraction of a second.
//
// The result lists the largest decay first. Buffers may come out nearly
// equal, or with a decay near 0, when fewer would do.
func FitBLT(T, k, b, buffers int) (BLT, error) {
	m, err := bltCheckParticipation(T, k, b)
	if err != nil {
		return BLT{}, fmt.Errorf("dp: fit blt: %w", err)
	}
	if buffers < 1 || buffers > bltMaxFitBuffers {
		return BLT{}, fmt.Errorf("dp: fit blt: %w: %d buffers, want 1 to %d", ErrInvalid, buffers, bltMaxFitBuffers)
	}
	var best []float64
	for d := 1; d <= buffers; d++ {
		loss := bltFitLoss(T, m, b, d)
		starts := bltFitStarts(T, b, d)
		if best != nil {
			starts = append(starts, bltFitGrow(best, T)...)
		}
		vals := make([]float64, len(starts))
		order := make([]int, len(starts))
		for i, x := range starts {
			vals[i], order[i] = loss(x), i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(vals[a], vals[b]) })
		best = nil
		bestLoss := math.Inf(1)
		for _, i := range order[:min(bltFitRuns, len(order))] {
			if math.IsInf(vals[i], 1) {
				break
			}
			x, v := bltFitRun(loss, starts[i], vals[i], bltFitEvalsPerDim*2*d)
			if v < bestLoss {
				best, bestLoss = x, v
			}
		}
		if best == nil {
			return BLT{}, fmt.Errorf("dp: fit blt: %w: no feasible starting point for T = %d, %d buffers", ErrInvalid, T, d)
		}
	}
	d := buffers
	out := BLT{Theta: make([]float64, d), Omega: make([]float64, d)}
	for i := 0; i < d; i++ {
		out.Theta[i] = 1 / (1 + math.Exp(-best[i]))
		out.Omega[i] = bltSoftplus(best[d+i])
	}
	// Largest decay first, so equal fits print alike.
	idx := make([]int, d)
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(out.Theta[b], out.Theta[a]) })
	sorted := BLT{Theta: make([]float64, d), Omega: make([]float64, d)}
	for j, i := range idx {
		sorted.Theta[j], sorted.Omega[j] = out.Theta[i], out.Omega[i]
	}
	if err := sorted.validate(); err != nil {
		return BLT{}, fmt.Errorf("dp: fit blt: %w", err)
	}
	return sorted, nil
}

// bltFitLoss is the logarithm of MeanSquaredError on FitBLT's
// coordinates for d buffers, +Inf where Σ ω_i > 1. The weights are
// positive, so the lemma gives the sensitivity. The logarithm makes the
// simplex's tolerance relative.
func bltFitLoss(T, m, b, d int) func([]float64) float64 {
	theta := make([]float64, d)
	omega := make([]float64, d)
	scratch := make([]float64, d)
	return func(x []float64) float64 {
		var sum float64
		for i := 0; i < d; i++ {
			theta[i] = 1 / (1 + math.Exp(-x[i]))
			omega[i] = bltSoftplus(x[d+i])
			if !(theta[i] > 0 && theta[i] < 1) {
				return math.Inf(1)
			}
			sum += omega[i]
		}
		if !(sum <= 1) {
			return math.Inf(1)
		}
		v := bltEarlySensSq(theta, omega, T, m, b, scratch) * bltMeanError(theta, omega, T, scratch)
		if !(v > 0) || math.IsInf(v, 0) {
			return math.Inf(1)
		}
		return math.Log(v)
	}
}

// bltFitRun runs Nelder–Mead from x with value v, restarting from the best
// point while a restart still gains: a collapsed simplex is the method's
// usual way of stopping short of a minimum.
func bltFitRun(loss func([]float64) float64, x []float64, v float64, budget int) ([]float64, float64) {
	for r := 0; r < bltFitRestarts && budget > 0; r++ {
		xn, vn, used := bltNelderMead(loss, x, 0.5, budget)
		budget -= used
		gain := v - vn
		if vn < v {
			x, v = xn, vn
		}
		if gain <= bltFitTolerance {
			break
		}
	}
	return x, v
}

// bltFitGrow returns starting points for d+1 buffers from a fit x with d:
// the same buffers plus one with a small weight, its decay placed between
// two existing ones or beyond either end (geometric means in 1 − θ).
func bltFitGrow(x []float64, T int) [][]float64 {
	d := len(x) / 2
	gaps := make([]float64, d)
	var sum float64
	for i := 0; i < d; i++ {
		gaps[i] = 1 / (1 + math.Exp(x[i]))
		sum += bltSoftplus(x[d+i])
	}
	slices.Sort(gaps)
	cands := []float64{math.Max(gaps[0]/4, 1/(4*float64(max(T, 1)))), math.Min(gaps[d-1]*4, 0.95)}
	for i := 1; i < d; i++ {
		cands = append(cands, math.Sqrt(gaps[i-1]*gaps[i]))
	}
	const w = 0.02
	shrink := 1.0
	if sum+w > 1 {
		shrink = (1 - w) / sum
	}
	var out [][]float64
	for _, g := range cands {
		y := make([]float64, 2*d+2)
		copy(y, x[:d])
		y[d] = math.Log((1 - g) / g)
		for i := 0; i < d; i++ {
			y[d+1+i] = bltSoftplusInv(bltSoftplus(x[d+i]) * shrink)
		}
		y[2*d+1] = bltSoftplusInv(w)
		out = append(out, y)
	}
	return out
}

func bltSoftplus(y float64) float64 {
	if y > 30 {
		return y
	}
	return math.Log1p(math.Exp(y))
}

func bltSoftplusInv(w float64) float64 {
	if w > 30 {
		return w
	}
	return math.Log(math.Expm1(w))
}

// bltFitStarts returns FitBLT's candidate starting points in the
// unconstrained coordinates: least-squares fits of d geometric sequences
// with fixed decays to the square-root factorisation's coefficients, the
// decays spread geometrically in 1 − θ from 1/T (the horizon) or 1/b (the
// separation, which matters more with several participations) up to 1/2
// or 0.9. Weights are then made positive and scaled to Σ ω_i ≤ 0.99.
func bltFitStarts(T, b, d int) [][]float64 {
	n := max(T, 2)
	target := make([]float64, n)
	target[0] = 1
	for k := 1; k < n; k++ {
		target[k] = target[k-1] * float64(2*k-1) / float64(2*k)
	}
	ranges := [][2]float64{{1 / float64(n), 0.5}, {1 / float64(n), 0.9}}
	if b >= 4 && b < n {
		ranges = append(ranges, [2]float64{1 / float64(b), 0.5})
	}
	var starts [][]float64
	for _, rg := range ranges {
		theta := make([]float64, d)
		for i := 0; i < d; i++ {
			frac := 0.5
			if d > 1 {
				frac = float64(i) / float64(d-1)
			}
			gap := rg[0] * math.Pow(rg[1]/rg[0], frac)
			theta[i] = 1 - gap
		}
		omega := bltFitWeights(theta, target)
		var sum float64
		for i := range omega {
			omega[i] = math.Max(omega[i], 1e-6)
			sum += omega[i]
		}
		if sum > 0.99 {
			for i := range omega {
				omega[i] *= 0.99 / sum
			}
		}
		x := make([]float64, 2*d)
		for i := 0; i < d; i++ {
			x[i] = math.Log(theta[i] / (1 - theta[i]))
			x[d+i] = bltSoftplusInv(omega[i])
		}
		starts = append(starts, x)
	}
	return starts
}

// bltFitWeights solves min_ω Σ_(k≥1) (target_k − Σ_i ω_i θ_i^(k−1))² by
// its normal equations, which are d×d and well enough conditioned for
// decays spread geometrically.
func bltFitWeights(theta, target []float64) []float64 {
	d := len(theta)
	g := mat.NewDense(d, d, nil)
	rhs := mat.NewVecDense(d, nil)
	pow := make([]float64, d)
	for i := range pow {
		pow[i] = 1
	}
	for k := 1; k < len(target); k++ {
		for i := 0; i < d; i++ {
			rhs.SetVec(i, rhs.AtVec(i)+pow[i]*target[k])
			for l := 0; l < d; l++ {
				g.Set(i, l, g.At(i, l)+pow[i]*pow[l])
			}
		}
		for i := range pow {
			pow[i] *= theta[i]
		}
	}
	var w mat.VecDense
	if err := w.SolveVec(g, rhs); err != nil {
		out := make([]float64, d)
		for i := range out {
			out[i] = 0.5 / float64(d)
		}
		return out
	}
	return append([]float64(nil), w.RawVector().Data...)
}

// bltNelderMead minimises f from x0 with an initial simplex of edge step
// along each axis and the adaptive coefficients of Gao and Han 2012
// ("Implementing the Nelder–Mead simplex algorithm with adaptive
// parameters"), which keep it from stalling in a dozen dimensions. It
// returns the best point, its value and the evaluations spent.
func bltNelderMead(f func([]float64) float64, x0 []float64, step float64, maxEval int) ([]float64, float64, int) {
	n := len(x0)
	alpha, beta := 1.0, 1+2/float64(n)
	gamma, delta := 0.75-1/(2*float64(n)), 1-1/float64(n)
	pts := make([][]float64, n+1)
	vals := make([]float64, n+1)
	evals := 0
	eval := func(x []float64) float64 { evals++; return f(x) }
	for i := range pts {
		pts[i] = append([]float64(nil), x0...)
		if i > 0 {
			pts[i][i-1] += step
		}
		vals[i] = eval(pts[i])
	}
	order := make([]int, n+1)
	cen := make([]float64, n)
	xr := make([]float64, n)
	xe := make([]float64, n)
	xc := make([]float64, n)
	at := func(dst []float64, from []float64, t float64) {
		for i := range dst {
			dst[i] = cen[i] + t*(from[i]-cen[i])
		}
	}
	for evals < maxEval {
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(vals[a], vals[b]) })
		best, worst, second := order[0], order[n], order[n-1]
		if vals[worst]-vals[best] <= bltFitTolerance*(1+math.Abs(vals[best])) {
			break
		}
		clear(cen)
		for _, i := range order[:n] {
			for j := range cen {
				cen[j] += pts[i][j]
			}
		}
		for j := range cen {
			cen[j] /= float64(n)
		}
		at(xr, pts[worst], -alpha)
		fr := eval(xr)
		switch {
		case fr < vals[best]:
			at(xe, pts[worst], -alpha*beta)
			if fe := eval(xe); fe < fr {
				copy(pts[worst], xe)
				vals[worst] = fe
			} else {
				copy(pts[worst], xr)
				vals[worst] = fr
			}
			continue
		case fr < vals[second]:
			copy(pts[worst], xr)
			vals[worst] = fr
			continue
		case fr < vals[worst]:
			at(xc, pts[worst], -alpha*gamma)
			if fc := eval(xc); fc <= fr {
				copy(pts[worst], xc)
				vals[worst] = fc
				continue
			}
		default:
			at(xc, pts[worst], gamma)
			if fc := eval(xc); fc < vals[worst] {
				copy(pts[worst], xc)
				vals[worst] = fc
				continue
			}
		}
		for _, i := range order[1:] {
			for j := range pts[i] {
				pts[i][j] = pts[best][j] + delta*(pts[i][j]-pts[best][j])
			}
			vals[i] = eval(pts[i])
		}
	}
	bi := 0
	for i := range vals {
		if vals[i] < vals[bi] {
			bi = i
		}
	}
	return pts[bi], vals[bi], evals
}

// BLTNoise streams the correlated noise of a BLT mechanism: round t's
// share (C⁻¹z)_t of the noise B·z = A·C⁻¹·z, for z_t ~ N(0, std²·I) of
// dimension dim (McMahan, Xu, Zhang 2024, Alg. 3). It solves C·w = z one
// round at a time with C's own d buffers,
//
//	w_t = z_t − Σ_i ω_i·S_i,   S_i ← θ_i·S_i + w_t,
//
// so it holds d vectors of dim float64, and never needs C⁻¹'s parameters
// (which may be complex) or past z: z_t is regenerated from
// DerivedSource(secret, "fleetlearn/dp/blt/<t>").
//
// Its state — the round counter and the buffers — serialises with
// MarshalBinary; the secret does not, and is kept apart (a key store, not
// the state's file). The buffers are exponentially weighted sums of past
// noise: whoever reads them along with the released aggregates removes
// part of the noise, so store the state as confidentially as the secret.
// Persist the state written after Next before releasing the round: a
// server restarted from an older state would add the same noise again to
// a different aggregate, and the difference of the two releases carries
// no noise at all. For the same reason use a fresh secret per task.
//
// The buffer arithmetic converts products explicitly to float64, which
// rules out fused multiply-adds, so it rounds alike on every architecture.
// A BLTNoise is not safe for concurrent use.
type BLTNoise struct {
	theta, omega []float64
	secret       []byte
	macKey       []byte
	dim          int
	std          float64
	round        int
	buf          []float64
	w            []float64
}

// NewBLTNoise returns the noise stream of C = c for vectors of dimension
// dim with per-round standard deviation std = z·clipNorm. secret must hold
// at least 32 bytes. It refuses a BLT whose inverse decays are not all
// inside the unit circle: that noise grows without bound.
func NewBLTNoise(c BLT, secret []byte, dim int, std float64) (*BLTNoise, error) {
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("dp: blt noise: %w", err)
	}
	if len(secret) < 32 {
		return nil, fmt.Errorf("dp: blt noise: %w: a secret of %d bytes, want at least 32", ErrInvalid, len(secret))
	}
	d := len(c.Theta)
	if dim < 1 || dim > math.MaxInt/8/(d+1) {
		return nil, fmt.Errorf("dp: blt noise: %w: dimension %d, want 1 to %d", ErrInvalid, dim, math.MaxInt/8/(d+1))
	}
	if err := checkPositive("noise standard deviation", std); err != nil {
		return nil, fmt.Errorf("dp: blt noise: %w", err)
	}
	if r, err := bltSpectralRadius(c.Theta, c.Omega); err != nil {
		return nil, fmt.Errorf("dp: blt noise: %w", err)
	} else if r >= 1 {
		return nil, fmt.Errorf("dp: blt noise: %w: C⁻¹ has a decay of modulus %v ≥ 1, so its noise grows without bound", ErrInvalid, r)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("fleetlearn/dp/blt/state"))
	return &BLTNoise{
		theta:  slices.Clone(c.Theta),
		omega:  slices.Clone(c.Omega),
		secret: slices.Clone(secret),
		macKey: mac.Sum(nil),
		dim:    dim,
		std:    std,
		buf:    make([]float64, d*dim),
		w:      make([]float64, dim),
	}, nil
}

// bltSpectralRadius is the largest modulus among the eigenvalues of
// Θ − 1ωᵀ, the decays of C⁻¹.
func bltSpectralRadius(theta, omega []float64) (float64, error) {
	d := len(theta)
	if d == 0 {
		return 0, nil
	}
	m := mat.NewDense(d, d, nil)
	for i := 0; i < d; i++ {
		for l := 0; l < d; l++ {
			v := -omega[l]
			if i == l {
				v += theta[i]
			}
			m.Set(i, l, v)
		}
	}
	var eig mat.Eigen
	if !eig.Factorize(m, mat.EigenNone) {
		return 0, fmt.Errorf("%w: the decays of C⁻¹ did not converge", ErrInvalid)
	}
	var r float64
	for _, v := range eig.Values(nil) {
		r = math.Max(r, math.Hypot(real(v), imag(v)))
	}
	return r, nil
}

// Round returns how many rounds of noise have been produced; the next
// call to Next produces round Round()+1.
func (n *BLTNoise) Round() int { return n.round }

// Next adds round t = Round()+1's noise (C⁻¹z)_t to dst, which must have
// the stream's dimension and finite elements, and advances the stream. On
// error nothing changes.
func (n *BLTNoise) Next(dst []float64) error {
	if n == nil || n.secret == nil {
		return fmt.Errorf("dp: blt noise: %w: not made by NewBLTNoise", ErrInvalid)
	}
	if len(dst) != n.dim {
		return fmt.Errorf("dp: blt noise: %w: %d elements, want %d", ErrInvalid, len(dst), n.dim)
	}
	for i, v := range dst {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("dp: blt noise: %w: element %d is %v", ErrInvalid, i, v)
		}
	}
	if n.round == math.MaxInt {
		return fmt.Errorf("dp: blt noise: %w: round counter exhausted", ErrInvalid)
	}
	t := n.round + 1
	src, err := DerivedSource(n.secret, "fleetlearn/dp/blt/"+strconv.Itoa(t))
	if err != nil {
		return fmt.Errorf("dp: blt noise: %w", err)
	}
	w := n.w
	for j := range w {
		w[j] = n.std * src.Normal()
	}
	dim := n.dim
	for i, om := range n.omega {
		s := n.buf[i*dim : (i+1)*dim]
		for j := range w {
			w[j] -= float64(om * s[j])
		}
	}
	for i, th := range n.theta {
		s := n.buf[i*dim : (i+1)*dim]
		for j := range s {
			s[j] = float64(th*s[j]) + w[j]
		}
	}
	for j := range dst {
		dst[j] += w[j]
	}
	n.round = t
	return nil
}

// The serialised state: magic, then little-endian d (uint32), dim, round
// (uint64), std, θ, ω, the d buffers (float64 bits), and an HMAC-SHA-256
// of all that under a key derived from the secret.
const (
	bltStateMagic  = "FLBLT\x00\x00\x01"
	bltStateHeader = len(bltStateMagic) + 4 + 8 + 8 + 8
	bltStateMAC    = sha256.Size
)

// stateLen is the exact length of the receiver's state; n.buf exists, so
// it cannot overflow.
func (n *BLTNoise) stateLen() int {
	d := len(n.theta)
	return bltStateHeader + 16*d + 8*len(n.buf) + bltStateMAC
}

// MarshalBinary serialises the round counter and buffers, together with
// the parameters to check them against and a MAC under the secret. The
// secret itself is not included. See BLTNoise for how to store it.
func (n *BLTNoise) MarshalBinary() ([]byte, error) {
	if n == nil || n.secret == nil {
		return nil, fmt.Errorf("dp: blt noise: %w: not made by NewBLTNoise", ErrInvalid)
	}
	out := make([]byte, 0, n.stateLen())
	out = append(out, bltStateMagic...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(n.theta)))
	out = binary.LittleEndian.AppendUint64(out, uint64(n.dim))
	out = binary.LittleEndian.AppendUint64(out, uint64(n.round))
	out = binary.LittleEndian.AppendUint64(out, math.Float64bits(n.std))
	for _, vs := range [][]float64{n.theta, n.omega, n.buf} {
		for _, v := range vs {
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(v))
		}
	}
	mac := hmac.New(sha256.New, n.macKey)
	mac.Write(out)
	return mac.Sum(out), nil
}

// UnmarshalBinary restores a state written by MarshalBinary into a
// BLTNoise made by NewBLTNoise with the same BLT, secret, dimension and
// standard deviation, after which Next continues the original stream bit
// for bit. It refuses with ErrInvalid, and leaves the receiver unchanged,
// a state of any other length (checked before anything is read or
// allocated), of another configuration, not written under this secret or
// altered since, or with non-finite buffers.
func (n *BLTNoise) UnmarshalBinary(data []byte) error {
	if n == nil || n.secret == nil {
		return fmt.Errorf("dp: blt noise: %w: unmarshal into a BLTNoise made by NewBLTNoise", ErrInvalid)
	}
	if want := n.stateLen(); len(data) != want {
		return fmt.Errorf("dp: blt noise: %w: a state of %d bytes, want %d", ErrInvalid, len(data), want)
	}
	body, sum := data[:len(data)-bltStateMAC], data[len(data)-bltStateMAC:]
	if !bytes.HasPrefix(body, []byte(bltStateMagic)) {
		return fmt.Errorf("dp: blt noise: %w: not a BLT noise state", ErrInvalid)
	}
	p := body[len(bltStateMagic):]
	d := binary.LittleEndian.Uint32(p)
	dim := binary.LittleEndian.Uint64(p[4:])
	round := binary.LittleEndian.Uint64(p[12:])
	std := binary.LittleEndian.Uint64(p[20:])
	p = p[28:]
	same := int64(d) == int64(len(n.theta)) && dim == uint64(n.dim) && std == math.Float64bits(n.std)
	for _, vs := range [][]float64{n.theta, n.omega} {
		for _, v := range vs {
			same = same && binary.LittleEndian.Uint64(p) == math.Float64bits(v)
			p = p[8:]
		}
	}
	if !same {
		return fmt.Errorf("dp: blt noise: %w: the state is of another BLT, dimension or standard deviation", ErrInvalid)
	}
	mac := hmac.New(sha256.New, n.macKey)
	mac.Write(body)
	if !hmac.Equal(mac.Sum(nil), sum) {
		return fmt.Errorf("dp: blt noise: %w: the state was not written under this secret, or was altered", ErrInvalid)
	}
	if round >= uint64(math.MaxInt) {
		return fmt.Errorf("dp: blt noise: %w: round %d", ErrInvalid, round)
	}
	for i := 0; i < len(n.buf); i++ {
		v := math.Float64frombits(binary.LittleEndian.Uint64(p[8*i:]))
		if math.IsNaN(v) || math.IsInf(v, 0) || (round == 0 && v != 0) {
			return fmt.Errorf("dp: blt noise: %w: buffer element %d is %v at round %d", ErrInvalid, i, v, round)
		}
	}
	for i := range n.buf {
		n.buf[i] = math.Float64frombits(binary.LittleEndian.Uint64(p[8*i:]))
	}
	n.round = int(round)
	return nil
}
