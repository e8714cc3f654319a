package fleetlearnv1_test

import (
	"crypto/ed25519"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	fleetlearnv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// deviceMessages returns an empty instance of every message the server
// decodes from device-supplied bytes: on the device's NATS subjects
// (check-ins, reports and their chunks and manifests, failures, SecAgg
// stage messages, which carry AdvertiseKeys, ShareKeys, ConsistencyCheck
// and UnmaskResponse) and the unauthenticated enrollment request. The
// stage messages are also decoded alone, as privacy/secagg's server takes
// them.
func deviceMessages() []proto.Message {
	return []proto.Message{
		new(fleetlearnv1.CheckIn),
		new(fleetlearnv1.UpdateReport),
		new(fleetlearnv1.EvaluationReport),
		new(fleetlearnv1.ReportManifest),
		new(fleetlearnv1.ReportChunk),
		new(fleetlearnv1.PlanFailure),
		new(fleetlearnv1.SecAggUp),
		new(fleetlearnv1.AdvertiseKeys),
		new(fleetlearnv1.ShareKeys),
		new(fleetlearnv1.ConsistencyCheck),
		new(fleetlearnv1.UnmaskResponse),
		new(fleetlearnv1.EnrollRequest),
	}
}

var writeCorpus = flag.Bool("write-corpus", false, "write FuzzDeviceMessages' generated seeds under testdata/fuzz")

// fuzzKey signs the report seeds; a fuzzed report that verifies under it
// must say what the seed said.
var fuzzKey = ed25519.NewKeyFromSeed([]byte("fleetlearn fuzz device key 32 b!"))

// counted is what the server takes from a report: its ids, what it was
// computed against, its payload's digest, its weight and its metrics. It is
// read from the message, not from identity's statement, so that a field the
// statement left out would show.
type counted struct {
	task                                  string
	round                                 uint64
	device, model, module, payload, stats string
	examples                              uint64
}

// signedSeeds are the honest reports whose signatures the fuzzer mutates
// around: what each signature's report says.
var signedSeeds = map[string]counted{}

func countedOf(task string, round uint64, device, model, module, payload string, examples uint64, m *fleetlearnv1.Metrics) counted {
	return counted{task: task, round: round, device: device, model: model, module: module, payload: payload,
		examples: examples, stats: fmt.Sprint(m.GetValues())} // fmt sorts map keys
}

func updateCounted(r *fleetlearnv1.UpdateReport) counted {
	return countedOf(r.TaskId, r.Round, r.DeviceId, r.ModelVersion, r.ModuleSha256, r.PayloadSha256, r.NumExamples, r.Metrics)
}

func evalCounted(r *fleetlearnv1.EvaluationReport) counted {
	return countedOf(r.TaskId, r.Round, r.DeviceId, r.ModelVersion, r.ModuleSha256, "", r.NumExamples, r.Metrics)
}

func signUpdate(tb testing.TB, r *fleetlearnv1.UpdateReport) {
	tb.Helper()
	sig, err := identity.SignReport(fuzzKey, identity.UpdateStatement(r))
	if err != nil {
		tb.Fatal(err)
	}
	r.Signature = sig
	signedSeeds[string(sig)] = updateCounted(r)
}

func signEval(tb testing.TB, r *fleetlearnv1.EvaluationReport) {
	tb.Helper()
	sig, err := identity.SignReport(fuzzKey, identity.EvalStatement(r))
	if err != nil {
		tb.Fatal(err)
	}
	r.Signature = sig
	signedSeeds[string(sig)] = evalCounted(r)
}

// checkSigned: a report whose statement verifies under fuzzKey says what
// the seed that carried its signature said, so no edit of a signed report
// keeps its signature but changes what the server would count.
func checkSigned(t *testing.T, s identity.ReportStatement, sig []byte, got counted) {
	if identity.VerifyReport(fuzzKey.Public().(ed25519.PublicKey), s, sig) != nil {
		return
	}
	want, ok := signedSeeds[string(sig)]
	if !ok {
		t.Fatalf("a signature no seed carries verifies for %+v", got)
	}
	if got != want {
		t.Fatalf("a signature over %+v verifies for %+v", want, got)
	}
}

// checkSubject: the server trusts the task, round and device a message's
// body names only when they equal those its subject names, and a device
// may publish on its own subjects only; so a body whose subject would not
// parse back to it must not be acceptable on any subject.
func checkSubject(t *testing.T, kind string, task string, round uint64, device string,
	build func(string, uint64, string) string, parse func(string) (string, uint64, string, error)) {
	subj := build(task, round, device)
	gotTask, gotRound, gotDevice, err := parse(subj)
	if err == nil && (gotTask != task || gotRound != round || gotDevice != device) {
		t.Fatalf("%s for %q/%d/%q is on %q, the subject of %q/%d/%q", kind, task, round, device, subj, gotTask, gotRound, gotDevice)
	}
}

// checkDevice runs the server's pure checks of a decoded device message.
func checkDevice(t *testing.T, m proto.Message) {
	switch m := m.(type) {
	case *fleetlearnv1.CheckIn:
		checkSubject(t, "check-in", "", 0, m.DeviceId,
			func(_ string, _ uint64, d string) string { return wire.CheckInSubject(d) },
			func(s string) (string, uint64, string, error) {
				d, err := wire.ParseCheckInSubject(s)
				return "", 0, d, err
			})
	case *fleetlearnv1.UpdateReport:
		checkSubject(t, "update report", m.TaskId, m.Round, m.DeviceId, wire.ReportSubject, wire.ParseReportSubject)
		checkSigned(t, identity.UpdateStatement(m), m.Signature, updateCounted(m))
		switch p := m.Payload.(type) {
		case *fleetlearnv1.UpdateReport_Dense:
			body := p.Dense.GetValues()
			if v, err := wire.DecodeDense(body, len(body)/4); err == nil && string(wire.EncodeDense(v)) != string(body) {
				t.Fatal("an accepted dense payload does not re-encode to itself")
			}
		case *fleetlearnv1.UpdateReport_Masked:
			// Packed values are checked as they are unpacked; plain ones
			// (older agents) by the SecAgg server's AddMasked.
			mu := p.Masked
			bits := int(mu.Bits)
			dim := len(mu.Packed) / secagg.PackedWidth(max(1, min(bits, 32)))
			if len(mu.Packed) > 0 && secagg.Unpack(mu, bits, dim) == nil {
				if len(mu.Values) != dim || len(mu.Packed) != 0 {
					t.Fatalf("unpacked %d values of %d, %d packed bytes left", len(mu.Values), dim, len(mu.Packed))
				}
				for i, v := range mu.Values {
					if bits < 32 && v>>bits != 0 {
						t.Fatalf("unpacked value %d = %d is not below 2^%d", i, v, bits)
					}
				}
				wire.MaskedSHA256(mu)
			}
		}
	case *fleetlearnv1.EvaluationReport:
		checkSubject(t, "evaluation report", m.TaskId, m.Round, m.DeviceId, wire.EvalSubject, wire.ParseReportSubject)
		checkSigned(t, identity.EvalStatement(m), m.Signature, evalCounted(m))
	case *fleetlearnv1.PlanFailure:
		checkSubject(t, "plan failure", m.TaskId, m.Round, m.DeviceId, wire.FailureSubject, wire.ParseFailureSubject)
		// What the server keeps of the reason: bounded, printable, valid
		// UTF-8 and kept as it is when kept again.
		kept := wire.FailureReason("device failed: " + m.Reason)
		if len(kept) > wire.MaxFailureReason || !utf8.ValidString(kept) || strings.ContainsFunc(kept, unicode.IsControl) ||
			wire.FailureReason(kept) != kept {
			t.Fatalf("failure reason kept as %q", kept)
		}
	case *fleetlearnv1.SecAggUp:
		checkSubject(t, "secagg message", m.TaskId, m.Round, m.DeviceId, wire.SecAggUpSubject, wire.ParseSecAggUpSubject)
	case *fleetlearnv1.ReportManifest, *fleetlearnv1.ReportChunk:
		// server/internal/coord's FuzzAssembleReport runs the chunk checks.
	case *fleetlearnv1.EnrollRequest:
		if key, err := identity.ParseUserKeyID(m.KeyId); err == nil && len(key) != ed25519.PublicKeySize {
			t.Fatalf("key id %q parsed to %d bytes", m.KeyId, len(key))
		}
		if m.DeviceId != "" && wire.CheckToken("device_id", m.DeviceId) == nil {
			checkSubject(t, "enrolled device", "", 0, m.DeviceId,
				func(_ string, _ uint64, d string) string { return wire.CheckInSubject(d) },
				func(s string) (string, uint64, string, error) {
					d, err := wire.ParseCheckInSubject(s)
					return "", 0, d, err
				})
		}
	}
}

// deviceSeeds are honest messages of the kinds the checked-in corpus lacks.
func deviceSeeds(tb testing.TB) map[string]proto.Message {
	plan := testRoundPlan()
	update := &fleetlearnv1.UpdateReport{
		TaskId: plan.GetTaskId(), Round: plan.GetRound(), DeviceId: "dev-1", NumExamples: 10,
		ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
		Metrics: &fleetlearnv1.Metrics{Values: map[string]float64{"loss": 0.5}},
		Payload: &fleetlearnv1.UpdateReport_Dense{Dense: &fleetlearnv1.DenseUpdate{
			Values: wire.EncodeDense([]float32{1, -2, 0.5}),
			Layout: []*fleetlearnv1.TensorSpec{{Name: "w", Shape: []uint64{3}}},
		}},
	}
	update.PayloadSha256 = wire.SHA256(update.GetDense().GetValues())
	signUpdate(tb, update)
	masked := &fleetlearnv1.UpdateReport{
		TaskId: plan.GetTaskId(), Round: plan.GetRound(), DeviceId: "dev-2",
		ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
		Payload: &fleetlearnv1.UpdateReport_Masked{Masked: &fleetlearnv1.MaskedUpdate{
			ParticipantId: 1, Bits: 20, Packed: []byte{1, 0, 0, 2, 0, 0, 0xff, 0xff, 0x0f},
		}},
	}
	unpacked := proto.Clone(masked.GetMasked()).(*fleetlearnv1.MaskedUpdate)
	if err := secagg.Unpack(unpacked, 20, 3); err != nil {
		tb.Fatal(err)
	}
	masked.PayloadSha256 = wire.MaskedSHA256(unpacked)
	signUpdate(tb, masked)
	eval := &fleetlearnv1.EvaluationReport{
		TaskId: plan.GetTaskId(), Round: plan.GetRound() + 1, DeviceId: "dev-1", NumExamples: 20,
		ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
		Metrics: &fleetlearnv1.Metrics{Values: map[string]float64{"loss": 0.25, "accuracy": 0.9}},
	}
	signEval(tb, eval)
	keyID, err := nkeys.Encode(nkeys.PrefixByteUser, fuzzKey.Public().(ed25519.PublicKey))
	if err != nil {
		tb.Fatal(err)
	}
	payload := []byte(strings.Repeat("report bytes ", 100))
	sum := wire.SHA256(payload)
	return map[string]proto.Message{
		"update_signed":     update,
		"update_masked":     masked,
		"evaluation_signed": eval,
		"manifest": &fleetlearnv1.ReportManifest{Count: 2, TotalSize: uint64(len(payload)), PayloadSha256: sum,
			ChunkSize: 1000, Sequences: []uint64{17, 18}},
		"chunk": &fleetlearnv1.ReportChunk{Index: 1, Count: 2, TotalSize: uint64(len(payload)), PayloadSha256: sum,
			Data: payload[1000:]},
		"failure": &fleetlearnv1.PlanFailure{TaskId: plan.GetTaskId(), Round: plan.GetRound(), DeviceId: "dev-1",
			Reason: "module trap: out of bounds memory access\n\x1b[31m", Attempts: 3},
		"secagg_up": &fleetlearnv1.SecAggUp{TaskId: plan.GetTaskId(), Round: plan.GetRound(), DeviceId: "dev-1",
			Msg: &fleetlearnv1.SecAggUp_Consistency{Consistency: &fleetlearnv1.ConsistencyCheck{
				TaskId: plan.GetTaskId(), Round: plan.GetRound(), ParticipantId: 2, Signature: make([]byte, 64)}}},
		"enroll": &fleetlearnv1.EnrollRequest{Token: "flet_v1.token", KeyId: string(keyID),
			DeviceId: "dev-1", Attributes: &fleetlearnv1.DeviceAttributes{DeviceClass: "phone", AgentVersion: "0.1.0"}},
	}
}

// FuzzDeviceMessages decodes arbitrary bytes as each device-to-server
// message and checks that anything accepted re-encodes to an equal message,
// so a report's signed encoding cannot be made ambiguous, then runs the
// server's pure checks of it: the subject binding of its ids, its signature
// and its payload decoders.
func FuzzDeviceMessages(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x03, 'd', 'e', 'v'})
	plan := testRoundPlan()
	report := &fleetlearnv1.UpdateReport{
		TaskId: plan.GetTaskId(), Round: plan.GetRound(), DeviceId: "dev-1", NumExamples: 10,
		Metrics: &fleetlearnv1.Metrics{Values: map[string]float64{"loss": 0.5}},
		Payload: &fleetlearnv1.UpdateReport_Masked{Masked: &fleetlearnv1.MaskedUpdate{
			ParticipantId: 1, Bits: 16, Values: []uint32{1, 2, 65535},
		}},
	}
	seeds := []proto.Message{plan, report}
	for name, m := range deviceSeeds(f) {
		seeds = append(seeds, m)
		if *writeCorpus {
			b, err := proto.Marshal(m)
			if err != nil {
				f.Fatal(err)
			}
			dir := filepath.Join("testdata", "fuzz", f.Name())
			if err := os.WriteFile(filepath.Join(dir, name), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b), 0o644); err != nil {
				f.Fatal(err)
			}
		}
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range deviceMessages() {
			if err := proto.Unmarshal(data, m); err != nil {
				continue
			}
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatalf("%T: decoded but cannot re-encode: %v", m, err)
			}
			if got := proto.Size(m); got != len(b) {
				t.Fatalf("%T: Size = %d, encoding is %d bytes", m, got, len(b))
			}
			again := m.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(b, again); err != nil {
				t.Fatalf("%T: re-encoding does not decode: %v", m, err)
			}
			if !proto.Equal(m, again) {
				t.Fatalf("%T: re-encoding changed the message:\n%v\n%v", m, m, again)
			}
			checkDevice(t, m)
		}
	})
}
