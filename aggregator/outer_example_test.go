package aggregator_test

import (
	"fmt"
	"log"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

func ExampleOuter() {
	// DiLoCo's outer step with the paper's lr 0.7 and Nesterov momentum
	// 0.9: two islands start from theta, each takes its inner steps, and the
	// outer optimizer moves theta along the pseudo-gradient
	// Δ = theta − mean(islands) = [0.3, −0.1].
	outer, err := aggregator.NewOuter(2)
	if err != nil {
		log.Fatal(err)
	}
	theta := []float32{1, 2}
	islands := [][]float32{{0.8, 2.2}, {0.6, 2.0}}
	if err := outer.Step(theta, islands, nil); err != nil { // nil: equal weights
		log.Fatal(err)
	}
	// b = Δ, theta −= 0.7·(Δ + 0.9·b) = 1.33·Δ
	fmt.Printf("theta: %.3f\n", theta)

	// Persist the momentum buffer with theta; a restarted server restores
	// it and continues exactly where it stopped.
	saved, err := outer.MarshalBinary()
	if err != nil {
		log.Fatal(err)
	}
	restored, _ := aggregator.NewOuter(2)
	if err := restored.UnmarshalBinary(saved); err != nil {
		log.Fatal(err)
	}
	fmt.Println("steps:", restored.Steps(), "state bytes:", len(saved))

	// With momentum 0 and lr 1 the outer step is plain averaging.
	plain, _ := aggregator.NewOuter(2, aggregator.WithServerLR(1), aggregator.WithMomentum(0))
	theta = []float32{1, 2}
	if err := plain.Step(theta, islands, []float64{3, 1}); err != nil { // example counts
		log.Fatal(err)
	}
	fmt.Printf("plain: %.2f\n", theta)
	// Output:
	// theta: [0.601 2.133]
	// steps: 1 state bytes: 29
	// plain: [0.75 2.15]
}
