package coord

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// fuzzLayout is the update layout of the task FuzzReportChecks checks
// reports against: 9 values in two tensors.
var fuzzLayout = model.Layout{Entries: []model.LayoutEntry{
	{Name: "w", Shape: []int{2, 3}, Offset: 0, Size: 6},
	{Name: "b", Shape: []int{3}, Offset: 6, Size: 3},
}}

func fuzzLayoutSpec() []*pb.TensorSpec {
	return []*pb.TensorSpec{{Name: "w", Shape: []uint64{2, 3}}, {Name: "b", Shape: []uint64{3}}}
}

// reportSeeds are update and evaluation reports for fuzzLayout's task in
// each of its encodings, and one of each refusal of their payload and
// metrics.
func reportSeeds(tb testing.TB) map[string]proto.Message {
	tb.Helper()
	values := []float32{0.5, -1, 2, 0, 1e-3, -0.25, 3, 4, -5}
	dense := func(body []byte) *pb.UpdateReport {
		return &pb.UpdateReport{TaskId: "t", Round: 7, DeviceId: "dev-1", NumExamples: 10, PayloadSha256: wire.SHA256(body),
			Metrics: &pb.Metrics{Values: map[string]float64{"loss": 0.5}},
			Payload: &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: body, Layout: fuzzLayoutSpec()}}}
	}
	quantized := func(enc pb.UpdateEncoding, body []byte) *pb.UpdateReport {
		return &pb.UpdateReport{TaskId: "t", Round: 7, DeviceId: "dev-1", NumExamples: 10, PayloadSha256: wire.SHA256(body),
			Payload: &pb.UpdateReport_Quantized{Quantized: &pb.QuantizedUpdate{Encoding: enc, Data: body, Layout: fuzzLayoutSpec()}}}
	}
	rng := rand.NewPCG(1, 2)
	q8, err := quant.Quantize(values, quant.MinStreamBlock, rng)
	if err != nil {
		tb.Fatal(err)
	}
	b8, err := q8.MarshalBinary()
	if err != nil {
		tb.Fatal(err)
	}
	q4, err := quant.Quantize4(values, quant.MinStreamBlock, rng)
	if err != nil {
		tb.Fatal(err)
	}
	b4, err := q4.MarshalBinary()
	if err != nil {
		tb.Fatal(err)
	}
	nan := wire.EncodeDense(values)
	copy(nan[8:], []byte{0, 0, 0xc0, 0x7f})
	wrongShape := dense(wire.EncodeDense(values))
	wrongShape.GetDense().Layout[1].Shape = []uint64{1, 3}
	wrongHash := dense(wire.EncodeDense(values))
	wrongHash.PayloadSha256 = wire.SHA256(nil)
	metric := func(m map[string]float64) *pb.EvaluationReport {
		return &pb.EvaluationReport{TaskId: "t", Round: 7, DeviceId: "dev-1", NumExamples: 10, Metrics: &pb.Metrics{Values: m}}
	}
	many := map[string]float64{}
	for i := range maxMetrics + 1 {
		many[strings.Repeat("m", i%60+1)+string(rune('a'+i/60))] = 1
	}
	return map[string]proto.Message{
		"dense":        dense(wire.EncodeDense(values)),
		"int8":         quantized(pb.UpdateEncoding_UPDATE_ENCODING_INT8, b8),
		"int4":         quantized(pb.UpdateEncoding_UPDATE_ENCODING_INT4, b4),
		"dense-nan":    dense(nan),
		"dense-short":  dense(wire.EncodeDense(values[:8])),
		"wrong-shape":  wrongShape,
		"wrong-hash":   wrongHash,
		"int8-as-int4": quantized(pb.UpdateEncoding_UPDATE_ENCODING_INT4, b8),
		"masked": &pb.UpdateReport{TaskId: "t", Round: 7, DeviceId: "dev-1",
			Payload: &pb.UpdateReport_Masked{Masked: &pb.MaskedUpdate{ParticipantId: 1, Bits: 16, Values: []uint32{1, 2}}}},
		"eval":             metric(map[string]float64{"loss": 0.25, "accuracy": 0.9}),
		"metric-inf":       metric(map[string]float64{"loss": math.Inf(1)}),
		"metric-huge":      metric(map[string]float64{"loss": 2 * MaxMetricAbs}),
		"metric-control":   metric(map[string]float64{"lo\nss": 1}),
		"metric-long-name": metric(map[string]float64{strings.Repeat("l", maxMetricNameSize+1): 1}),
		"metric-many":      metric(many),
	}
}

// checkFuzzPayload runs the intake's first pass over a one-message report
// and returns the values it checked.
func checkFuzzPayload(tr *taskRun, data []byte) ([]float32, error) {
	var v []float32
	in := &updateIntake{spec: round.Spec{Task: tr.id, Round: 7}, encoding: tr.spec.GetUpdateEncoding(),
		layout: tr.ulayout, trained: tr.trained, kept: new([]float32)}
	p := &scanPass{in: in, emit: func(b []float32) error {
		v = append(v, b...)
		return nil
	}}
	_, err := p.checkPayload(onePiece(data))
	return v, err
}

// TestReportCheckSeeds: each seed of FuzzReportChecks meets the check its
// name says: accepted in its encoding, or refused.
func TestReportCheckSeeds(t *testing.T) {
	encodings := map[string]pb.UpdateEncoding{"dense": pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED,
		"int8": pb.UpdateEncoding_UPDATE_ENCODING_INT8, "int4": pb.UpdateEncoding_UPDATE_ENCODING_INT4}
	for name, m := range reportSeeds(t) {
		switch m := m.(type) {
		case *pb.UpdateReport:
			for encName, enc := range encodings {
				tr := &taskRun{id: "t", spec: &pb.Task{UpdateEncoding: enc}}
				tr.setLayout(fuzzLayout)
				b, err := proto.Marshal(m)
				if err != nil {
					t.Fatal(err)
				}
				_, err = checkFuzzPayload(tr, b)
				if (err == nil) != (name == encName) {
					t.Errorf("%s in a %s task: %v", name, encName, err)
				}
			}
		case *pb.EvaluationReport:
			if err := checkMetrics(m.GetMetrics().GetValues()); (err == nil) != (name == "eval") {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

// FuzzReportChecks decodes arbitrary bytes as an update and as an
// evaluation report and runs the round's pure checks of them: the payload
// against a task of each update encoding, the metrics and the example
// count. An accepted payload is exactly the task's values, all finite, and
// hashes as the report declares; accepted metrics and counts are within
// their bounds; every refusal is a report refusal. Run it with
// -fuzzminimizetime 100x, as FuzzAssembleReport.
func FuzzReportChecks(f *testing.F) {
	for name, m := range reportSeeds(f) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		if *writeCorpus {
			dir := filepath.Join("testdata", "fuzz", f.Name())
			if err := os.MkdirAll(dir, 0o755); err != nil {
				f.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b), 0o644); err != nil {
				f.Fatal(err)
			}
		}
	}
	const seatExamples = 100
	f.Fuzz(func(t *testing.T, data []byte) {
		refused := func(what string, err error) bool {
			if err != nil && !errors.Is(err, ErrReport) {
				t.Fatalf("%s: %v is not a report refusal", what, err)
			}
			return err != nil
		}
		for _, enc := range []pb.UpdateEncoding{pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED,
			pb.UpdateEncoding_UPDATE_ENCODING_INT8, pb.UpdateEncoding_UPDATE_ENCODING_INT4} {
			tr := &taskRun{id: "t", spec: &pb.Task{UpdateEncoding: enc}}
			tr.setLayout(fuzzLayout)
			v, err := checkFuzzPayload(tr, data)
			if refused("payload", err) {
				continue
			}
			var rep pb.UpdateReport
			if err := proto.Unmarshal(data, &rep); err != nil {
				t.Fatalf("%v: accepted a report protobuf refuses: %v", enc, err)
			}
			{
				if len(v) != fuzzLayout.Size() {
					t.Fatalf("%v: accepted %d values, the task trains %d", enc, len(v), fuzzLayout.Size())
				}
				for i, x := range v {
					if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
						t.Fatalf("%v: accepted value %d = %v", enc, i, x)
					}
				}
				var body []byte
				switch p := rep.Payload.(type) {
				case *pb.UpdateReport_Dense:
					body = p.Dense.GetValues()
				case *pb.UpdateReport_Quantized:
					body = p.Quantized.GetData()
				default:
					t.Fatalf("%v: accepted a %T payload", enc, p)
				}
				if wire.SHA256(body) != rep.PayloadSha256 {
					t.Fatalf("%v: accepted a payload that does not hash to the declared %q", enc, rep.PayloadSha256)
				}
			}
		}
		var rep pb.UpdateReport
		if proto.Unmarshal(data, &rep) == nil {
			checkFuzzedMetrics(t, rep.GetMetrics().GetValues(), refused)
			if !refused("examples", checkExamples(rep.NumExamples, round.Seat{Examples: seatExamples})) &&
				(rep.NumExamples == 0 || rep.NumExamples > seatExamples) {
				t.Fatalf("accepted num_examples %d of a device that had %d", rep.NumExamples, seatExamples)
			}
		}
		var ev pb.EvaluationReport
		if proto.Unmarshal(data, &ev) == nil {
			checkFuzzedMetrics(t, ev.GetMetrics().GetValues(), refused)
		}
	})
}

// checkFuzzedMetrics: metrics checkMetrics accepts are few, named in short
// printable UTF-8, finite and bounded, so that their weighted mean over a
// round stays finite.
func checkFuzzedMetrics(t *testing.T, m map[string]float64, refused func(string, error) bool) {
	if refused("metrics", checkMetrics(m)) {
		return
	}
	if len(m) > maxMetrics {
		t.Fatalf("accepted %d metrics", len(m))
	}
	for k, v := range m {
		if k == "" || len(k) > maxMetricNameSize || !utf8.ValidString(k) || strings.ContainsFunc(k, unicode.IsControl) {
			t.Fatalf("accepted metric name %q", k)
		}
		if math.IsNaN(v) || math.Abs(v) > MaxMetricAbs {
			t.Fatalf("accepted metric %q = %v", k, v)
		}
	}
}
