package api_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestCreateTaskRefusesLimits(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	for _, c := range []struct {
		limits  *pb.Limits
		mention string
	}{
		{&pb.Limits{MemoryPages: 65537}, "memory pages 65537 above the wasm32 maximum 65536"},
		{&pb.Limits{Timeout: durationpb.New(-time.Second)}, "timeout -1s not in [0, 24h0m0s]"},
		{&pb.Limits{MaxFlops: 1 << 63}, "max_flops 9223372036854775808 above 9223372036854775807"},
	} {
		in := seed(e)
		in.Limits = c.limits
		_, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: in})
		wantCode(t, err, codes.InvalidArgument)
		msg := status.Convert(err).Message()
		if !strings.HasPrefix(msg, "create task: task.limits: ") || !strings.Contains(msg, c.mention) {
			t.Errorf("limits %v: message %q, want task.limits mentioning %q", c.limits, msg, c.mention)
		}
	}
	if got := e.b.LastCreated(); got != nil {
		t.Errorf("the backend received a task with bad limits: %v", got)
	}
	// The largest values the sandbox honours pass, and reach the backend unchanged.
	in := seed(e)
	in.Limits = &pb.Limits{MemoryPages: 65536, Timeout: durationpb.New(24 * time.Hour), MaxFlops: 1<<63 - 1, MaxTensorBytes: 1<<63 - 1}
	if _, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: in}); err != nil {
		t.Fatal(err)
	}
	if got := e.b.LastCreated().GetLimits(); got.GetMemoryPages() != 65536 || got.GetMaxFlops() != 1<<63-1 {
		t.Errorf("backend received limits %v", got)
	}
}
