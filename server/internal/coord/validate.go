package coord

import (
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// ErrReport marks a refused report.
var ErrReport = errors.New("report refused")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrReport, fmt.Sprintf(format, args...))
}

// Bounds on a report's metrics.
const (
	maxMetrics        = round.MaxMetrics
	maxMetricNameSize = round.MaxMetricNameSize
)

// sender checks that a report's subject names this round and a device of
// its cohort that has not reported yet, and returns the device, its seat and
// its enrolled key (nil when not enrolled).
func (t *taskRun) sender(r *roundRun, subject string, kind round.Kind) (string, round.Seat, ed25519.PublicKey, error) {
	task, rnd, device, err := wire.ParseReportSubject(subject)
	if err != nil {
		return "", round.Seat{}, nil, refuseAs(metrics.RefusedSubject, "%v", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := r.cohort.Standing(device)
	c.OverQuota = c.Seated && !c.Reported && t.quotaFor(r.row.Round).over(r.row.Round, device)
	if err := fromRound(round.CheckSender(t.roundSpec(r), task, rnd, device, kind, c)); err != nil {
		return device, c.Seat, nil, err
	}
	return device, c.Seat, r.keys[device], nil
}

// acceptReport checks an evaluation report and counts its metrics.
func (t *taskRun) acceptReport(r *roundRun, mm *metricMean, m jetstream.Msg) (string, error) {
	device, seat, key, err := t.sender(r, m.Subject(), round.Evaluate)
	if err != nil {
		return device, err
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
	r.cohort.Report(device)
	t.mu.Unlock()
	return device, nil
}

// checkExamples, checkMetrics and checkHeader are the round engine's rules
// (package round), as refusals of this package.
func checkExamples(n uint64, seat round.Seat) error { return fromRound(round.CheckExamples(n, seat)) }

func checkMetrics(m map[string]float64) error { return fromRound(round.CheckMetrics(m)) }

// fromRound turns the engine's refusal into this package's, with its class.
func fromRound(err error) error {
	var rr *round.Refusal
	if errors.As(err, &rr) {
		return refuseAs(string(rr.Class), "%s", rr.Reason())
	}
	return err
}

// roundSpec is the open round as the engine sees it.
func (t *taskRun) roundSpec(r *roundRun) round.Spec {
	return round.Spec{Task: t.id, Round: r.row.Round, Kind: roundKind(r.row.Kind), Model: r.row.BaseModel,
		Module: t.spec.GetModule().GetSha256()}
}

// roundKind is the engine's name for a round kind of the wire.
func roundKind(k pb.RoundKind) round.Kind {
	if k == pb.RoundKind_ROUND_KIND_EVALUATE {
		return round.Evaluate
	}
	return round.Train
}

// checkSignature checks a report's device signature against the key the
// device enrolled. The statement covers task, round, device, model, module,
// payload digest (the metrics, for evaluation reports) and example count, so
// none can be altered in transit.
func (in *updateIntake) checkSignature(key ed25519.PublicKey, sig []byte, keyID string, s identity.ReportStatement) error {
	return fromRound(round.CheckSignature(round.Signed{Device: s.Device, KeyID: keyID, Sig: sig, Key: key,
		RequireEnrollment: in.enrollment}, func(key ed25519.PublicKey, sig []byte) error {
		return identity.VerifyReport(key, s, sig)
	}))
}

func (in *updateIntake) checkHeader(device, task string, rnd uint64, bodyDevice, modelVersion, module string) error {
	return fromRound(round.CheckHeader(in.spec, device, round.Header{Task: task, Round: rnd, Device: bodyDevice,
		Model: modelVersion, Module: module}))
}

func (t *taskRun) checkSignature(key ed25519.PublicKey, sig []byte, keyID string, s identity.ReportStatement) error {
	in := updateIntake{enrollment: t.c.d.RequireEnrollment}
	return in.checkSignature(key, sig, keyID, s)
}

func (t *taskRun) checkHeader(r *roundRun, device, task string, rnd uint64, bodyDevice, modelVersion, module string) error {
	in := updateIntake{spec: t.roundSpec(r)}
	return in.checkHeader(device, task, rnd, bodyDevice, modelVersion, module)
}
