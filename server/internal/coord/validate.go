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

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
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

func (t *taskRun) acceptReport(r *roundRun, col aggregator.Collector, mm *metricMean, m jetstream.Msg, kind string) (string, error) {
	device, seat, key, err := t.sender(r, m.Subject())
	if err != nil {
		return device, err
	}
	wantKind := map[pb.RoundKind]string{pb.RoundKind_ROUND_KIND_TRAIN: "update", pb.RoundKind_ROUND_KIND_EVALUATE: "evaluation"}[r.row.Kind]
	if kind != wantKind {
		return device, refuseAs(metrics.RefusedKind, "%s report in a round that wants %s reports", kind, wantKind)
	}
	var (
		examples uint64
		metrics  map[string]float64
	)
	if kind == "evaluation" {
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
		examples, metrics = rep.NumExamples, rep.GetMetrics().GetValues()
	} else {
		var rep pb.UpdateReport
		if err := proto.Unmarshal(m.Data(), &rep); err != nil {
			return device, refuseAs(refusedDecode, "decode update report: %v", err)
		}
		if err := t.checkHeader(r, device, rep.TaskId, rep.Round, rep.DeviceId, rep.ModelVersion, rep.ModuleSha256); err != nil {
			return device, err
		}
		if err := t.checkSignature(key, rep.Signature, rep.KeyId, identity.UpdateStatement(&rep)); err != nil {
			return device, err
		}
		delta, err := t.checkDense(r, &rep)
		if err != nil {
			return device, err
		}
		if err := checkMetrics(rep.GetMetrics().GetValues()); err != nil {
			return device, err
		}
		if err := checkExamples(rep.NumExamples, seat); err != nil {
			return device, err
		}
		// Last: a refused report must not have touched the aggregate.
		if err := col.Add(delta, t.weight(rep.NumExamples)); err != nil {
			return device, refuseAs(refusedAggregate, "%v", err)
		}
		examples, metrics = rep.NumExamples, rep.GetMetrics().GetValues()
	}
	mm.add(metrics, t.weight(examples))
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

// checkDense decodes a plaintext update, float32 or quantized as the task
// says, into float32 and checks it against the model layout: one
// conversion into the round's buffer, bounded by the model's size.
func (t *taskRun) checkDense(r *roundRun, rep *pb.UpdateReport) (_ []float32, refused error) {
	defer classify(&refused, metrics.RefusedPayload)
	want := t.spec.GetUpdateEncoding()
	var (
		layout []*pb.TensorSpec
		body   []byte
		bits   int
	)
	switch p := rep.Payload.(type) {
	case *pb.UpdateReport_Dense:
		if want != pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
			return nil, refuse("update is float32, task %s takes %s updates", t.id, encodingName(want))
		}
		layout, body = p.Dense.GetLayout(), p.Dense.GetValues()
	case *pb.UpdateReport_Quantized:
		q := p.Quantized
		switch {
		case want == pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED:
			return nil, refuse("update is %s-quantized, task %s takes float32 updates", encodingName(q.GetEncoding()), t.id)
		case q.GetEncoding() != want:
			return nil, refuse("update is %s-quantized, task %s takes %s updates", encodingName(q.GetEncoding()), t.id, encodingName(want))
		case want == pb.UpdateEncoding_UPDATE_ENCODING_INT8:
			bits = 8
		case want == pb.UpdateEncoding_UPDATE_ENCODING_INT4:
			bits = 4
		default:
			return nil, refuse("update encoding %v is unknown", want)
		}
		layout, body = q.GetLayout(), q.GetData()
	case nil:
		return nil, refuse("update has no dense payload")
	default:
		return nil, refuse("update has no dense payload (a masked one, but round %d is not secure)", r.row.Round)
	}
	if got := wire.SHA256(body); got != rep.PayloadSha256 {
		return nil, refuse("payload sha256 %s does not match the declared %q", got, rep.PayloadSha256)
	}
	ml := t.ulayout
	if len(layout) != len(ml.Entries) {
		return nil, refuse("update has %d tensors, the task trains %d", len(layout), len(ml.Entries))
	}
	for i, e := range ml.Entries {
		s := layout[i]
		if s.Name != e.Name || len(s.Shape) != len(e.Shape) {
			return nil, refuse("tensor %d is %s%v, the task trains %s%v", i, s.Name, s.Shape, e.Name, e.Shape)
		}
		for j := range e.Shape {
			if s.Shape[j] != uint64(e.Shape[j]) {
				return nil, refuse("tensor %s has shape %v, model has %v", e.Name, s.Shape, e.Shape)
			}
		}
	}
	var (
		v   []float32
		err error
	)
	if bits == 0 {
		v, err = wire.DecodeDenseInto(r.decoded, body, ml.Size())
	} else {
		v, err = quant.DecodeInto(r.decoded, body, bits, ml.Size())
	}
	if err != nil {
		return nil, refuse("%v", err)
	}
	r.decoded = v
	return v, nil
}
