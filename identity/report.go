package identity

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"
	"slices"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// reportLabel separates report signatures from every other use of a
// device key (NATS nonces, SecAgg advertisements).
// v2 added the metrics digest.
const reportLabel = "fleetlearn/update-report/v2"

// Report kinds.
const (
	ReportUpdate = "update"
	ReportEval   = "eval"
)

// ReportStatement is what a device signs about a report it sends: which
// round it answers, what it computed against, and a digest of the payload.
// The device id, example count (the aggregation weight) and metrics are
// signed too, so none can be changed in transit.
type ReportStatement struct {
	Kind          string // ReportUpdate or ReportEval
	Task          string
	Round         uint64
	Device        string
	ModelVersion  string
	ModuleSHA256  string
	PayloadSHA256 string
	NumExamples   uint64
	// MetricsSHA256 is wire.MetricsSHA256 of the report's metrics: they
	// reach the round's summary and the audit log.
	MetricsSHA256 string
	// ClipBit is an update report's adaptive clipping bit (0: none, the
	// only value of every other report). It moves the task's clip bound,
	// so it is signed like the weight; encoded only when set, so that
	// statements without one encode as they always have.
	ClipBit pb.ClipBit
}

// UpdateStatement is what an update report claims, as its device signs it.
func UpdateStatement(r *pb.UpdateReport) ReportStatement {
	return ReportStatement{Kind: ReportUpdate, Task: r.GetTaskId(), Round: r.GetRound(), Device: r.GetDeviceId(),
		ModelVersion: r.GetModelVersion(), ModuleSHA256: r.GetModuleSha256(), PayloadSHA256: r.GetPayloadSha256(),
		NumExamples: r.GetNumExamples(), MetricsSHA256: wire.MetricsSHA256(r.GetMetrics().GetValues()), ClipBit: r.GetClipBit()}
}

// EvalStatement is what an evaluation report claims, as its device signs it.
// Its payload is its metrics: they are what the report releases.
func EvalStatement(r *pb.EvaluationReport) ReportStatement {
	m := wire.MetricsSHA256(r.GetMetrics().GetValues())
	return ReportStatement{Kind: ReportEval, Task: r.GetTaskId(), Round: r.GetRound(), Device: r.GetDeviceId(),
		ModelVersion: r.GetModelVersion(), ModuleSHA256: r.GetModuleSha256(), PayloadSHA256: m,
		NumExamples: r.GetNumExamples(), MetricsSHA256: m}
}

// Bytes is the canonical encoding signed: the label, then each field
// length-prefixed (uint32 big-endian) or as uint64 big-endian, in the
// order of the struct. No two statements encode alike.
func (s ReportStatement) Bytes() ([]byte, error) {
	const op = "identity: report statement"
	if s.Kind != ReportUpdate && s.Kind != ReportEval {
		return nil, fmt.Errorf("%s: %w: kind %q", op, ErrBadInput, s.Kind)
	}
	for _, f := range []struct{ kind, v string }{{"task", s.Task}, {"device", s.Device}} {
		if err := wire.CheckToken(f.kind, f.v); err != nil {
			return nil, fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
		}
	}
	if s.ModelVersion == "" || len(s.ModelVersion) > 256 {
		return nil, fmt.Errorf("%s: %w: model version must be 1-256 bytes", op, ErrBadInput)
	}
	for _, f := range []struct{ kind, v string }{{"module", s.ModuleSHA256}, {"payload", s.PayloadSHA256}, {"metrics", s.MetricsSHA256}} {
		if err := wire.CheckSHA256(f.kind, f.v); err != nil {
			return nil, fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
		}
	}
	b := make([]byte, 0, 256)
	str := func(v string) {
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	str(reportLabel)
	str(s.Kind)
	str(s.Task)
	b = binary.BigEndian.AppendUint64(b, s.Round)
	str(s.Device)
	str(s.ModelVersion)
	str(s.ModuleSHA256)
	str(s.PayloadSHA256)
	b = binary.BigEndian.AppendUint64(b, s.NumExamples)
	str(s.MetricsSHA256)
	if s.ClipBit != pb.ClipBit_CLIP_BIT_UNSPECIFIED {
		if s.Kind != ReportUpdate || (s.ClipBit != pb.ClipBit_CLIP_BIT_UNCLIPPED && s.ClipBit != pb.ClipBit_CLIP_BIT_CLIPPED) {
			return nil, fmt.Errorf("%s: %w: clip bit %v in a %s report", op, ErrBadInput, s.ClipBit, s.Kind)
		}
		b = binary.BigEndian.AppendUint64(b, uint64(s.ClipBit))
	}
	return b, nil
}

// SignReport signs s with a device key.
func SignReport(key ed25519.PrivateKey, s ReportStatement) ([]byte, error) {
	if _, err := publicKeyOf("identity: sign report", key); err != nil {
		return nil, err
	}
	b, err := s.Bytes()
	if err != nil {
		return nil, err
	}
	return ed25519.Sign(key, b), nil
}

// VerifyReport checks a device's signature over s.
func VerifyReport(pub ed25519.PublicKey, s ReportStatement, sig []byte) error {
	const op = "identity: verify report"
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%s: %w: public key has %d bytes", op, ErrBadKey, len(pub))
	}
	b, err := s.Bytes()
	if err != nil {
		return err
	}
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(pub, b, sig) {
		return fmt.Errorf("%s: %w: device %s, task %s round %d", op, ErrBadSignature, s.Device, s.Task, s.Round)
	}
	return nil
}

func sortedStrings(s []string) []string { slices.Sort(s); return s }
