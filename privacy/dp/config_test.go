package dp_test

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

func TestDistributedConfigValidate(t *testing.T) {
	good := dp.DistributedConfig{Mechanism: dp.Skellam, Contributors: 10, ClipNorm: 1, NoiseMultiplier: 0.8}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mutate := range map[string]func(*dp.DistributedConfig){
		"no mechanism":      func(c *dp.DistributedConfig) { c.Mechanism = 0 },
		"unknown mechanism": func(c *dp.DistributedConfig) { c.Mechanism = dp.Skellam + 1 },
		"no contributors":   func(c *dp.DistributedConfig) { c.Contributors = 0 },
		"negative":          func(c *dp.DistributedConfig) { c.Contributors = -3 },
		"zero clip":         func(c *dp.DistributedConfig) { c.ClipNorm = 0 },
		"NaN clip":          func(c *dp.DistributedConfig) { c.ClipNorm = math.NaN() },
		"infinite noise":    func(c *dp.DistributedConfig) { c.NoiseMultiplier = math.Inf(1) },
		"negative noise":    func(c *dp.DistributedConfig) { c.NoiseMultiplier = -1 },
	} {
		c := good
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
		if _, err := dp.DistributedFor(c, 100, 16); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: DistributedFor = %v, want ErrInvalid", name, err)
		}
	}
}

// DistributedFor is the mechanism NewDistributed builds from the same
// parameters: server and devices derive identical scales and noise.
func TestDistributedForMatchesNewDistributed(t *testing.T) {
	for _, mech := range []dp.Mechanism{dp.DiscreteGaussian, dp.Skellam} {
		c := dp.DistributedConfig{Mechanism: mech, Contributors: 50, ClipNorm: 0.5, NoiseMultiplier: 1.1}
		got, err := dp.DistributedFor(c, 1000, 20)
		if err != nil {
			t.Fatal(err)
		}
		want, err := dp.NewDistributed(mech, 1000, 20, 50, 0.5, 1.1)
		if err != nil {
			t.Fatal(err)
		}
		if got.Scale() != want.Scale() || got.LocalStddev() != want.LocalStddev() ||
			got.NormBound() != want.NormBound() || got.PaddedDim() != want.PaddedDim() {
			t.Errorf("%v: DistributedFor gives scale %v, σ %v, bound %v, dim %d; NewDistributed %v, %v, %v, %d", mech,
				got.Scale(), got.LocalStddev(), got.NormBound(), got.PaddedDim(),
				want.Scale(), want.LocalStddev(), want.NormBound(), want.PaddedDim())
		}
		if _, err := dp.DistributedFor(c, 0, 20); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%v: dimension 0: %v", mech, err)
		}
	}
}
