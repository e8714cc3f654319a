package fleetlearnv1_test

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	fleetlearnv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// A device agent decodes the server's answer to a CheckIn and either runs
// the assigned plan or waits.
func ExampleCheckInResponse() {
	wire, err := proto.Marshal(&fleetlearnv1.CheckInResponse{
		Result: &fleetlearnv1.CheckInResponse_RetryAfter{RetryAfter: &fleetlearnv1.RetryAfter{
			Duration: durationpb.New(30 * time.Second),
			Reason:   fleetlearnv1.RetryReason_RETRY_REASON_ROUND_FULL,
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	resp := new(fleetlearnv1.CheckInResponse)
	if err := proto.Unmarshal(wire, resp); err != nil {
		fmt.Println(err)
		return
	}
	switch r := resp.GetResult().(type) {
	case *fleetlearnv1.CheckInResponse_Plan:
		fmt.Println("run round", r.Plan.GetRound(), "of", r.Plan.GetTaskId())
	case *fleetlearnv1.CheckInResponse_RetryAfter:
		fmt.Println("retry in", r.RetryAfter.GetDuration().AsDuration(), "because", r.RetryAfter.GetReason())
	}
	// Output: retry in 30s because RETRY_REASON_ROUND_FULL
}
