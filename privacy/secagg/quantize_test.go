package secagg_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

func sumMod(vs [][]uint32, bits int) []uint32 {
	s := make([]uint32, len(vs[0]))
	for _, v := range vs {
		for i, x := range v {
			s[i] += x
		}
	}
	for i := range s {
		s[i] &= uint32(1<<bits - 1)
	}
	return s
}

func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		bits, n   int
		clip, max float64
	}{{32, 200, 1, 1000}, {24, 50, 0.5, 10}, {16, 8, 2, 1}, {12, 3, 1, 100}} {
		q, err := secagg.NewQuantizer(tc.bits, tc.clip, tc.n, tc.max)
		if err != nil {
			t.Fatal(err)
		}
		const dim = 20
		want := make([]float64, dim)
		var wantW float64
		var qs [][]uint32
		for range tc.n {
			u := make([]float32, dim)
			w := tc.max * (0.01 + 0.99*r.Float64())
			for i := range u {
				u[i] = float32(3 * tc.clip * (2*r.Float64() - 1)) // a third beyond the clip
				want[i] += w * max(-tc.clip, min(tc.clip, float64(u[i])))
			}
			wantW += w
			v, err := q.Quantize(u, w, r)
			if err != nil {
				t.Fatal(err)
			}
			qs = append(qs, v)
		}
		got, gotW, err := q.Dequantize(sumMod(qs, tc.bits))
		if err != nil {
			t.Fatal(err)
		}
		tol := float64(tc.n) * q.Step()
		for i := range want {
			if math.Abs(got[i]-want[i]) > tol {
				t.Errorf("bits=%d n=%d: element %d = %v, want %v ± %v", tc.bits, tc.n, i, got[i], want[i], tol)
			}
		}
		if wtol := float64(tc.n) * q.Step() / tc.clip; math.Abs(gotW-wantW) > wtol {
			t.Errorf("bits=%d n=%d: weight %v, want %v ± %v", tc.bits, tc.n, gotW, wantW, wtol)
		}
	}
}

// TestQuantizeNoWrap: n clients all at the extreme still decode.
func TestQuantizeNoWrap(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, bits := range []int{8, 16, 32} {
		const n = 100
		q, err := secagg.NewQuantizer(bits, 1, n, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, sign := range []float32{1, -1} {
			var qs [][]uint32
			for range n {
				v, err := q.Quantize([]float32{sign * 5, sign}, 50, r)
				if err != nil {
					t.Fatal(err)
				}
				qs = append(qs, v)
			}
			got, w, err := q.Dequantize(sumMod(qs, bits))
			if err != nil {
				t.Fatal(err)
			}
			want := float64(sign) * n * 50
			for _, g := range got {
				if math.Abs(g-want) > n*q.Step() {
					t.Errorf("bits=%d: %v, want %v", bits, g, want)
				}
			}
			if math.Abs(w-n*50) > n*q.Step() {
				t.Errorf("bits=%d: weight %v", bits, w)
			}
		}
	}
}

// TestQuantizeUnbiased: stochastic rounding averages to the exact value.
func TestQuantizeUnbiased(t *testing.T) {
	q, err := secagg.NewQuantizer(8, 1, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 10))
	const trials = 20000
	x := float32(0.3337)
	sum := 0.0
	for range trials {
		v, err := q.Quantize([]float32{x}, 1, r)
		if err != nil {
			t.Fatal(err)
		}
		d, _, err := q.Dequantize([]uint32{v[0], v[1]})
		if err != nil {
			t.Fatal(err)
		}
		sum += d[0]
	}
	// The rounding error of one draw is within one step; the mean of
	// 20000 has standard deviation below step/280.
	if mean := sum / trials; math.Abs(mean-float64(x)) > 5*q.Step()/math.Sqrt(trials) {
		t.Errorf("mean %v, want %v (step %v)", mean, x, q.Step())
	}
}

func TestQuantizeBadInput(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		bits   int
		clip   float64
		n      int
		maxW   float64
		reason string
	}{{0, 1, 1, 1, "bits"}, {33, 1, 1, 1, "bits"}, {32, 0, 1, 1, "clip"}, {32, math.NaN(), 1, 1, "clip"},
		{32, 1, 0, 1, "n"}, {32, 1, 1, math.Inf(1), "weight bound"}, {4, 1, 10, 1, "headroom"}} {
		if _, err := secagg.NewQuantizer(tc.bits, tc.clip, tc.n, tc.maxW); !errors.Is(err, secagg.ErrConfig) {
			t.Errorf("%s: %v", tc.reason, err)
		}
	}
	q, _ := secagg.NewQuantizer(32, 1, 10, 5)
	for _, tc := range []struct {
		u []float32
		w float64
	}{{[]float32{float32(math.NaN())}, 1}, {[]float32{float32(math.Inf(-1))}, 1}, {[]float32{1}, 0},
		{[]float32{1}, 6}, {[]float32{1}, math.NaN()}, {nil, 1}} {
		if _, err := q.Quantize(tc.u, tc.w, r); !errors.Is(err, secagg.ErrRange) {
			t.Errorf("Quantize(%v, %v) = %v", tc.u, tc.w, err)
		}
	}
	if _, err := q.Quantize([]float32{1}, 1, nil); !errors.Is(err, secagg.ErrConfig) {
		t.Errorf("nil rng: %v", err)
	}
	if _, _, err := q.Dequantize([]uint32{1}); !errors.Is(err, secagg.ErrRange) {
		t.Errorf("short sum: %v", err)
	}
	if _, _, err := q.Dequantize([]uint32{1, 0}); !errors.Is(err, secagg.ErrRange) {
		t.Errorf("zero weight: %v", err)
	}
	q8, _ := secagg.NewQuantizer(8, 1, 10, 5)
	if _, _, err := q8.Dequantize([]uint32{256, 1}); !errors.Is(err, secagg.ErrRange) {
		t.Errorf("value beyond 2^8: %v", err)
	}
}

// Bits of a cohort sum through the ring to their count, even in a small
// ring where the scale of a count is not an integer.
func TestQuantizeCount(t *testing.T) {
	for _, bits := range []int{12, 32} {
		const n = 300
		q, err := secagg.NewQuantizer(bits, 1, n, 1)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(bits)))
		var sum uint32
		ones := 0
		for i := range n {
			c := float64(i % 3 / 2) // a third of them set
			ones += int(c)
			v, err := q.QuantizeCount(c, rng)
			if err != nil {
				t.Fatal(err)
			}
			sum = (sum + v) & uint32(1<<bits-1)
		}
		got, err := q.DequantizeCount(sum)
		if err != nil {
			t.Fatal(err)
		}
		if math.Round(got) != float64(ones) {
			t.Errorf("%d bits: count %v, want %d", bits, got, ones)
		}
		if _, err := q.QuantizeCount(2, rng); !errors.Is(err, secagg.ErrRange) {
			t.Errorf("a count above the weight bound: %v", err)
		}
		if _, err := q.QuantizeCount(math.NaN(), rng); !errors.Is(err, secagg.ErrRange) {
			t.Errorf("NaN: %v", err)
		}
	}
}
