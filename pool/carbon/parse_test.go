package carbon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseCarbonAwareSDK(t *testing.T) {
	fs, err := ParseCarbonAwareSDK(readTestdata(t, "carbon-aware-sdk.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 || fs[0].Zone != "eastus" || fs[1].Zone != "westus" {
		t.Fatalf("zones %+v", fs)
	}
	for _, f := range fs {
		if len(f.Points) != 72 {
			t.Fatalf("%s: %d points", f.Zone, len(f.Points))
		}
		for i, p := range f.Points {
			if !p.Start.Equal(t0.Add(time.Duration(i)*5*time.Minute)) || p.Duration != 5*time.Minute {
				t.Fatalf("%s point %d: %+v", f.Zone, i, p)
			}
		}
	}
	if p := fs[0].Points[0]; p.Intensity != 415.0 || p.Start.Location() != time.UTC {
		t.Fatalf("first point %+v", p)
	}
}

func TestParseWattTime(t *testing.T) {
	f, err := ParseWattTime(readTestdata(t, "watttime.json"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Zone != "CAISO_NORTH" || len(f.Points) != 72 {
		t.Fatalf("zone %q, %d points", f.Zone, len(f.Points))
	}
	p := f.Points[0]
	if !p.Start.Equal(t0) || p.Duration != 5*time.Minute || math.Abs(p.Intensity-1240*0.453592) > 1e-9 {
		t.Fatalf("first point %+v", p)
	}
	// 1240 lbs/MWh is 562 g/kWh: a gas-heavy marginal generator.
	if math.Round(p.Intensity) != 562 {
		t.Fatalf("conversion gave %v", p.Intensity)
	}
}

func TestParseDetectsLayout(t *testing.T) {
	sdk := readTestdata(t, "carbon-aware-sdk.json")
	wt := readTestdata(t, "watttime.json")
	want, _ := ParseCarbonAwareSDK(sdk)
	got, err := Parse(sdk)
	if err != nil || Digest(got) != Digest(want) {
		t.Fatalf("Parse(sdk) = %v, %v", got, err)
	}
	w, _ := ParseWattTime(wt)
	got, err = Parse(wt)
	if err != nil || len(got) != 1 || Digest(got) != Digest([]Forecast{w}) {
		t.Fatalf("Parse(watttime) = %v, %v", got, err)
	}

	// One SDK element on its own, and WattTime responses for two regions
	// in an array.
	var elems []json.RawMessage
	if err := json.Unmarshal(sdk, &elems); err != nil {
		t.Fatal(err)
	}
	got, err = Parse(elems[1])
	if err != nil || len(got) != 1 || got[0].Zone != "westus" {
		t.Fatalf("Parse(one SDK object) = %v, %v", got, err)
	}
	other := bytes.Replace(wt, []byte(`"CAISO_NORTH"`), []byte(`"PJM_DC"`), 1)
	arr := []byte("[" + string(wt) + "," + string(other) + "]")
	got, err = Parse(arr)
	if err != nil || len(got) != 2 || got[1].Zone != "PJM_DC" {
		t.Fatalf("Parse(WattTime array) = %v, %v", got, err)
	}
	if _, err := Parse([]byte("[" + string(wt) + "," + string(wt) + "]")); !errors.Is(err, ErrInvalidForecast) {
		t.Fatalf("a region twice: %v", err)
	}
}

// toSDK re-expresses forecasts in the Carbon Aware SDK layout, values
// written so that they parse back to the same float64.
func toSDK(fs []Forecast) []byte {
	var b strings.Builder
	b.WriteString(`[`)
	for i, f := range fs {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"location":%q,"forecastData":[`, f.Zone)
		for j, p := range f.Points {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"timestamp":%q,"duration":%d,"value":%s}`, p.Start.Format(time.RFC3339Nano),
				p.Duration/time.Minute, strconv.FormatFloat(p.Intensity, 'g', -1, 64))
		}
		b.WriteString("]}")
	}
	b.WriteString("]")
	return []byte(b.String())
}

func TestDigestIsOfTheData(t *testing.T) {
	sdk := readTestdata(t, "carbon-aware-sdk.json")
	a, _ := Parse(sdk)
	var compact bytes.Buffer
	if err := json.Compact(&compact, sdk); err != nil {
		t.Fatal(err)
	}
	b, err := Parse(compact.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if Digest(a) != Digest(b) {
		t.Fatal("whitespace changed the digest")
	}
	if Digest([]Forecast{a[1], a[0]}) != Digest(a) {
		t.Fatal("zone order changed the digest")
	}

	// The same WattTime data in SDK layout digests alike.
	w, _ := Parse(readTestdata(t, "watttime.json"))
	w2, err := Parse(toSDK(w))
	if err != nil {
		t.Fatal(err)
	}
	if Digest(w) != Digest(w2) {
		t.Fatal("layout changed the digest")
	}

	c := []Forecast{{Zone: a[0].Zone, Points: append([]Point(nil), a[0].Points...)}, a[1]}
	c[0].Points[7].Intensity += 0.01
	if Digest(c) == Digest(a) {
		t.Fatal("a changed value kept the digest")
	}
	if d := Digest(a); len(d) != 64 || strings.ToLower(d) != d {
		t.Fatalf("digest %q is not lower hex sha256", d)
	}
}

func TestWattTimeInfersPeriod(t *testing.T) {
	b := []byte(`{"data":[{"point_time":"2026-05-03T10:00:00Z","value":900},{"point_time":"2026-05-03T10:15:00Z","value":800},{"point_time":"2026-05-03T10:30:00Z","value":700}],
	  "meta":{"region":"ERCOT_EASTTX","signal_type":"co2_moer","units":"lbs_co2_per_mwh"}}`)
	f, err := ParseWattTime(b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Points[2].Duration != 15*time.Minute {
		t.Fatalf("period %s", f.Points[2].Duration)
	}
}

func sdkDoc(points string) string {
	return `[{"location":"eastus","forecastData":[` + points + `]}]`
}

func sdkPt(ts string, dur int, v string) string {
	return fmt.Sprintf(`{"location":"eastus","timestamp":%q,"duration":%d,"value":%s}`, ts, dur, v)
}

func wtDoc(meta, data string) string { return `{"data":[` + data + `],"meta":{` + meta + `}}` }

const wtMeta5 = `"region":"CAISO_NORTH","signal_type":"co2_moer","units":"lbs_co2_per_mwh","data_point_period_seconds":300`

func TestParseRefusesHostileInput(t *testing.T) {
	ok1 := sdkPt("2026-05-03T10:00:00Z", 5, "300")
	many := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(sdkPt(t0.Add(time.Duration(i)*5*time.Minute).Format(time.RFC3339), 5, "1"))
		}
		return b.String()
	}
	zones := func(n int) string {
		var b strings.Builder
		b.WriteString("[")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"location":"z%d","forecastData":[%s]}`, i, sdkPt("2026-05-03T10:00:00Z", 5, "1"))
		}
		return b.String() + "]"
	}
	cases := []struct {
		name, in string
		want     error
	}{
		{"empty", ``, ErrUnknownFormat},
		{"number", `42`, ErrUnknownFormat},
		{"array of numbers", `[1,2]`, ErrUnknownFormat},
		{"object without markers", `{"foo":1}`, ErrUnknownFormat},
		{"empty array", `[]`, ErrInvalidForecast},
		{"truncated", sdkDoc(ok1)[:30], ErrInvalidForecast},
		{"trailing garbage", sdkDoc(ok1) + `x`, ErrInvalidForecast},
		{"no forecastData value", `[{"location":"eastus","forecastData":null}]`, ErrInvalidForecast},
		{"empty forecastData", sdkDoc(``), ErrInvalidForecast},
		{"no location", `[{"forecastData":[{"timestamp":"2026-05-03T10:00:00Z","duration":5,"value":1}]}]`, ErrInvalidForecast},
		{"mixed locations", sdkDoc(ok1 + `,{"location":"westus","timestamp":"2026-05-03T10:05:00Z","duration":5,"value":1}`), ErrInvalidForecast},
		{"bad zone name", `[{"location":"east us\n","forecastData":[` + ok1 + `]}]`, ErrInvalidForecast},
		{"long zone name", `[{"location":"` + strings.Repeat("z", MaxZoneLen+1) + `","forecastData":[` + ok1 + `]}]`, ErrInvalidForecast},
		{"duplicate zone", `[{"location":"a","forecastData":[` + ok1 + `]},{"location":"a","forecastData":[` + ok1 + `]}]`, ErrInvalidForecast},
		{"bad timestamp", sdkDoc(sdkPt("yesterday", 5, "1")), ErrInvalidForecast},
		{"year 1970", sdkDoc(sdkPt("1970-01-01T00:00:00Z", 5, "1")), ErrInvalidForecast},
		{"year 9999", sdkDoc(sdkPt("9999-01-01T00:00:00Z", 5, "1")), ErrInvalidForecast},
		{"zero duration", sdkDoc(sdkPt("2026-05-03T10:00:00Z", 0, "1")), ErrInvalidForecast},
		{"negative duration", sdkDoc(sdkPt("2026-05-03T10:00:00Z", -5, "1")), ErrInvalidForecast},
		{"two-day duration", sdkDoc(sdkPt("2026-05-03T10:00:00Z", 2880, "1")), ErrInvalidForecast},
		{"fractional duration", sdkDoc(`{"timestamp":"2026-05-03T10:00:00Z","duration":2.5,"value":1}`), ErrInvalidForecast},
		{"no duration", sdkDoc(`{"timestamp":"2026-05-03T10:00:00Z","value":1}`), ErrInvalidForecast},
		{"no value", sdkDoc(`{"timestamp":"2026-05-03T10:00:00Z","duration":5}`), ErrInvalidForecast},
		{"null value", sdkDoc(`{"timestamp":"2026-05-03T10:00:00Z","duration":5,"value":null}`), ErrInvalidForecast},
		{"string value", sdkDoc(`{"timestamp":"2026-05-03T10:00:00Z","duration":5,"value":"300"}`), ErrInvalidForecast},
		{"negative value", sdkDoc(sdkPt("2026-05-03T10:00:00Z", 5, "-1")), ErrInvalidForecast},
		{"huge value", sdkDoc(sdkPt("2026-05-03T10:00:00Z", 5, "5000.01")), ErrInvalidForecast},
		{"overflowing value", sdkDoc(sdkPt("2026-05-03T10:00:00Z", 5, "1e999")), ErrInvalidForecast},
		{"unsorted", sdkDoc(sdkPt("2026-05-03T10:05:00Z", 5, "1") + "," + ok1), ErrInvalidForecast},
		{"repeated timestamp", sdkDoc(ok1 + "," + ok1), ErrInvalidForecast},
		{"rolling averages overlap", sdkDoc(sdkPt("2026-05-03T10:00:00Z", 30, "1") + "," + sdkPt("2026-05-03T10:05:00Z", 30, "1")), ErrInvalidForecast},
		{"too many zones", zones(MaxZones + 1), ErrTooLarge},
		{"too many bytes", sdkDoc(ok1) + strings.Repeat(" ", MaxInputBytes), ErrTooLarge},
		{"watttime no meta", `{"data":[],"meta":null}`, ErrInvalidForecast},
		{"watttime health signal", wtDoc(`"region":"CAISO_NORTH","signal_type":"health_damage","units":"lbs_co2_per_mwh","data_point_period_seconds":300`, `{"point_time":"2026-05-03T10:00:00Z","value":1}`), ErrInvalidForecast},
		{"watttime other units", wtDoc(`"region":"CAISO_NORTH","units":"$_per_mwh","data_point_period_seconds":300`, `{"point_time":"2026-05-03T10:00:00Z","value":1}`), ErrInvalidForecast},
		{"watttime no region", wtDoc(`"units":"lbs_co2_per_mwh","data_point_period_seconds":300`, `{"point_time":"2026-05-03T10:00:00Z","value":1}`), ErrInvalidForecast},
		{"watttime zero period", wtDoc(`"region":"CAISO_NORTH","units":"lbs_co2_per_mwh","data_point_period_seconds":0`, `{"point_time":"2026-05-03T10:00:00Z","value":1}`), ErrInvalidForecast},
		{"watttime period overlaps points", wtDoc(wtMeta5, `{"point_time":"2026-05-03T10:00:00Z","value":1},{"point_time":"2026-05-03T10:01:00Z","value":1}`), ErrInvalidForecast},
		{"watttime uneven, no period", wtDoc(`"region":"CAISO_NORTH","units":"lbs_co2_per_mwh"`, `{"point_time":"2026-05-03T10:00:00Z","value":1},{"point_time":"2026-05-03T10:05:00Z","value":1},{"point_time":"2026-05-03T10:15:00Z","value":1}`), ErrInvalidForecast},
		{"watttime one point, no period", wtDoc(`"region":"CAISO_NORTH","units":"lbs_co2_per_mwh"`, `{"point_time":"2026-05-03T10:00:00Z","value":1}`), ErrInvalidForecast},
		// 11024 lbs/MWh is just over 5000 g/kWh.
		{"watttime huge value", wtDoc(wtMeta5, `{"point_time":"2026-05-03T10:00:00Z","value":11024}`), ErrInvalidForecast},
		{"watttime empty data", wtDoc(wtMeta5, ``), ErrInvalidForecast},
		{"watttime array mixed", `[` + wtDoc(wtMeta5, `{"point_time":"2026-05-03T10:00:00Z","value":1}`) + `,{"location":"x"}]`, ErrInvalidForecast},
	}
	if !testing.Short() {
		// About 7 MB of JSON; Validate's own count check is tested below.
		cases = append(cases, struct {
			name, in string
			want     error
		}{"too many points", sdkDoc(many(MaxPoints + 1)), ErrTooLarge})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.in))
			if !errors.Is(err, c.want) {
				t.Fatalf("Parse: got %v, want %v", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "carbon: parse forecast: ") {
				t.Fatalf("error %q lacks its operation", err)
			}
		})
	}
	if _, err := ParseWattTime([]byte(sdkDoc(ok1))); !errors.Is(err, ErrInvalidForecast) {
		t.Fatalf("ParseWattTime(sdk): %v", err)
	}
	if _, err := ParseCarbonAwareSDK([]byte(`"x"`)); !errors.Is(err, ErrUnknownFormat) {
		t.Fatalf("ParseCarbonAwareSDK(string): %v", err)
	}
}

func TestValidateHandBuilt(t *testing.T) {
	good := Forecast{Zone: "a", Points: []Point{{t0, time.Hour, 100}, {t0.Add(2 * time.Hour), time.Hour, 200}}}
	if err := Validate([]Forecast{good}); err != nil {
		t.Fatalf("a gap is allowed: %v", err)
	}
	for name, f := range map[string]Forecast{
		"NaN":      {Zone: "a", Points: []Point{{t0, time.Hour, math.NaN()}}},
		"+Inf":     {Zone: "a", Points: []Point{{t0, time.Hour, math.Inf(1)}}},
		"zero":     {Zone: "a", Points: []Point{{time.Time{}, time.Hour, 1}}},
		"overlap":  {Zone: "a", Points: []Point{{t0, time.Hour, 1}, {t0.Add(time.Minute), time.Hour, 1}}},
		"too late": {Zone: "a", Points: []Point{{maxTime.Add(-time.Minute), time.Hour, 1}}},
	} {
		if err := Validate([]Forecast{f}); !errors.Is(err, ErrInvalidForecast) {
			t.Errorf("%s: %v", name, err)
		}
	}
	long := Forecast{Zone: "a", Points: make([]Point, MaxPoints+1)}
	for i := range long.Points {
		long.Points[i] = Point{t0.Add(time.Duration(i) * time.Minute), time.Minute, 1}
	}
	if err := Validate([]Forecast{long}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many points: %v", err)
	}
	if err := Validate(nil); !errors.Is(err, ErrInvalidForecast) {
		t.Errorf("no zones: %v", err)
	}
}
