package aggregator_test

import (
	"errors"
	"fmt"
	"log"
	"math"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

func ExampleAccumulator() {
	// Three devices report deltas for a 2-parameter model, weighted by
	// their example counts. The norm bound refuses the third.
	acc, err := aggregator.NewAccumulator(2, 1.0)
	if err != nil {
		log.Fatal(err)
	}
	reports := []struct {
		delta    []float32
		examples float64
	}{
		{[]float32{0.2, -0.1}, 30},
		{[]float32{0.6, 0.5}, 10},
		{[]float32{5, 5}, 1000},
	}
	for _, r := range reports {
		if err := acc.Add(r.delta, r.examples); err != nil {
			fmt.Println("refused:", errors.Is(err, aggregator.ErrNormBound), err)
		}
	}
	mean, err := acc.Mean()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reports:", acc.Count(), "examples:", acc.TotalWeight())
	fmt.Printf("mean: %.3f\n", mean)

	// With secure aggregation only Σ examples·delta and Σ examples are
	// revealed; AddSum gives the same mean.
	sec, _ := aggregator.NewAccumulator(2, 1.0)
	if err := sec.AddSum([]float64{30*0.2 + 10*0.6, 30*-0.1 + 10*0.5}, 40, 2); err != nil {
		log.Fatal(err)
	}
	mean, _ = sec.Mean()
	fmt.Printf("secure mean: %.3f\n", mean)
	// Output:
	// refused: true aggregator: add: update norm 7.07107 exceeds bound 1: norm over bound
	// reports: 2 examples: 40
	// mean: [0.300 0.050]
	// secure mean: [0.300 0.050]
}

func ExampleNewRule() {
	// FedAvgM on a 2-parameter model; in the service the kind and options
	// come from the task's AggregationConfig.
	rule, err := aggregator.NewRule(aggregator.FedAvgM, 2,
		aggregator.WithServerLR(1), aggregator.WithMomentum(0.5))
	if err != nil {
		log.Fatal(err)
	}
	global := []float32{1, 1}
	rounds := [][][]float32{
		{{0.1, 0.2}, {0.3, 0.2}},
		{{0.2, 0}, {0.2, float32(math.NaN())}}, // the NaN report is refused
	}
	for i, updates := range rounds {
		c, err := rule.NewCollector(0)
		if err != nil {
			log.Fatal(err)
		}
		for _, u := range updates {
			if err := c.Add(u, 100); err != nil {
				fmt.Println("refused:", err)
			}
		}
		delta, err := c.Aggregate()
		if err != nil {
			log.Fatal(err)
		}
		if err := rule.Apply(global, delta); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("round %d: %d reports, global %.2f\n", i+1, c.Count(), global)
	}

	// Persist the momentum with the model; restore it after a restart.
	state, err := rule.MarshalBinary()
	if err != nil {
		log.Fatal(err)
	}
	restored, _ := aggregator.NewRule(aggregator.FedAvgM, 2,
		aggregator.WithServerLR(1), aggregator.WithMomentum(0.5))
	if err := restored.UnmarshalBinary(state); err != nil {
		log.Fatal(err)
	}
	fmt.Println("state:", len(state), "bytes, steps:", restored.Steps())
	// Output:
	// round 1: 2 reports, global [1.20 1.20]
	// refused: aggregator: add: update[1] = NaN: non-finite value
	// round 2: 1 reports, global [1.50 1.30]
	// state: 26 bytes, steps: 2
}
