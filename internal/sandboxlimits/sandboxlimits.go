// Package sandboxlimits turns a task's protobuf Limits into the sandbox's. The
// API checks a task's limits with it at creation, and the coordinator and the
// edge agent convert with it before each call, so a task the API accepts is
// one every device's sandbox can run, and all of them read a value the same way.
package sandboxlimits

import (
	"fmt"
	"math"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// FromProto converts l, refusing what the sandbox cannot honour; nothing is
// clamped. Unset or zero fields (and a nil l) mean the sandbox default. Errors
// wrap wasm.ErrLimits and say what is allowed.
func FromProto(l *pb.Limits) (wasm.Limits, error) {
	if l == nil {
		return wasm.Limits{}, nil
	}
	if l.GetMaxFlops() > math.MaxInt64 {
		return wasm.Limits{}, fmt.Errorf("limits: %w: max_flops %d above %d (0 takes the sandbox default)",
			wasm.ErrLimits, l.GetMaxFlops(), int64(math.MaxInt64))
	}
	if l.GetMaxTensorBytes() > math.MaxInt64 {
		return wasm.Limits{}, fmt.Errorf("limits: %w: max_tensor_bytes %d above %d (0 takes the sandbox default)",
			wasm.ErrLimits, l.GetMaxTensorBytes(), int64(math.MaxInt64))
	}
	if t := l.GetTimeout(); t != nil {
		// AsDuration would quietly turn a malformed duration into some value.
		if err := t.CheckValid(); err != nil {
			return wasm.Limits{}, fmt.Errorf("limits: %w: timeout: %v", wasm.ErrLimits, err)
		}
	}
	out := wasm.Limits{MemoryPages: l.GetMemoryPages(), Timeout: l.GetTimeout().AsDuration(),
		MaxWork: int64(l.GetMaxFlops()), MaxTensorBytes: int64(l.GetMaxTensorBytes())}
	if err := out.Validate(); err != nil {
		return wasm.Limits{}, fmt.Errorf("limits: %w", err)
	}
	return out, nil
}
