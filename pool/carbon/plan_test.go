package carbon

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// naiveCost integrates a window by walking every point, with none of
// Plan's prefix sums or searches, and reports whether it is covered.
func naiveCost(f Forecast, s, e time.Time) (float64, bool) {
	var sum time.Duration
	var g float64
	for _, p := range f.Points {
		if !p.Start.Before(e) {
			break
		}
		a, b := p.Start, p.End()
		if a.Before(s) {
			a = s
		}
		if b.After(e) {
			b = e
		}
		if b.After(a) {
			g += p.Intensity * b.Sub(a).Seconds()
			sum += b.Sub(a)
		}
	}
	return g, sum == e.Sub(s)
}

type brute struct {
	zone  string
	start time.Time
	cost  float64 // gCO2e·s/kWh
}

// bruteForce tries every whole-minute start in every zone, with Plan's tie
// rule: least cost, then earliest, then zone name.
func bruteForce(req Request, fs []Forecast) (brute, bool) {
	best, found := brute{cost: math.Inf(1)}, false
	first := req.Earliest.Truncate(time.Minute)
	if first.Before(req.Earliest) {
		first = first.Add(time.Minute)
	}
	for s := first; !s.Add(req.Duration).After(req.Deadline); s = s.Add(time.Minute) {
		for _, f := range fs {
			c, ok := naiveCost(f, s, s.Add(req.Duration))
			if !ok {
				continue
			}
			tol := tieTolerance*math.Max(c, best.cost) + 1e-9
			if !found || c < best.cost-tol || (math.Abs(c-best.cost) <= tol && (s.Before(best.start) || s.Equal(best.start) && f.Zone < best.zone)) {
				best, found = brute{f.Zone, s, c}, true
			}
		}
	}
	return best, found
}

func closeTo(a, b float64) bool { return math.Abs(a-b) <= 1e-7*math.Max(math.Abs(a), math.Abs(b))+1e-9 }

func TestPlanFromFileIsBruteForceOptimum(t *testing.T) {
	fs, raw, err := FileSource{Path: "testdata/carbon-aware-sdk.json"}.Forecasts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, dur := range []time.Duration{5 * time.Minute, 37 * time.Minute, 2 * time.Hour, 5*time.Hour + 57*time.Minute} {
		req := Request{Earliest: t0.Add(3 * time.Minute), Deadline: t0.Add(6 * time.Hour), Duration: dur, Power: 8 * 700}
		c, err := Plan(req, fs)
		if err != nil {
			t.Fatal(err)
		}
		b, ok := bruteForce(req, fs)
		if !ok {
			t.Fatal("brute force found nothing")
		}
		if c.Zone != b.zone || !c.Start.Equal(b.start) || !closeTo(c.Expected, req.Power*b.cost/JoulesPerKWh) {
			t.Fatalf("%s: plan %s at %s (%v g), brute force %s at %s (%v g)", dur, c.Zone, c.Start, c.Expected, b.zone, b.start, req.Power*b.cost/JoulesPerKWh)
		}
		if c.End.After(req.Deadline) || c.Start.Before(req.Earliest) {
			t.Fatalf("window %s-%s outside the request", c.Start, c.End)
		}
		again, _ := Parse(raw)
		if c.Digest != Digest(again) {
			t.Fatal("the digest does not match the raw bytes the source returned")
		}
	}
}

// randomForecast is a step function at 5-minute resolution over 24 h whose
// steps last 5 to 120 minutes, optionally with gaps.
func randomForecast(r *rand.Rand, zone string, gaps bool) Forecast {
	f := Forecast{Zone: zone}
	end := t0.Add(24 * time.Hour)
	v := 50 + 600*r.Float64()
	for t := t0; t.Before(end); {
		run := time.Duration(1+r.IntN(24)) * 5 * time.Minute
		if r.IntN(3) == 0 {
			v = 50 + 600*r.Float64()
		}
		if r.IntN(10) == 0 {
			v = math.Round(v) // repeated exact values make ties
		}
		for i := time.Duration(0); i < run && t.Before(end); i += 5 * time.Minute {
			f.Points = append(f.Points, Point{t, 5 * time.Minute, v})
			t = t.Add(5 * time.Minute)
		}
		if gaps && r.IntN(15) == 0 {
			t = t.Add(time.Duration(1+r.IntN(6)) * 5 * time.Minute)
		}
	}
	return f
}

func TestPlanMatchesBruteForce(t *testing.T) {
	trials := 100
	if testing.Short() {
		trials = 25
	}
	r := rand.New(rand.NewPCG(17, 3))
	onGrid, offGrid, beaten, noCover := 0, 0, 0, 0
	for trial := range trials {
		gaps := trial%3 == 0
		fs := []Forecast{randomForecast(r, "eu-north", gaps), randomForecast(r, "us-west", gaps), randomForecast(r, "ap-south", gaps)}
		aligned := trial%2 == 0
		earliest := t0.Add(time.Duration(r.IntN(12*60)) * time.Minute)
		dur := time.Duration(1+r.IntN(6*60)) * time.Minute
		slack := time.Duration(r.IntN(12*60)) * time.Minute
		if !aligned {
			earliest = earliest.Add(time.Duration(1+r.IntN(59)) * time.Second)
			dur += time.Duration(r.IntN(60)) * time.Second
			slack += time.Duration(r.IntN(60)) * time.Second
		}
		req := Request{Earliest: earliest, Deadline: earliest.Add(dur + slack), Duration: dur, Power: 1000}
		c, err := Plan(req, fs)
		b, found := bruteForce(req, fs)
		if errors.Is(err, ErrNoCoverage) {
			// Plan tries a superset of the covered windows that the grid
			// could hit, so brute force must find none either.
			if found {
				t.Fatalf("trial %d: plan found no coverage, brute force found %s at %s", trial, b.zone, b.start)
			}
			noCover++
			continue
		}
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		got, ok := naiveCost(mustLookup(t, fs, c.Zone), c.Start, c.End)
		if !ok || c.Start.Before(req.Earliest) || c.End.After(req.Deadline) || c.End.Sub(c.Start) != dur {
			t.Fatalf("trial %d: plan %s %s-%s is not a covered window of the request", trial, c.Zone, c.Start, c.End)
		}
		if !closeTo(c.Expected, req.Power*got/JoulesPerKWh) {
			t.Fatalf("trial %d: expected %v g, window costs %v g", trial, c.Expected, req.Power*got/JoulesPerKWh)
		}
		if !found {
			// Off the grid, a covered window may exist that no whole minute
			// starts; on the grid every candidate is a whole minute.
			if aligned {
				t.Fatalf("trial %d: brute force found nothing, plan found %s at %s", trial, c.Zone, c.Start)
			}
			continue
		}
		if got > b.cost+tieTolerance*b.cost+1e-9 {
			t.Fatalf("trial %d: plan %s at %s costs %v, brute force %s at %s costs %v", trial, c.Zone, c.Start, got, b.zone, b.start, b.cost)
		}
		if aligned {
			onGrid++
			if c.Zone != b.zone || !c.Start.Equal(b.start) {
				t.Fatalf("trial %d: plan %s at %s (%v), brute force %s at %s (%v)", trial, c.Zone, c.Start, got, b.zone, b.start, b.cost)
			}
		} else {
			offGrid++
			if got < b.cost-tieTolerance*b.cost-1e-9 {
				beaten++
			}
		}
	}
	t.Logf("%d on the grid equal, %d off the grid no worse (%d strictly better), %d without coverage", onGrid, offGrid, beaten, noCover)
	if onGrid == 0 || offGrid == 0 || (!testing.Short() && (beaten == 0 || noCover == 0)) {
		t.Fatal("the trials did not exercise every case")
	}
}

func mustLookup(t *testing.T, fs []Forecast, zone string) Forecast {
	t.Helper()
	f, ok := Lookup(fs, zone)
	if !ok {
		t.Fatalf("plan chose %q, which has no forecast", zone)
	}
	return f
}

func flat(zone string, start time.Time, hours int, v float64) Forecast {
	f := Forecast{Zone: zone}
	for i := range hours {
		f.Points = append(f.Points, Point{start.Add(time.Duration(i) * time.Hour), time.Hour, v})
	}
	return f
}

func TestPlanTiesGoEarliestThenByName(t *testing.T) {
	fs := []Forecast{flat("b", t0, 10, 200), flat("a", t0, 10, 200)}
	c, err := Plan(Request{Earliest: t0.Add(time.Hour), Deadline: t0.Add(10 * time.Hour), Duration: 2 * time.Hour, Power: 500}, fs)
	if err != nil {
		t.Fatal(err)
	}
	if c.Zone != "a" || !c.Start.Equal(t0.Add(time.Hour)) {
		t.Fatalf("tie went to %s at %s", c.Zone, c.Start)
	}
	// 500 W for 2 h is 1 kWh, at 200 g/kWh.
	if !closeTo(c.Expected, 200) || c.Intensity != 200 {
		t.Fatalf("expected %v g at %v", c.Expected, c.Intensity)
	}
	if !strings.Contains(c.Reason, "starting now is already the best") {
		t.Fatalf("reason %q", c.Reason)
	}
	// Input order does not matter.
	c2, _ := Plan(Request{Earliest: t0.Add(time.Hour), Deadline: t0.Add(10 * time.Hour), Duration: 2 * time.Hour, Power: 500}, []Forecast{fs[1], fs[0]})
	if c2 != c {
		t.Fatalf("order changed the plan: %+v vs %+v", c2, c)
	}
}

func TestPlanWaitsAndMoves(t *testing.T) {
	home := flat("home", t0, 12, 400)
	away := flat("away", t0, 12, 300)
	away.Points[6].Intensity, away.Points[7].Intensity = 100, 100
	fs := []Forecast{home, away}
	req := Request{Earliest: t0, Deadline: t0.Add(12 * time.Hour), Duration: 2 * time.Hour, Energy: 7.2e6, Home: "home"}
	c, err := Plan(req, fs)
	if err != nil {
		t.Fatal(err)
	}
	// 7.2 MJ is 2 kWh: 200 g at 100 g/kWh against 800 g at home now.
	if c.Zone != "away" || !c.Start.Equal(t0.Add(6*time.Hour)) || !closeTo(c.Expected, 200) || !closeTo(c.Baseline, 800) || c.BaselineZone != "home" {
		t.Fatalf("choice %+v", c)
	}
	want := "zone away at 2026-05-03T16:00:00Z: 200 g expected (100 gCO2e/kWh average), 75% below starting now in home (800 g)"
	if c.Reason != want {
		t.Fatalf("reason %q, want %q", c.Reason, want)
	}
	// Restricted to home, it runs at once.
	req.Zones = []string{"home"}
	c, _ = Plan(req, fs)
	if c.Zone != "home" || !c.Start.Equal(t0) {
		t.Fatalf("restricted choice %+v", c)
	}
	// A 3 h job costs 500 g whether it starts at 15:00 (300, 100, 100) or
	// at 16:00 (100, 100, 300); the tie goes to the earlier.
	req = Request{Earliest: t0.Add(time.Minute), Deadline: t0.Add(12 * time.Hour), Duration: 3 * time.Hour, Power: 1000}
	c, _ = Plan(req, fs)
	if c.Zone != "away" || !c.Start.Equal(t0.Add(5*time.Hour)) || !closeTo(c.Expected, 500) {
		t.Fatalf("3 h choice %+v", c)
	}
	if !strings.Contains(c.Reason, "% below starting now in away") {
		t.Fatalf("without Home the baseline is the best zone now: %q", c.Reason)
	}
}

func TestPlanNeverCrossesGaps(t *testing.T) {
	f := flat("z", t0, 10, 500)
	f.Points[4].Intensity = 10 // cheap hour, but the next hour is missing
	f.Points = append(f.Points[:5], f.Points[6:]...)
	c, err := Plan(Request{Earliest: t0, Deadline: t0.Add(10 * time.Hour), Duration: 90 * time.Minute, Power: 1000}, []Forecast{f})
	if err != nil {
		t.Fatal(err)
	}
	// The cheapest covered 90 minutes end at the gap: 4:30-6:00 would cross it.
	if !c.Start.Equal(t0.Add(3*time.Hour + 30*time.Minute)) {
		t.Fatalf("start %s", c.Start)
	}
	_, err = Plan(Request{Earliest: t0, Deadline: t0.Add(10 * time.Hour), Duration: 6 * time.Hour, Power: 1000}, []Forecast{f})
	if !errors.Is(err, ErrNoCoverage) {
		t.Fatalf("6 h across the gap: %v", err)
	}
	_, err = Plan(Request{Earliest: t0.Add(20 * time.Hour), Duration: time.Hour, Power: 1000}, []Forecast{f})
	if !errors.Is(err, ErrNoCoverage) {
		t.Fatalf("after the forecast: %v", err)
	}
	// No deadline: anywhere the forecast covers.
	c, err = Plan(Request{Earliest: t0, Duration: time.Hour, Power: 1000}, []Forecast{f})
	if err != nil || !c.Start.Equal(t0.Add(4*time.Hour)) {
		t.Fatalf("no deadline: %+v, %v", c, err)
	}
	// Starting now is not covered: the reason says there is no baseline.
	c, err = Plan(Request{Earliest: t0.Add(-time.Hour), Duration: time.Hour, Power: 1000}, []Forecast{f})
	if err != nil || !strings.Contains(c.Reason, "no baseline") {
		t.Fatalf("uncovered now: %+v, %v", c, err)
	}
}

func TestPlanRefusesBadRequests(t *testing.T) {
	fs := []Forecast{flat("z", t0, 10, 100)}
	ok := Request{Earliest: t0, Deadline: t0.Add(5 * time.Hour), Duration: time.Hour, Power: 100}
	for name, c := range map[string]struct {
		mut  func(*Request)
		want error
	}{
		"no earliest":      {func(r *Request) { r.Earliest = time.Time{} }, ErrInvalidRequest},
		"deadline 1900":    {func(r *Request) { r.Deadline = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC) }, ErrInvalidRequest},
		"zero duration":    {func(r *Request) { r.Duration = 0 }, ErrInvalidRequest},
		"two-year job":     {func(r *Request) { r.Duration = 2 * 366 * 24 * time.Hour }, ErrInvalidRequest},
		"no power":         {func(r *Request) { r.Power = 0 }, ErrInvalidRequest},
		"NaN power":        {func(r *Request) { r.Power = math.NaN() }, ErrInvalidRequest},
		"Inf power":        {func(r *Request) { r.Power = math.Inf(1) }, ErrInvalidRequest},
		"negative power":   {func(r *Request) { r.Power = -1 }, ErrInvalidRequest},
		"power and energy": {func(r *Request) { r.Energy = 1 }, ErrInvalidRequest},
		"NaN energy":       {func(r *Request) { r.Power, r.Energy = 0, math.NaN() }, ErrInvalidRequest},
		"unknown zone":     {func(r *Request) { r.Zones = []string{"mars"} }, ErrInvalidRequest},
		"unknown home":     {func(r *Request) { r.Home = "mars" }, ErrInvalidRequest},
		"infeasible":       {func(r *Request) { r.Deadline = t0.Add(30 * time.Minute) }, ErrInfeasible},
	} {
		r := ok
		c.mut(&r)
		if _, err := Plan(r, fs); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if _, err := Plan(ok, append(fs, fs[0])); !errors.Is(err, ErrInvalidForecast) {
		t.Errorf("duplicate zone: %v", err)
	}
	if _, err := Plan(ok, fs); err != nil {
		t.Fatal(err)
	}
}

func TestPlanLargeForecastIsExact(t *testing.T) {
	if testing.Short() {
		t.Skip("a year of five-minute points in four zones")
	}
	r := rand.New(rand.NewPCG(5, 5))
	var fs []Forecast
	for _, z := range []string{"a", "b", "c", "d"} {
		f := Forecast{Zone: z, Points: make([]Point, MaxPoints)}
		for i := range f.Points {
			f.Points[i] = Point{t0.Add(time.Duration(i) * 5 * time.Minute), 5 * time.Minute, 200 + 400*r.Float64()}
		}
		fs = append(fs, f)
	}
	// The cheapest hour anywhere, planted late in the year.
	for i := 90_000; i < 90_012; i++ {
		fs[2].Points[i].Intensity = 1
	}
	c, err := Plan(Request{Earliest: t0, Deadline: t0.Add(MaxPoints * 5 * time.Minute), Duration: time.Hour, Power: 1000}, fs)
	if err != nil {
		t.Fatal(err)
	}
	if c.Zone != "c" || !c.Start.Equal(fs[2].Points[90_000].Start) || !closeTo(c.Expected, 1) {
		t.Fatalf("choice %+v", c)
	}
}
