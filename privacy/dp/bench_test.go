package dp_test

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// 1,000 rounds composed, q = 0.01, z = 1.1, δ = 1e-5.
func BenchmarkAccountant1000Rounds(b *testing.B) {
	for _, acc := range []dp.Accountant{dp.RDP, dp.PLD} {
		b.Run(acc.String(), func(b *testing.B) {
			ev := []dp.Event{{Q: 0.01, NoiseMultiplier: 1.1, Steps: 1000}}
			for b.Loop() {
				if _, err := dp.Epsilon(ev, 1e-5, dp.WithAccountant(acc)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// One device's distributed DP encoding (rotation, clipping, conditional
// rounding, noise, modular reduction) of a 100,000-element update: 20 bits,
// 100 devices, C = 1, z = 1.
func BenchmarkEncode100k(b *testing.B) {
	for _, mech := range []dp.Mechanism{dp.DiscreteGaussian, dp.Skellam} {
		b.Run(mech.String(), func(b *testing.B) {
			const dim = 100000
			d, err := dp.NewDistributed(mech, dim, 20, 100, 1, 1)
			if err != nil {
				b.Fatal(err)
			}
			src := testSource(b, 1)
			update := randomUpdate(src, dim, 2)
			enc, err := d.NewEncoder([32]byte{7}, src)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(dim * 4)
			for b.Loop() {
				if _, err := enc.Encode(update); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
