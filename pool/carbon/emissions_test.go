package carbon

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestEmissions(t *testing.T) {
	// 3.6 MJ is 1 kWh.
	if g := Emissions(3.6e6, 250); g != 250 {
		t.Fatalf("1 kWh at 250 g/kWh = %v g", g)
	}
	if g := Emissions(0, 400); g != 0 {
		t.Fatalf("no energy emitted %v", g)
	}
}

func TestRunEmissions(t *testing.T) {
	f := Forecast{Zone: "z", Points: []Point{{t0, time.Hour, 100}, {t0.Add(time.Hour), time.Hour, 400}, {t0.Add(3 * time.Hour), time.Hour, 50}}}
	// 30 min at 100 and 30 min at 400 average 250 g/kWh; 2 kWh emit 500 g.
	g, err := RunEmissions(f, t0.Add(30*time.Minute), t0.Add(90*time.Minute), 7.2e6)
	if err != nil || !closeTo(g, 500) {
		t.Fatalf("got %v, %v", g, err)
	}
	avg, err := AverageIntensity(f, t0.Add(50*time.Minute), t0.Add(70*time.Minute))
	if err != nil || !closeTo(avg, 250) {
		t.Fatalf("average %v, %v", avg, err)
	}
	for name, c := range map[string]struct {
		s, e time.Time
		j    float64
		want error
	}{
		"across the gap":  {t0.Add(90 * time.Minute), t0.Add(200 * time.Minute), 1, ErrNoCoverage},
		"before":          {t0.Add(-time.Minute), t0.Add(time.Minute), 1, ErrNoCoverage},
		"after":           {t0.Add(4 * time.Hour), t0.Add(5 * time.Hour), 1, ErrNoCoverage},
		"backwards":       {t0.Add(time.Hour), t0, 1, ErrInvalidRequest},
		"empty":           {t0, t0, 1, ErrInvalidRequest},
		"negative energy": {t0, t0.Add(time.Hour), -1, ErrInvalidRequest},
		"NaN energy":      {t0, t0.Add(time.Hour), math.NaN(), ErrInvalidRequest},
		"Inf energy":      {t0, t0.Add(time.Hour), math.Inf(1), ErrInvalidRequest},
		"zero time":       {time.Time{}, t0, 1, ErrInvalidRequest},
	} {
		if _, err := RunEmissions(f, c.s, c.e, c.j); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if _, err := RunEmissions(Forecast{Zone: "z"}, t0, t0.Add(time.Hour), 1); !errors.Is(err, ErrInvalidForecast) {
		t.Errorf("empty forecast: %v", err)
	}
}

func TestPlanExpectedMatchesRunEmissions(t *testing.T) {
	fs, err := Parse(readTestdata(t, "watttime.json"))
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Earliest: t0, Deadline: t0.Add(6 * time.Hour), Duration: 47 * time.Minute, Power: 2500}
	c, err := Plan(req, fs)
	if err != nil {
		t.Fatal(err)
	}
	g, err := RunEmissions(fs[0], c.Start, c.End, req.Power*req.Duration.Seconds())
	if err != nil || !closeTo(g, c.Expected) {
		t.Fatalf("metered %v g, planned %v g (%v)", g, c.Expected, err)
	}
}
