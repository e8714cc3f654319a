package aggregator_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

func randomUpdates(rng *rand.Rand, n, dim int, scale float64) ([][]float32, []float64) {
	ups := make([][]float32, n)
	ws := make([]float64, n)
	for k := range ups {
		ups[k] = make([]float32, dim)
		for i := range ups[k] {
			ups[k][i] = float32(rng.NormFloat64() * scale)
		}
		ws[k] = float64(1 + rng.IntN(5000))
	}
	return ups, ws
}

func mustAccumulator(t testing.TB, dim int, maxNorm float64) *aggregator.Accumulator {
	t.Helper()
	a, err := aggregator.NewAccumulator(dim, maxNorm)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mean(t testing.TB, a interface{ Mean() ([]float32, error) }) []float32 {
	t.Helper()
	m, err := a.Mean()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func closeTo(t testing.TB, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= tol) {
			t.Fatalf("%s[%d] = %v, want %v (±%g)", what, i, got[i], want[i], tol)
		}
	}
}

func TestAccumulatorHandComputed(t *testing.T) {
	a := mustAccumulator(t, 2, 0)
	if _, err := a.Mean(); !errors.Is(err, aggregator.ErrEmpty) {
		t.Fatalf("Mean of nothing = %v, want ErrEmpty", err)
	}
	// (1·[1, 2] + 3·[5, -2]) / 4 = [4, -1]
	if err := a.Add([]float32{1, 2}, 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Add([]float32{5, -2}, 3); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "mean", mean(t, a), []float32{4, -1}, 0)
	if a.Count() != 2 || a.TotalWeight() != 4 || a.Dim() != 2 {
		t.Errorf("Count, TotalWeight, Dim = %d, %v, %d; want 2, 4, 2", a.Count(), a.TotalWeight(), a.Dim())
	}
	a.Reset()
	if _, err := a.Mean(); !errors.Is(err, aggregator.ErrEmpty) || a.Count() != 0 || a.TotalWeight() != 0 {
		t.Errorf("after Reset: Mean err %v, Count %d, TotalWeight %v", err, a.Count(), a.TotalWeight())
	}
	if err := a.Add([]float32{-2, 8}, 2); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "mean after reset", mean(t, a), []float32{-2, 8}, 0)
}

// TestStreamingEqualsBatch checks the streaming mean against a batch mean
// summed in the other order.
func TestStreamingEqualsBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 17, 300} {
		const dim = 64
		ups, ws := randomUpdates(rng, n, dim, 0.1)
		a := mustAccumulator(t, dim, 0)
		for k := range ups {
			if err := a.Add(ups[k], ws[k]); err != nil {
				t.Fatal(err)
			}
		}
		want := make([]float32, dim)
		for i := range want {
			var s, w float64
			for k := n - 1; k >= 0; k-- {
				s += ws[k] * float64(ups[k][i])
				w += ws[k]
			}
			want[i] = float32(s / w)
		}
		closeTo(t, "streaming mean", mean(t, a), want, 1e-6)
		if a.Count() != n {
			t.Errorf("Count = %d, want %d", a.Count(), n)
		}
	}
}

func TestAddSumEqualsAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const dim, n = 32, 30
	ups, ws := randomUpdates(rng, n, dim, 1)
	one := mustAccumulator(t, dim, 10)
	sums := mustAccumulator(t, dim, 10)
	for _, part := range [][2]int{{0, 1}, {1, 12}, {12, 30}} {
		s := make([]float64, dim)
		var w float64
		for k := part[0]; k < part[1]; k++ {
			if err := one.Add(ups[k], ws[k]); err != nil {
				t.Fatal(err)
			}
			for i, x := range ups[k] {
				s[i] += ws[k] * float64(x)
			}
			w += ws[k]
		}
		if err := sums.AddSum(s, w, part[1]-part[0]); err != nil {
			t.Fatal(err)
		}
	}
	closeTo(t, "AddSum mean", mean(t, sums), mean(t, one), 1e-6)
	if sums.Count() != one.Count() || sums.TotalWeight() != one.TotalWeight() {
		t.Errorf("AddSum count %d weight %v, Add count %d weight %v",
			sums.Count(), sums.TotalWeight(), one.Count(), one.TotalWeight())
	}
	// The two mix.
	if err := sums.Add(ups[0], ws[0]); err != nil {
		t.Fatal(err)
	}
	if err := one.Add(ups[0], ws[0]); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "mixed mean", mean(t, sums), mean(t, one), 1e-6)
}

// TestShardSumsCombine: accumulators that each sum part of the reports,
// read out in pages with WeightedSum and combined with AddSum, give the
// mean one accumulator of every report gives, to float64 rounding.
func TestShardSumsCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const dim, n = 37, 40
	ups, ws := randomUpdates(rng, n, dim, 1)
	one := mustAccumulator(t, dim, 10)
	shards := []*aggregator.Accumulator{mustAccumulator(t, dim, 0), mustAccumulator(t, dim, 0), mustAccumulator(t, dim, 0)}
	for k := range ups {
		if err := one.Add(ups[k], ws[k]); err != nil {
			t.Fatal(err)
		}
		if err := shards[k%len(shards)].Add(ups[k], ws[k]); err != nil {
			t.Fatal(err)
		}
	}
	combined := mustAccumulator(t, dim, 10)
	for _, s := range shards {
		sum := make([]float64, dim)
		for from := 0; from < dim; {
			got := s.WeightedSum(sum[from:min(from+8, dim)], from)
			if got == 0 {
				t.Fatalf("WeightedSum from %d copied nothing", from)
			}
			from += got
		}
		if s.WeightedSum(sum, dim) != 0 || s.WeightedSum(sum, -1) != 0 {
			t.Error("WeightedSum outside [0, dim) copied values")
		}
		if err := combined.AddSum(sum, s.TotalWeight(), s.Count()); err != nil {
			t.Fatal(err)
		}
	}
	closeTo(t, "combined mean", mean(t, combined), mean(t, one), 1e-6)
	if combined.Count() != n {
		t.Errorf("combined count %d, want %d", combined.Count(), n)
	}
}

type snapshot struct {
	mean   []float32
	count  int
	weight float64
}

func snap(t *testing.T, a *aggregator.Accumulator) snapshot {
	return snapshot{mean(t, a), a.Count(), a.TotalWeight()}
}

func (s snapshot) same(o snapshot) bool {
	return slices.Equal(s.mean, o.mean) && s.count == o.count && s.weight == o.weight
}

func TestAccumulatorRefusesBadUpdates(t *testing.T) {
	for _, tc := range badUpdates {
		t.Run(tc.name, func(t *testing.T) {
			a := mustAccumulator(t, 4, 1)
			if err := a.Add([]float32{0.5, -0.25, 0, 0.125}, 3); err != nil {
				t.Fatal(err)
			}
			before := snap(t, a)
			err := a.Add(tc.update, tc.weight)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Add = %v, want %v", err, tc.want)
			}
			if after := snap(t, a); !before.same(after) {
				t.Errorf("refused update changed the accumulator: %+v -> %+v", before, after)
			}
		})
	}
}

func TestAddSumRefusesBadSums(t *testing.T) {
	ok := []float64{1, 2, 3, 0}
	cases := []struct {
		name   string
		sum    []float64
		weight float64
		count  int
		want   error
	}{
		{"short", []float64{1, 2, 3}, 10, 2, aggregator.ErrShape},
		{"long", []float64{1, 2, 3, 4, 5}, 10, 2, aggregator.ErrShape},
		{"NaN", []float64{1, math.NaN(), 3, 0}, 10, 2, aggregator.ErrNonFinite},
		{"Inf", []float64{1, 2, math.Inf(-1), 0}, 10, 2, aggregator.ErrNonFinite},
		{"mean beyond float32", []float64{1, 2, 1e40, 0}, 10, 2, aggregator.ErrNonFinite},
		{"norm over weight×bound", []float64{20, 0, 0, 0}, 10, 2, aggregator.ErrNormBound},
		{"zero weight", ok, 0, 2, aggregator.ErrWeight},
		{"negative weight", ok, -1, 2, aggregator.ErrWeight},
		{"NaN weight", ok, math.NaN(), 2, aggregator.ErrWeight},
		{"zero count", ok, 10, 0, aggregator.ErrWeight},
		{"negative count", ok, 10, -1, aggregator.ErrWeight},
		{"total over MaxWeight", ok, aggregator.MaxWeight, 1, aggregator.ErrWeight},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := mustAccumulator(t, 4, 1)
			if err := a.AddSum([]float64{2, -1, 0, 0.5}, 4, 3); err != nil {
				t.Fatal(err)
			}
			before := snap(t, a)
			if err := a.AddSum(tc.sum, tc.weight, tc.count); !errors.Is(err, tc.want) {
				t.Fatalf("AddSum = %v, want %v", err, tc.want)
			}
			if after := snap(t, a); !before.same(after) {
				t.Errorf("refused sum changed the accumulator: %+v -> %+v", before, after)
			}
		})
	}
}

// TestTotalWeightBound checks that the round's total, not only each weight,
// stays within MaxWeight.
func TestTotalWeightBound(t *testing.T) {
	a := mustAccumulator(t, 1, 0)
	if err := a.Add([]float32{1}, aggregator.MaxWeight-1); err != nil {
		t.Fatal(err)
	}
	if err := a.Add([]float32{1}, 2); !errors.Is(err, aggregator.ErrWeight) {
		t.Fatalf("Add past MaxWeight = %v, want ErrWeight", err)
	}
	if err := a.Add([]float32{3}, 1); err != nil {
		t.Fatalf("Add up to MaxWeight = %v", err)
	}
}

// TestExtremeValuesStayFinite checks that the largest float32 values with
// the largest weights still average to a finite mean.
func TestExtremeValuesStayFinite(t *testing.T) {
	a := mustAccumulator(t, 2, 0)
	for range 4 {
		if err := a.Add([]float32{math.MaxFloat32, -math.MaxFloat32}, aggregator.MaxWeight/4); err != nil {
			t.Fatal(err)
		}
	}
	closeTo(t, "mean", mean(t, a), []float32{math.MaxFloat32, -math.MaxFloat32}, 0)
}

func TestNewAccumulatorRefusesBadConfig(t *testing.T) {
	for _, c := range []struct {
		dim     int
		maxNorm float64
	}{{0, 0}, {-5, 0}, {1 << 40, 0}, {3, -1}, {3, math.NaN()}} {
		if _, err := aggregator.NewAccumulator(c.dim, c.maxNorm); !errors.Is(err, aggregator.ErrConfig) {
			t.Errorf("NewAccumulator(%d, %v) = %v, want ErrConfig", c.dim, c.maxNorm, err)
		}
	}
}
