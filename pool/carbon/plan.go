package carbon

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Bounds on a Request.
const (
	MaxJobDuration = 366 * 24 * time.Hour
	MaxPower       = 1e9 // watts: a gigawatt is far past any one job
)

// tieTolerance is the relative difference below which two windows' costs
// count as equal, so float rounding in how a cost was summed never decides
// between windows that are the same in exact arithmetic.
const tieTolerance = 1e-9

// Request describes a job to place.
type Request struct {
	// Earliest is the first instant the job may start, usually now.
	Earliest time.Time
	// Deadline is when the job must have ended. Zero means the job may run
	// anywhere the forecasts cover.
	Deadline time.Time
	// Duration is how long the job runs.
	Duration time.Duration
	// Power is the job's expected average draw in watts. Set Power or
	// Energy, not both.
	Power float64
	// Energy is the job's expected total energy in joules, spread evenly
	// over Duration.
	Energy float64
	// Zones restricts the choice to these zones; empty means every zone
	// with a forecast.
	Zones []string
	// Home is the zone the job would run in without carbon awareness, the
	// baseline the reason compares against. Empty means the best zone to
	// start in at Earliest, so the comparison shows what waiting saves.
	Home string
}

// Choice is where and when a job should run, and why.
type Choice struct {
	Zone       string
	Start, End time.Time
	// Expected is the job's expected emissions in gCO2e.
	Expected float64
	// Intensity is the average forecast intensity over the run, gCO2e/kWh.
	Intensity float64
	// Baseline is the expected gCO2e of starting at Earliest in
	// BaselineZone; BaselineZone is empty when no forecast covers that.
	Baseline     float64
	BaselineZone string
	// Digest is the Digest of the forecasts the decision used, for the
	// audit log.
	Digest string
	// Reason says it in words.
	Reason string
}

func (r Request) power() float64 {
	if r.Power > 0 {
		return r.Power
	}
	return r.Energy / r.Duration.Seconds()
}

func (r Request) validate(fs []Forecast) error {
	if r.Earliest.IsZero() || !saneTime(r.Earliest) {
		return fmt.Errorf("%w: earliest start must be set, within %d-%d", ErrInvalidRequest, minTime.Year(), maxTime.Year()-1)
	}
	if !r.Deadline.IsZero() && !saneTime(r.Deadline) {
		return fmt.Errorf("%w: deadline outside %d-%d", ErrInvalidRequest, minTime.Year(), maxTime.Year()-1)
	}
	if r.Duration <= 0 || r.Duration > MaxJobDuration {
		return fmt.Errorf("%w: duration %s not in (0, %s]", ErrInvalidRequest, r.Duration, MaxJobDuration)
	}
	okPower := func(v float64) bool { return v > 0 && v <= MaxPower && !math.IsInf(v, 0) }
	switch {
	case r.Power != 0 && r.Energy != 0:
		return fmt.Errorf("%w: set power or energy, not both", ErrInvalidRequest)
	case r.Power != 0:
		if !okPower(r.Power) {
			return fmt.Errorf("%w: power %v W not in (0, %v]", ErrInvalidRequest, r.Power, MaxPower)
		}
	case r.Energy != 0:
		if !(r.Energy > 0) || !okPower(r.Energy/r.Duration.Seconds()) {
			return fmt.Errorf("%w: energy %v J over %s is not an average power in (0, %v] W", ErrInvalidRequest, r.Energy, r.Duration, MaxPower)
		}
	default:
		return fmt.Errorf("%w: set the job's power (W) or energy (J)", ErrInvalidRequest)
	}
	if len(r.Zones) > MaxZones {
		return fmt.Errorf("%w: %d zones, more than %d", ErrInvalidRequest, len(r.Zones), MaxZones)
	}
	for _, z := range r.Zones {
		if _, ok := Lookup(fs, z); !ok {
			return fmt.Errorf("%w: zone %q has no forecast", ErrInvalidRequest, z)
		}
	}
	if r.Home != "" {
		if _, ok := Lookup(fs, r.Home); !ok {
			return fmt.Errorf("%w: home zone %q has no forecast", ErrInvalidRequest, r.Home)
		}
	}
	return nil
}

// index answers "integral and covered time up to t" in O(log n) with
// compensated prefix sums, so a window's cost is accurate to its own size
// rather than to the size of the whole forecast.
type index struct {
	zone         string
	starts, ends []int64   // Unix ns
	val          []float64 // gCO2e/kWh
	hi, lo       []float64 // prefix integral, gCO2e·s/kWh, as an unevaluated sum hi+lo
	cov          []int64   // prefix covered ns
}

func newIndex(f Forecast) *index {
	n := len(f.Points)
	x := &index{zone: f.Zone, starts: make([]int64, n), ends: make([]int64, n), val: make([]float64, n),
		hi: make([]float64, n+1), lo: make([]float64, n+1), cov: make([]int64, n+1)}
	for i, p := range f.Points {
		x.starts[i], x.ends[i], x.val[i] = p.Start.UnixNano(), p.End().UnixNano(), p.Intensity
		s, e := twoSum(x.hi[i], p.Intensity*p.Duration.Seconds())
		x.hi[i+1], x.lo[i+1] = s, x.lo[i]+e
		x.cov[i+1] = x.cov[i] + int64(p.Duration)
	}
	return x
}

// twoSum is Knuth's error-free addition: s+e == a+b exactly.
func twoSum(a, b float64) (s, e float64) {
	s = a + b
	bb := s - a
	e = (a - (s - bb)) + (b - bb)
	return s, e
}

// at returns the prefix integral at t as hi+lo+part, and the covered ns.
func (x *index) at(t int64) (hi, lo, part float64, cov int64) {
	k := sort.Search(len(x.starts), func(i int) bool { return x.starts[i] > t })
	if k == 0 {
		return 0, 0, 0, 0
	}
	i := k - 1
	c := min(t-x.starts[i], x.ends[i]-x.starts[i])
	return x.hi[i], x.lo[i], x.val[i] * float64(c) / 1e9, x.cov[i] + c
}

// cost is the integral of intensity over [s, e] in gCO2e·s/kWh, and
// whether the forecast covers all of it.
func (x *index) cost(s, e int64) (float64, bool) {
	h1, l1, p1, c1 := x.at(s)
	h2, l2, p2, c2 := x.at(e)
	if c2-c1 != e-s {
		return 0, false
	}
	return (h2 - h1) + (l2 - l1) + (p2 - p1), true
}

// candidates calls fn with every start in [lo, hi] at which the cost of a
// d-long window can be least: the interval's ends, every point boundary b
// and every b-d (see the package doc).
func (x *index) candidates(lo, hi, d int64, fn func(s int64)) {
	try := func(s int64) {
		if s >= lo && s <= hi {
			fn(s)
		}
	}
	try(lo)
	try(hi)
	for i := range x.starts {
		for _, b := range [2]int64{x.starts[i], x.ends[i]} {
			try(b)
			try(b - d)
		}
	}
}

// Plan chooses the zone and start, at or after req.Earliest and ending by
// req.Deadline, that minimise the job's expected emissions under fs.
// Windows that any forecast gap touches are never chosen. Costs within one
// part in 10^9 tie, and ties go to the earliest start, then the zone name.
func Plan(req Request, fs []Forecast) (Choice, error) {
	if err := Validate(fs); err != nil {
		return Choice{}, fmt.Errorf("carbon: plan: %w", err)
	}
	if err := req.validate(fs); err != nil {
		return Choice{}, fmt.Errorf("carbon: plan: %w", err)
	}
	var zones []*index
	for _, f := range fs {
		if len(req.Zones) == 0 || slices.Contains(req.Zones, f.Zone) {
			zones = append(zones, newIndex(f))
		}
	}
	slices.SortFunc(zones, func(a, b *index) int { return strings.Compare(a.zone, b.zone) })

	d := int64(req.Duration)
	lo := req.Earliest.UnixNano()
	var hi int64
	if !req.Deadline.IsZero() {
		hi = req.Deadline.UnixNano() - d
		if hi < lo {
			return Choice{}, fmt.Errorf("carbon: plan: %w: a %s job starting at %s ends after %s", ErrInfeasible,
				req.Duration, req.Earliest.UTC().Format(time.RFC3339), req.Deadline.UTC().Format(time.RFC3339))
		}
	} else {
		hi = math.MinInt64
		for _, z := range zones {
			hi = max(hi, z.ends[len(z.ends)-1]-d)
		}
	}

	best := math.Inf(1)
	for _, z := range zones {
		z.candidates(lo, hi, d, func(s int64) {
			if c, ok := z.cost(s, s+d); ok && c < best {
				best = c
			}
		})
	}
	if math.IsInf(best, 1) {
		return Choice{}, fmt.Errorf("carbon: plan: %w: no allowed zone's forecast covers a whole %s window starting between %s and %s; refresh the forecast or move the deadline",
			ErrNoCoverage, req.Duration, req.Earliest.UTC().Format(time.RFC3339), time.Unix(0, max(lo, hi)).UTC().Format(time.RFC3339))
	}
	limit := best + tieTolerance*best + 1e-12
	var pick *index
	var start int64
	for _, z := range zones {
		first, found := int64(math.MaxInt64), false
		z.candidates(lo, hi, d, func(s int64) {
			if s < first {
				if c, ok := z.cost(s, s+d); ok && c <= limit {
					first, found = s, true
				}
			}
		})
		if found && (pick == nil || first < start) {
			pick, start = z, first
		}
	}

	f, _ := Lookup(fs, pick.zone)
	s, e := time.Unix(0, start).UTC(), time.Unix(0, start+d).UTC()
	integral, _ := integrate(f, s, e)
	p := req.power()
	ch := Choice{Zone: pick.zone, Start: s, End: e, Expected: p * integral / JoulesPerKWh,
		Intensity: integral / req.Duration.Seconds(), Digest: Digest(fs)}

	baseZones := zones
	if req.Home != "" {
		h, _ := Lookup(fs, req.Home)
		baseZones = []*index{newIndex(h)}
	}
	baseCost := math.Inf(1)
	for _, z := range baseZones {
		if c, ok := z.cost(lo, lo+d); ok && c < baseCost {
			bf, _ := Lookup(fs, z.zone)
			exact, _ := integrate(bf, req.Earliest, req.Earliest.Add(req.Duration))
			baseCost, ch.BaselineZone, ch.Baseline = c, z.zone, p*exact/JoulesPerKWh
		}
	}
	ch.Reason = reason(ch, req.Earliest)
	return ch, nil
}

func grams(g float64) string {
	if g >= 10 {
		return strconv.FormatFloat(g, 'f', 0, 64) + " g"
	}
	return strconv.FormatFloat(g, 'f', 2, 64) + " g"
}

func reason(c Choice, earliest time.Time) string {
	head := fmt.Sprintf("zone %s at %s: %s expected (%.0f gCO2e/kWh average)", c.Zone, c.Start.Format(time.RFC3339), grams(c.Expected), c.Intensity)
	switch {
	case c.BaselineZone == "":
		return head + "; no forecast covers starting now, so there is no baseline"
	case c.Zone == c.BaselineZone && c.Start.Equal(earliest.UTC()):
		return head + ", starting now is already the best"
	case c.Baseline > 0:
		return fmt.Sprintf("%s, %.0f%% below starting now in %s (%s)", head, 100*(c.Baseline-c.Expected)/c.Baseline, c.BaselineZone, grams(c.Baseline))
	}
	return fmt.Sprintf("%s; starting now in %s would emit %s", head, c.BaselineZone, grams(c.Baseline))
}
