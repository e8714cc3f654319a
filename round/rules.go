package round

import (
	"math"
	"unicode"
	"unicode/utf8"
)

// Kind is what a round asks of its devices.
type Kind int

// The round kinds.
const (
	Train    Kind = iota + 1 // devices send updates
	Evaluate                 // devices send metrics of the current model
)

func (k Kind) report() string {
	if k == Evaluate {
		return "evaluation"
	}
	return "update"
}

// Spec is what the server knows of the open round.
type Spec struct {
	Task   string
	Round  uint64
	Kind   Kind
	Model  string // the model version the round serves
	Module string // the module's sha256
}

// Seat is a cohort member's place in the round.
type Seat struct {
	// Participant is the device's number in the round, given by the store
	// when the seat was recorded (secure aggregation's participant id).
	Participant uint32 `json:"participant"`
	// Examples is what the device said it had when selected; its report
	// may claim no more.
	Examples uint64 `json:"examples"`
}

// Standing is what the round knows of a device that sends a report.
type Standing struct {
	Seat     Seat
	Seated   bool // the device holds a seat in the round
	Reported bool // its report was already counted
	// OverQuota: it stored more than the round admits per device.
	OverQuota bool
}

// CheckSender decides whether the round takes a report on subject (task,
// round, device): the subject names this round and a seated device that
// has not reported and is within its storage quota. kind is the report's
// kind, from its subject.
func CheckSender(s Spec, task string, round uint64, device string, kind Kind, c Standing) error {
	switch {
	case task != s.Task || round != s.Round:
		return refuse(ClassSubject, "subject is for %s/%d, round is %s/%d", task, round, s.Task, s.Round)
	case !c.Seated:
		return refuse(ClassCohort, "device %q is not in the cohort of round %d", device, round)
	case c.Reported:
		return refuse(ClassDuplicate, "device %q already reported for round %d", device, round)
	case c.OverQuota:
		return refuse(ClassQuota, "device %q stored more than round %d admits per device", device, round)
	case kind != s.Kind:
		return refuse(ClassKind, "%s report in a round that wants %s reports", kind.report(), s.Kind.report())
	}
	return nil
}

// Header is what a report's body says it is.
type Header struct {
	Task   string
	Round  uint64
	Device string
	Model  string
	Module string
}

// CheckHeader decides whether a report's body is for this round, from the
// device its subject names, on the round's model and module.
func CheckHeader(s Spec, device string, h Header) error {
	switch {
	case h.Task != s.Task || h.Round != s.Round:
		return refuse(ClassHeader, "report body is for %s/%d, not %s/%d", h.Task, h.Round, s.Task, s.Round)
	case h.Device != device:
		return refuse(ClassHeader, "report body names device %q, subject %q", h.Device, device)
	case h.Model != s.Model:
		return refuse(ClassHeader, "trained on model %q, round %d serves %q", h.Model, s.Round, s.Model)
	case h.Module != s.Module:
		return refuse(ClassHeader, "ran module %q, task uses %q", h.Module, s.Module)
	}
	return nil
}

// CheckExamples: the example count weights the report, so a device may not
// claim more than it said it had when it was selected, nor none.
func CheckExamples(n uint64, seat Seat) error {
	if n == 0 || n > seat.Examples {
		return refuse(ClassExamples, "num_examples %d not in [1, %d] (examples available at check-in)", n, seat.Examples)
	}
	return nil
}

// Bounds on a report's metrics.
const (
	MaxMetrics        = 64
	MaxMetricNameSize = 64
	// MaxMetricAbs bounds the magnitude of every metric: their weighted
	// mean over a round stays finite and fits the audit log.
	MaxMetricAbs = 1e12
)

// CheckMetrics bounds what a report's metrics may be: few, named in short
// printable UTF-8, finite and at most MaxMetricAbs in magnitude.
func CheckMetrics(m map[string]float64) error {
	if len(m) > MaxMetrics {
		return refuse(ClassMetrics, "%d metrics, at most %d", len(m), MaxMetrics)
	}
	for k, v := range m {
		if k == "" || len(k) > MaxMetricNameSize || !utf8.ValidString(k) {
			return refuse(ClassMetrics, "metric name %q must be 1-%d bytes of UTF-8", k, MaxMetricNameSize)
		}
		for _, c := range k {
			if unicode.IsControl(c) {
				return refuse(ClassMetrics, "metric name %q contains a control character", k)
			}
		}
		if !(math.Abs(v) <= MaxMetricAbs) {
			return refuse(ClassMetrics, "metric %q is %v (metrics must be finite, at most %g in magnitude)", k, v, MaxMetricAbs)
		}
	}
	return nil
}
