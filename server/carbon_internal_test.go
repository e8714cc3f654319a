package server

import (
	"context"
	"errors"
	"math"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool/carbon"
	"github.com/fleetlearn/fleetlearn/server/internal/carbonhttp"
)

// A forecast file is read as a file, with no HTTP client in sight; only a
// URL makes a provider source, and an insecure one is refused at start.
func TestCarbonSourceKinds(t *testing.T) {
	if s, err := carbonSource(""); s != nil || err != nil {
		t.Fatalf("none: %v %v", s, err)
	}
	if s, err := carbonSource("/etc/fleetlearn/forecast.json"); err != nil {
		t.Fatal(err)
	} else if _, ok := s.(carbon.FileSource); !ok {
		t.Fatalf("a path gave %T", s)
	}
	if s, err := carbonSource("https://carbon.example.net/emissions/forecasts/current?location=westus"); err != nil {
		t.Fatal(err)
	} else if _, ok := s.(*carbonhttp.Source); !ok {
		t.Fatalf("a URL gave %T", s)
	}
	if _, err := carbonSource("http://carbon.example.net/f"); err == nil {
		t.Fatal("plain http to another host accepted")
	}
}

// countingTransport fails every request and counts them.
type countingTransport struct{ calls atomic.Int64 }

func (c *countingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	c.calls.Add(1)
	return nil, errors.New("this test allows no network call")
}

// TestCarbonFilePlanMakesNoNetworkCall plans from a forecast file with
// every HTTP client of the process failing: the plan is made, equals
// the optimum the pool/carbon tests check by brute force, and no request
// was attempted. A provider URL, by contrast, does reach the transport.
func TestCarbonFilePlanMakesNoNetworkCall(t *testing.T) {
	tr := &countingTransport{}
	old := http.DefaultTransport
	http.DefaultTransport = tr
	t.Cleanup(func() { http.DefaultTransport = old })

	src, err := carbonSource(filepath.Join("..", "pool", "carbon", "testdata", "carbon-aware-sdk.json"))
	if err != nil {
		t.Fatal(err)
	}
	fs, _, err := src.Forecasts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t0 := fs[0].Points[0].Start
	req := carbon.Request{Earliest: t0, Deadline: t0.Add(6 * time.Hour), Duration: 2 * time.Hour, Power: 5600}
	c, err := carbon.Plan(req, fs)
	if err != nil {
		t.Fatal(err)
	}
	// The brute force over every 1-minute start of every zone.
	best, bestZone, bestStart := math.Inf(1), "", time.Time{}
	for _, f := range fs {
		for s := req.Earliest; !s.Add(req.Duration).After(req.Deadline); s = s.Add(time.Minute) {
			e, err := carbon.RunEmissions(f, s, s.Add(req.Duration), req.Power*req.Duration.Seconds())
			if err != nil {
				continue // a window the zone does not cover
			}
			if e < best*(1-1e-9) {
				best, bestZone, bestStart = e, f.Zone, s
			}
		}
	}
	if c.Zone != bestZone || !c.Start.Equal(bestStart) {
		t.Fatalf("plan %s at %s (%.3f g), brute force %s at %s (%.3f g)", c.Zone, c.Start, c.Expected, bestZone, bestStart, best)
	}
	if n := tr.calls.Load(); n != 0 {
		t.Fatalf("planning from a file made %d HTTP requests", n)
	}

	url, err := carbonSource("https://carbon.example.net/emissions/forecasts/current?location=westus")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := url.Forecasts(context.Background()); err == nil || tr.calls.Load() == 0 {
		t.Fatalf("the provider source did not go through the failing transport: %v, %d calls", err, tr.calls.Load())
	}
}
