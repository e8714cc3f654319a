package carbon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// LbsPerMWhToGPerKWh converts WattTime's lbs_co2_per_mwh to gCO2e/kWh:
// 453.592 g per lb over 1000 kWh per MWh.
const LbsPerMWhToGPerKWh = 0.453592

// sdkForecast is one element of the Carbon Aware SDK's
// GET /emissions/forecasts/current response (EmissionsForecastDTO). Its
// optimalDataPoints, dataStartAt, dataEndAt and requestedAt are ignored:
// Plan computes its own optimum from forecastData for the job's own window.
type sdkForecast struct {
	Location     string      `json:"location"`
	WindowSize   *int64      `json:"windowSize"`
	ForecastData *[]sdkPoint `json:"forecastData"`
}

// sdkPoint is an EmissionsDataDTO: duration in minutes, value in
// gCO2eq/kWh.
type sdkPoint struct {
	Location  string   `json:"location"`
	Timestamp string   `json:"timestamp"`
	Duration  *int64   `json:"duration"`
	Value     *float64 `json:"value"`
}

// wtResponse is WattTime's v3 /forecast response. WattTime adds meta fields
// over time (warnings, model, generated_at_period_seconds); unknown fields
// are ignored, the ones read are checked.
type wtResponse struct {
	Data *[]wtPoint `json:"data"`
	Meta *wtMeta    `json:"meta"`
}

type wtPoint struct {
	PointTime string   `json:"point_time"`
	Value     *float64 `json:"value"`
}

type wtMeta struct {
	Region                 string `json:"region"`
	SignalType             string `json:"signal_type"`
	Units                  string `json:"units"`
	DataPointPeriodSeconds *int64 `json:"data_point_period_seconds"`
}

func checkSize(b []byte) error {
	if len(b) > MaxInputBytes {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, len(b), MaxInputBytes)
	}
	return nil
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: timestamp %q is not RFC 3339", ErrInvalidForecast, s)
	}
	if !saneTime(t) {
		return time.Time{}, fmt.Errorf("%w: timestamp %q outside %d-%d", ErrInvalidForecast, s, minTime.Year(), maxTime.Year()-1)
	}
	return t.UTC(), nil
}

// intensity normalises -0 so that equal data encodes and digests alike.
func intensity(v float64) float64 {
	if v == 0 {
		return 0
	}
	return v
}

// ParseCarbonAwareSDK parses the Carbon Aware SDK's EmissionsForecast JSON:
// the array that GET /emissions/forecasts/current returns, or one element
// of it. Each element is one zone, named by its location.
func ParseCarbonAwareSDK(b []byte) ([]Forecast, error) {
	fs, err := parseSDK(b)
	if err != nil {
		return nil, fmt.Errorf("carbon: parse Carbon Aware SDK forecast: %w", err)
	}
	return fs, nil
}

func parseSDK(b []byte) ([]Forecast, error) {
	if err := checkSize(b); err != nil {
		return nil, err
	}
	var raw []sdkForecast
	switch firstByte(b) {
	case '[':
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidForecast, err)
		}
	case '{':
		var one sdkForecast
		if err := json.Unmarshal(b, &one); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidForecast, err)
		}
		raw = []sdkForecast{one}
	default:
		return nil, fmt.Errorf("%w: expected a JSON array of EmissionsForecast objects", ErrUnknownFormat)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: empty forecast array; check the location query", ErrInvalidForecast)
	}
	if len(raw) > MaxZones {
		return nil, fmt.Errorf("%w: %d locations, more than %d", ErrTooLarge, len(raw), MaxZones)
	}
	fs := make([]Forecast, 0, len(raw))
	for i, r := range raw {
		if r.ForecastData == nil {
			return nil, fmt.Errorf("%w: forecast %d has no forecastData", ErrInvalidForecast, i)
		}
		pts := *r.ForecastData
		if len(pts) > MaxPoints {
			return nil, fmt.Errorf("%w: forecast %d has %d points, more than %d", ErrTooLarge, i, len(pts), MaxPoints)
		}
		zone := r.Location
		f := Forecast{Points: make([]Point, 0, len(pts))}
		for j, p := range pts {
			if zone == "" {
				zone = p.Location
			}
			if p.Location != "" && p.Location != zone {
				return nil, fmt.Errorf("%w: forecast %d point %d is for location %q, not %q", ErrInvalidForecast, i, j, p.Location, zone)
			}
			t, err := parseTime(p.Timestamp)
			if err != nil {
				return nil, fmt.Errorf("forecast %d point %d: %w", i, j, err)
			}
			if p.Duration == nil || *p.Duration <= 0 || *p.Duration > int64(MaxPointDuration/time.Minute) {
				return nil, fmt.Errorf("%w: forecast %d point %d: duration must be 1 to %d minutes", ErrInvalidForecast, i, j, int64(MaxPointDuration/time.Minute))
			}
			if p.Value == nil {
				return nil, fmt.Errorf("%w: forecast %d point %d has no value", ErrInvalidForecast, i, j)
			}
			f.Points = append(f.Points, Point{Start: t, Duration: time.Duration(*p.Duration) * time.Minute, Intensity: intensity(*p.Value)})
		}
		f.Zone = zone
		if f.Zone == "" {
			return nil, fmt.Errorf("%w: forecast %d names no location", ErrInvalidForecast, i)
		}
		fs = append(fs, f)
	}
	if err := Validate(fs); err != nil {
		return nil, err
	}
	return fs, nil
}

// ParseWattTime parses a WattTime v3 /forecast response for one region.
// Values in lbs_co2_per_mwh are converted to gCO2e/kWh; other units (a
// health-damage signal in $/MWh, say) are refused. Each point holds for
// meta.data_point_period_seconds, or, where a saved file lacks it, for the
// spacing of the points if that is uniform.
func ParseWattTime(b []byte) (Forecast, error) {
	if err := checkSize(b); err != nil {
		return Forecast{}, fmt.Errorf("carbon: parse WattTime forecast: %w", err)
	}
	var r wtResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return Forecast{}, fmt.Errorf("carbon: parse WattTime forecast: %w: %v", ErrInvalidForecast, err)
	}
	f, err := wattTime(r)
	if err != nil {
		return Forecast{}, fmt.Errorf("carbon: parse WattTime forecast: %w", err)
	}
	return f, nil
}

func wattTime(r wtResponse) (Forecast, error) {
	if r.Meta == nil || r.Data == nil {
		return Forecast{}, fmt.Errorf("%w: need both \"data\" and \"meta\"; save the whole /v3/forecast response", ErrInvalidForecast)
	}
	m := *r.Meta
	if m.Units != "lbs_co2_per_mwh" {
		return Forecast{}, fmt.Errorf("%w: units %q: only lbs_co2_per_mwh (signal_type co2_moer or co2_aoer) is supported", ErrInvalidForecast, m.Units)
	}
	if m.SignalType != "" && m.SignalType != "co2_moer" && m.SignalType != "co2_aoer" {
		return Forecast{}, fmt.Errorf("%w: signal_type %q is not a CO2 signal; request co2_moer or co2_aoer", ErrInvalidForecast, m.SignalType)
	}
	pts := *r.Data
	if len(pts) > MaxPoints {
		return Forecast{}, fmt.Errorf("%w: %d points, more than %d", ErrTooLarge, len(pts), MaxPoints)
	}
	times := make([]time.Time, len(pts))
	for i, p := range pts {
		t, err := parseTime(p.PointTime)
		if err != nil {
			return Forecast{}, fmt.Errorf("point %d: %w", i, err)
		}
		if p.Value == nil {
			return Forecast{}, fmt.Errorf("%w: point %d has no value", ErrInvalidForecast, i)
		}
		times[i] = t
	}
	var period time.Duration
	switch s := m.DataPointPeriodSeconds; {
	case s != nil:
		if *s <= 0 || *s > int64(MaxPointDuration/time.Second) {
			return Forecast{}, fmt.Errorf("%w: data_point_period_seconds %d not in [1, %d]", ErrInvalidForecast, *s, int64(MaxPointDuration/time.Second))
		}
		period = time.Duration(*s) * time.Second
	case len(times) >= 2:
		period = times[1].Sub(times[0])
		for i := 2; i < len(times); i++ {
			if times[i].Sub(times[i-1]) != period {
				return Forecast{}, fmt.Errorf("%w: no meta.data_point_period_seconds and the points are not evenly spaced; save the whole /v3/forecast response", ErrInvalidForecast)
			}
		}
	default:
		return Forecast{}, fmt.Errorf("%w: no meta.data_point_period_seconds and too few points to infer it", ErrInvalidForecast)
	}
	f := Forecast{Zone: m.Region, Points: make([]Point, len(pts))}
	for i, p := range pts {
		f.Points[i] = Point{Start: times[i], Duration: period, Intensity: intensity(*p.Value * LbsPerMWhToGPerKWh)}
	}
	if err := f.Validate(); err != nil {
		return Forecast{}, err
	}
	return f, nil
}

// Parse detects the layout and parses it: a Carbon Aware SDK array or
// object (it has "forecastData"), a WattTime response (it has "data" and
// "meta"), or an array of WattTime responses, one per region.
func Parse(b []byte) ([]Forecast, error) {
	fs, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("carbon: parse forecast: %w", err)
	}
	return fs, nil
}

func parse(b []byte) ([]Forecast, error) {
	if err := checkSize(b); err != nil {
		return nil, err
	}
	var probe map[string]json.RawMessage
	switch firstByte(b) {
	case '{':
		if err := json.Unmarshal(b, &probe); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidForecast, err)
		}
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(b, &elems); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidForecast, err)
		}
		if len(elems) == 0 {
			return nil, fmt.Errorf("%w: empty array", ErrInvalidForecast)
		}
		if len(elems) > MaxZones {
			return nil, fmt.Errorf("%w: %d zones, more than %d", ErrTooLarge, len(elems), MaxZones)
		}
		if firstByte(elems[0]) != '{' {
			return nil, fmt.Errorf("%w: array elements must be objects", ErrUnknownFormat)
		}
		if err := json.Unmarshal(elems[0], &probe); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidForecast, err)
		}
		if _, ok := probe["meta"]; ok {
			return parseWattTimeArray(elems)
		}
	default:
		return nil, fmt.Errorf("%w: not a JSON object or array", ErrUnknownFormat)
	}
	_, sdk := probe["forecastData"]
	_, data := probe["data"]
	_, meta := probe["meta"]
	switch {
	case sdk:
		return parseSDK(b)
	case data && meta:
		var r wtResponse
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidForecast, err)
		}
		f, err := wattTime(r)
		if err != nil {
			return nil, err
		}
		return []Forecast{f}, nil
	}
	return nil, fmt.Errorf("%w: expected Carbon Aware SDK \"forecastData\" or WattTime \"data\" and \"meta\"", ErrUnknownFormat)
}

func parseWattTimeArray(elems []json.RawMessage) ([]Forecast, error) {
	fs := make([]Forecast, len(elems))
	for i, e := range elems {
		var r wtResponse
		if err := json.Unmarshal(e, &r); err != nil {
			return nil, fmt.Errorf("%w: response %d: %v", ErrInvalidForecast, i, err)
		}
		f, err := wattTime(r)
		if err != nil {
			return nil, fmt.Errorf("response %d: %w", i, err)
		}
		fs[i] = f
	}
	if err := Validate(fs); err != nil {
		return nil, err
	}
	return fs, nil
}

// firstByte is the first byte that is not JSON whitespace, or 0.
func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}
