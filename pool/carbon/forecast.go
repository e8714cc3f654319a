package carbon

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds on forecast input. A forecast comes from a file or a provider that
// Fleetlearn does not control, so every count and value is bounded before
// any arithmetic sees it. The year bounds keep every instant within int64
// nanoseconds of every other, so time differences never overflow.
const (
	MaxInputBytes    = 16 << 20
	MaxZones         = 64
	MaxPoints        = 100_000 // per zone: about a year at five minutes
	MaxIntensity     = 5000.0  // gCO2e/kWh; the dirtiest grids are near 1200
	MaxPointDuration = 24 * time.Hour
	MaxZoneLen       = 128
)

var (
	minTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// JoulesPerKWh converts metered joules to the kWh that intensities are
// quoted per.
const JoulesPerKWh = 3.6e6

// Point is one step of a forecast: Intensity gCO2e/kWh holds from Start for
// Duration.
type Point struct {
	Start     time.Time
	Duration  time.Duration
	Intensity float64
}

// End is the instant the point stops holding.
func (p Point) End() time.Time { return p.Start.Add(p.Duration) }

// Forecast is the carbon intensity of one zone (a grid region, a cloud
// location) over time. Points are sorted by Start and do not overlap; a gap
// between one point's End and the next Start is time the forecast says
// nothing about. The same type holds measured actuals.
type Forecast struct {
	Zone   string
	Points []Point
}

// Lookup returns the forecast for zone.
func Lookup(fs []Forecast, zone string) (Forecast, bool) {
	for _, f := range fs {
		if f.Zone == zone {
			return f, true
		}
	}
	return Forecast{}, false
}

func validZone(z string) error {
	if z == "" || len(z) > MaxZoneLen || !utf8.ValidString(z) {
		return fmt.Errorf("%w: zone name must be 1 to %d bytes", ErrInvalidForecast, MaxZoneLen)
	}
	for _, r := range z {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/", r)
		if !ok {
			return fmt.Errorf("%w: zone %q: only letters, digits and - _ . : / are allowed", ErrInvalidForecast, z)
		}
	}
	return nil
}

func saneTime(t time.Time) bool { return !t.Before(minTime) && t.Before(maxTime) }

// Validate checks one forecast against the bounds and the ordering rule.
func (f Forecast) Validate() error {
	if err := validZone(f.Zone); err != nil {
		return err
	}
	if len(f.Points) == 0 {
		return fmt.Errorf("%w: zone %q has no points; request a forecast that covers the planning horizon", ErrInvalidForecast, f.Zone)
	}
	if len(f.Points) > MaxPoints {
		return fmt.Errorf("%w: zone %q has %d points, more than %d", ErrTooLarge, f.Zone, len(f.Points), MaxPoints)
	}
	for i, p := range f.Points {
		if !saneTime(p.Start) {
			return fmt.Errorf("%w: zone %q point %d: start %s outside %d-%d", ErrInvalidForecast, f.Zone, i, p.Start.UTC().Format(time.RFC3339), minTime.Year(), maxTime.Year()-1)
		}
		if p.Duration <= 0 || p.Duration > MaxPointDuration {
			return fmt.Errorf("%w: zone %q point %d: duration %s not in (0, %s]", ErrInvalidForecast, f.Zone, i, p.Duration, MaxPointDuration)
		}
		if !saneTime(p.End()) {
			return fmt.Errorf("%w: zone %q point %d: ends after %d", ErrInvalidForecast, f.Zone, i, maxTime.Year()-1)
		}
		if math.IsNaN(p.Intensity) || p.Intensity < 0 || p.Intensity > MaxIntensity {
			return fmt.Errorf("%w: zone %q point %d: intensity %v gCO2e/kWh not in [0, %v]", ErrInvalidForecast, f.Zone, i, p.Intensity, MaxIntensity)
		}
		if i > 0 && p.Start.Before(f.Points[i-1].End()) {
			return fmt.Errorf("%w: zone %q point %d at %s starts before the previous point ends at %s; points must be sorted and must not overlap (a Carbon Aware SDK windowSize above the data resolution yields overlapping rolling averages: omit it)",
				ErrInvalidForecast, f.Zone, i, p.Start.UTC().Format(time.RFC3339), f.Points[i-1].End().UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// Validate checks a set of forecasts: at most MaxZones, each valid, no zone
// twice.
func Validate(fs []Forecast) error {
	if len(fs) == 0 {
		return fmt.Errorf("%w: no zones", ErrInvalidForecast)
	}
	if len(fs) > MaxZones {
		return fmt.Errorf("%w: %d zones, more than %d", ErrTooLarge, len(fs), MaxZones)
	}
	seen := make(map[string]bool, len(fs))
	for _, f := range fs {
		if err := f.Validate(); err != nil {
			return err
		}
		if seen[f.Zone] {
			return fmt.Errorf("%w: zone %q appears twice; merge its points into one forecast", ErrInvalidForecast, f.Zone)
		}
		seen[f.Zone] = true
	}
	return nil
}

// digestDomain separates this encoding from any other sha256 in Fleetlearn
// and versions it: a change to the encoding changes the prefix.
const digestDomain = "fleetlearn carbon forecast v1\n"

// Digest is the hex sha256 of a canonical encoding of the parsed points:
// zones in name order, each as its length-prefixed name, its point count
// and, per point, start (Unix ns), duration (ns) and intensity (IEEE 754
// bits), all big-endian. It identifies the data a decision used whatever
// layout, field order or whitespace it arrived in. Call it on valid
// forecasts; the result for an invalid set is well defined but means
// nothing.
func Digest(fs []Forecast) string {
	order := make([]int, len(fs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(fs[a].Zone, fs[b].Zone) })
	h := sha256.New()
	h.Write([]byte(digestDomain))
	var buf [24]byte
	for _, i := range order {
		f := fs[i]
		binary.BigEndian.PutUint64(buf[:8], uint64(len(f.Zone)))
		h.Write(buf[:8])
		h.Write([]byte(f.Zone))
		binary.BigEndian.PutUint64(buf[:8], uint64(len(f.Points)))
		h.Write(buf[:8])
		for _, p := range f.Points {
			v := p.Intensity
			if v == 0 {
				v = 0 // -0 and +0 are the same intensity
			}
			binary.BigEndian.PutUint64(buf[0:8], uint64(p.Start.UnixNano()))
			binary.BigEndian.PutUint64(buf[8:16], uint64(p.Duration))
			binary.BigEndian.PutUint64(buf[16:24], math.Float64bits(v))
			h.Write(buf[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
