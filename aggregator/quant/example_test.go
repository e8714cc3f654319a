package quant_test

import (
	"fmt"
	"log"
	"math/rand/v2"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
)

func ExampleQuantize() {
	// Each island sends its pseudo-gradient θ − θᵢ as int8 codes, with its
	// random source seeded per island and round so the bytes are
	// reproducible.
	const dim = 1000
	theta := make([]float32, dim)
	var sent [][]byte
	for island := range uint64(2) {
		delta := make([]float32, dim)
		for i := range delta {
			delta[i] = float32(i%7-3) * 0.01 * float32(island+1)
		}
		q, err := quant.Quantize(delta, quant.DefaultBlock, rand.NewPCG(island, 1))
		if err != nil {
			log.Fatal(err)
		}
		b, err := q.MarshalBinary()
		if err != nil {
			log.Fatal(err)
		}
		sent = append(sent, b)
	}
	fmt.Println("bytes per island:", len(sent[0]), "float32 would be:", 4*dim)

	// The outer server decodes each for the model's dimension, averages
	// the dequantized pseudo-gradients and takes the outer step.
	var deltas [][]float32
	for _, b := range sent {
		q, err := quant.Decode(b, dim)
		if err != nil {
			log.Fatal(err) // refuse the island's report
		}
		deltas = append(deltas, q.Dequantize())
	}
	mean, err := aggregator.WeightedMean(deltas, []float64{1, 1})
	if err != nil {
		log.Fatal(err)
	}
	outer, _ := aggregator.NewOuter(dim, aggregator.WithServerLR(1), aggregator.WithMomentum(0))
	if err := outer.Apply(theta, mean); err != nil {
		log.Fatal(err)
	}
	// θ − 1.5·[−0.03, −0.02, −0.01, 0] for the first four values, to
	// within a scale step (max|Δ|/127) of each island's quantization.
	fmt.Printf("theta[:4]: %.3f\n", theta[:4])
	// Output:
	// bytes per island: 1029 float32 would be: 4000
	// theta[:4]: [0.045 0.030 0.015 0.000]
}
