package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestRobustRuleCapped: a rule that keeps every update is refused at task
// creation when a round's seats would hold more than
// aggregator.MaxSampleBytes; FedAvg over the same cohort is not.
func TestRobustRuleCapped(t *testing.T) {
	h := servertest.New(t)
	const params = 6000 // × 4 bytes × 100,000 seats = 2.4 GB
	base, _ := model.New(model.Tensor{Name: "w", Shape: []int{params}, Data: make([]float32, params)})
	version := h.ImportModel(t, "wide", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	task := func(rule pb.AggregationRule) *pb.Task {
		return &pb.Task{Name: "big cohort", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
			CohortTarget: 100_000, ReportGoal: 1000, RoundsTotal: 1,
			Aggregation: &pb.AggregationConfig{Rule: rule, TrimFraction: 0.1}}
	}
	_, err := h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: task(pb.AggregationRule_AGGREGATION_RULE_TRIMMED_MEAN)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "keeps every update") {
		t.Fatalf("trimmed mean over %d seats: %v, want InvalidArgument naming the cap of %d bytes", 100_000, err, aggregator.MaxSampleBytes)
	}
	fedavg := task(pb.AggregationRule_AGGREGATION_RULE_FEDAVG)
	fedavg.Aggregation.TrimFraction = 0
	if _, err := h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: fedavg}); err != nil {
		t.Fatalf("fedavg over the same cohort: %v", err)
	}
}
