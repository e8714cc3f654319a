package fleetlearnv1_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	fleetlearnv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

const pkg protoreflect.FullName = "fleetlearn.v1"

func float32LE(vs ...float32) []byte {
	b := make([]byte, 0, 4*len(vs))
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func testRoundPlan() *fleetlearnv1.RoundPlan {
	return &fleetlearnv1.RoundPlan{
		TaskId: "task-1",
		Round:  7,
		Kind:   fleetlearnv1.RoundKind_ROUND_KIND_TRAIN,
		Model: &fleetlearnv1.ModelRef{
			Sha256:        strings.Repeat("ab", 32),
			Version:       "mnist-mlp@6",
			SizeBytes:     1 << 20,
			ParentVersion: "mnist-mlp@5",
		},
		Module: &fleetlearnv1.ModuleRef{
			Sha256:     strings.Repeat("0f", 32),
			AbiVersion: 1,
			SizeBytes:  4096,
			Name:       "sgd-mlp",
		},
		Hyperparameters: []byte(`{"lr":0.05,"batch_size":32,"epochs":1}`),
		Seed:            0xdeadbeefcafef00d,
		ReportDeadline:  timestamppb.New(time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)),
		Limits: &fleetlearnv1.Limits{
			MemoryPages:    256,
			Timeout:        durationpb.New(90 * time.Second),
			MaxFlops:       1e12,
			MaxTensorBytes: 64 << 20,
		},
		Secagg: &fleetlearnv1.SecAggConfig{K: 8, Threshold: 5, Bits: 20, ClipRange: 4, GraphSeed: 42},
		Dp: &fleetlearnv1.DPConfig{
			Mechanism:               fleetlearnv1.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN,
			ClipNorm:                1,
			TargetUnclippedQuantile: 0.5,
			ClipLearningRate:        0.2,
			NoiseMultiplier:         1.1,
			TargetEpsilon:           8,
			Delta:                   1e-6,
			Accountant:              fleetlearnv1.Accountant_ACCOUNTANT_RDP,
			MinNoiseContributors:    50,
		},
		ParticipantId: 3,
	}
}

func TestRoundPlanRoundTrip(t *testing.T) {
	in := testRoundPlan()
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	out := new(fleetlearnv1.RoundPlan)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if !proto.Equal(in, out) {
		t.Fatalf("round trip changed the plan:\n in: %v\nout: %v", in, out)
	}
	if got, want := out.GetReportDeadline().AsTime(), in.GetReportDeadline().AsTime(); !got.Equal(want) {
		t.Errorf("report deadline = %v, want %v", got, want)
	}
	if got := out.GetLimits().GetTimeout().AsDuration(); got != 90*time.Second {
		t.Errorf("timeout = %v, want 90s", got)
	}
	if got := out.GetSecagg().GetThreshold(); got != 5 {
		t.Errorf("secagg threshold = %d, want 5", got)
	}

	// The plan travels inside a CheckInResponse; the oneof must survive too.
	resp := &fleetlearnv1.CheckInResponse{Result: &fleetlearnv1.CheckInResponse_Plan{Plan: in}}
	b, err = proto.Marshal(resp)
	if err != nil {
		t.Fatalf("Marshal response: %v", err)
	}
	gotResp := new(fleetlearnv1.CheckInResponse)
	if err := proto.Unmarshal(b, gotResp); err != nil {
		t.Fatalf("Unmarshal response: %v", err)
	}
	if gotResp.GetRetryAfter() != nil || !proto.Equal(gotResp.GetPlan(), in) {
		t.Fatalf("response round trip = %v, want plan %v", gotResp, in)
	}
}

func TestUpdateReportRoundTrip(t *testing.T) {
	values := float32LE(0.5, -1.25, float32(math.Inf(1)), 3e-8, 0, 1, 2)
	tests := []struct {
		name      string
		payload   func(*fleetlearnv1.UpdateReport)
		wantDense bool
	}{
		{
			name: "dense",
			payload: func(r *fleetlearnv1.UpdateReport) {
				r.Payload = &fleetlearnv1.UpdateReport_Dense{Dense: &fleetlearnv1.DenseUpdate{
					Values: values,
					Layout: []*fleetlearnv1.TensorSpec{
						{Name: "dense.weight", Shape: []uint64{2, 3}},
						{Name: "dense.bias", Shape: nil},
					},
				}}
			},
			wantDense: true,
		},
		{
			name: "masked",
			payload: func(r *fleetlearnv1.UpdateReport) {
				r.Payload = &fleetlearnv1.UpdateReport_Masked{Masked: &fleetlearnv1.MaskedUpdate{
					ParticipantId: 3,
					Bits:          32,
					Values:        []uint32{0, 1, 1<<20 - 1, math.MaxUint32},
				}}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := &fleetlearnv1.UpdateReport{
				TaskId:        "task-1",
				Round:         7,
				DeviceId:      "dev-7f3a",
				ModelVersion:  "mnist-mlp@6",
				ModuleSha256:  strings.Repeat("0f", 32),
				NumExamples:   600,
				Metrics:       &fleetlearnv1.Metrics{Values: map[string]float64{"loss": 0.31, "accuracy": 0.9}},
				PayloadSha256: strings.Repeat("cd", 32),
				Signature:     []byte{1, 2, 3, 4},
				KeyId:         "device-key-1",
			}
			tt.payload(in)
			b, err := proto.Marshal(in)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			out := new(fleetlearnv1.UpdateReport)
			if err := proto.Unmarshal(b, out); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !proto.Equal(in, out) {
				t.Fatalf("round trip changed the report:\n in: %v\nout: %v", in, out)
			}
			if gotDense := out.GetDense() != nil; gotDense != tt.wantDense {
				t.Fatalf("dense payload present = %v, want %v", gotDense, tt.wantDense)
			}
			if tt.wantDense {
				if !bytes.Equal(out.GetDense().GetValues(), values) {
					t.Errorf("dense values changed")
				}
			} else if got := out.GetMasked().GetValues(); len(got) != 4 || got[3] != math.MaxUint32 {
				t.Errorf("masked values = %v", got)
			}
		})
	}
}

// TestMaskedValuesArePackedFixed32 pins the wire size of masked updates:
// uniformly random ring elements must cost 4 bytes each, not up to 5 as
// varints would.
func TestMaskedValuesArePackedFixed32(t *testing.T) {
	const n = 1000
	m := &fleetlearnv1.MaskedUpdate{Values: make([]uint32, n)}
	for i := range m.Values {
		m.Values[i] = math.MaxUint32 - uint32(i)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	// Tag (1 byte) + length varint (2 bytes) + 4 bytes per value.
	if want := 1 + 2 + 4*n; len(b) != want {
		t.Fatalf("encoded size = %d, want %d", len(b), want)
	}
}

// TestFieldNumbers guards wire compatibility: renumbering any of these
// fields would silently break devices running older agents.
func TestFieldNumbers(t *testing.T) {
	tests := []struct {
		message protoreflect.FullName
		field   protoreflect.Name
		number  protoreflect.FieldNumber
	}{
		{"fleetlearn.v1.CheckIn", "device_id", 1},
		{"fleetlearn.v1.CheckIn", "attributes", 3},
		{"fleetlearn.v1.CheckInResponse", "plan", 1},
		{"fleetlearn.v1.CheckInResponse", "retry_after", 2},
		{"fleetlearn.v1.RoundPlan", "task_id", 1},
		{"fleetlearn.v1.RoundPlan", "round", 2},
		{"fleetlearn.v1.RoundPlan", "model", 4},
		{"fleetlearn.v1.RoundPlan", "module", 5},
		{"fleetlearn.v1.RoundPlan", "hyperparameters", 6},
		{"fleetlearn.v1.RoundPlan", "secagg", 10},
		{"fleetlearn.v1.RoundPlan", "dp", 11},
		{"fleetlearn.v1.UpdateReport", "dense", 8},
		{"fleetlearn.v1.UpdateReport", "masked", 9},
		{"fleetlearn.v1.UpdateReport", "payload_sha256", 10},
		{"fleetlearn.v1.UpdateReport", "signature", 11},
		{"fleetlearn.v1.DenseUpdate", "values", 1},
		{"fleetlearn.v1.MaskedUpdate", "values", 3},
		{"fleetlearn.v1.ModelRef", "sha256", 1},
		{"fleetlearn.v1.ModuleRef", "abi_version", 2},
		{"fleetlearn.v1.AuditEntry", "jws", 2},
		{"fleetlearn.v1.InclusionProof", "hashes", 3},
	}
	for _, tt := range tests {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(tt.message)
		if err != nil {
			t.Errorf("%s: %v", tt.message, err)
			continue
		}
		f := d.(protoreflect.MessageDescriptor).Fields().ByName(tt.field)
		if f == nil {
			t.Errorf("%s has no field %s", tt.message, tt.field)
			continue
		}
		if f.Number() != tt.number {
			t.Errorf("%s.%s = %d, want %d", tt.message, tt.field, f.Number(), tt.number)
		}
	}
}

// TestNoServices keeps the services out of the message package: their gRPC
// stubs live in fleetlearn.api.v1, so that code using only the messages
// (SecAgg+, the device protocol) does not link gRPC.
func TestNoServices(t *testing.T) {
	var files int
	protoregistry.GlobalFiles.RangeFilesByPackage(pkg, func(fd protoreflect.FileDescriptor) bool {
		files++
		for i := range fd.Services().Len() {
			t.Errorf("%s declares service %s; services belong in fleetlearn.api.v1", fd.Path(), fd.Services().Get(i).FullName())
		}
		return true
	})
	if files == 0 {
		t.Fatal("no files registered for package " + string(pkg))
	}
}

// TestEnumsHaveUnspecifiedZero ensures an unset enum never reads as a real
// choice, for every enum in the package.
func TestEnumsHaveUnspecifiedZero(t *testing.T) {
	var n int
	protoregistry.GlobalFiles.RangeFilesByPackage(pkg, func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Enums().Len() {
			e := fd.Enums().Get(i)
			n++
			zero := e.Values().ByNumber(0)
			if zero == nil || !strings.HasSuffix(string(zero.Name()), "_UNSPECIFIED") {
				t.Errorf("%s: zero value is %v, want *_UNSPECIFIED", e.FullName(), zero)
			}
		}
		return true
	})
	if n == 0 {
		t.Fatal("no enums registered for package " + string(pkg))
	}
}
