package aggregator_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

var (
	nan  = float32(math.NaN())
	pinf = float32(math.Inf(1))
	ninf = float32(math.Inf(-1))
)

// badUpdates are rows every collector and Validate must refuse, for
// dimension 4 and norm bound 1.
var badUpdates = []struct {
	name    string
	update  []float32
	weight  float64
	want    error
	message string // part of the error text naming the culprit
}{
	{"short", []float32{0, 0, 0}, 1, aggregator.ErrShape, "3 values, want 4"},
	{"long", []float32{0, 0, 0, 0, 0}, 1, aggregator.ErrShape, "5 values"},
	{"nil", nil, 1, aggregator.ErrShape, "0 values"},
	{"NaN", []float32{0, 0, 0, nan}, 1, aggregator.ErrNonFinite, "update[3] = NaN"},
	{"+Inf", []float32{pinf, 0, 0, 0}, 1, aggregator.ErrNonFinite, "update[0] = +Inf"},
	{"-Inf", []float32{0, ninf, 0, 0}, 1, aggregator.ErrNonFinite, "update[1] = -Inf"},
	{"norm over bound", []float32{0.6, 0.6, 0.6, 0}, 1, aggregator.ErrNormBound, "norm 1.03"},
	{"zero weight", []float32{0, 0, 0, 0}, 0, aggregator.ErrWeight, "weight 0"},
	{"negative weight", []float32{0, 0, 0, 0}, -3, aggregator.ErrWeight, "weight -3"},
	{"NaN weight", []float32{0, 0, 0, 0}, math.NaN(), aggregator.ErrWeight, "weight NaN"},
	{"infinite weight", []float32{0, 0, 0, 0}, math.Inf(1), aggregator.ErrWeight, "weight +Inf"},
	{"weight over MaxWeight", []float32{0, 0, 0, 0}, 2 * aggregator.MaxWeight, aggregator.ErrWeight, "weight"},
}

func TestValidate(t *testing.T) {
	opts := aggregator.ValidateOptions{Dim: 4, MaxNorm: 1}
	for _, tc := range badUpdates {
		t.Run(tc.name, func(t *testing.T) {
			err := aggregator.Validate(tc.update, tc.weight, opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Validate = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) || !strings.HasPrefix(err.Error(), "aggregator: validate: ") {
				t.Errorf("error %q does not say %q", err, tc.message)
			}
		})
	}

	good := []struct {
		name   string
		update []float32
		weight float64
		opts   aggregator.ValidateOptions
	}{
		{"zeros", make([]float32, 4), 1, opts},
		{"fractional weight", []float32{0.5, 0, 0, 0}, 0.25, opts},
		{"MaxWeight", []float32{1, 0, 0, 0}, aggregator.MaxWeight, opts},
		// A float32 clip lands within a few ulps of the bound.
		{"norm at bound", []float32{0.5, 0.5, 0.5, 0.5}, 1, opts},
		{"norm within tolerance", []float32{1.000001, 0, 0, 0}, 1, opts},
		{"no bound", []float32{3e38, 3e38, -3e38, 0}, 7, aggregator.ValidateOptions{Dim: 4}},
	}
	for _, tc := range good {
		if err := aggregator.Validate(tc.update, tc.weight, tc.opts); err != nil {
			t.Errorf("%s: Validate = %v, want nil", tc.name, err)
		}
	}

	for _, o := range []aggregator.ValidateOptions{{Dim: 0}, {Dim: -1}, {Dim: 4, MaxNorm: -1}, {Dim: 4, MaxNorm: math.NaN()}} {
		if err := aggregator.Validate(make([]float32, 4), 1, o); !errors.Is(err, aggregator.ErrConfig) {
			t.Errorf("Validate with %+v = %v, want ErrConfig", o, err)
		}
	}
}
