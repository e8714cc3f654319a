package aggregator_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

func mustRule(t testing.TB, kind aggregator.Kind, dim int, opts ...aggregator.Option) aggregator.Rule {
	t.Helper()
	r, err := aggregator.NewRule(kind, dim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustCollector(t testing.TB, r aggregator.Rule, maxNorm float64) aggregator.Collector {
	t.Helper()
	c, err := r.NewCollector(maxNorm)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stateVectors decodes the documented state layout: an 18-byte header, then
// dim float32 values per vector.
func stateVectors(t *testing.T, r aggregator.Rule) [][]float32 {
	t.Helper()
	b, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var vecs [][]float32
	for p := b[18:]; len(p) > 0; {
		v := make([]float32, r.Dim())
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(p))
			p = p[4:]
		}
		vecs = append(vecs, v)
	}
	return vecs
}

// TestRulesTwoSteps applies two hand-computed rounds to global = [1, 2] with
// pseudo-gradients Δ₁ = [0.5, -0.2] and Δ₂ = [0.1, 0.01], checking the model
// and the optimizer state after each.
func TestRulesTwoSteps(t *testing.T) {
	deltas := [][]float32{{0.5, -0.2}, {0.1, 0.01}}
	type step struct{ global, m, v []float32 }
	cases := []struct {
		kind  aggregator.Kind
		opts  []aggregator.Option
		steps [2]step
	}{
		// global += 0.5·Δ
		{aggregator.FedAvg, []aggregator.Option{aggregator.WithServerLR(0.5)}, [2]step{
			{global: []float32{1.25, 1.9}},
			{global: []float32{1.3, 1.905}},
		}},
		// m₁ = Δ₁; m₂ = 0.9·m₁ + Δ₂ = [0.55, -0.17]; global += m
		{aggregator.FedAvgM, nil, [2]step{
			{global: []float32{1.5, 1.8}, m: []float32{0.5, -0.2}},
			{global: []float32{2.05, 1.63}, m: []float32{0.55, -0.17}},
		}},
		// η = 0.1, β₁ = 0.9, β₂ = 0.99, τ = 1e-3, v₀ = τ² = 1e-6. Coordinate 0,
		// step 1: m = 0.1·0.5 = 0.05, v = 0.99e-6 + 0.01·0.25 = 0.00250099,
		// global = 1 + 0.1·0.05/(√0.00250099 + 0.001) = 1.09802019012.
		{aggregator.FedAdam, []aggregator.Option{aggregator.WithServerLR(0.1)}, [2]step{
			{[]float32{1.09802019012, 1.90487394832}, []float32{0.05, -0.02}, []float32{0.00250099, 0.00040099}},
			{[]float32{1.20429193477, 1.82372618903}, []float32{0.055, -0.017}, []float32{0.0025759801, 0.0003979801}},
		}},
		// Coordinate 0, step 1: v₀ < Δ², so v = 1e-6 + 0.01·0.25 = 0.002501.
		// Coordinate 1, step 2: v = 0.000401 > Δ² = 1e-4, so v shrinks by
		// 0.01·1e-4 to 0.0004.
		{aggregator.FedYogi, []aggregator.Option{aggregator.WithServerLR(0.1)}, [2]step{
			{[]float32{1.098019998, 1.90487507803}, []float32{0.05, -0.02}, []float32{0.002501, 0.000401}},
			{[]float32{1.20378922877, 1.82392269708}, []float32{0.055, -0.017}, []float32{0.002601, 0.0004}},
		}},
		// Coordinate 0, step 1: v = 1e-6 + 0.25, global = 1 + 0.1·0.05/(0.500001 + 0.001).
		{aggregator.FedAdagrad, []aggregator.Option{aggregator.WithServerLR(0.1)}, [2]step{
			{[]float32{1.00998002, 1.990049875}, []float32{0.05, -0.02}, []float32{0.250001, 0.040001}},
			{[]float32{1.02074527433, 1.98160276828}, []float32{0.055, -0.017}, []float32{0.260001, 0.040101}},
		}},
		// The robust rules apply their aggregate like FedAvg.
		{aggregator.Median, []aggregator.Option{aggregator.WithServerLR(2)}, [2]step{
			{global: []float32{2, 1.6}},
			{global: []float32{2.2, 1.62}},
		}},
		{aggregator.TrimmedMean, nil, [2]step{
			{global: []float32{1.5, 1.8}},
			{global: []float32{1.6, 1.81}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.kind.String(), func(t *testing.T) {
			r := mustRule(t, tc.kind, 2, tc.opts...)
			global := []float32{1, 2}
			for s, want := range tc.steps {
				if err := r.Apply(global, deltas[s]); err != nil {
					t.Fatal(err)
				}
				closeTo(t, "global", global, want.global, 2e-6)
				vecs := stateVectors(t, r)
				if want.m != nil {
					closeTo(t, "m", vecs[0], want.m, 1e-7)
				}
				if want.v != nil {
					closeTo(t, "v", vecs[1], want.v, 1e-7)
				}
				wantVecs := 0
				if want.v != nil {
					wantVecs = 2
				} else if want.m != nil {
					wantVecs = 1
				}
				if len(vecs) != wantVecs {
					t.Errorf("%d state vectors, want %d", len(vecs), wantVecs)
				}
			}
			if r.Steps() != 2 {
				t.Errorf("Steps = %d, want 2", r.Steps())
			}
		})
	}
}

func TestCollectorsHandComputed(t *testing.T) {
	// Five updates of two coordinates; the weights must not matter to the
	// robust rules. Sorted, coordinate 0 is [1 2 3 4 100] and coordinate 1
	// is [-5 0 1 2 10].
	five := [][]float32{{1, 10}, {3, -5}, {2, 0}, {100, 1}, {4, 2}}
	weights := []float64{1, 50, 2, 1000, 3}
	cases := []struct {
		name string
		kind aggregator.Kind
		opts []aggregator.Option
		n    int // first n updates
		want []float32
	}{
		{"median odd", aggregator.Median, nil, 5, []float32{3, 1}},
		{"median even", aggregator.Median, nil, 4, []float32{2.5, 0.5}}, // [1 2 3 100], [-5 0 1 10]
		{"median one", aggregator.Median, nil, 1, []float32{1, 10}},
		{"median two", aggregator.Median, nil, 2, []float32{2, 2.5}},
		{"trimmed 0.2 of 5", aggregator.TrimmedMean, []aggregator.Option{aggregator.WithTrimFraction(0.2)}, 5, []float32{3, 1}},
		{"trimmed 0.25 of 4", aggregator.TrimmedMean, []aggregator.Option{aggregator.WithTrimFraction(0.25)}, 4, []float32{2.5, 0.5}},
		// ⌊0.1·5⌋ = 0: nothing trimmed, the plain unweighted mean.
		{"trimmed 0.1 of 5", aggregator.TrimmedMean, nil, 5, []float32{22, 1.6}},
		{"trimmed 0.49 of 5", aggregator.TrimmedMean, []aggregator.Option{aggregator.WithTrimFraction(0.49)}, 5, []float32{3, 1}},
		{"trimmed 0.4 of 2", aggregator.TrimmedMean, []aggregator.Option{aggregator.WithTrimFraction(0.4)}, 2, []float32{2, 2.5}},
		{"trimmed 0 of 3", aggregator.TrimmedMean, []aggregator.Option{aggregator.WithTrimFraction(0)}, 3, []float32{2, 5.0 / 3}},
		// The FedAvg family weighs: (1·[1 10] + 50·[3 -5] + 2·[2 0]) / 53.
		{"weighted mean", aggregator.FedAdam, nil, 3, []float32{155.0 / 53, -240.0 / 53}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCollector(t, mustRule(t, tc.kind, 2, tc.opts...), 0)
			var total float64
			for k := range tc.n {
				if err := c.Add(five[k], weights[k]); err != nil {
					t.Fatal(err)
				}
				total += weights[k]
			}
			got, err := c.Aggregate()
			if err != nil {
				t.Fatal(err)
			}
			closeTo(t, "aggregate", got, tc.want, 1e-6)
			if c.Count() != tc.n || c.TotalWeight() != total {
				t.Errorf("Count, TotalWeight = %d, %v; want %d, %v", c.Count(), c.TotalWeight(), tc.n, total)
			}
		})
	}
}

// TestRobustToOutlier puts one huge update among ten honest ones: the
// robust rules barely move, the mean is dragged away.
func TestRobustToOutlier(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const dim = 50
	run := func(kind aggregator.Kind) []float32 {
		c := mustCollector(t, mustRule(t, kind, dim), 0)
		for range 10 {
			u := make([]float32, dim)
			for i := range u {
				u[i] = float32(1 + 0.01*rng.NormFloat64())
			}
			if err := c.Add(u, 1); err != nil {
				t.Fatal(err)
			}
		}
		evil := make([]float32, dim)
		for i := range evil {
			evil[i] = 1e6
		}
		if err := c.Add(evil, 1); err != nil {
			t.Fatal(err)
		}
		agg, err := c.Aggregate()
		if err != nil {
			t.Fatal(err)
		}
		return agg
	}
	ones := slices.Repeat([]float32{1}, dim)
	closeTo(t, "median", run(aggregator.Median), ones, 0.05)
	closeTo(t, "trimmed mean", run(aggregator.TrimmedMean), ones, 0.05)
	if m := run(aggregator.FedAvg); m[0] < 1e4 {
		t.Errorf("mean with outlier = %v; the outlier should dominate it", m[0])
	}
}

func TestRobustCollectorsRefuse(t *testing.T) {
	for _, kind := range []aggregator.Kind{aggregator.Median, aggregator.TrimmedMean} {
		if kind.Streaming() {
			t.Errorf("%v.Streaming() = true", kind)
		}
		c := mustCollector(t, mustRule(t, kind, 4), 1)
		if _, err := c.Aggregate(); !errors.Is(err, aggregator.ErrEmpty) {
			t.Errorf("%v: Aggregate of nothing = %v, want ErrEmpty", kind, err)
		}
		if err := c.AddSum([]float64{0, 0, 0, 0}, 1, 1); !errors.Is(err, aggregator.ErrUnsupported) {
			t.Errorf("%v: AddSum = %v, want ErrUnsupported", kind, err)
		}
		// A caller may reuse its buffer: the collector must have copied it.
		buf := []float32{0.5, 0.5, 0, 0}
		if err := c.Add(buf, 2); err != nil {
			t.Fatal(err)
		}
		buf[0] = 0.75
		for _, tc := range badUpdates {
			if err := c.Add(tc.update, tc.weight); !errors.Is(err, tc.want) {
				t.Errorf("%v %s: Add = %v, want %v", kind, tc.name, err, tc.want)
			}
		}
		got, err := c.Aggregate()
		if err != nil {
			t.Fatal(err)
		}
		closeTo(t, kind.String(), got, []float32{0.5, 0.5, 0, 0}, 0)
		if c.Count() != 1 || c.TotalWeight() != 2 {
			t.Errorf("%v: refused updates counted: Count %d, TotalWeight %v", kind, c.Count(), c.TotalWeight())
		}
	}
}

func TestStreamingCollectorAddSum(t *testing.T) {
	for _, kind := range []aggregator.Kind{aggregator.FedAvg, aggregator.FedAvgM, aggregator.FedAdam, aggregator.FedYogi, aggregator.FedAdagrad} {
		if !kind.Streaming() {
			t.Errorf("%v.Streaming() = false", kind)
		}
		c := mustCollector(t, mustRule(t, kind, 2), 0)
		// Devices [1, 0]·2 and [0, 4]·2 summed: [2, 8] with weight 4.
		if err := c.AddSum([]float64{2, 8}, 4, 2); err != nil {
			t.Fatal(err)
		}
		if err := c.Add([]float32{3, 0}, 4); err != nil {
			t.Fatal(err)
		}
		got, err := c.Aggregate()
		if err != nil {
			t.Fatal(err)
		}
		closeTo(t, kind.String(), got, []float32{14.0 / 8, 1}, 1e-7)
		if c.Count() != 3 || c.TotalWeight() != 8 {
			t.Errorf("%v: Count %d TotalWeight %v, want 3, 8", kind, c.Count(), c.TotalWeight())
		}
	}
}

// TestApplyFailureChangesNothing checks that a refused step leaves the model
// and the optimizer state alone, even when earlier coordinates were fine.
func TestApplyFailureChangesNothing(t *testing.T) {
	cases := []struct {
		name          string
		kind          aggregator.Kind
		global, delta []float32
		want          error
		prior         []float32 // a good step before, so there is state to protect
	}{
		{"short global", aggregator.FedAvg, []float32{1, 2}, []float32{1, 2, 3}, aggregator.ErrShape, nil},
		{"short delta", aggregator.FedAdam, []float32{1, 2, 3}, []float32{1, 2}, aggregator.ErrShape, nil},
		{"NaN delta", aggregator.FedAvgM, []float32{1, 2, 3}, []float32{0.1, 0.1, nan}, aggregator.ErrNonFinite, nil},
		{"Inf delta", aggregator.Median, []float32{1, 2, 3}, []float32{0.1, pinf, 0}, aggregator.ErrNonFinite, nil},
		{"NaN global", aggregator.FedYogi, []float32{1, 2, nan}, []float32{0.1, 0.1, 0.1}, aggregator.ErrNonFinite, nil},
		{"overflowing global", aggregator.FedAvg, []float32{1, 2, 3e38}, []float32{0.1, 0.1, 3e38}, aggregator.ErrNonFinite, nil},
		// m = 0.9·3e38 + 3e38 overflows while global + m would not.
		{"overflowing momentum", aggregator.FedAvgM, []float32{0, 0, -3e38}, []float32{0.1, 0.1, 3e38}, aggregator.ErrNonFinite, []float32{0, 0, 3e38}},
		{"overflowing second moment", aggregator.FedAdagrad, []float32{1, 2, 3}, []float32{0.1, 0.1, 1e20}, aggregator.ErrNonFinite, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRule(t, tc.kind, 3)
			prior := tc.prior
			if prior == nil {
				prior = []float32{0.5, -0.5, 0.25}
			}
			if err := r.Apply(make([]float32, 3), prior); err != nil {
				t.Fatal(err)
			}
			state, _ := r.MarshalBinary()
			global := slices.Clone(tc.global)
			if err := r.Apply(global, tc.delta); !errors.Is(err, tc.want) {
				t.Fatalf("Apply = %v, want %v", err, tc.want)
			}
			after, _ := r.MarshalBinary()
			if !bytes.Equal(state, after) || r.Steps() != 1 {
				t.Error("failed Apply changed the optimizer state")
			}
			for i := range global {
				if math.Float32bits(global[i]) != math.Float32bits(tc.global[i]) {
					t.Errorf("failed Apply changed global: %v -> %v", tc.global, global)
				}
			}
		})
	}
}

func TestNewRuleRefusesBadConfig(t *testing.T) {
	W := aggregator.WithServerLR
	cases := []struct {
		name string
		kind aggregator.Kind
		dim  int
		opts []aggregator.Option
	}{
		{"unspecified kind", aggregator.KindUnspecified, 4, nil},
		{"kind 8", aggregator.Kind(8), 4, nil},
		{"negative kind", aggregator.Kind(-1), 4, nil},
		{"zero dim", aggregator.FedAvg, 0, nil},
		{"negative dim", aggregator.FedAvg, -1, nil},
		{"huge dim", aggregator.FedAvg, 1 << 40, nil},
		{"zero lr", aggregator.FedAvg, 4, []aggregator.Option{W(0)}},
		{"negative lr", aggregator.FedAdam, 4, []aggregator.Option{W(-1)}},
		{"NaN lr", aggregator.FedAvg, 4, []aggregator.Option{W(math.NaN())}},
		{"Inf lr", aggregator.FedAvg, 4, []aggregator.Option{W(math.Inf(1))}},
		{"momentum 1", aggregator.FedAvgM, 4, []aggregator.Option{aggregator.WithMomentum(1)}},
		{"negative momentum", aggregator.FedAvgM, 4, []aggregator.Option{aggregator.WithMomentum(-0.1)}},
		{"beta1 1", aggregator.FedAdam, 4, []aggregator.Option{aggregator.WithBeta1(1)}},
		{"beta2 NaN", aggregator.FedYogi, 4, []aggregator.Option{aggregator.WithBeta2(math.NaN())}},
		{"tau 0", aggregator.FedAdagrad, 4, []aggregator.Option{aggregator.WithTau(0)}},
		{"tau negative", aggregator.FedAdam, 4, []aggregator.Option{aggregator.WithTau(-1e-3)}},
		{"tau huge", aggregator.FedAdam, 4, []aggregator.Option{aggregator.WithTau(1e20)}},
		{"trim 0.5", aggregator.TrimmedMean, 4, []aggregator.Option{aggregator.WithTrimFraction(0.5)}},
		{"trim negative", aggregator.TrimmedMean, 4, []aggregator.Option{aggregator.WithTrimFraction(-0.1)}},
		{"trim NaN", aggregator.TrimmedMean, 4, []aggregator.Option{aggregator.WithTrimFraction(math.NaN())}},
	}
	for _, tc := range cases {
		if r, err := aggregator.NewRule(tc.kind, tc.dim, tc.opts...); !errors.Is(err, aggregator.ErrConfig) || r != nil {
			t.Errorf("%s: NewRule = %v, %v; want nil, ErrConfig", tc.name, r, err)
		}
	}
	r := mustRule(t, aggregator.FedAvg, 4, nil, aggregator.WithMomentum(0))
	for _, maxNorm := range []float64{-1, math.NaN()} {
		if _, err := r.NewCollector(maxNorm); !errors.Is(err, aggregator.ErrConfig) {
			t.Errorf("NewCollector(%v) = %v, want ErrConfig", maxNorm, err)
		}
	}
	if _, err := mustRule(t, aggregator.Median, 4).NewCollector(-1); !errors.Is(err, aggregator.ErrConfig) {
		t.Errorf("Median NewCollector(-1) = %v, want ErrConfig", err)
	}
}

// TestDefaultLearningRates checks the defaults by their effect: a unit
// pseudo-gradient moves FedAvg by 1 and FedAdam by about η = 0.01.
func TestDefaultLearningRates(t *testing.T) {
	g := []float32{0}
	if err := mustRule(t, aggregator.FedAvg, 1).Apply(g, []float32{1}); err != nil || g[0] != 1 {
		t.Errorf("FedAvg default step = %v, %v; want 1", g[0], err)
	}
	g[0] = 0
	// m = 0.1, v = 0.99e-6 + 0.01, step = 0.01·0.1/(√v + 0.001)
	want := 0.01 * 0.1 / (math.Sqrt(0.99e-6+0.01) + 0.001)
	if err := mustRule(t, aggregator.FedAdam, 1).Apply(g, []float32{1}); err != nil || math.Abs(float64(g[0])-want) > 1e-7 {
		t.Errorf("FedAdam default step = %v, %v; want %v", g[0], err, want)
	}
}

func TestKindNames(t *testing.T) {
	for k := aggregator.FedAvg; k <= aggregator.TrimmedMean; k++ {
		for _, s := range []string{k.String(), "AGGREGATION_RULE_" + k.String(), "aggregation_rule_" + k.String()} {
			if got, err := aggregator.ParseKind(s); err != nil || got != k {
				t.Errorf("ParseKind(%q) = %v, %v; want %v", s, got, err, k)
			}
		}
	}
	if aggregator.TrimmedMean.String() != "TRIMMED_MEAN" || aggregator.Kind(42).String() != "Kind(42)" {
		t.Errorf("String: %v, %v", aggregator.TrimmedMean, aggregator.Kind(42))
	}
	for _, s := range []string{"", "UNSPECIFIED", "AGGREGATION_RULE_UNSPECIFIED", "fedsgd", "Kind(1)"} {
		if _, err := aggregator.ParseKind(s); !errors.Is(err, aggregator.ErrConfig) {
			t.Errorf("ParseKind(%q) = %v, want ErrConfig", s, err)
		}
	}
}
