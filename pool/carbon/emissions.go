package carbon

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// MaxRunEnergy bounds a metered run's energy: a gigawatt for a year.
const MaxRunEnergy = MaxPower * 366 * 24 * 3600

// Emissions is the gCO2e of energyJoules drawn at intensity gCO2e/kWh.
func Emissions(energyJoules, intensity float64) float64 {
	return energyJoules / JoulesPerKWh * intensity
}

// integrate sums intensity × seconds over [s, e] point by point, and
// returns how much of it the forecast covers.
func integrate(f Forecast, s, e time.Time) (float64, time.Duration) {
	i := sort.Search(len(f.Points), func(i int) bool { return f.Points[i].End().After(s) })
	var sum, comp float64
	var cov time.Duration
	for ; i < len(f.Points) && f.Points[i].Start.Before(e); i++ {
		p := f.Points[i]
		a, b := p.Start, p.End()
		if a.Before(s) {
			a = s
		}
		if b.After(e) {
			b = e
		}
		d := b.Sub(a)
		t, err := twoSum(sum, p.Intensity*d.Seconds())
		sum, comp = t, comp+err
		cov += d
	}
	return sum + comp, cov
}

// AverageIntensity is the time-weighted mean intensity of f over
// [start, end] in gCO2e/kWh. Every instant must be covered.
func AverageIntensity(f Forecast, start, end time.Time) (float64, error) {
	if err := f.Validate(); err != nil {
		return 0, fmt.Errorf("carbon: average intensity: %w", err)
	}
	if !saneTime(start) || !saneTime(end) || !end.After(start) {
		return 0, fmt.Errorf("carbon: average intensity: %w: window must be non-empty, within %d-%d", ErrInvalidRequest, minTime.Year(), maxTime.Year()-1)
	}
	sum, cov := integrate(f, start, end)
	if cov != end.Sub(start) {
		return 0, fmt.Errorf("carbon: average intensity: %w: zone %q covers %s of the %s from %s", ErrNoCoverage, f.Zone, cov, end.Sub(start), start.UTC().Format(time.RFC3339))
	}
	return sum / end.Sub(start).Seconds(), nil
}

// RunEmissions is the gCO2e of a metered run in f's zone from start to end
// that drew energyJoules. The meter gives energy, not its profile, so the
// draw is taken as even over the run. Pass actuals where they exist and the
// forecast otherwise.
func RunEmissions(f Forecast, start, end time.Time, energyJoules float64) (float64, error) {
	if math.IsNaN(energyJoules) || energyJoules < 0 || energyJoules > MaxRunEnergy {
		return 0, fmt.Errorf("carbon: run emissions: %w: energy %v J not in [0, %v]", ErrInvalidRequest, energyJoules, MaxRunEnergy)
	}
	avg, err := AverageIntensity(f, start, end)
	if err != nil {
		return 0, fmt.Errorf("carbon: run emissions: %w", err)
	}
	return Emissions(energyJoules, avg), nil
}
