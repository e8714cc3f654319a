package carbon

import (
	"errors"
	"testing"
	"time"
)

// FuzzParse feeds arbitrary bytes to Parse: it either refuses them with one
// of the sentinels, or returns forecasts that are valid, digest stably and
// can be planned over without panicking.
func FuzzParse(f *testing.F) {
	f.Add(readTestdata(f, "carbon-aware-sdk.json"))
	f.Add(readTestdata(f, "watttime.json"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidForecast) && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrUnknownFormat) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		if err := Validate(fs); err != nil {
			t.Fatalf("Parse returned invalid forecasts: %v", err)
		}
		again, err := Parse(b)
		if err != nil || Digest(again) != Digest(fs) {
			t.Fatal("parse is not deterministic")
		}
		first := fs[0].Points[0]
		c, err := Plan(Request{Earliest: first.Start, Duration: first.Duration, Power: 100}, fs)
		if err != nil {
			t.Fatalf("the first point's own window is covered: %v", err)
		}
		if c.Start.Before(first.Start) || c.Expected < 0 || c.Digest != Digest(fs) {
			t.Fatalf("choice %+v", c)
		}
		if _, err := Plan(Request{Earliest: first.Start, Deadline: first.Start.Add(24 * time.Hour), Duration: time.Minute, Energy: 1}, fs); err != nil && !errors.Is(err, ErrNoCoverage) && !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("plan: %v", err)
		}
	})
}
