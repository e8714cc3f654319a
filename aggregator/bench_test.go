package aggregator_test

import (
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

const benchDim = 100_000

// BenchmarkAccumulatorAdd measures validating and accumulating one
// 100k-parameter update with a norm bound; MB/s counts update bytes.
func BenchmarkAccumulatorAdd(b *testing.B) {
	ups, _ := randomUpdates(rand.New(rand.NewPCG(1, 1)), 1, benchDim, 1e-3)
	acc := mustAccumulator(b, benchDim, 10)
	b.SetBytes(4 * benchDim)
	for b.Loop() {
		if err := acc.Add(ups[0], 100); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFedAvgRound runs a whole FedAvg round: 1000 reports of 100k
// parameters, the mean and the step. Eight distinct updates are cycled so
// that the benchmark itself does not hold 400 MB.
func BenchmarkFedAvgRound(b *testing.B) {
	benchRound(b, aggregator.FedAvg, 1000)
}

// BenchmarkFedAdamRound is the same round with the server Adam step.
func BenchmarkFedAdamRound(b *testing.B) {
	benchRound(b, aggregator.FedAdam, 1000)
}

// BenchmarkMedianRound: 100 reports of 100k parameters; the robust rules
// keep every update, so rounds are smaller.
func BenchmarkMedianRound(b *testing.B) {
	benchRound(b, aggregator.Median, 100)
}

func benchRound(b *testing.B, kind aggregator.Kind, reports int) {
	ups, ws := randomUpdates(rand.New(rand.NewPCG(2, 2)), 8, benchDim, 1e-3)
	rule := mustRule(b, kind, benchDim)
	global := make([]float32, benchDim)
	b.SetBytes(int64(4 * benchDim * reports))
	for b.Loop() {
		c := mustCollector(b, rule, 10)
		for k := range reports {
			if err := c.Add(ups[k%len(ups)], ws[k%len(ws)]); err != nil {
				b.Fatal(err)
			}
		}
		delta, err := c.Aggregate()
		if err != nil {
			b.Fatal(err)
		}
		if err := rule.Apply(global, delta); err != nil {
			b.Fatal(err)
		}
	}
}
