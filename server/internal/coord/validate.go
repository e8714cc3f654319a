package coord

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"math"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// ErrReport marks a refused report.
var ErrReport = errors.New("report refused")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrReport, fmt.Sprintf(format, args...))
}

// Bounds on a report's metrics.
const (
	maxMetrics        = 64
	maxMetricNameSize = 64
)

// sender checks that a report's subject names this round and a device of
// its cohort that has not reported yet, and returns the device, its seat and
// its enrolled key (nil when not enrolled).
func (t *taskRun) sender(r *roundRun, subject string) (string, store.Assignment, ed25519.PublicKey, error) {
	task, round, device, err := wire.ParseReportSubject(subject)
	if err != nil {
		return "", store.Assignment{}, nil, refuseAs(metrics.RefusedSubject, "%v", err)
	}
	if task != t.id || round != r.row.Round {
		return device, store.Assignment{}, nil, refuseAs(metrics.RefusedSubject, "subject is for %s/%d, round is %s/%d", task, round, t.id, r.row.Round)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	seat, inCohort := r.assigned[device]
	switch {
	case !inCohort:
		return device, seat, nil, refuseAs(metrics.RefusedCohort, "device %q is not in the cohort of round %d", device, round)
	case r.reported[device]:
		return device, seat, nil, refuseAs(metrics.RefusedDuplicate, "device %q already reported for round %d", device, round)
	case t.quota.over(round, device):
		return device, seat, nil, refuseAs(metrics.RefusedQuota, "device %q stored more than round %d admits per device", device, round)
	}
	return device, seat, r.keys[device], nil
}

// acceptReport checks an evaluation report and counts its metrics.
func (t *taskRun) acceptReport(r *roundRun, mm *metricMean, m jetstream.Msg) (string, error) {
	device, seat, key, err := t.sender(r, m.Subject())
	if err != nil {
		return device, err
	}
	if r.row.Kind != pb.RoundKind_ROUND_KIND_EVALUATE {
		return device, refuseAs(metrics.RefusedKind, "evaluation report in a round that wants update reports")
	}
	var rep pb.EvaluationReport
	if err := proto.Unmarshal(m.Data(), &rep); err != nil {
		return device, refuseAs(refusedDecode, "decode evaluation report: %v", err)
	}
	if err := t.checkHeader(r, device, rep.TaskId, rep.Round, rep.DeviceId, rep.ModelVersion, rep.ModuleSha256); err != nil {
		return device, err
	}
	if err := t.checkSignature(key, rep.Signature, rep.KeyId, identity.EvalStatement(&rep)); err != nil {
		return device, err
	}
	if err := checkMetrics(rep.GetMetrics().GetValues()); err != nil {
		return device, err
	}
	if err := checkExamples(rep.NumExamples, seat); err != nil {
		return device, err
	}
	mm.add(rep.GetMetrics().GetValues(), t.weight(rep.NumExamples))
	t.mu.Lock()
	r.reported[device] = true
	t.mu.Unlock()
	return device, nil
}

// checkExamples: the example count weights the report, so a device may not
// claim more than it said it had when it was selected (and its weight is
// capped besides, see taskRun.weight).
func checkExamples(n uint64, seat store.Assignment) (err error) {
	defer classify(&err, metrics.RefusedExamples)
	if n == 0 || n > seat.Examples {
		return refuse("num_examples %d not in [1, %d] (examples available at check-in)", n, seat.Examples)
	}
	return nil
}

// checkMetrics bounds what a report's metrics may be: few, named in short
// printable UTF-8, finite and at most MaxMetricAbs in magnitude, so that
// their weighted mean is finite and fits the audit log.
func checkMetrics(m map[string]float64) (err error) {
	defer classify(&err, metrics.RefusedMetrics)
	if len(m) > maxMetrics {
		return refuse("%d metrics, at most %d", len(m), maxMetrics)
	}
	for k, v := range m {
		if k == "" || len(k) > maxMetricNameSize || !utf8.ValidString(k) {
			return refuse("metric name %q must be 1-%d bytes of UTF-8", k, maxMetricNameSize)
		}
		for _, c := range k {
			if unicode.IsControl(c) {
				return refuse("metric name %q contains a control character", k)
			}
		}
		if !(math.Abs(v) <= MaxMetricAbs) {
			return refuse("metric %q is %v (metrics must be finite, at most %g in magnitude)", k, v, MaxMetricAbs)
		}
	}
	return nil
}

// checkSignature checks a report's device signature against the key the
// device enrolled. The statement covers task, round, device, model, module,
// payload digest (the metrics, for evaluation reports) and example count, so
// none can be altered in transit.
func (t *taskRun) checkSignature(key ed25519.PublicKey, sig []byte, keyID string, s identity.ReportStatement) (err error) {
	defer classify(&err, metrics.RefusedSignature)
	if key == nil {
		if t.c.d.RequireEnrollment {
			return refuse("device %q is not enrolled", s.Device)
		}
		return nil // an open deployment: devices are not enrolled
	}
	if len(sig) == 0 {
		return refuse("report is not signed")
	}
	if err := identity.VerifyReport(key, s, sig); err != nil {
		return refuse("signature does not verify with the key device %q enrolled (report names key %q): %v", s.Device, keyID, err)
	}
	return nil
}

func (t *taskRun) checkHeader(r *roundRun, device, task string, round uint64, bodyDevice, modelVersion, module string) (err error) {
	defer classify(&err, metrics.RefusedHeader)
	switch {
	case task != t.id || round != r.row.Round:
		return refuse("report body is for %s/%d, not %s/%d", task, round, t.id, r.row.Round)
	case bodyDevice != device:
		return refuse("report body names device %q, subject %q", bodyDevice, device)
	case modelVersion != r.row.BaseModel:
		return refuse("trained on model %q, round %d serves %q", modelVersion, r.row.Round, r.row.BaseModel)
	case module != t.spec.GetModule().GetSha256():
		return refuse("ran module %q, task uses %q", module, t.spec.GetModule().GetSha256())
	}
	return nil
}
