package dp_test

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// The published figures of TF-Privacy's compute_dp_sgd_privacy and of
// Opacus's RDPAccountant test.
func TestRDPMatchesReferences(t *testing.T) {
	for _, c := range []struct {
		name   string
		q, z   float64
		steps  int
		delta  float64
		orders []float64
		want   float64
	}{
		{"tfp mnist", 0.0025, 1.3, 6000, 1e-5, dp.OrdersTFP(), 0.7242234026109595},
		{"tfp long", 0.001, 1.0, 30000, 1e-7, dp.OrdersTFP(), 1.4154988495444842},
		{"opacus", 0.04, 1.5, 2250, 1e-5, dp.OrdersOpacus(), 7.32911117143},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := dp.Epsilon([]dp.Event{{Q: c.q, NoiseMultiplier: c.z, Steps: c.steps}}, c.delta, dp.WithOrders(c.orders))
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-c.want) > 1e-6*c.want {
				t.Errorf("ε = %.16g, want %.16g", got, c.want)
			}
		})
	}
}

func TestOrderSets(t *testing.T) {
	if n := len(dp.OrdersTFP()); n != 72 {
		t.Errorf("tfp has %d orders, want 72", n)
	}
	if n := len(dp.OrdersOpacus()); n != 151 {
		t.Errorf("opacus has %d orders, want 151", n)
	}
	for _, name := range []string{"tfp", "OPACUS"} {
		if _, err := dp.ParseOrders(name); err != nil {
			t.Error(err)
		}
	}
	if _, err := dp.ParseOrders("dense"); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("unknown order set: %v", err)
	}
}

func eps(t *testing.T, q, z float64, steps int, opts ...dp.Option) float64 {
	t.Helper()
	e, err := dp.Epsilon([]dp.Event{{Q: q, NoiseMultiplier: z, Steps: steps}}, 1e-5, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// ε falls as noise grows and rises with the sampling rate and the number of
// steps, for both accountants.
func TestEpsilonMonotone(t *testing.T) {
	for _, acc := range []dp.Accountant{dp.RDP, dp.PLD} {
		opt := dp.WithAccountant(acc)
		prev := math.Inf(1)
		for _, z := range []float64{0.7, 1, 1.5, 3} {
			e := eps(t, 0.01, z, 200, opt)
			if !(e < prev) {
				t.Errorf("%v: ε(z=%v) = %v, not below %v", acc, z, e, prev)
			}
			prev = e
		}
		prev = 0
		for _, q := range []float64{0.001, 0.01, 0.1, 1} {
			e := eps(t, q, 1.2, 200, opt)
			if !(e > prev) {
				t.Errorf("%v: ε(q=%v) = %v, not above %v", acc, q, e, prev)
			}
			prev = e
		}
		prev = 0
		for _, steps := range []int{1, 10, 100, 1000} {
			e := eps(t, 0.01, 1.2, steps, opt)
			if !(e > prev) {
				t.Errorf("%v: ε(steps=%v) = %v, not above %v", acc, steps, e, prev)
			}
			prev = e
		}
	}
}

// gaussianEpsilon is the exact ε of the composed Gaussian mechanism with
// μ = √T/σ (Balle and Wang 2018): δ(ε) = Φ(μ/2 − ε/μ) − e^ε·Φ(−μ/2 − ε/μ).
func gaussianEpsilon(mu, delta float64) float64 {
	phi := func(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }
	d := func(e float64) float64 { return phi(mu/2-e/mu) - math.Exp(e)*phi(-mu/2-e/mu) }
	lo, hi := 0.0, 1.0
	for d(hi) > delta {
		hi *= 2
	}
	for range 200 {
		if m := (lo + hi) / 2; d(m) > delta {
			lo = m
		} else {
			hi = m
		}
	}
	return hi
}

// Without sampling the exact ε is known: PLD must not go below it (it is an
// upper bound) and should be within 1% above it.
func TestPLDBracketsExactGaussian(t *testing.T) {
	for _, c := range []struct {
		z     float64
		steps int
	}{{1, 1}, {2, 100}, {5, 1000}} {
		want := gaussianEpsilon(math.Sqrt(float64(c.steps))/c.z, 1e-5)
		got := eps(t, 1, c.z, c.steps, dp.WithAccountant(dp.PLD))
		if got < want || got > want*1.01 {
			t.Errorf("z=%v steps=%d: PLD ε %v, exact %v", c.z, c.steps, got, want)
		}
		if r := eps(t, 1, c.z, c.steps); r < got {
			t.Errorf("z=%v steps=%d: RDP ε %v below PLD %v", c.z, c.steps, r, got)
		}
	}
}

// With sampling PLD is tighter than RDP, but not by much.
func TestPLDBelowRDP(t *testing.T) {
	for _, c := range []struct {
		q, z  float64
		steps int
	}{{0.0025, 1.3, 6000}, {0.04, 1.5, 2250}, {0.01, 0.8, 1000}} {
		r := eps(t, c.q, c.z, c.steps)
		p := eps(t, c.q, c.z, c.steps, dp.WithAccountant(dp.PLD))
		if p > r || p < 0.75*r {
			t.Errorf("q=%v z=%v steps=%d: PLD ε %v, RDP ε %v", c.q, c.z, c.steps, p, r)
		}
	}
}

func TestNoiseMultiplier(t *testing.T) {
	for _, acc := range []dp.Accountant{dp.RDP, dp.PLD} {
		z, err := dp.NoiseMultiplier(2, 1e-5, 0.01, 1000, dp.WithAccountant(acc))
		if err != nil {
			t.Fatal(err)
		}
		if e := eps(t, 0.01, z, 1000, dp.WithAccountant(acc)); e > 2 {
			t.Errorf("%v: z = %v gives ε %v > 2", acc, z, e)
		}
		if e := eps(t, 0.01, z*(1-3e-4), 1000, dp.WithAccountant(acc)); e <= 2 {
			t.Errorf("%v: z = %v is not the smallest: %v gives ε %v", acc, z, z*(1-3e-4), e)
		}
	}
	if _, err := dp.NoiseMultiplier(1e-4, 1e-9, 1, 1e6); !errors.Is(err, dp.ErrUnreachable) {
		t.Errorf("unreachable target: %v", err)
	}
}

func TestAccountingRejectsBadInput(t *testing.T) {
	ok := dp.Event{Q: 0.01, NoiseMultiplier: 1, Steps: 10}
	for _, c := range []struct {
		name  string
		ev    dp.Event
		delta float64
		opts  []dp.Option
	}{
		{"q zero", dp.Event{Q: 0, NoiseMultiplier: 1, Steps: 1}, 1e-5, nil},
		{"q above one", dp.Event{Q: 1.5, NoiseMultiplier: 1, Steps: 1}, 1e-5, nil},
		{"q NaN", dp.Event{Q: math.NaN(), NoiseMultiplier: 1, Steps: 1}, 1e-5, nil},
		{"sigma zero", dp.Event{Q: 0.1, NoiseMultiplier: 0, Steps: 1}, 1e-5, nil},
		{"sigma negative", dp.Event{Q: 0.1, NoiseMultiplier: -1, Steps: 1}, 1e-5, nil},
		{"sigma NaN", dp.Event{Q: 0.1, NoiseMultiplier: math.NaN(), Steps: 1}, 1e-5, nil},
		{"sigma inf", dp.Event{Q: 0.1, NoiseMultiplier: math.Inf(1), Steps: 1}, 1e-5, nil},
		{"steps zero", dp.Event{Q: 0.1, NoiseMultiplier: 1, Steps: 0}, 1e-5, nil},
		{"delta zero", ok, 0, nil},
		{"delta one", ok, 1, nil},
		{"delta NaN", ok, math.NaN(), nil},
		{"order one", ok, 1e-5, []dp.Option{dp.WithOrders([]float64{1, 2})}},
		{"no orders", ok, 1e-5, []dp.Option{dp.WithOrders(nil)}},
		{"accountant", ok, 1e-5, []dp.Option{dp.WithAccountant(7)}},
		{"discretization", ok, 1e-5, []dp.Option{dp.WithAccountant(dp.PLD), dp.WithDiscretization(0)}},
	} {
		if _, err := dp.Epsilon([]dp.Event{c.ev}, c.delta, c.opts...); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, err := dp.Epsilon(nil, 1e-5); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("no events: %v", err)
	}
	if _, _, err := dp.EpsilonFromRDP([]float64{2, 3}, []float64{1}, 1e-5); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("mismatched lengths: %v", err)
	}
	if _, _, err := dp.EpsilonFromRDP([]float64{2}, []float64{math.NaN()}, 1e-5); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("NaN RDP: %v", err)
	}
	if _, err := dp.RDPCurve(0.1, 1, 1, []float64{0.5}); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("order below one: %v", err)
	}
	if _, err := dp.NoiseMultiplier(-1, 1e-5, 0.1, 10); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("negative target: %v", err)
	}
	if _, err := dp.ParseAccountant("moments"); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("unknown accountant: %v", err)
	}
}

// TestEpsilonFromZCDPTreeFigure: TF-Privacy's single-epoch tree
// aggregation of 1,600 steps at noise 1.13 is 11/(2·1.13²)-zCDP (a tree of
// depth ⌈log₂ 1601⌉ = 11), which its conversion at its orders puts at
// ε ≈ 18.71 for δ = 1e-6.
func TestEpsilonFromZCDPTreeFigure(t *testing.T) {
	eps, _, err := dp.EpsilonFromZCDP(11/(2*1.13*1.13), 1e-6, nil)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(eps-18.7096)/18.7096 > 1e-4 {
		t.Fatalf("ε = %v, want 18.7096", eps)
	}
	if _, _, err := dp.EpsilonFromZCDP(math.NaN(), 1e-6, nil); err == nil {
		t.Error("NaN ρ accepted")
	}
}

// TestDerivedSource: a derived source is a function of its secret and
// label: the same pair repeats its noise, another label or secret does not.
func TestDerivedSource(t *testing.T) {
	secret := make([]byte, 32)
	draw := func(secret []byte, label string) [4]float64 {
		t.Helper()
		s, err := dp.DerivedSource(secret, label)
		if err != nil {
			t.Fatal(err)
		}
		return [4]float64{s.Normal(), s.Normal(), s.Normal(), s.Normal()}
	}
	a := draw(secret, "tree/3/7")
	if draw(secret, "tree/3/7") != a {
		t.Error("the same secret and label gave other noise")
	}
	if draw(secret, "tree/3/8") == a {
		t.Error("another label gave the same noise")
	}
	other := make([]byte, 32)
	other[0] = 1
	if draw(other, "tree/3/7") == a {
		t.Error("another secret gave the same noise")
	}
	if _, err := dp.DerivedSource(secret[:31], "x"); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("a 31-byte secret: %v", err)
	}
}
