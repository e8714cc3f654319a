package dp_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/seeds"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

var bltUpdate = flag.Bool("blt.update", false, "rewrite the BLT noise states in testdata/blt")

// bltCoef expands a BLT's coefficients with math.Pow, apart from the
// package's multiplicative recurrence.
func bltCoef(theta, omega []float64, n int) []float64 {
	c := make([]float64, n)
	c[0] = 1
	for k := 1; k < n; k++ {
		for i := range theta {
			c[k] += omega[i] * math.Pow(theta[i], float64(k-1))
		}
	}
	return c
}

// bltToeplitzInverse inverts a lower-triangular Toeplitz matrix with
// c_0 = 1 by forward substitution on its first column.
func bltToeplitzInverse(c []float64) []float64 {
	inv := make([]float64, len(c))
	inv[0] = 1
	for n := 1; n < len(c); n++ {
		var s float64
		for j := 1; j <= n; j++ {
			s += c[j] * inv[n-j]
		}
		inv[n] = -s
	}
	return inv
}

// bltColumnSumSq is ‖Σ_(j∈pattern) C[:, j]‖² with C materialised.
func bltColumnSumSq(c []float64, pattern []int) float64 {
	T := len(c)
	var sq float64
	for t := 0; t < T; t++ {
		var y float64
		for _, j := range pattern {
			if j <= t {
				y += c[t-j]
			}
		}
		sq += y * y
	}
	return sq
}

// bltBruteForce returns, for each m = 0, 1, …, the largest
// ‖Σ_(j∈π) C[:, j]‖² over every pattern π of exactly m rounds in [0, T)
// pairwise at least b apart, and one pattern attaining it.
func bltBruteForce(c []float64, b int) (best []float64, arg [][]int) {
	T := len(c)
	best, arg = []float64{0}, [][]int{nil}
	var rec func(pattern []int, next int)
	rec = func(pattern []int, next int) {
		for p := next; p < T; p++ {
			q := append(append([]int(nil), pattern...), p)
			v := bltColumnSumSq(c, q)
			if len(q) == len(best) {
				best, arg = append(best, v), append(arg, q)
			} else if v > best[len(q)] {
				best[len(q)], arg[len(q)] = v, q
			}
			rec(q, p+b)
		}
	}
	rec(nil, 0)
	return best, arg
}

func bltSqrtCoef(n int) []float64 {
	c := make([]float64, n)
	c[0] = 1
	for k := 1; k < n; k++ {
		c[k] = c[k-1] * float64(2*k-1) / float64(2*k)
	}
	return c
}

// bltExplicitLoss is sens²·‖A·C⁻¹‖²_F/T with C⁻¹ inverted explicitly, for
// coefficients that are non-negative and non-increasing (the sensitivity
// is then the early pattern's, checked against brute force elsewhere).
func bltExplicitLoss(c []float64, k, b int) float64 {
	T := len(c)
	var early []int
	for j := 0; j < k && j*b < T; j++ {
		early = append(early, j*b)
	}
	sens := bltColumnSumSq(c, early)
	inv := bltToeplitzInverse(c)
	var r, rowSq, total float64
	for t := 0; t < T; t++ {
		r += inv[t]
		rowSq += r * r // row t of A·C⁻¹ holds r_0 … r_t
		total += rowSq
	}
	return sens * total / float64(T)
}

func bltNonIncreasing(c []float64) bool {
	for i := 1; i < len(c); i++ {
		if c[i] < 0 || c[i] > c[i-1] {
			return false
		}
	}
	return true
}

// bltLemmaHolds: non-negative, and non-increasing from c_1 on.
func bltLemmaHolds(c []float64) bool {
	return c[0] >= 0 && bltNonIncreasing(c[1:])
}

func bltRelClose(a, b, tol float64) bool {
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func bltMustFit(t testing.TB, T, k, b, d int) dp.BLT {
	t.Helper()
	c, err := dp.FitBLT(T, k, b, d)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestBLTRefusesBadInput(t *testing.T) {
	good := dp.BLT{Theta: []float64{0.9}, Omega: []float64{0.3}}
	secret := bytes.Repeat([]byte{7}, 32)
	var errs []error
	for _, c := range []dp.BLT{
		{Theta: []float64{math.NaN()}, Omega: []float64{0.1}},
		{Theta: []float64{0}, Omega: []float64{0.1}},
		{Theta: []float64{1}, Omega: []float64{0.1}},
		{Theta: []float64{1.5}, Omega: []float64{0.1}},
		{Theta: []float64{-0.5}, Omega: []float64{0.1}},
		{Theta: []float64{0.5}, Omega: []float64{math.NaN()}},
		{Theta: []float64{0.5}, Omega: []float64{math.Inf(1)}},
		{Theta: []float64{0.5, 0.4}, Omega: []float64{0.1}},
		{Theta: make([]float64, 65), Omega: make([]float64, 65)},
	} {
		errs = append(errs, c.Validate())
		_, err := c.Sensitivity(10, 1, 1)
		errs = append(errs, err)
		_, _, err = c.Inverse()
		errs = append(errs, err)
		_, err = dp.NewBLTNoise(c, secret, 4, 1)
		errs = append(errs, err)
	}
	for _, tkb := range [][3]int{{0, 1, 1}, {10, 0, 1}, {10, 1, 0}, {-1, 1, 1}} {
		_, err := good.Sensitivity(tkb[0], tkb[1], tkb[2])
		errs = append(errs, err)
		_, err = good.MeanSquaredError(tkb[0], tkb[1], tkb[2])
		errs = append(errs, err)
		_, err = good.ZCDP(1, tkb[0], tkb[1], tkb[2])
		errs = append(errs, err)
		_, err = dp.FitBLT(tkb[0], tkb[1], tkb[2], 2)
		errs = append(errs, err)
	}
	for _, z := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		_, err := good.ZCDP(z, 10, 1, 1)
		errs = append(errs, err)
	}
	for _, d := range []int{0, -1, 9} {
		_, err := dp.FitBLT(10, 1, 1, d)
		errs = append(errs, err)
	}
	_, err := good.Coefficients(0)
	errs = append(errs, err)
	_, err = dp.NewBLTNoise(good, secret[:31], 4, 1)
	errs = append(errs, err)
	for _, dim := range []int{0, -3} {
		_, err = dp.NewBLTNoise(good, secret, dim, 1)
		errs = append(errs, err)
	}
	for _, std := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		_, err = dp.NewBLTNoise(good, secret, 4, std)
		errs = append(errs, err)
	}
	// C⁻¹'s decay θ − ω = −1.2 makes the noise grow geometrically.
	_, err = dp.NewBLTNoise(dp.BLT{Theta: []float64{0.3}, Omega: []float64{1.5}}, secret, 4, 1)
	errs = append(errs, err)
	n, _ := dp.NewBLTNoise(good, secret, 4, 1)
	errs = append(errs, n.Next(make([]float64, 3)), n.Next([]float64{0, math.NaN(), 0, 0}))
	var zero dp.BLTNoise
	errs = append(errs, zero.Next(make([]float64, 4)), zero.UnmarshalBinary(nil))
	_, err = zero.MarshalBinary()
	errs = append(errs, err)
	for i, err := range errs {
		if !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("case %d: err = %v, want ErrInvalid", i, err)
		} else if !strings.HasPrefix(err.Error(), "dp: ") {
			t.Errorf("case %d: %q lacks the package prefix", i, err)
		}
	}
	if n.Round() != 0 {
		t.Errorf("refused Next advanced the stream to round %d", n.Round())
	}
}

func TestBLTCoefficients(t *testing.T) {
	c := dp.BLT{Theta: []float64{0.99, 0.7, 0.2}, Omega: []float64{0.1, 0.25, -0.05}}
	got, err := c.Coefficients(300)
	if err != nil {
		t.Fatal(err)
	}
	want := bltCoef(c.Theta, c.Omega, 300)
	for i := range want {
		if !bltRelClose(got[i], want[i], 1e-12) {
			t.Fatalf("c_%d = %v, want %v", i, got[i], want[i])
		}
	}
	if id, _ := (dp.BLT{}).Coefficients(5); !reflect.DeepEqual(id, []float64{1, 0, 0, 0, 0}) {
		t.Errorf("no buffers: %v, want the identity's column", id)
	}
}

// The inverse's parameters reproduce the explicit inverse of C.
func TestBLTInverseMatchesToeplitzInverse(t *testing.T) {
	const T = 300
	cases := map[string]dp.BLT{
		"one buffer":         {Theta: []float64{0.9}, Omega: []float64{0.3}},
		"fitted T=300 k=1":   bltMustFit(t, T, 1, T, 4),
		"fitted T=300 k=6":   bltMustFit(t, T, 6, 50, 3),
		"negative inv decay": {Theta: []float64{0.95, 0.6, 0.2}, Omega: []float64{0.1, 0.5, 0.3}},
		"merged and dropped": {Theta: []float64{0.8, 0.5, 0.8}, Omega: []float64{0.1, 0, 0.2}},
		"close decays":       {Theta: []float64{0.9, 0.9 + 1e-9, 0.3}, Omega: []float64{0.2, 0.1, 0.2}},
		// Θ − 1ωᵀ = [[0.8, −0.1], [0.2, 0.1]] has eigenvalues 0.77 and 0.13.
		"mixed signs":         {Theta: []float64{0.6, 0.2}, Omega: []float64{-0.2, 0.1}},
		"many buffers":        {Theta: []float64{0.999, 0.99, 0.95, 0.9, 0.7, 0.5, 0.2, 0.05}, Omega: []float64{0.02, 0.05, 0.05, 0.1, 0.1, 0.1, 0.05, 0.02}},
		"weights above one":   {Theta: []float64{0.7, 0.4}, Omega: []float64{0.8, 0.5}},
		"no buffers":          {},
		"decays near 1 and 0": {Theta: []float64{1 - 1e-6, 1e-6}, Omega: []float64{0.1, 0.2}},
	}
	for name, c := range cases {
		th, om, err := c.Inverse()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		want := bltToeplitzInverse(bltCoef(c.Theta, c.Omega, T))
		got := bltCoef(th, om, T)
		for i := range want {
			if !bltRelClose(got[i], want[i], 1e-9) {
				t.Errorf("%s: inverse coefficient %d = %v, want %v (θ' %v, ω' %v)", name, i, got[i], want[i], th, om)
				break
			}
		}
		t.Logf("%s: θ' = %.6g, ω' = %.6g", name, th, om)
	}
	// Θ − 1ωᵀ = [[−1.1, 1], [−2, 1.1]] has eigenvalues ±0.89i.
	if _, _, err := (dp.BLT{Theta: []float64{0.9, 0.1}, Omega: []float64{2, -1}}).Inverse(); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("complex inverse decays: err = %v, want ErrInvalid", err)
	}
}

// Sensitivity equals the maximum over every participation pattern, for
// every T ≤ 12, b ≤ T and k ≤ ⌈T/b⌉; where the coefficients are
// non-negative and non-increasing from c_1 on (c_0 free), the lemma's early
// pattern 0, b, 2b, … attains that maximum, and elsewhere it need not.
func TestBLTSensitivityMatchesBruteForce(t *testing.T) {
	cases := map[string]struct {
		c     dp.BLT
		lemma bool
	}{
		"fitted T=12 k=3 b=4":      {bltMustFit(t, 12, 3, 4, 2), true},
		"fitted T=12 k=1":          {bltMustFit(t, 12, 1, 12, 3), true},
		"fitted T=100 k=4 b=25":    {bltMustFit(t, 100, 4, 25, 4), true},
		"fitted T=1000 k=10 b=100": {bltMustFit(t, 1000, 10, 100, 3), true},
		"one buffer":               {dp.BLT{Theta: []float64{0.9}, Omega: []float64{0.3}}, true},
		"weights sum to one":       {dp.BLT{Theta: []float64{0.99, 0.5}, Omega: []float64{0.5, 0.5}}, true},
		"identity":                 {dp.BLT{}, true},
		"c_1 above c_0":            {dp.BLT{Theta: []float64{0.7}, Omega: []float64{1.5}}, true},
		"two above one":            {dp.BLT{Theta: []float64{0.95, 0.3}, Omega: []float64{0.9, 0.6}}, true},
		"rising, mixed weights":    {dp.BLT{Theta: []float64{0.9, 0.5}, Omega: []float64{0.4, -0.1}}, false},
		"hump":                     {dp.BLT{Theta: []float64{0.95, 0.6}, Omega: []float64{0.5, -0.45}}, false},
		"short hump":               {dp.BLT{Theta: []float64{0.9, 0.3}, Omega: []float64{0.3, -0.25}}, false},
	}
	var beaten []string
	for name, tc := range cases {
		coefAll := bltCoef(tc.c.Theta, tc.c.Omega, 12)
		if bltLemmaHolds(coefAll) != tc.lemma {
			t.Fatalf("%s: coefficients %v, lemma's condition should be %v", name, coefAll, tc.lemma)
		}
		earlyFails := false
		for T := 1; T <= 12; T++ {
			coef := coefAll[:T]
			for b := 1; b <= T; b++ {
				best, arg := bltBruteForce(coef, b)
				K := (T-1)/b + 1
				if len(best) != K+1 {
					t.Fatalf("brute force found patterns of up to %d rounds, want %d", len(best)-1, K)
				}
				var upTo float64
				for k := 1; k <= K; k++ {
					upTo = math.Max(upTo, best[k])
					got, err := tc.c.Sensitivity(T, k, b)
					if err != nil {
						t.Fatalf("%s T=%d k=%d b=%d: %v", name, T, k, b, err)
					}
					if !bltRelClose(got, math.Sqrt(upTo), 1e-9) {
						t.Fatalf("%s T=%d k=%d b=%d: sensitivity %v, brute force %v (pattern %v)", name, T, k, b, got, math.Sqrt(upTo), arg[k])
					}
					var early []int
					for j := 0; j < k; j++ {
						early = append(early, j*b)
					}
					e := bltColumnSumSq(coef, early)
					if tc.lemma && !bltRelClose(e, upTo, 1e-12) {
						t.Fatalf("%s T=%d k=%d b=%d: early pattern gives %v, the maximum %v is at %v", name, T, k, b, e, upTo, arg[k])
					}
					earlyFails = earlyFails || !bltRelClose(e, upTo, 1e-9)
				}
			}
		}
		if !tc.lemma && earlyFails {
			beaten = append(beaten, name)
		}
	}
	if len(beaten) == 0 {
		t.Error("the early pattern was always worst, so the exact fallback went untested")
	}
	t.Logf("BLTs where a later pattern beats the early one: %v", beaten)
}

// Where C has a negative coefficient the worst contributions are not
// equal and the column-sum formula is not the sensitivity: refused, except
// for one participation; enumeration is refused when too long.
func TestBLTSensitivityRefusesWhatItCannotComputeExactly(t *testing.T) {
	neg := dp.BLT{Theta: []float64{0.5}, Omega: []float64{-0.2}}
	if _, err := neg.Sensitivity(10, 2, 3); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("negative coefficients: err = %v, want ErrInvalid", err)
	}
	got, err := neg.Sensitivity(10, 1, 3)
	if want := math.Sqrt(bltColumnSumSq(bltCoef(neg.Theta, neg.Omega, 10), []int{0})); err != nil || !bltRelClose(got, want, 1e-12) {
		t.Errorf("single participation: %v, %v, want %v", got, err, want)
	}
	hump := dp.BLT{Theta: []float64{0.95, 0.6}, Omega: []float64{0.5, -0.45}}
	if _, err := hump.Sensitivity(10000, 3, 2); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("long enumeration: err = %v, want ErrInvalid", err)
	}
	if _, err := hump.Sensitivity(10000, 1, 2); err != nil {
		t.Errorf("single participation needs no enumeration: %v", err)
	}
	// Enumeration stays exact beyond the sizes brute-forced above.
	got, err = hump.Sensitivity(60, 3, 20)
	best, _ := bltBruteForce(bltCoef(hump.Theta, hump.Omega, 60), 20)
	if err != nil || !bltRelClose(got, math.Sqrt(best[3]), 1e-9) {
		t.Errorf("T=60 k=3 b=20: %v, %v, want %v", got, err, math.Sqrt(best[3]))
	}
}

// MeanSquaredError's O(T·d) streams agree with the loss computed from the
// materialised C and its explicit inverse.
func TestBLTMeanSquaredErrorMatchesExplicit(t *testing.T) {
	for _, tc := range []struct {
		c       dp.BLT
		T, k, b int
	}{
		{bltMustFit(t, 200, 4, 50, 3), 200, 4, 50},
		{bltMustFit(t, 200, 1, 200, 2), 200, 1, 200},
		{dp.BLT{Theta: []float64{0.95, 0.5}, Omega: []float64{0.3, 0.2}}, 300, 7, 40},
		{dp.BLT{}, 100, 3, 30},
	} {
		got, err := tc.c.MeanSquaredError(tc.T, tc.k, tc.b)
		if err != nil {
			t.Fatal(err)
		}
		want := bltExplicitLoss(bltCoef(tc.c.Theta, tc.c.Omega, tc.T), tc.k, tc.b)
		if !bltRelClose(got, want, 1e-9) {
			t.Errorf("%v T=%d k=%d b=%d: %v, explicit %v", tc.c, tc.T, tc.k, tc.b, got, want)
		}
	}
	// Independent noise: sens² = k and ‖A‖²_F/T = (T+1)/2.
	if got, _ := (dp.BLT{}).MeanSquaredError(100, 3, 30); !bltRelClose(got, 3*101.0/2, 1e-12) {
		t.Errorf("identity: %v, want %v", got, 3*101.0/2)
	}
}

// The fitted BLT beats independent noise by a wide margin and the
// square-root Toeplitz factorisation by a few percent for one
// participation and by more for several (where the square root's slowly
// decaying columns overlap).
func TestFitBLTAgainstBaselines(t *testing.T) {
	const d = 4
	for _, T := range []int{100, 1000} {
		for _, k := range []int{1, 2, 5, 10} {
			b := T / k
			c := bltMustFit(t, T, k, b, d)
			coef, _ := c.Coefficients(T)
			if !bltNonIncreasing(coef) {
				t.Fatalf("T=%d k=%d: fitted coefficients not non-increasing: %v", T, k, coef[:5])
			}
			blt, err := c.MeanSquaredError(T, k, b)
			if err != nil {
				t.Fatal(err)
			}
			ind, _ := dp.BLT{}.MeanSquaredError(T, k, b)
			sqrt := bltExplicitLoss(bltSqrtCoef(T), k, b)
			t.Logf("T=%4d k=%2d b=%4d: BLT(%d) %8.3f  independent %8.1f (×%.3f)  sqrt-Toeplitz %8.3f (×%.4f)  θ=%.5f ω=%.4f",
				T, k, b, d, blt, ind, blt/ind, sqrt, blt/sqrt, c.Theta, c.Omega)
			if blt > 0.25*ind {
				t.Errorf("T=%d k=%d: BLT %v, independent noise %v", T, k, blt, ind)
			}
			limit := 0.99
			if k > 1 {
				limit = 0.95
			}
			if blt > limit*sqrt {
				t.Errorf("T=%d k=%d: BLT %v, square-root factorisation %v: ratio %v above %v", T, k, blt, sqrt, blt/sqrt, limit)
			}
		}
	}
}

// FitBLT is deterministic, more buffers do not fit worse, and the size the
// brief names (T = 2000, 4 buffers) is fast; its time is logged, not
// asserted.
func TestFitBLTDeterministic(t *testing.T) {
	start := time.Now()
	a := bltMustFit(t, 2000, 4, 500, 4)
	elapsed := time.Since(start)
	b := bltMustFit(t, 2000, 4, 500, 4)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two fits differ: %v and %v", a, b)
	}
	la, _ := a.MeanSquaredError(2000, 4, 500)
	two := bltMustFit(t, 2000, 4, 500, 2)
	l2, _ := two.MeanSquaredError(2000, 4, 500)
	if la > l2*(1+1e-9) {
		t.Errorf("4 buffers %v, 2 buffers %v", la, l2)
	}
	t.Logf("FitBLT(T=2000, k=4, b=500, 4 buffers) took %v: loss %.4f (2 buffers %.4f)", elapsed, la, l2)
}

// Degenerate horizons and separations longer than the horizon still give
// valid BLTs.
func TestFitBLTSmallHorizons(t *testing.T) {
	for _, tkb := range [][4]int{{1, 1, 1, 2}, {2, 5, 1, 3}, {10, 3, 100, 2}, {3, 3, 1, 8}} {
		c, err := dp.FitBLT(tkb[0], tkb[1], tkb[2], tkb[3])
		if err != nil {
			t.Fatalf("%v: %v", tkb, err)
		}
		if err := c.Validate(); err != nil || len(c.Theta) != tkb[3] {
			t.Fatalf("%v: %v, %v", tkb, c, err)
		}
		if _, err := c.MeanSquaredError(tkb[0], tkb[1], tkb[2]); err != nil {
			t.Fatalf("%v: %v", tkb, err)
		}
	}
}

func TestBLTZCDP(t *testing.T) {
	c := bltMustFit(t, 100, 4, 25, 3)
	sens, _ := c.Sensitivity(100, 4, 25)
	rho, err := c.ZCDP(2, 100, 4, 25)
	if err != nil || !bltRelClose(rho, sens*sens/8, 1e-12) {
		t.Errorf("ρ = %v, %v, want %v", rho, err, sens*sens/8)
	}
	rho, _ = dp.BLT{}.ZCDP(2, 100, 4, 25)
	if !bltRelClose(rho, 4.0/8, 1e-12) {
		t.Errorf("independent noise: ρ = %v, want k/(2z²) = 0.5", rho)
	}
}

// bltNoiseZ regenerates round t's z from the documented label.
func bltNoiseZ(t testing.TB, secret []byte, round, dim int, std float64) []float64 {
	t.Helper()
	src, err := dp.DerivedSource(secret, "fleetlearn/dp/blt/"+strconv.Itoa(round))
	if err != nil {
		t.Fatal(err)
	}
	z := make([]float64, dim)
	for j := range z {
		z[j] = std * src.Normal()
	}
	return z
}

// The streamed noise is C⁻¹·z for the z that DerivedSource gives each
// round, computed here by explicit forward substitution.
func TestBLTNoiseMatchesExplicitInverse(t *testing.T) {
	const T, dim, std = 50, 4, 1.7
	secret := []byte("a 32-byte secret for blt tests!!")
	for name, c := range map[string]dp.BLT{
		"fitted":          bltMustFit(t, T, 2, 25, 3),
		"complex inverse": {Theta: []float64{0.9, 0.1}, Omega: []float64{2, -1}},
		"identity":        {},
	} {
		n, err := dp.NewBLTNoise(c, secret, dim, std)
		if err != nil {
			t.Fatal(err)
		}
		coef := bltCoef(c.Theta, c.Omega, T)
		var w [][]float64
		for round := 1; round <= T; round++ {
			base := []float64{1, -2, 0.5, 1e3}
			dst := append([]float64(nil), base...)
			if err := n.Next(dst); err != nil {
				t.Fatal(err)
			}
			if n.Round() != round {
				t.Fatalf("Round() = %d, want %d", n.Round(), round)
			}
			want := bltNoiseZ(t, secret, round, dim, std)
			for j := 0; j < round-1; j++ {
				for i := range want {
					want[i] -= coef[round-1-j] * w[j][i]
				}
			}
			w = append(w, want)
			for i := range want {
				if got := dst[i] - base[i]; !bltRelClose(got, want[i], 1e-9) {
					t.Fatalf("%s round %d element %d: %v, want %v", name, round, i, got, want[i])
				}
			}
		}
	}
}

func bltNoiseStream(t testing.TB, n *dp.BLTNoise, rounds, dim int) [][]float64 {
	t.Helper()
	var out [][]float64
	for r := 0; r < rounds; r++ {
		dst := make([]float64, dim)
		if err := n.Next(dst); err != nil {
			t.Fatal(err)
		}
		out = append(out, dst)
	}
	return out
}

func bltBitsEqual(a, b [][]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		for j := range a[i] {
			if math.Float64bits(a[i][j]) != math.Float64bits(b[i][j]) {
				return false
			}
		}
	}
	return true
}

// A server restarted from a state marshalled mid-stream continues the
// same noise bit for bit.
func TestBLTNoiseResumesBitForBit(t *testing.T) {
	const dim, std = 5, 0.8
	c := bltMustFit(t, 40, 4, 10, 3)
	secret := bytes.Repeat([]byte("restart!"), 4)
	ref, _ := dp.NewBLTNoise(c, secret, dim, std)
	want := bltNoiseStream(t, ref, 30, dim)

	first, _ := dp.NewBLTNoise(c, secret, dim, std)
	got := bltNoiseStream(t, first, 11, dim)
	state, err := first.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	restarted, _ := dp.NewBLTNoise(c, secret, dim, std)
	if err := restarted.UnmarshalBinary(state); err != nil {
		t.Fatal(err)
	}
	if restarted.Round() != 11 {
		t.Fatalf("restored round %d, want 11", restarted.Round())
	}
	again, _ := restarted.MarshalBinary()
	if !bytes.Equal(again, state) {
		t.Fatal("re-marshalled state differs")
	}
	got = append(got, bltNoiseStream(t, restarted, 19, dim)...)
	if !bltBitsEqual(got, want) {
		t.Fatal("the restarted stream differs from the uninterrupted one")
	}
}

// States of another length, configuration or secret, or altered, are
// refused and leave the receiver as it was.
func TestBLTNoiseRefusesForeignState(t *testing.T) {
	const dim, std = 3, 1
	c := dp.BLT{Theta: []float64{0.9, 0.4}, Omega: []float64{0.3, 0.2}}
	secret := bytes.Repeat([]byte{1}, 32)
	src, _ := dp.NewBLTNoise(c, secret, dim, std)
	bltNoiseStream(t, src, 4, dim)
	state, _ := src.MarshalBinary()

	other := func(c dp.BLT, secret []byte, dim int, std float64) []byte {
		n, err := dp.NewBLTNoise(c, secret, dim, std)
		if err != nil {
			t.Fatal(err)
		}
		bltNoiseStream(t, n, 4, dim)
		s, _ := n.MarshalBinary()
		return s
	}
	flipped := append([]byte(nil), state...)
	flipped[len(flipped)-40] ^= 1
	bad := map[string][]byte{
		"empty":         nil,
		"truncated":     state[:len(state)-1],
		"extended":      append(append([]byte(nil), state...), 0),
		"altered":       flipped,
		"other secret":  other(c, bytes.Repeat([]byte{2}, 32), dim, std),
		"other std":     other(c, secret, dim, 2),
		"other dim":     other(c, secret, dim+1, std),
		"other weights": other(dp.BLT{Theta: c.Theta, Omega: []float64{0.3, 0.21}}, secret, dim, std),
		"other buffers": other(dp.BLT{Theta: []float64{0.9}, Omega: []float64{0.3}}, secret, dim, std),
	}
	for name, data := range bad {
		n, _ := dp.NewBLTNoise(c, secret, dim, std)
		bltNoiseStream(t, n, 2, dim)
		before, _ := n.MarshalBinary()
		if err := n.UnmarshalBinary(data); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
		after, _ := n.MarshalBinary()
		if !bytes.Equal(before, after) {
			t.Errorf("%s: a refused state changed the receiver", name)
		}
	}
}

// The fuzz and state tests use this configuration; testdata/blt holds
// states of it (go test -run TestBLTNoiseStateFiles -blt.update rewrites
// them).
var (
	bltFuzzBLT    = dp.BLT{Theta: []float64{0.9, 0.4}, Omega: []float64{0.3, 0.2}}
	bltFuzzSecret = []byte("fleetlearn blt fuzz state secret")
)

const bltFuzzDim, bltFuzzStd = 3, 1.25

func bltFuzzNoise(t testing.TB) *dp.BLTNoise {
	n, err := dp.NewBLTNoise(bltFuzzBLT, bltFuzzSecret, bltFuzzDim, bltFuzzStd)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func bltStateFiles(t testing.TB) map[string][]byte {
	t.Helper()
	return seeds.Read(t, "blt", "*.state")
}

// Valid states in testdata/blt still decode (the format is stable) and
// the others are refused.
func TestBLTNoiseStateFiles(t *testing.T) {
	if *bltUpdate {
		n := bltFuzzNoise(t)
		round0, _ := n.MarshalBinary()
		bltNoiseStream(t, n, 3, bltFuzzDim)
		round3, _ := n.MarshalBinary()
		tampered := append([]byte(nil), round3...)
		tampered[len(tampered)-33] ^= 0x80
		o, _ := dp.NewBLTNoise(bltFuzzBLT, bytes.Repeat([]byte{9}, 32), bltFuzzDim, bltFuzzStd)
		bltNoiseStream(t, o, 3, bltFuzzDim)
		foreign, _ := o.MarshalBinary()
		for name, data := range map[string][]byte{
			"valid-round0.state":   round0,
			"valid-round3.state":   round3,
			"truncated.state":      round3[:len(round3)-5],
			"tampered.state":       tampered,
			"other-secret.state":   foreign,
			"header-only.state":    round3[:36],
			"huge-dimension.state": append(append([]byte(nil), round3[:12]...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f),
			"rewound.state":        append(append([]byte(nil), round0[:28]...), round3[28:]...),
		} {
			if err := os.WriteFile(filepath.Join("testdata", "blt", name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	files := bltStateFiles(t)
	if len(files) < 4 {
		t.Fatalf("%d state files in testdata/blt", len(files))
	}
	for name, data := range files {
		n := bltFuzzNoise(t)
		err := n.UnmarshalBinary(data)
		if strings.HasPrefix(name, "valid-") {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			again, _ := n.MarshalBinary()
			if !bytes.Equal(again, data) {
				t.Errorf("%s: re-marshalled state differs", name)
			}
		} else if !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

// UnmarshalBinary accepts exactly the states MarshalBinary writes for the
// receiver's configuration and secret, never panics, and leaves the
// receiver unchanged when it refuses.
func FuzzBLTNoiseUnmarshal(f *testing.F) {
	for _, data := range bltStateFiles(f) {
		f.Add(data)
	}
	n := bltFuzzNoise(f)
	bltNoiseStream(f, n, 7, bltFuzzDim)
	s, _ := n.MarshalBinary()
	f.Add(s)
	fresh := bltNoiseStream(f, bltFuzzNoise(f), 1, bltFuzzDim)
	f.Fuzz(func(t *testing.T, data []byte) {
		n := bltFuzzNoise(t)
		if err := n.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, dp.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if n.Round() != 0 || !bltBitsEqual(bltNoiseStream(t, n, 1, bltFuzzDim), fresh) {
				t.Fatal("a refused state changed the receiver")
			}
			return
		}
		again, err := n.MarshalBinary()
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("accepted state does not re-marshal to itself: %v", err)
		}
		for _, v := range bltNoiseStream(t, n, 1, bltFuzzDim)[0] {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("noise %v after an accepted state", v)
			}
		}
	})
}

// Over 1,000 rounds in which a device takes part at most 4 times, at least
// 250 rounds apart, a fitted BLT has a larger sensitivity than independent
// noise, so at the same noise multiplier its ε is larger; at the same ε
// its prefix sums (the models) are far more accurate.
func ExampleBLT_ZCDP() {
	const T, k, b, z, delta = 1000, 4, 250, 4.0, 1e-6
	blt, err := dp.FitBLT(T, k, b, 4)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range []struct {
		name string
		c    dp.BLT
	}{{"independent", dp.BLT{}}, {"BLT, 4 buffers", blt}} {
		sens, _ := m.c.Sensitivity(T, k, b)
		rho, _ := m.c.ZCDP(z, T, k, b)
		eps, _, _ := dp.EpsilonFromZCDP(rho, delta, nil)
		fmt.Printf("%-15s sensitivity %.2f  ε = %.2f\n", m.name, sens, eps)
	}
	ind, _ := dp.BLT{}.MeanSquaredError(T, k, b)
	fit, _ := blt.MeanSquaredError(T, k, b)
	fmt.Printf("prefix-sum RMSE at equal ε: %.2f of independent noise's\n", math.Sqrt(fit/ind))
	// Output:
	// independent     sensitivity 2.00  ε = 2.42
	// BLT, 4 buffers  sensitivity 3.64  ε = 4.69
	// prefix-sum RMSE at equal ε: 0.15 of independent noise's
}
