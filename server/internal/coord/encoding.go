package coord

import (
	"fmt"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// SecAggInt8Bits is the SecAgg ring of a task whose updates travel as
// int8: one byte per masked value.
const SecAggInt8Bits = 8

// CheckUpdateEncoding checks a task's update encoding against its other
// settings and fills in what it implies: an int8 task with secure
// aggregation gets an 8-bit ring (secagg.bits 0 or 8). In an 8-bit ring the
// quantizer keeps 2^7 − 1 − n of the 127 levels for n slots
// (secagg.NewQuantizer), so SecureConfig, which the caller runs next,
// refuses 126 slots or more, and each device's update gets only
// log2((127 − n)/n) bits of resolution: about 3.3 for 10 slots, 0 at 63.
// A 4-bit ring would hold sums of at most 6 devices, so int4 is for
// plaintext rounds only; distributed DP picks its own ring and scale.
func CheckUpdateEncoding(t *pb.Task) error {
	enc := t.GetUpdateEncoding()
	switch enc {
	case pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED:
		return nil
	case pb.UpdateEncoding_UPDATE_ENCODING_INT8, pb.UpdateEncoding_UPDATE_ENCODING_INT4:
	default:
		return fmt.Errorf("update encoding: %v is not none, int8 or int4", enc)
	}
	sa := t.GetSecagg()
	if sa == nil {
		return nil
	}
	if enc == pb.UpdateEncoding_UPDATE_ENCODING_INT4 {
		return fmt.Errorf("update encoding: int4 cannot run with secure aggregation (a 4-bit ring holds sums of at most 6 devices); use int8")
	}
	if _, ok := privacyconf.Distributed(t.GetDp()); ok {
		return fmt.Errorf("update encoding: int8 cannot run with distributed DP (%v), whose encoder picks its own ring; leave the encoding unset", t.GetDp().GetMechanism())
	}
	switch sa.GetBits() {
	case 0:
		sa.Bits = SecAggInt8Bits
	case SecAggInt8Bits:
	default:
		return fmt.Errorf("update encoding: int8 sets an 8-bit secure aggregation ring, but secagg.bits is %d (leave it 0 or set 8)", sa.GetBits())
	}
	return nil
}

// encodingName is the task option's name for an encoding, as the CLI and
// the audit log spell it.
func encodingName(e pb.UpdateEncoding) string {
	switch e {
	case pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED:
		return "none"
	case pb.UpdateEncoding_UPDATE_ENCODING_INT8:
		return "int8"
	case pb.UpdateEncoding_UPDATE_ENCODING_INT4:
		return "int4"
	}
	return e.String()
}

// EncodingName is encodingName for the server's audit settings.
func EncodingName(e pb.UpdateEncoding) string { return encodingName(e) }
