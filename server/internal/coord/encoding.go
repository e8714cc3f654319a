package coord

import (
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// SecAggInt8Bits is the SecAgg ring of a task whose updates travel as
// int8: one byte per masked value.
const SecAggInt8Bits = privacyconf.SecAggInt8Bits

// CheckUpdateEncoding checks a task's update encoding against its other
// settings and fills in what it implies (privacyconf.CheckEncoding): an int8
// task with secure aggregation gets an 8-bit ring.
func CheckUpdateEncoding(t *pb.Task) error {
	return privacyconf.CheckEncoding(t, privacyconf.APINames)
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
