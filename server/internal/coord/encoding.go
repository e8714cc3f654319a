package coord

import (
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
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

// EncodingName is the task option's name for an encoding, as the CLI and
// the audit log spell it.
func EncodingName(e pb.UpdateEncoding) string {
	if bits, ok := wire.EncodingBits(e); ok {
		return round.EncodingName(bits)
	}
	return e.String()
}
