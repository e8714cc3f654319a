package aggregator

import (
	"fmt"
	"math"
)

// Defaults. The adaptive ones are those of Reddi et al. 2021; the paper tunes
// the server learning rate per task, so DefaultAdaptiveLR is only a starting
// point.
const (
	DefaultServerLR     = 1.0  // FedAvg, FedAvgM, Median, TrimmedMean
	DefaultAdaptiveLR   = 1e-2 // η of FedAdam, FedYogi, FedAdagrad
	DefaultMomentum     = 0.9  // FedAvgM
	DefaultBeta1        = 0.9
	DefaultBeta2        = 0.99
	DefaultTau          = 1e-3
	DefaultTrimFraction = 0.1 // TrimmedMean, per side
)

// maxTau keeps τ², the second moment's starting value, within float32.
const maxTau = 1e19

// Option configures NewRule. Parameters a rule does not use are ignored, as
// in the wire AggregationConfig; out-of-range values make NewRule fail with
// ErrConfig. Proto3 doubles have no presence, so a caller translating an
// AggregationConfig passes only the fields that are set (non-zero).
type Option func(*config)

type config struct {
	lrSet    bool
	serverLR float64
	momentum float64
	beta1    float64
	beta2    float64
	tau      float64
	trim     float64
}

// WithServerLR sets the server learning rate: FedAvg, FedAvgM and the robust
// rules add lr·update to the global weights; for the adaptive rules it is η.
// Must be positive and finite.
func WithServerLR(lr float64) Option {
	return func(c *config) { c.serverLR, c.lrSet = lr, true }
}

// WithMomentum sets FedAvgM's momentum β in [0, 1). β = 0 is FedAvg.
func WithMomentum(beta float64) Option { return func(c *config) { c.momentum = beta } }

// WithBeta1 sets the first-moment decay of the adaptive rules, in [0, 1).
func WithBeta1(b float64) Option { return func(c *config) { c.beta1 = b } }

// WithBeta2 sets the second-moment decay of FedAdam and FedYogi, in [0, 1).
func WithBeta2(b float64) Option { return func(c *config) { c.beta2 = b } }

// WithTau sets the adaptivity constant τ of the adaptive rules: positive, and
// small enough that τ² fits a float32.
func WithTau(tau float64) Option { return func(c *config) { c.tau = tau } }

// WithTrimFraction sets TrimmedMean's fraction of updates dropped at each
// end of every coordinate, in [0, 0.5).
func WithTrimFraction(beta float64) Option { return func(c *config) { c.trim = beta } }

func newConfig(kind Kind, opts []Option) (config, error) {
	c := config{
		momentum: DefaultMomentum,
		beta1:    DefaultBeta1,
		beta2:    DefaultBeta2,
		tau:      DefaultTau,
		trim:     DefaultTrimFraction,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if !c.lrSet {
		c.serverLR = DefaultServerLR
		if kind.adaptive() {
			c.serverLR = DefaultAdaptiveLR
		}
	}
	unit := func(x float64) bool { return x >= 0 && x < 1 } // false for NaN
	switch {
	case !(c.serverLR > 0) || math.IsInf(c.serverLR, 0):
		return c, fmt.Errorf("aggregator: server learning rate %v must be positive and finite: %w", c.serverLR, ErrConfig)
	case !unit(c.momentum):
		return c, fmt.Errorf("aggregator: momentum %v not in [0, 1): %w", c.momentum, ErrConfig)
	case !unit(c.beta1):
		return c, fmt.Errorf("aggregator: beta1 %v not in [0, 1): %w", c.beta1, ErrConfig)
	case !unit(c.beta2):
		return c, fmt.Errorf("aggregator: beta2 %v not in [0, 1): %w", c.beta2, ErrConfig)
	case !(c.tau > 0 && c.tau <= maxTau):
		return c, fmt.Errorf("aggregator: tau %v not in (0, %g]: %w", c.tau, maxTau, ErrConfig)
	case !(c.trim >= 0 && c.trim < 0.5):
		return c, fmt.Errorf("aggregator: trim fraction %v not in [0, 0.5): %w", c.trim, ErrConfig)
	}
	return c, nil
}
