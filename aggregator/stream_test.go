package aggregator_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

// cuts splits v at random points, with empty pieces among them.
func cuts(rng *rand.Rand, v []float32) [][]float32 {
	var out [][]float32
	for len(v) > 0 {
		n := rng.IntN(min(len(v), 13) + 1)
		out = append(out, v[:n])
		v = v[n:]
	}
	return out
}

// TestCheckMatchesValidate: a check over any cut of an update decides what
// Validate decides, on the same norm to the bit.
func TestCheckMatchesValidate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dim := range []int{1, 3, 4, 5, 8, 37, 64, 1001} {
		for trial := range 20 {
			v := make([]float32, dim)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			whole := float64(0)
			for _, x := range v {
				whole += float64(x) * float64(x)
			}
			// A bound right at the norm: the two must agree at the edge.
			bound := math.Sqrt(whole) * (0.99999 + 0.00002*float64(trial%2))
			if trial%5 == 0 {
				v[rng.IntN(dim)] = float32(math.Inf(1))
			}
			want := aggregator.Validate(v, 1, aggregator.ValidateOptions{Dim: dim, MaxNorm: bound})
			c, err := aggregator.NewCheck(dim, bound)
			if err != nil {
				t.Fatal(err)
			}
			var got error
			for _, p := range cuts(rng, v) {
				if got = c.Write(p); got != nil {
					break
				}
			}
			if got == nil {
				got = c.Close()
			}
			if (want == nil) != (got == nil) || want != nil && !sameSentinel(want, got) {
				t.Fatalf("dim %d trial %d: Validate %v, Check %v", dim, trial, want, got)
			}
		}
	}
}

func sameSentinel(a, b error) bool {
	for _, s := range []error{aggregator.ErrShape, aggregator.ErrNonFinite, aggregator.ErrNormBound} {
		if errors.Is(a, s) {
			return errors.Is(b, s)
		}
	}
	return false
}

func TestCheckShape(t *testing.T) {
	c, _ := aggregator.NewCheck(4, 0)
	if err := c.Write(make([]float32, 3)); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, aggregator.ErrShape) {
		t.Fatalf("short update: %v, want ErrShape", err)
	}
	if err := c.Write(make([]float32, 2)); !errors.Is(err, aggregator.ErrShape) {
		t.Fatalf("long update: %v, want ErrShape", err)
	}
}

// TestPartMatchesAdd: adding updates in pieces gives the sums Add gives, bit
// for bit, for the mean and the robust rules.
func TestPartMatchesAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const dim = 203
	for _, kind := range []aggregator.Kind{aggregator.FedAvg, aggregator.Median, aggregator.TrimmedMean} {
		rule, err := aggregator.NewRule(kind, dim)
		if err != nil {
			t.Fatal(err)
		}
		whole, _ := rule.NewCollector(0)
		parts, _ := rule.NewCollector(0)
		for k := range 7 {
			v := make([]float32, dim)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			w := float64(k + 1)
			if err := whole.Add(v, w); err != nil {
				t.Fatal(err)
			}
			p, err := parts.Begin(w)
			if err != nil {
				t.Fatal(err)
			}
			for _, piece := range cuts(rng, v) {
				if err := p.Write(piece); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		}
		a, err := whole.Aggregate()
		if err != nil {
			t.Fatal(err)
		}
		b, err := parts.Aggregate()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) || whole.Count() != parts.Count() || whole.TotalWeight() != parts.TotalWeight() {
			t.Fatalf("%v: pieces aggregate differently from whole updates", kind)
		}
	}
}

// TestPartLeftOpen: an update abandoned half-added makes the mean fail
// rather than come out partial; one abandoned before any value is harmless
// ; and a second Part cannot start while one is open.
func TestPartLeftOpen(t *testing.T) {
	acc, err := aggregator.NewAccumulator(4, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := acc.Add([]float32{1, 2, 3, 4}, 1); err != nil {
		t.Fatal(err)
	}
	p, err := acc.Begin(2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acc.Begin(1); !errors.Is(err, aggregator.ErrIncomplete) {
		t.Fatalf("second Begin: %v, want ErrIncomplete", err)
	}
	if err := acc.Add([]float32{1, 1, 1, 1}, 1); !errors.Is(err, aggregator.ErrIncomplete) {
		t.Fatalf("Add while a part is open: %v, want ErrIncomplete", err)
	}
	if err := p.Write([]float32{5, 5}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, aggregator.ErrIncomplete) {
		t.Fatalf("Close after 2 of 4 values: %v, want ErrIncomplete", err)
	}
	if _, err := acc.Mean(); !errors.Is(err, aggregator.ErrIncomplete) {
		t.Fatalf("Mean with half an update in the sum: %v, want ErrIncomplete", err)
	}
	acc.Reset()
	if err := acc.Add([]float32{1, 2, 3, 4}, 1); err != nil {
		t.Fatalf("after Reset: %v", err)
	}
	if _, err := acc.Begin(math.NaN()); !errors.Is(err, aggregator.ErrWeight) {
		t.Fatalf("NaN weight: %v, want ErrWeight", err)
	}
}

// TestMeanInPlace: the in-place mean is Mean's to the bit, and spends the
// accumulator until Reset.
func TestMeanInPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dim := range []int{1, 2, 3, 1000} {
		a, _ := aggregator.NewAccumulator(dim, 0)
		for k := range 3 {
			v := make([]float32, dim)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			if err := a.Add(v, float64(k+1)); err != nil {
				t.Fatal(err)
			}
		}
		want, err := a.Mean()
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.MeanInPlace()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(want, got) {
			t.Fatalf("dim %d: in-place mean differs", dim)
		}
		if err := a.Add(make([]float32, dim), 1); !errors.Is(err, aggregator.ErrIncomplete) {
			t.Fatalf("Add after MeanInPlace: %v, want ErrIncomplete", err)
		}
		a.Reset()
		if err := a.Add(make([]float32, dim), 1); err != nil {
			t.Fatalf("after Reset: %v", err)
		}
	}
}

// TestApplyParts: a model in parts steps as the same model in one slice.
func TestApplyParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const dim = 50
	for _, kind := range []aggregator.Kind{aggregator.FedAvg, aggregator.FedAvgM, aggregator.FedAdam} {
		whole, _ := aggregator.NewRule(kind, dim)
		parts, _ := aggregator.NewRule(kind, dim)
		g := make([]float32, dim)
		d := make([]float32, dim)
		for i := range g {
			g[i], d[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		g2 := slices.Clone(g)
		for range 3 {
			if err := whole.Apply(g, d); err != nil {
				t.Fatal(err)
			}
			if err := parts.ApplyParts([][]float32{g2[:7], g2[7:7], g2[7:40], g2[40:]}, d); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(g, g2) {
			t.Fatalf("%v: parts stepped differently", kind)
		}
		bad := slices.Clone(d)
		bad[45] = float32(math.NaN())
		before := slices.Clone(g2)
		if err := parts.ApplyParts([][]float32{g2[:40], g2[40:]}, bad); !errors.Is(err, aggregator.ErrNonFinite) || !slices.Equal(before, g2) {
			t.Fatalf("%v: NaN in the last part: %v, model changed %v", kind, err, !slices.Equal(before, g2))
		}
	}
}
