package quant_test

import (
	"fmt"
	"log"
	"math/rand/v2"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
)

func ExampleFeedback() {
	// A device sends the same kind of update every round in 4-bit codes,
	// keeping what each round's rounding lost for the next one.
	const dim, rounds = 10_000, 3
	update := make([]float32, dim)
	for i := range update {
		update[i] = float32(i%13-6) * 0.001
	}
	var fb quant.Feedback
	received := make([]float64, dim)
	for round := range uint64(rounds) {
		enc, _, err := fb.Compress(update, 4, quant.DefaultBlock, rand.NewPCG(42, round))
		if err != nil {
			log.Fatal(err)
		}
		// The device persists its residual between rounds.
		saved, err := fb.MarshalBinary()
		if err != nil {
			log.Fatal(err)
		}
		fb = quant.Feedback{}
		if err := fb.UnmarshalBinary(saved); err != nil {
			log.Fatal(err)
		}
		if round == 0 {
			fmt.Println("bytes sent:", len(enc), "float32 would be:", 4*dim, "residual kept:", len(saved))
		}
		// The receiver decodes for the model's dimension.
		q, err := quant.Decode4(enc, dim)
		if err != nil {
			log.Fatal(err) // refuse the device's report
		}
		for i, v := range q.Dequantize() {
			received[i] += float64(v)
		}
	}
	// All it received falls short of rounds·update by the residual alone,
	// which stays under one step, max|update|/7, in every coordinate.
	const step = 0.006 / 7
	e := fb.Residual()
	exact, bounded := true, true
	for i, v := range update {
		miss := received[i] - (rounds*float64(v) - float64(e[i]))
		exact = exact && miss < 1e-8 && miss > -1e-8
		bounded = bounded && e[i] < step && e[i] > -step
	}
	fmt.Println("received = rounds·update − residual:", exact)
	fmt.Println("residual under one step:", bounded)
	// Output:
	// bytes sent: 5173 float32 would be: 40000 residual kept: 40009
	// received = rounds·update − residual: true
	// residual under one step: true
}
