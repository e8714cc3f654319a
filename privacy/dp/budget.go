package dp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// Budget tracks the privacy spent by a task's rounds against a target
// (ε, δ). Ask Preview before running a round and Spend once it ran; Spend
// refuses a round that would exceed the target and leaves the budget
// unchanged. The state marshals to JSON so a server can persist it between
// rounds and restarts. A Budget is not safe for concurrent use.
type Budget struct {
	target, delta float64
	cfg           config
	events        []Event
	curve         []float64 // RDP of events, for the RDP accountant
}

// maxEvents bounds the distinct runs a persisted budget may hold.
const maxEvents = 4096

// NewBudget returns an empty budget for (targetEpsilon, delta).
func NewBudget(targetEpsilon, delta float64, opts ...Option) (*Budget, error) {
	c, err := newConfig(opts)
	if err != nil {
		return nil, fmt.Errorf("dp: budget: %w", err)
	}
	if err := checkPositive("target epsilon", targetEpsilon); err != nil {
		return nil, fmt.Errorf("dp: budget: %w", err)
	}
	if err := checkDelta(delta); err != nil {
		return nil, fmt.Errorf("dp: budget: %w", err)
	}
	return &Budget{target: targetEpsilon, delta: delta, cfg: c, curve: make([]float64, len(c.orders))}, nil
}

// Target returns the budget's (ε, δ).
func (b *Budget) Target() (epsilon, delta float64) { return b.target, b.delta }

// Rounds returns the number of rounds spent.
func (b *Budget) Rounds() int {
	n := 0
	for _, e := range b.events {
		n += e.Steps
	}
	return n
}

// Spent returns the ε of the rounds spent so far; 0 before the first.
func (b *Budget) Spent() (float64, error) {
	if len(b.events) == 0 {
		return 0, nil
	}
	return b.epsilonWith(nil)
}

// Preview returns the ε the budget would stand at after one more round
// with sampling rate q (1 without amplification) and noise multiplier z.
func (b *Budget) Preview(q, z float64) (float64, error) {
	ev := Event{Q: q, NoiseMultiplier: z, Steps: 1}
	if err := ev.validate(); err != nil {
		return 0, fmt.Errorf("dp: budget: %w", err)
	}
	return b.epsilonWith(&ev)
}

// Spend records one round if the budget allows it and returns the new ε.
// A round that would exceed the target returns ErrBudgetExceeded and
// records nothing.
func (b *Budget) Spend(q, z float64) (float64, error) {
	eps, err := b.Preview(q, z)
	if err != nil {
		return 0, err
	}
	if eps > b.target {
		return eps, fmt.Errorf("dp: budget: %w: round would reach ε %.4g, target %.4g", ErrBudgetExceeded, eps, b.target)
	}
	ev := Event{Q: q, NoiseMultiplier: z, Steps: 1}
	if b.cfg.accountant == RDP {
		addRDP(b.curve, ev, b.cfg.orders)
	}
	if n := len(b.events); n > 0 && b.events[n-1].Q == q && b.events[n-1].NoiseMultiplier == z {
		b.events[n-1].Steps++
	} else {
		b.events = append(b.events, ev)
	}
	return eps, nil
}

func (b *Budget) epsilonWith(extra *Event) (float64, error) {
	if b.cfg.accountant == RDP {
		curve := b.curve
		if extra != nil {
			curve = append([]float64(nil), b.curve...)
			addRDP(curve, *extra, b.cfg.orders)
		}
		eps, _, err := EpsilonFromRDP(b.cfg.orders, curve, b.delta)
		return eps, err
	}
	// PLD composes one distribution per distinct (q, z), so merge runs.
	merged := map[[2]float64]int{}
	var keys [][2]float64
	add := func(e Event) {
		k := [2]float64{e.Q, e.NoiseMultiplier}
		if _, ok := merged[k]; !ok {
			keys = append(keys, k)
		}
		merged[k] += e.Steps
	}
	for _, e := range b.events {
		add(e)
	}
	if extra != nil {
		add(*extra)
	}
	evs := make([]Event, len(keys))
	for i, k := range keys {
		evs[i] = Event{Q: k[0], NoiseMultiplier: k[1], Steps: merged[k]}
	}
	return b.cfg.epsilon(evs, b.delta)
}

// budgetState is the persisted form.
type budgetState struct {
	Version        int       `json:"version"`
	TargetEpsilon  float64   `json:"target_epsilon"`
	Delta          float64   `json:"delta"`
	Accountant     string    `json:"accountant"`
	Orders         []float64 `json:"orders"`
	Discretization float64   `json:"discretization"`
	Events         []Event   `json:"events"`
}

// MarshalJSON encodes the budget's configuration and spent rounds.
func (b *Budget) MarshalJSON() ([]byte, error) {
	return json.Marshal(budgetState{Version: 1, TargetEpsilon: b.target, Delta: b.delta,
		Accountant: b.cfg.accountant.String(), Orders: b.cfg.orders,
		Discretization: b.cfg.discretization, Events: b.events})
}

// UnmarshalJSON restores a budget from MarshalJSON's output, validating
// every field; on error b is unchanged.
func (b *Budget) UnmarshalJSON(data []byte) error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("dp: budget: %w: "+f, append([]any{ErrMalformed}, a...)...)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s budgetState
	if err := dec.Decode(&s); err != nil {
		return bad("%v", err)
	}
	if dec.More() {
		return bad("trailing data")
	}
	if s.Version != 1 {
		return bad("version %d, want 1", s.Version)
	}
	acc, err := ParseAccountant(s.Accountant)
	if err != nil {
		return bad("%v", err)
	}
	nb, err := NewBudget(s.TargetEpsilon, s.Delta, WithAccountant(acc), WithOrders(s.Orders), WithDiscretization(s.Discretization))
	if err != nil {
		return bad("%v", err)
	}
	if len(s.Events) > maxEvents {
		return bad("%d events, want at most %d", len(s.Events), maxEvents)
	}
	total := 0
	for i, e := range s.Events {
		if err := e.validate(); err != nil {
			return bad("event %d: %v", i, err)
		}
		if total += e.Steps; total > maxSteps {
			return bad("more than %d rounds", maxSteps)
		}
		if acc == RDP {
			addRDP(nb.curve, e, nb.cfg.orders)
		}
	}
	for _, v := range nb.curve {
		if math.IsNaN(v) {
			return bad("RDP is NaN")
		}
	}
	nb.events = append([]Event(nil), s.Events...)
	*b = *nb
	return nil
}
