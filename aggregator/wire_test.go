package aggregator_test

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
	fleetlearnv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestKindsMatchWire pins Kind to the wire enum, so that Kind(cfg.GetRule())
// stays a valid conversion.
func TestKindsMatchWire(t *testing.T) {
	names := fleetlearnv1.AggregationRule_name
	if len(names) != len(allKinds)+1 {
		t.Errorf("wire enum has %d values, aggregator knows %d rules", len(names), len(allKinds))
	}
	for _, k := range append([]aggregator.Kind{aggregator.KindUnspecified}, allKinds...) {
		if got := names[int32(k)]; got != "AGGREGATION_RULE_"+k.String() {
			t.Errorf("Kind %d is %v here and %s on the wire", int32(k), k, got)
		}
	}
}
