package dp_test

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

func TestClipL2(t *testing.T) {
	for _, c := range []struct {
		in       []float32
		clip     float64
		norm     float64
		wantNorm float64
	}{
		{[]float32{3, 4}, 1, 5, 1},
		{[]float32{3, 4}, 10, 5, 5},
		{[]float32{0, 0}, 1, 0, 0},
	} {
		v := append([]float32(nil), c.in...)
		norm, err := dp.ClipL2(v, c.clip)
		if err != nil {
			t.Fatal(err)
		}
		after, _ := dp.L2Norm(v)
		if math.Abs(norm-c.norm) > 1e-9 || math.Abs(after-c.wantNorm) > 1e-6 {
			t.Errorf("ClipL2(%v, %v): norm %v → %v", c.in, c.clip, norm, after)
		}
	}
	for _, c := range []struct {
		name string
		v    []float32
		clip float64
	}{
		{"NaN element", []float32{1, float32(math.NaN())}, 1},
		{"Inf element", []float32{float32(math.Inf(-1))}, 1},
		{"zero clip", []float32{1}, 0},
		{"NaN clip", []float32{1}, math.NaN()},
	} {
		if _, err := dp.ClipL2(c.v, c.clip); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// Noiseless adaptive clipping converges to the target quantile of a fixed
// norm distribution: here norms 1…100, so the median is about 50.
func TestAdaptiveClipTracksQuantile(t *testing.T) {
	src := testSource(t, 1)
	a, err := dp.NewAdaptiveClip(5, 0.5, 0.2, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 300 {
		n := 0
		for i := 1; i <= 100; i++ {
			if a.Unclipped(float64(i)) {
				n++
			}
		}
		if _, err := a.Update(n, 100, src); err != nil {
			t.Fatal(err)
		}
	}
	if c := a.Norm(); c < 45 || c > 56 {
		t.Errorf("clip norm %v after 300 rounds, want about 50", c)
	}
	// With count noise it still moves the right way: up while every update
	// is clipped.
	a, _ = dp.NewAdaptiveClip(1, 0.5, 0.2, 5)
	for range 100 {
		_, _ = a.Update(0, 100, src)
	}
	if a.Norm() <= 2 {
		t.Errorf("bound %v did not grow while every update was clipped", a.Norm())
	}
}

func TestAdjustedNoiseMultiplier(t *testing.T) {
	z, err := dp.AdjustedNoiseMultiplier(1, 5)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 / math.Sqrt(1-1.0/100); math.Abs(z-want) > 1e-12 {
		t.Errorf("z_Δ = %v, want %v", z, want)
	}
	// The bits' noise must not use up the whole budget.
	if _, err := dp.AdjustedNoiseMultiplier(1, 0.5); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("σ_b = z/2: %v", err)
	}
	for _, c := range [][2]float64{{0, 1}, {1, 0}, {math.NaN(), 1}, {-1, 1}} {
		if _, err := dp.AdjustedNoiseMultiplier(c[0], c[1]); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%v: %v", c, err)
		}
	}
	for _, c := range [][4]float64{{0, 0.5, 0.2, 1}, {1, 0, 0.2, 1}, {1, 1, 0.2, 1}, {1, 0.5, 0, 1}, {1, 0.5, 0.2, -1}} {
		if _, err := dp.NewAdaptiveClip(c[0], c[1], c[2], c[3]); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("NewAdaptiveClip%v: %v", c, err)
		}
	}
	a, _ := dp.NewAdaptiveClip(1, 0.5, 0.2, 1)
	if _, err := a.Update(3, 2, testSource(t, 2)); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("more unclipped than reported: %v", err)
	}
}

// The noise has standard deviation z·C and mean zero.
func TestGaussianNoiseScale(t *testing.T) {
	src := testSource(t, 3)
	const n = 200000
	sum := make([]float64, n)
	if err := dp.AddCentralNoise(sum, 2, 1.5, src); err != nil {
		t.Fatal(err)
	}
	var m, v float64
	for _, x := range sum {
		m += x
	}
	m /= n
	for _, x := range sum {
		v += (x - m) * (x - m)
	}
	v /= n - 1
	// Variance 9; standard error of the sample variance √(2·81/n).
	if math.Abs(m) > 5*3/math.Sqrt(n) || math.Abs(v-9) > 5*math.Sqrt(2*81.0/n) {
		t.Errorf("mean %v variance %v, want 0 and 9", m, v)
	}

	up := []float32{30, 40}
	if err := dp.AddLocalNoise(up, 1, 0.001, src); err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(up[0])-0.6) > 0.01 || math.Abs(float64(up[1])-0.8) > 0.01 {
		t.Errorf("local noise did not clip first: %v", up)
	}

	for _, err := range []error{
		dp.AddCentralNoise([]float64{math.NaN()}, 1, 1, src),
		dp.AddCentralNoise([]float64{1}, 1, 0, src),
		dp.AddCentralNoise([]float64{1}, -1, 1, src),
		dp.AddCentralNoise([]float64{1}, 1, 1, nil),
		dp.AddLocalNoise([]float32{float32(math.Inf(1))}, 1, 1, src),
	} {
		if !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("bad input: %v", err)
		}
	}
}
