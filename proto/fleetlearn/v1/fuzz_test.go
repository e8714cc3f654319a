package fleetlearnv1_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	fleetlearnv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// deviceMessages returns an empty instance of every message the server
// decodes from device-supplied bytes.
func deviceMessages() []proto.Message {
	return []proto.Message{
		new(fleetlearnv1.CheckIn),
		new(fleetlearnv1.UpdateReport),
		new(fleetlearnv1.EvaluationReport),
		new(fleetlearnv1.AdvertiseKeys),
		new(fleetlearnv1.ShareKeys),
		new(fleetlearnv1.ConsistencyCheck),
		new(fleetlearnv1.UnmaskResponse),
	}
}

// FuzzDeviceMessages decodes arbitrary bytes as each device-to-server
// message and checks that anything accepted re-encodes to an equal message,
// so a report's signed encoding cannot be made ambiguous.
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
	for _, m := range []proto.Message{plan, report} {
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
		}
	})
}
