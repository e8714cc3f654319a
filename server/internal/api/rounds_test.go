package api_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestListRoundsFailures: a round's failures and metrics reach clients as
// the backend summarised them.
func TestListRoundsFailures(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: seed(e)})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetTask().GetId()
	want := &pb.RoundSummary{TaskId: id, Round: 1, State: pb.RoundState_ROUND_STATE_ABANDONED, Assigned: 3, Dropped: 2,
		Metrics: &pb.Metrics{Values: map[string]float64{"train_loss": 0.25}},
		Failures: []*pb.DeviceFailure{
			{DeviceId: "d-1", Reason: "train: wasm: memory limit exceeded"},
			{DeviceId: "d-2", Reason: "report refused: num_examples 0 not in [1, 10]"},
		}}
	e.b.AddRound(want)
	rs, err := e.tasks.ListRounds(ctx, &pb.ListRoundsRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.GetRounds()) != 1 || !proto.Equal(rs.GetRounds()[0], want) {
		t.Fatalf("ListRounds = %v, want %v", rs.GetRounds(), want)
	}
}
