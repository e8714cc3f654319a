package dp_test

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// randomUpdate returns a vector of the given L2 norm.
func randomUpdate(src *dp.Source, dim int, norm float64) []float32 {
	v := make([]float64, dim)
	var s float64
	for i := range v {
		v[i] = src.Normal()
		s += v[i] * v[i]
	}
	out := make([]float32, dim)
	for i := range v {
		out[i] = float32(v[i] * norm / math.Sqrt(s))
	}
	return out
}

// n devices encode, the sum is taken mod 2^bits as secure aggregation
// would, and the decoded sum differs from the true sum of clipped updates
// by noise of the central standard deviation z·C.
func TestDistributedEndToEnd(t *testing.T) {
	for _, mech := range []dp.Mechanism{dp.DiscreteGaussian, dp.Skellam} {
		t.Run(mech.String(), func(t *testing.T) {
			const dim, n, bits, clip, z = 1000, 20, 20, 1.0, 0.5
			d, err := dp.NewDistributed(mech, dim, bits, n, clip, z)
			if err != nil {
				t.Fatal(err)
			}
			seed := [32]byte{1, 2, 3}
			src := testSource(t, 10)
			truth := make([]float64, dim)
			sum := make([]uint32, d.PaddedDim())
			mask := uint32(1)<<bits - 1
			for i := range n {
				norm := 0.5
				if i%4 == 0 {
					norm = 3 // clipped to 1
				}
				u := randomUpdate(src, dim, norm)
				clipped := append([]float32(nil), u...)
				if _, err := dp.ClipL2(clipped, clip); err != nil {
					t.Fatal(err)
				}
				for j, x := range clipped {
					truth[j] += float64(x)
				}
				enc, err := d.NewEncoder(seed, testSource(t, byte(20+i)))
				if err != nil {
					t.Fatal(err)
				}
				v, err := enc.Encode(u)
				if err != nil {
					t.Fatal(err)
				}
				for j, x := range v {
					sum[j] = (sum[j] + x) & mask
				}
			}
			got, err := d.NewDecoder(seed).Decode(sum)
			if err != nil {
				t.Fatal(err)
			}
			var se, mean float64
			for j := range got {
				e := got[j] - truth[j]
				mean += e
				se += e * e
			}
			mean /= dim
			rms := math.Sqrt(se / dim)
			// Rounding adds at most n/4 variance in scaled units.
			want := math.Sqrt(z*z*clip*clip + float64(n)/4/(d.Scale()*d.Scale()))
			if math.Abs(rms-want) > 0.1*want || math.Abs(mean) > 5*want/math.Sqrt(dim) {
				t.Errorf("error rms %v mean %v, want rms ≈ %v", rms, mean, want)
			}
		})
	}
}

// The RDP of the discrete mechanisms approaches that of the continuous
// Gaussian with the same sensitivity and total noise, from above.
func TestDistributedEpsilonNearGaussian(t *testing.T) {
	for _, mech := range []dp.Mechanism{dp.DiscreteGaussian, dp.Skellam} {
		d, err := dp.NewDistributed(mech, 1<<14, 20, 100, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.Epsilon(100, 1e-5)
		if err != nil {
			t.Fatal(err)
		}
		zEff := 10 * d.LocalStddev() / d.NormBound()
		var orders []float64
		for a := 2; a <= 128; a++ {
			orders = append(orders, float64(a))
		}
		gauss, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: zEff, Steps: 100}}, 1e-5,
			dp.WithOrders(append(orders, 256)))
		if err != nil {
			t.Fatal(err)
		}
		if got < gauss || got > 1.05*gauss {
			t.Errorf("%v: ε %v, Gaussian with z %v has %v", mech, got, zEff, gauss)
		}
		// The inflated norm bound is above s·C and below s·C + √d.
		sc := d.Scale()
		if nb := d.NormBound(); nb <= sc || nb >= sc+math.Sqrt(float64(d.PaddedDim())) {
			t.Errorf("norm bound %v for s·C %v", nb, sc)
		}
	}
}

func TestDistributedRejectsBadInput(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"mechanism", func() error { _, err := dp.NewDistributed(0, 10, 16, 10, 1, 1); return err }},
		{"dim", func() error { _, err := dp.NewDistributed(dp.Skellam, 0, 16, 10, 1, 1); return err }},
		{"bits", func() error { _, err := dp.NewDistributed(dp.Skellam, 10, 33, 10, 1, 1); return err }},
		{"clients", func() error { _, err := dp.NewDistributed(dp.Skellam, 10, 16, 0, 1, 1); return err }},
		{"too few bits", func() error { _, err := dp.NewDistributed(dp.Skellam, 10, 4, 100, 1, 1); return err }},
		{"clip", func() error { _, err := dp.NewDistributed(dp.Skellam, 10, 16, 10, math.NaN(), 1); return err }},
		{"sigma", func() error { _, err := dp.NewDistributed(dp.Skellam, 10, 16, 10, 1, 0); return err }},
		{"beta", func() error {
			_, err := dp.NewDistributed(dp.Skellam, 10, 16, 10, 1, 1, dp.WithBeta(1))
			return err
		}},
		{"scale", func() error {
			_, err := dp.NewDistributed(dp.Skellam, 10, 16, 10, 1, 1, dp.WithScale(-1))
			return err
		}},
	} {
		if err := c.f(); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	d, err := dp.NewDistributed(dp.DiscreteGaussian, 10, 16, 10, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := d.NewEncoder([32]byte{}, testSource(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Encode(make([]float32, 11)); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("wrong length: %v", err)
	}
	bad := make([]float32, 10)
	bad[3] = float32(math.NaN())
	if _, err := enc.Encode(bad); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("NaN: %v", err)
	}
	if _, err := d.NewEncoder([32]byte{}, nil); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("nil source: %v", err)
	}
	dec := d.NewDecoder([32]byte{})
	if _, err := dec.Decode(make([]uint32, 10)); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("decode length: %v", err)
	}
	big := make([]uint32, d.PaddedDim())
	big[0] = 1 << 16
	if _, err := dec.Decode(big); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("decode value ≥ 2^bits: %v", err)
	}
	if _, err := d.Epsilon(0, 1e-5); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("zero rounds: %v", err)
	}
	if _, err := d.Epsilon(1, 2); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("delta 2: %v", err)
	}
}

// With a count, n devices' bits, each the clip the encoder applied, decode
// to the number of unclipped ones plus noise of standard deviation
// CountStddev, and the ε composes the update's mechanism with the count's, a
// Gaussian of multiplier 2σ_b for sensitivity ½ (sum of bits, centred).
func TestDistributedCount(t *testing.T) {
	for _, mech := range []dp.Mechanism{dp.DiscreteGaussian, dp.Skellam} {
		t.Run(mech.String(), func(t *testing.T) {
			const dim, n, bits, clip, z, sigmaB = 64, 30, 24, 1.0, 4.0, 3.0
			d, err := dp.NewDistributed(mech, dim, bits, n, clip, z, dp.WithCount(sigmaB))
			if err != nil {
				t.Fatal(err)
			}
			if !d.Counts() || d.EncodedDim() != d.PaddedDim()+1 || d.CountStddev() != sigmaB {
				t.Fatalf("counts %v, encoded %d of %d, stddev %v", d.Counts(), d.EncodedDim(), d.PaddedDim(), d.CountStddev())
			}
			seed := [32]byte{9}
			mask := uint32(1)<<bits - 1
			var errs []float64
			for trial := range 200 {
				sum := make([]uint32, d.EncodedDim())
				unclipped := 0
				for i := range n {
					enc, err := d.NewEncoder(seed, seededSource(t, uint64(trial*n+i)))
					if err != nil {
						t.Fatal(err)
					}
					// Two devices in three are within the clip norm (a zero
					// update); the third is three times over it.
					update := make([]float32, dim)
					if (i+trial)%3 != 0 {
						unclipped++
					} else {
						for j := range update {
							update[j] = float32(3 * clip / math.Sqrt(dim))
						}
					}
					v, err := enc.EncodeCounted(update)
					if err != nil {
						t.Fatal(err)
					}
					for j, x := range v {
						sum[j] = (sum[j] + x) & mask
					}
				}
				_, count, err := d.NewDecoder(seed).DecodeCounted(sum, n)
				if err != nil {
					t.Fatal(err)
				}
				errs = append(errs, count-float64(unclipped))
			}
			var mean, sq float64
			for _, e := range errs {
				mean += e
				sq += e * e
			}
			mean /= float64(len(errs))
			sd := math.Sqrt(sq/float64(len(errs)) - mean*mean)
			if math.Abs(mean) > 4*sigmaB/math.Sqrt(float64(len(errs))) || math.Abs(sd-sigmaB) > 0.15*sigmaB {
				t.Errorf("count error mean %v sd %v, want 0 and %v", mean, sd, sigmaB)
			}
			// Encode and Decode refuse a counting mechanism, and the
			// counted forms one without.
			enc, _ := d.NewEncoder(seed, testSource(t, 1))
			if _, err := enc.Encode(make([]float32, dim)); !errors.Is(err, dp.ErrInvalid) {
				t.Errorf("Encode with a count: %v", err)
			}
			if _, err := d.NewDecoder(seed).Decode(make([]uint32, d.EncodedDim())); !errors.Is(err, dp.ErrInvalid) {
				t.Errorf("Decode with a count: %v", err)
			}
			if _, _, err := d.NewDecoder(seed).DecodeCounted(make([]uint32, d.EncodedDim()), 1<<30); !errors.Is(err, dp.ErrInvalid) {
				t.Errorf("a count that cannot fit: %v", err)
			}
			plain, err := dp.NewDistributed(mech, dim, bits, n, clip, z)
			if err != nil {
				t.Fatal(err)
			}
			penc, _ := plain.NewEncoder(seed, testSource(t, 1))
			if _, err := penc.EncodeCounted(make([]float32, dim)); !errors.Is(err, dp.ErrInvalid) {
				t.Errorf("EncodeCounted without a count: %v", err)
			}
			// ε: above the update's alone, and the count's share is about
			// what a Gaussian count of multiplier 2σ_b costs.
			with, err := d.Epsilon(50, 1e-6)
			if err != nil {
				t.Fatal(err)
			}
			without, err := plain.Epsilon(50, 1e-6)
			if err != nil {
				t.Fatal(err)
			}
			zUpd := math.Sqrt(float64(n)) * d.LocalStddev() / d.NormBound()
			joint := 1 / math.Sqrt(1/(zUpd*zUpd)+1/(4*sigmaB*sigmaB))
			gauss, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: joint, Steps: 50}}, 1e-6)
			if err != nil {
				t.Fatal(err)
			}
			if !(with > without) || with < 0.98*gauss || with > 1.05*gauss {
				t.Errorf("ε with the count %v, without %v; a Gaussian of the joint multiplier %v has %v", with, without, joint, gauss)
			}
		})
	}
}

// seededSource is a deterministic source for any number of devices.
func seededSource(t testing.TB, seed uint64) *dp.Source {
	t.Helper()
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	src, err := dp.NewSource(rand.NewChaCha8(key))
	if err != nil {
		t.Fatal(err)
	}
	return src
}
