package carbon_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetlearn/fleetlearn/pool/carbon"
)

// A 2-hour, 8-GPU job due by 16:00 is placed from a Carbon Aware SDK
// forecast file; the choice carries the digest the audit log records.
func Example() {
	fs, _, err := carbon.FileSource{Path: "testdata/carbon-aware-sdk.json"}.Forecasts(context.Background())
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 5, 3, 10, 0, 0, 0, time.UTC)
	c, err := carbon.Plan(carbon.Request{
		Earliest: now,
		Deadline: now.Add(6 * time.Hour),
		Duration: 2 * time.Hour,
		Power:    8 * 700, // watts
		Home:     "eastus",
	}, fs)
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Reason)
	fmt.Println(c.Digest == carbon.Digest(fs))

	// Once the job has run and been metered, price it.
	f, _ := carbon.Lookup(fs, c.Zone)
	g, _ := carbon.RunEmissions(f, c.Start, c.End, 8*700*2*3600)
	fmt.Printf("%.0f g\n", g)
	// Output:
	// zone westus at 2026-05-03T11:15:00Z: 2347 g expected (210 gCO2e/kWh average), 57% below starting now in eastus (5400 g)
	// true
	// 2347 g
}
