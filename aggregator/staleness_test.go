package aggregator_test

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

// TestStaleness: a buffer's step is Σ sₖwₖuₖ / Σ wₖ, whether its updates
// are added whole or in pieces, with TotalWeight Σ wₖ; a factor outside
// (0, 1] is refused without touching the buffer.
func TestStaleness(t *testing.T) {
	rule, err := aggregator.NewRule(aggregator.FedAvg, 2)
	if err != nil {
		t.Fatal(err)
	}
	col, err := rule.NewCollector(0)
	if err != nil {
		t.Fatal(err)
	}
	st := aggregator.NewStaleness(col)
	if err := st.Add([]float32{1, 2}, 10, 1); err != nil {
		t.Fatal(err)
	}
	p, err := st.Begin(30, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write([]float32{3}); err != nil {
		t.Fatal(err)
	}
	if err := p.Write([]float32{-1}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []float64{0, -1, 1.5, math.NaN()} {
		if err := st.Add([]float32{100, 100}, 10, s); !errors.Is(err, aggregator.ErrWeight) {
			t.Errorf("factor %v: %v", s, err)
		}
		if _, err := st.Begin(10, s); !errors.Is(err, aggregator.ErrWeight) {
			t.Errorf("factor %v: %v", s, err)
		}
	}
	if st.Count() != 2 || st.TotalWeight() != 40 {
		t.Fatalf("count %d, total weight %v", st.Count(), st.TotalWeight())
	}
	got, err := st.Aggregate()
	if err != nil {
		t.Fatal(err)
	}
	// (10·1·(1, 2) + 30·0.5·(3, −1)) / 40
	want := []float64{(10 + 45) / 40.0, (20 - 15) / 40.0}
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > 1e-6 {
			t.Fatalf("step %v, want %v", got, want)
		}
	}
}
