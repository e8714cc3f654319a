package server

import "github.com/fleetlearn/fleetlearn/server/internal/metrics"

// MetricNames lists the metric families the aggregator serves on /metrics
// (fleetlearn_*, histograms without their _bucket, _sum and _count
// suffixes), sorted: what dashboards and alerting rules may refer to.
func MetricNames() []string { return metrics.New().Names() }
