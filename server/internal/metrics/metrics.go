// Package metrics defines the aggregator's Prometheus metrics on a registry
// of its own, so tests and embedded servers never collide on the default one.
package metrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlearn/fleetlearn/round"
)

// M holds the aggregator's collectors.
type M struct {
	Registry      *prometheus.Registry
	Rounds        *prometheus.CounterVec   // by kind and outcome
	RoundDuration *prometheus.HistogramVec // by kind
	Reports       *prometheus.CounterVec   // by kind and result (accepted, or the refusal class)
	Dropouts      prometheus.Counter
	ReportBytes   prometheus.Counter
	// QuotaPurges counts purges of what a device stored beyond its report
	// storage quota for a round.
	QuotaPurges prometheus.Counter
	// ShardReports counts the update reports of sharded rounds by who read
	// them: a worker, or the leader (no worker answered, or one could not
	// read the report); ShardRereads, the reports the leader read again
	// because their worker's partial sum could not be collected.
	ShardReports  *prometheus.CounterVec
	ShardRereads  prometheus.Counter
	CheckIns      *prometheus.CounterVec // by outcome
	OpenRounds    prometheus.Gauge
	AsyncTraining prometheus.Gauge
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
	// Refusals counts refused reports by one of RefusalReasons; use Refused.
	Refusals *prometheus.CounterVec
	// SecAggStage is how long each SecAgg+ stage of a round took, by stage.
	SecAggStage *prometheus.HistogramVec
	// PoolCPU, PoolGPU and PoolEnergy are the usage the pool metered, by tenant.
	PoolCPU, PoolGPU, PoolEnergy *prometheus.CounterVec
	// UIStreamRefusals counts the dashboard's refused live-update streams,
	// by reason (principal, reserved, full).
	UIStreamRefusals *prometheus.CounterVec
	// PoolRefusals counts what the pool refused a worker principal for
	// exceeding a bound, by one of PoolRefusalReasons; use PoolRefused.
	PoolRefusals *prometheus.CounterVec
	// PoolCheckpointStall is how long taking a checkpoint blocked a pool
	// rank's training, as the rank reported it with the commit, by tenant.
	PoolCheckpointStall *prometheus.HistogramVec

	state *stateCollector
	names []string
}

// Refusal reasons: the fixed label values of fleetlearn_report_refusals_total.
// Every refusal the coordinator makes maps to one of them, so a peer can
// never add a series.
const (
	RefusedNotOpen   = "not_open"                   // the report's round is not open (late, or a stray)
	RefusedSubject   = string(round.ClassSubject)   // the subject is malformed or names another round
	RefusedCohort    = string(round.ClassCohort)    // the device is not in the round's cohort
	RefusedDuplicate = string(round.ClassDuplicate) // the device already reported
	RefusedKind      = string(round.ClassKind)      // an update where an evaluation is wanted, or the reverse
	RefusedDecode    = "decode"                     // the message does not decode
	RefusedHeader    = string(round.ClassHeader)    // the body names another task, round, device, model or module
	RefusedSignature = string(round.ClassSignature) // unsigned, not enrolled, or the signature does not verify
	RefusedPayload   = string(round.ClassPayload)   // encoding, digest, layout or shape of the update is wrong
	RefusedMetrics   = string(round.ClassMetrics)   // too many, badly named or out-of-range metrics
	RefusedExamples  = string(round.ClassExamples)  // num_examples outside what the device declared
	RefusedAggregate = string(round.ClassAggregate) // the aggregator refused the update (bounds)
	RefusedChunks    = "chunks"                     // a chunked report cannot be reassembled
	RefusedSecAgg    = string(round.ClassSecAgg)    // a masked report that breaks the SecAgg+ protocol
	RefusedQuota     = string(round.ClassQuota)     // the device stored more than the round admits per device
	RefusedStale     = string(round.ClassStale)     // an asynchronous task's report trained too many versions back
	RefusedOther     = "other"                      // none of the above
)

// RefusalReasons lists every label value of fleetlearn_report_refusals_total.
var RefusalReasons = []string{RefusedNotOpen, RefusedSubject, RefusedCohort, RefusedDuplicate, RefusedKind,
	RefusedDecode, RefusedHeader, RefusedSignature, RefusedPayload, RefusedMetrics, RefusedExamples,
	RefusedAggregate, RefusedChunks, RefusedSecAgg, RefusedQuota, RefusedStale, RefusedOther}

// Refused counts one refused report; a reason outside RefusalReasons counts
// as RefusedOther.
func (m *M) Refused(reason string) {
	if !slices.Contains(RefusalReasons, reason) {
		reason = RefusedOther
	}
	m.Refusals.WithLabelValues(reason).Inc()
}

// Pool refusal reasons: the fixed label values of
// fleetlearn_pool_refusals_total.
const (
	PoolRefusedWorkersPerToken  = "workers_per_token" // a token registering more workers than its cap
	PoolRefusedWorkers          = "workers"           // the pool holds as many workers as it takes
	PoolRefusedNoStart          = "no_start"          // a worker left a lease unstarted; its job was requeued
	PoolRefusedCheckpointBytes  = "checkpoint_bytes"  // a job's checkpoint storage cap reached
	PoolRefusedCheckpointsAhead = "checkpoints_ahead" // a rank too many checkpoints ahead of the job
	PoolRefusedCheckpointModel  = "checkpoint_model"  // a manifest that does not fit the job's model
)

// PoolRefusalReasons lists every label value of fleetlearn_pool_refusals_total.
var PoolRefusalReasons = []string{PoolRefusedWorkersPerToken, PoolRefusedWorkers, PoolRefusedNoStart,
	PoolRefusedCheckpointBytes, PoolRefusedCheckpointsAhead, PoolRefusedCheckpointModel}

// PoolRefused counts one pool refusal; reason must be in PoolRefusalReasons.
func (m *M) PoolRefused(reason string) {
	if slices.Contains(PoolRefusalReasons, reason) {
		m.PoolRefusals.WithLabelValues(reason).Inc()
	}
}

// New registers the collectors (and the Go and process collectors) on a fresh registry.
func New() *M {
	r := prometheus.NewRegistry()
	m := &M{Registry: r}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		m.register(name, c)
		return c
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		m.register(name, c)
		return c
	}
	m.Rounds = counterVec("fleetlearn_rounds_total",
		"Rounds closed, by kind and outcome (committed, abandoned).", "kind", "outcome")
	m.RoundDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetlearn_round_duration_seconds",
		Help: "Wall time from a round opening to its close, in seconds.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}, []string{"kind"})
	m.register("fleetlearn_round_duration_seconds", m.RoundDuration)
	m.Reports = counterVec("fleetlearn_reports_total", "Reports received, by kind and result.", "kind", "result")
	m.Dropouts = counter("fleetlearn_dropouts_total", "Devices assigned to a round that did not report before it closed.")
	m.ReportBytes = counter("fleetlearn_report_bytes_total", "Bytes of report messages received.")
	m.QuotaPurges = counter("fleetlearn_report_quota_purges_total",
		"Purges of what a device stored in the reports stream beyond its per-round quota (the round's largest report).")
	m.ShardReports = counterVec("fleetlearn_shard_reports_total",
		"Update reports of sharded rounds, by who read and summed them (worker, leader).", "reader")
	m.ShardRereads = counter("fleetlearn_shard_rereads_total",
		"Reports the leader read again because their aggregation worker's partial sum could not be collected.")
	m.CheckIns = counterVec("fleetlearn_checkins_total", "Device check-ins, by outcome.", "outcome")
	m.OpenRounds = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleetlearn_open_rounds", Help: "Rounds currently open."})
	m.register("fleetlearn_open_rounds", m.OpenRounds)
	m.AsyncTraining = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleetlearn_async_training",
		Help: "Devices holding a seat of an asynchronous task (the concurrency in use), as the last task to change it counted."})
	m.register("fleetlearn_async_training", m.AsyncTraining)
	m.AuditFailures = counter("fleetlearn_audit_failures_total",
		"Events that could not be recorded in the audit log (each is also logged as an error).")
	m.CommitFailures = counterVec("fleetlearn_round_close_failures_total",
		"Failed attempts to close a round durably, by step (audit, store); each is logged and retried.", "step")
	m.PlanFailures = counter("fleetlearn_plan_failures_total",
		"Devices' reports that they could not carry out a round plan (recorded with the round).")
	m.Epsilon = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetlearn_dp_epsilon",
		Help: "Differential privacy epsilon a task has spent, at its delta (set when a round commits)."}, []string{"task"})
	m.register("fleetlearn_dp_epsilon", m.Epsilon)
	m.Cosignatures = counterVec("fleetlearn_audit_cosignatures_total",
		"Witnesses' cosignatures of audit checkpoints handed in, by result (accepted, invalid, unknown_witness, not_issued, error).", "result")
	m.Refusals = counterVec("fleetlearn_report_refusals_total",
		"Reports refused, by reason: one of a fixed set of refusal classes (deploy/README.md, Metrics).", "reason")
	for _, reason := range RefusalReasons {
		m.Refusals.WithLabelValues(reason) // every reason reads 0 from the start, so rate() sees the first one
	}
	m.SecAggStage = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetlearn_secagg_stage_duration_seconds",
		Help:    "Time a secure aggregation stage of a round was open, from its start to its close, in seconds, by stage.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16)}, []string{"stage"})
	m.register("fleetlearn_secagg_stage_duration_seconds", m.SecAggStage)
	m.PoolCPU = counterVec("fleetlearn_pool_usage_cpu_seconds_total",
		"CPU time pool jobs' ranks reported, in seconds, by tenant.", "tenant")
	m.PoolGPU = counterVec("fleetlearn_pool_usage_gpu_seconds_total",
		"GPU time metered to pool jobs (GPUs held times wall time), in GPU-seconds, by tenant.", "tenant")
	m.PoolEnergy = counterVec("fleetlearn_pool_usage_energy_joules_total",
		"Energy pool jobs' ranks reported, in joules, by tenant.", "tenant")
	m.UIStreamRefusals = counterVec("fleetlearn_ui_stream_refusals_total",
		"Dashboard live-update streams refused, by reason: principal (the viewer holds its share), reserved (the rest is kept for admins, operators and auditors), full.", "reason")
	m.PoolRefusals = counterVec("fleetlearn_pool_refusals_total",
		"Pool worker calls refused for exceeding a bound (workers per token, checkpoint storage, ...) and leases left unstarted, by reason.", "reason")
	for _, reason := range PoolRefusalReasons {
		m.PoolRefusals.WithLabelValues(reason)
	}
	m.PoolCheckpointStall = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetlearn_pool_checkpoint_stall_seconds",
		Help:    "Time taking a checkpoint blocked a pool rank's training loop, in seconds, as the rank reported it with the commit (clipped to an hour), by tenant.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}, []string{"tenant"})
	m.register("fleetlearn_pool_checkpoint_stall_seconds", m.PoolCheckpointStall)
	m.state = newStateCollector()
	m.register("", m.state)
	m.names = append(m.names, m.state.names...)
	r.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	slices.Sort(m.names)
	return m
}

// register adds c to the registry and its family name to Names.
func (m *M) register(name string, c prometheus.Collector) {
	m.Registry.MustRegister(c)
	if name != "" {
		m.names = append(m.names, name)
	}
}

// Names lists the metric families the aggregator defines (fleetlearn_*,
// without the _bucket, _sum and _count series of histograms), sorted.
func (m *M) Names() []string { return slices.Clone(m.names) }
