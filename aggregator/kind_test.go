package aggregator_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

// TestCheckSamples: the rules that keep every update are capped at
// MaxSampleBytes a round; the FedAvg family never is.
func TestCheckSamples(t *testing.T) {
	const dim = 12_719_104 // the example transformer at d=512, 4 layers
	if err := aggregator.CheckSamples(aggregator.FedAvg, dim, 100_000); err != nil {
		t.Errorf("fedavg: %v", err)
	}
	if err := aggregator.CheckSamples(aggregator.Median, dim, 10); err != nil {
		t.Errorf("median of 10: %v", err)
	}
	err := aggregator.CheckSamples(aggregator.TrimmedMean, dim, 100)
	if !errors.Is(err, aggregator.ErrConfig) || !strings.Contains(err.Error(), "100 reports of 12719104 parameters need 5087641600 bytes") {
		t.Errorf("trimmed mean of 100: %v", err)
	}
	if err := aggregator.CheckSamples(aggregator.Median, aggregator.MaxSampleBytes/4/8, 8); err != nil {
		t.Errorf("exactly at the cap: %v", err)
	}
	if err := aggregator.CheckSamples(aggregator.Median, aggregator.MaxSampleBytes/4/8, 9); err == nil {
		t.Error("one report past the cap passed")
	}
}
