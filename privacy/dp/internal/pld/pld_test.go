package pld

import (
	"errors"
	"math"
	"testing"

	"gonum.org/v1/gonum/dsp/fourier"
)

func epsilonOf(t *testing.T, evs []Event, delta float64) float64 {
	t.Helper()
	e, err := Epsilon(evs, delta, 1e-4)
	if err != nil {
		t.Fatalf("%+v δ=%g: %v", evs, delta, err)
	}
	return e
}

// logSF against the reference's own log Φ̄ (erfc, then a continued
// fraction), across the switch to the asymptotic series at 25.
func TestLogSF(t *testing.T) {
	for z := -12.0; z <= 80; z += 0.37 {
		got, want := logSF(z), refLogSF(z)
		if d := math.Abs(got - want); d > 1e-13*math.Max(1, math.Abs(want)) {
			t.Errorf("logSF(%v) = %.17g, want %.17g", z, got, want)
		}
	}
	for _, z := range []float64{math.Nextafter(25, 0), 25} {
		if got, want := logSF(z), refLogSF(z); math.Abs(got/want-1) > 1e-14 {
			t.Errorf("logSF(%v) = %.17g, want %.17g", z, got, want)
		}
	}
	if v := logSF(1e200); !math.IsInf(v, -1) {
		t.Errorf("logSF(1e200) = %v, want -Inf", v)
	}
}

// The closed forms behind logDelta, logLower and logComp (δ = q·G_μ(w),
// its mirror images and complement) against the hockey-stick divergence computed from the
// mixture densities (which loses a few digits to cancellation in the far
// tail, hence 1e-9).
func TestHockeyStickForms(t *testing.T) {
	for _, q := range []float64{0.001, 0.1, 0.5, 1} {
		for _, s := range []float64{0.5, 1, 3} {
			for _, remove := range []bool{true, false} {
				m := mechanism{q: q, sigma: s, remove: remove}
				r := refMech{q: q, sigma: s, remove: remove}
				for eps := -3.0; eps <= 6; eps += 0.0625 {
					d, g, _, _ := r.curve(eps)
					_, qgt, ple, _ := r.tails(eps)
					comp := ple + math.Exp(eps)*qgt
					for _, c := range []struct {
						name      string
						got, want float64
					}{{"δ", math.Exp(m.logDelta(eps)), d}, {"g", math.Exp(m.logLower(eps)), g}, {"1 − δ", math.Exp(m.logComp(eps)), comp}} {
						if c.want < 1e-250 && c.got < 1e-250 {
							continue
						}
						if math.Abs(c.got-c.want) > 1e-9*c.want+1e-300 {
							t.Errorf("q=%v σ=%v remove=%v ε=%v: %s %.15g, from the densities %.15g", q, s, remove, eps, c.name, c.got, c.want)
						}
					}
				}
			}
		}
	}
}

// Without sampling, events compose into one Gaussian mechanism and the
// result is its closed form, rounded up by at most 1e-9.
func TestGaussianExact(t *testing.T) {
	for _, s := range []float64{0.5, 0.7, 1, 1.3, 3, 10} {
		for _, n := range []int{1, 7, 100, 10000, 100000} {
			for _, d := range []float64{1e-5, 1e-6, 1e-10} {
				want := refGaussEps(math.Sqrt(float64(n))/s, d)
				got := epsilonOf(t, []Event{{Q: 1, Sigma: s, Count: n}}, d)
				if got < want || got > want*(1+1e-9) {
					t.Errorf("σ=%v T=%d δ=%g: ε %.15g, exact %.15g", s, n, d, got, want)
				}
			}
		}
	}
	// σ = 0.5, 10,000 steps, δ = 1e-6: about 20,950.
	if got := epsilonOf(t, []Event{{Q: 1, Sigma: 0.5, Count: 10000}}, 1e-6); math.Abs(got-20949.7) > 0.1 {
		t.Errorf("σ=0.5 T=10000 δ=1e-6: ε %v, want 20949.7", got)
	}
	// μ² adds up: 100/1² + 400/2² = 200 = 200/1².
	got := epsilonOf(t, []Event{{Q: 1, Sigma: 1, Count: 100}, {Q: 1, Sigma: 2, Count: 400}}, 1e-5)
	if want := refGaussEps(math.Sqrt(200), 1e-5); got < want || got > want*(1+1e-9) {
		t.Errorf("two unsampled events: ε %.15g, exact %.15g", got, want)
	}
}

// One sampled step is the exact root of its hockey-stick divergence.
func TestSingleStepExact(t *testing.T) {
	for _, q := range []float64{0.001, 0.01, 0.3, 0.9, 0.999} {
		for _, s := range []float64{0.3, 0.5, 1, 3, 8} {
			for _, d := range []float64{1e-5, 1e-6} {
				want := refSingleStep(q, s, d)
				got := epsilonOf(t, []Event{{Q: q, Sigma: s, Count: 1}}, d)
				if got < want || got > want*(1+1e-9)+1e-15 {
					t.Errorf("q=%v σ=%v δ=%g: ε %.15g, exact %.15g", q, s, d, got, want)
				}
			}
		}
	}
}

// The PLD path itself (connect the dots, FFT, read-off) on one step,
// where the exact answer is known: never below it, and within 0.1%.
func TestDiscretizedSingleStep(t *testing.T) {
	for _, q := range []float64{0.001, 0.1, 0.5, 1} {
		for _, s := range []float64{0.5, 1, 3} {
			if testing.Short() && (s == 0.5 || q >= 0.5) {
				continue
			}
			d := 1e-5
			evs := []Event{{Q: q, Sigma: s, Count: 1}}
			want := refSingleStep(q, s, d)
			if q == 1 {
				want = refGaussEps(1/s, d)
			}
			step := initialStep(evs, 1e-4, d)
			got := 0.0
			for _, remove := range []bool{true, false} {
				e, err := directionEpsilon(evs, d, step, remove, map[int]*fourier.FFT{})
				if err != nil {
					t.Fatal(err)
				}
				got = max(got, e)
			}
			if got < want || got > 1.001*want {
				t.Errorf("q=%v σ=%v δ=%g: discretized ε %.10g, exact %.10g", q, s, d, got, want)
			}
		}
	}
}

// dp_accounting's PLD accountant (pessimistic, value_discretization_interval
// 1e-4), to its four significant digits (±0.5 in the last): at most 0.1%
// above, and not below the true value (exact, or the reference table's
// lower bound).
func TestDPAccountingFigures(t *testing.T) {
	rows := tableRows(t)
	lowerOf := func(q, s float64, n int, d float64) float64 {
		for _, r := range rows {
			if r.q == q && r.sigma == s && r.steps == n && r.delta == d {
				return r.lower
			}
		}
		t.Fatalf("no reference row for q=%v σ=%v T=%d δ=%g", q, s, n, d)
		return 0
	}
	for _, c := range []struct {
		q, sigma float64
		steps    int
		delta    float64
		figure   float64 // dp_accounting, 4 significant digits
		ulp      float64
	}{
		{0.001, 3, 1, 1e-6, 0.001301, 1e-6},
		{0.001, 1.5, 10000, 1e-5, 0.2526, 1e-4},
	} {
		got := epsilonOf(t, []Event{{Q: c.q, Sigma: c.sigma, Count: c.steps}}, c.delta)
		if hi := 1.001 * (c.figure + c.ulp/2); got > hi {
			t.Errorf("q=%v σ=%v T=%d δ=%g: ε %.6g above 1.001 × dp_accounting's %v", c.q, c.sigma, c.steps, c.delta, got, c.figure)
		}
		if lo := lowerOf(c.q, c.sigma, c.steps, c.delta); got < lo {
			t.Errorf("q=%v σ=%v T=%d δ=%g: ε %.10g below the true ε's lower bound %.10g", c.q, c.sigma, c.steps, c.delta, got, lo)
		}
		// The same discretization held at dp_accounting's fixed 1e-4 grid
		// reproduces its figure: the method is the same, and the refined
		// grid is what makes Epsilon tighter.
		evs := []Event{{Q: c.q, Sigma: c.sigma, Count: c.steps}}
		fixed := 0.0
		for _, remove := range []bool{true, false} {
			e, err := directionEpsilon(evs, c.delta, 1e-4, remove, map[int]*fourier.FFT{})
			if err != nil {
				t.Fatal(err)
			}
			fixed = max(fixed, e)
		}
		if math.Abs(fixed-c.figure) > c.ulp/2 {
			t.Errorf("q=%v σ=%v T=%d δ=%g: connect the dots at 1e-4 gives %.6g, dp_accounting %v", c.q, c.sigma, c.steps, c.delta, fixed, c.figure)
		}
	}
}

// A coarse grid loses tightness, never soundness.
func TestCoarseGridStaysAbove(t *testing.T) {
	rows := tableRows(t)
	for _, r := range rows {
		if r.kind != "bracket" || r.delta != 1e-5 || r.steps > 1000 || (testing.Short() && r.steps > 10) {
			continue
		}
		for _, interval := range []float64{1e-2, 0.1} {
			got, err := Epsilon([]Event{{Q: r.q, Sigma: r.sigma, Count: r.steps}}, r.delta, interval)
			if err != nil {
				t.Fatal(err)
			}
			if got < r.lower {
				t.Errorf("q=%g σ=%g T=%d interval %g: ε %.10g below the lower bound %.10g", r.q, r.sigma, r.steps, interval, got, r.lower)
			}
		}
	}
}

// Events merge and compose: identical events are one, nearly identical
// ones compose to nearly the same, and adding an event never lowers ε.
func TestComposition(t *testing.T) {
	a := Event{Q: 0.05, Sigma: 2, Count: 50}
	whole := epsilonOf(t, []Event{{Q: 0.05, Sigma: 2, Count: 100}}, 1e-5)
	if got := epsilonOf(t, []Event{a, a}, 1e-5); got != whole {
		t.Errorf("two halves: ε %v, whole %v", got, whole)
	}
	b := a
	b.Sigma = math.Nextafter(2, 3)
	if got := epsilonOf(t, []Event{a, b}, 1e-5); math.Abs(got/whole-1) > 1e-6 {
		t.Errorf("two halves composed apart: ε %v, whole %v", got, whole)
	}
	sampled := epsilonOf(t, []Event{a}, 1e-5)
	plain := epsilonOf(t, []Event{{Q: 1, Sigma: 10, Count: 20}}, 1e-5)
	both := epsilonOf(t, []Event{a, {Q: 1, Sigma: 10, Count: 20}}, 1e-5)
	if both < max(sampled, plain) || both > sampled+plain {
		t.Errorf("mixed: ε %v, parts %v and %v", both, sampled, plain)
	}
	// A single sampled step among others goes through the composition.
	one := epsilonOf(t, []Event{{Q: 0.1, Sigma: 2, Count: 1}}, 1e-5)
	if got := epsilonOf(t, []Event{{Q: 0.1, Sigma: 2, Count: 1}, {Q: 1, Sigma: 1e6, Count: 1}}, 1e-5); got < one || got > 1.001*one {
		t.Errorf("one step plus a negligible one: ε %v, alone %v", got, one)
	}
	// An unsampled part far wider than the sampled one: at least the
	// Gaussian's exact ε, at most what basic composition allows.
	if testing.Short() {
		return
	}
	gauss := refGaussEps(200, 1e-6)
	wide := epsilonOf(t, []Event{{Q: 0.01, Sigma: 1, Count: 100}, {Q: 1, Sigma: 0.5, Count: 10000}}, 1e-6)
	basic := refGaussEps(200, 5e-7) + epsilonOf(t, []Event{{Q: 0.01, Sigma: 1, Count: 100}}, 5e-7)
	if !(wide >= gauss && wide <= basic) {
		t.Errorf("wide mixed: ε %v, Gaussian alone %v, basic composition %v", wide, gauss, basic)
	}
}

func TestInvalid(t *testing.T) {
	ok := Event{Q: 0.1, Sigma: 1, Count: 1}
	for _, c := range []struct {
		evs      []Event
		delta, h float64
	}{
		{nil, 1e-5, 1e-4},
		{[]Event{ok}, 0, 1e-4},
		{[]Event{ok}, 1, 1e-4},
		{[]Event{ok}, math.NaN(), 1e-4},
		{[]Event{ok}, 1e-5, 0},
		{[]Event{ok}, 1e-5, math.Inf(1)},
		{[]Event{{Q: 0, Sigma: 1, Count: 1}}, 1e-5, 1e-4},
		{[]Event{{Q: 1.5, Sigma: 1, Count: 1}}, 1e-5, 1e-4},
		{[]Event{{Q: 0.1, Sigma: 0, Count: 1}}, 1e-5, 1e-4},
		{[]Event{{Q: 0.1, Sigma: math.Inf(1), Count: 1}}, 1e-5, 1e-4},
		{[]Event{{Q: 0.1, Sigma: 1, Count: 0}}, 1e-5, 1e-4},
	} {
		if _, err := Epsilon(c.evs, c.delta, c.h); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v δ=%v interval=%v: err %v, want ErrInvalid", c.evs, c.delta, c.h, err)
		}
	}
}
