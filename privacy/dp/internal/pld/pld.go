// Package pld bounds ε of composed Poisson-subsampled Gaussian mechanisms
// under add-or-remove adjacency with privacy loss distributions (Koskela,
// Jälkö, Honkela 2020; Google's dp_accounting), pessimistically: the result
// is never below the true ε.
//
// Where the answer has a closed form it is computed exactly (to 1e-10,
// rounded up): events without sampling (q = 1) compose into one Gaussian
// mechanism of sensitivity μ = √(Σ count/σ²) (Balle and Wang 2018), and a
// single sampled step is the root of its exact hockey-stick divergence.
// Otherwise each direction (remove, add) of each event is discretized by
// "connect the dots" (Doroshenko et al. 2022, see discretize) on a grid of
// spacing Δ, the events are composed with one real FFT over a window set
// by a Chernoff bound (the mass above it is charged to δ), the q = 1
// events taking part as one more Gaussian step, and ε is read off the
// composed δ-curve exactly; the larger direction is the answer.
package pld

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/dsp/fourier"
)

// Event is count identical steps of the Gaussian mechanism with noise
// multiplier Sigma on a Poisson sample of rate Q ∈ (0, 1].
type Event struct {
	Q, Sigma float64
	Count    int
}

const (
	// maxFFT bounds the composed window; beyond it the grid is widened.
	// A window that wide spans some 20·√T loss deviations of one step, so
	// a grid of window/2¹⁹ is still 2.6e4/√T deviations fine, which costs
	// about 33·T/2³⁸ ≈ 1e-6 of ε at T = 10,000 (and ε is in the tens there).
	maxFFT = 1 << 19
	// maxPoints bounds one step's grid.
	maxPoints = 1 << 21
	// kappa is the finest grid as a fraction of a step's loss deviation:
	// connect-the-dots adds about Δ²/6 of variance per step, and at
	// Δ = 0.035·sd that is 2e-4 of the loss variance, about 1e-4 of ε.
	kappa = 0.035
	// maxRefine bounds how much finer than the caller's interval the grid
	// may go.
	maxRefine = 128
	// tailShare is the share of δ given to the composed mass above the FFT
	// window and to rounding.
	tailShare = 1e-7
)

// Epsilon returns an upper bound on ε such that the composition of events
// is (ε, δ)-DP under add-or-remove adjacency. interval is the grid spacing
// in nats: the grid is made finer where a step's loss is narrow (so that
// discretization costs well under 0.1% of ε) and wider where the composed
// range would need more than maxFFT points.
func Epsilon(events []Event, delta, interval float64) (float64, error) {
	if !(delta > 0 && delta < 1) {
		return 0, fmt.Errorf("pld: %w: delta %v", ErrInvalid, delta)
	}
	if !(interval > 0) || math.IsInf(interval, 1) {
		return 0, fmt.Errorf("pld: %w: interval %v", ErrInvalid, interval)
	}
	if len(events) == 0 {
		return 0, fmt.Errorf("pld: %w: no events", ErrInvalid)
	}
	// Merge identical events; q = 1 events become one Gaussian.
	var mu2 float64
	var sub []Event
	for _, ev := range events {
		if !(ev.Q > 0 && ev.Q <= 1) || !(ev.Sigma > 0) || math.IsInf(ev.Sigma, 1) || ev.Count < 1 {
			return 0, fmt.Errorf("pld: %w: event %+v", ErrInvalid, ev)
		}
		if ev.Q == 1 {
			mu2 += float64(ev.Count) / (ev.Sigma * ev.Sigma)
			continue
		}
		merged := false
		for i := range sub {
			if sub[i].Q == ev.Q && sub[i].Sigma == ev.Sigma {
				sub[i].Count += ev.Count
				merged = true
				break
			}
		}
		if !merged {
			sub = append(sub, ev)
		}
	}
	switch {
	case len(sub) == 0:
		return gaussianEpsilon(math.Sqrt(mu2), delta), nil
	case mu2 == 0 && len(sub) == 1 && sub[0].Count == 1:
		return singleStepEpsilon(sub[0].Q, sub[0].Sigma, delta), nil
	case mu2 > 0:
		sub = append(sub, Event{Q: 1, Sigma: 1 / math.Sqrt(mu2), Count: 1})
	}
	step := initialStep(sub, interval, delta)
	eps := 0.0
	plans := map[int]*fourier.FFT{}
	for _, remove := range []bool{true, false} {
		e, err := directionEpsilon(sub, delta, step, remove, plans)
		if err != nil {
			return 0, err
		}
		eps = max(eps, e)
	}
	return eps, nil
}

// initialStep returns the grid spacing to start from: the caller's
// interval, made finer (down to interval/maxRefine) where it exceeds kappa
// loss deviations, and wider where the composed window (estimated from the
// total loss variance) or one step's range would not fit.
func initialStep(evs []Event, interval, delta float64) float64 {
	var v, n float64
	for _, ev := range evs {
		v += float64(ev.Count) * mechanism{q: ev.Q, sigma: ev.Sigma, remove: true}.lossVariance()
		n += float64(ev.Count)
	}
	step := interval
	if fine := kappa * math.Sqrt(v/n); fine < step {
		step = max(fine, interval/maxRefine)
	}
	c := -math.Log(delta * tailShare / 4)
	step = max(step, 2*(math.Sqrt(2*c)+2)*math.Sqrt(v)/maxFFT)
	for _, ev := range evs {
		for _, remove := range []bool{true, false} {
			lo, hi := mechanism{q: ev.Q, sigma: ev.Sigma, remove: remove}.lossRange()
			step = max(step, (hi-lo)/(maxPoints-2))
		}
	}
	return step
}

// directionEpsilon composes one direction of all events at grid spacing
// step, widening it until the composed window fits maxFFT.
func directionEpsilon(evs []Event, delta, step float64, remove bool, plans map[int]*fourier.FFT) (float64, error) {
	tail := delta * tailShare / 4
	target := delta - 4*tail
	c := -math.Log(tail)
	for range 40 {
		if step > 1e3 {
			break
		}
		ts := make([]term, len(evs))
		for i, ev := range evs {
			m := mechanism{q: ev.Q, sigma: ev.Sigma, remove: remove}
			if lo, hi := m.indexRange(step); hi-lo+1 > maxPoints {
				step *= 1.05 * float64(hi-lo+1) / maxPoints
				ts = nil
				break
			}
			ts[i] = term{d: m.discretize(step), count: ev.Count}
		}
		if ts == nil {
			continue
		}
		wlo, whi := tailIndex(ts, c, true), tailIndex(ts, c, false)
		if whi < wlo {
			whi = wlo
		}
		width := whi - wlo + 1
		if width > maxFFT {
			step *= max(1.1, 1.02*float64(width)/maxFFT)
			continue
		}
		n := 2
		for int64(n) < width {
			n <<= 1
		}
		fft := plans[n]
		if fft == nil {
			fft = fourier.NewFFT(n)
			plans[n] = fft
		}
		eps := compose(ts, wlo, whi, fft).epsilon(step, target)
		return max(0, eps), nil
	}
	return 0, fmt.Errorf("pld: %w", ErrTooWide)
}
