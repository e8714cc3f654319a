package dp_test

import (
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// The privacy of 6,000 rounds that each sample 0.25% of devices, with noise
// multiplier 1.3, at δ = 1e-5: TF-Privacy's MNIST figure.
func ExampleEpsilon() {
	eps, err := dp.Epsilon([]dp.Event{{Q: 0.0025, NoiseMultiplier: 1.3, Steps: 6000}}, 1e-5)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("ε = %.4f\n", eps)
	// Output: ε = 0.7242
}

// A server checks each round against the task's budget before running it.
func ExampleBudget() {
	b, _ := dp.NewBudget(3, 1e-5)
	for {
		if _, err := b.Spend(1, 6); err != nil {
			fmt.Println(err)
			break
		}
	}
	eps, _ := b.Spent()
	fmt.Printf("%d rounds, ε = %.3f\n", b.Rounds(), eps)
	// Output:
	// dp: budget: privacy budget exceeded: round would reach ε 3.093, target 3
	// 16 rounds, ε = 2.992
}

// Devices encode their updates for secure aggregation; the server decodes
// the modular sum into the noised sum of clipped updates.
func ExampleDistributed() {
	d, _ := dp.NewDistributed(dp.DiscreteGaussian, 3, 16, 2, 1, 0.01)
	seed := [32]byte{42} // the round's shared rotation seed
	sum := make([]uint32, d.PaddedDim())
	for _, update := range [][]float32{{0.5, 0, 0}, {0, 0.3, 0}} {
		src, _ := dp.NewSource(nil)
		enc, _ := d.NewEncoder(seed, src)
		v, _ := enc.Encode(update)
		for i := range v {
			sum[i] = (sum[i] + v[i]) & 0xffff
		}
	}
	total, _ := d.NewDecoder(seed).Decode(sum)
	// Noise of standard deviation z·C = 0.01 hides below one decimal.
	r := func(x float64) float64 { return math.Round(x*10)/10 + 0 }
	fmt.Println(r(total[0]), r(total[1]), r(total[2]))
	eps, _ := d.Epsilon(1, 1e-5)
	fmt.Println(eps > 100) // z = 0.01 protects nothing
	// Output:
	// 0.5 0.3 0
	// true
}
