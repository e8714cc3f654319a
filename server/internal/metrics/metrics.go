// Package metrics defines the aggregator's Prometheus metrics on a registry
// of its own, so tests and embedded servers never collide on the default one.
package metrics

import "github.com/prometheus/client_golang/prometheus"

// M holds the aggregator's collectors.
type M struct {
	Registry      *prometheus.Registry
	Rounds        *prometheus.CounterVec   // by kind and outcome
	RoundDuration *prometheus.HistogramVec // by kind
	Reports       *prometheus.CounterVec   // by kind and result (accepted, or the refusal class)
	Dropouts      prometheus.Counter
	ReportBytes   prometheus.Counter
	CheckIns      *prometheus.CounterVec // by outcome
	OpenRounds    prometheus.Gauge
	AuditFailures prometheus.Counter
	// CommitFailures counts failed attempts to close a round durably, by
	// step (audit, store); each is retried.
	CommitFailures *prometheus.CounterVec
	// PlanFailures counts devices' reports that they could not carry out a plan.
	PlanFailures prometheus.Counter
	Epsilon      *prometheus.GaugeVec // by task
	// Cosignatures counts witnesses' AddCosignature calls, by result
	// (accepted, invalid, unknown_witness, not_issued, error).
	Cosignatures *prometheus.CounterVec
}

// New registers the collectors (and the Go and process collectors) on a fresh registry.
func New() *M {
	r := prometheus.NewRegistry()
	m := &M{
		Registry: r,
		Rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetlearn_rounds_total",
			Help: "Rounds closed, by kind and outcome (committed, abandoned)."}, []string{"kind", "outcome"}),
		RoundDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetlearn_round_duration_seconds",
			Help: "Wall time from a round opening to its close.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}, []string{"kind"}),
		Reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetlearn_reports_total",
			Help: "Reports received, by kind and result."}, []string{"kind", "result"}),
		Dropouts: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetlearn_dropouts_total",
			Help: "Devices assigned to a round that did not report before it closed."}),
		ReportBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetlearn_report_bytes_total",
			Help: "Bytes of report messages received."}),
		CheckIns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetlearn_checkins_total",
			Help: "Device check-ins, by outcome."}, []string{"outcome"}),
		OpenRounds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleetlearn_open_rounds",
			Help: "Rounds currently open."}),
		AuditFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetlearn_audit_failures_total",
			Help: "Events that could not be recorded in the audit log (each is also logged as an error)."}),
		CommitFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetlearn_round_close_failures_total",
			Help: "Failed attempts to close a round durably, by step (audit, store); each is logged and retried."}, []string{"step"}),
		PlanFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetlearn_plan_failures_total",
			Help: "Devices' reports that they could not carry out a round plan (recorded with the round)."}),
		Epsilon: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetlearn_dp_epsilon",
			Help: "Differential privacy epsilon a task has spent, at its delta."}, []string{"task"}),
		Cosignatures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetlearn_audit_cosignatures_total",
			Help: "Witnesses' cosignatures of audit checkpoints handed in, by result (accepted, invalid, unknown_witness, not_issued, error)."}, []string{"result"}),
	}
	r.MustRegister(m.Rounds, m.RoundDuration, m.Reports, m.Dropouts, m.ReportBytes, m.CheckIns, m.OpenRounds, m.AuditFailures, m.CommitFailures, m.PlanFailures, m.Epsilon, m.Cosignatures,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}
