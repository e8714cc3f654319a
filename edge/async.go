package edge

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// A secure asynchronous task trains first and aggregates after
// (docs/PROTOCOL.md, Asynchronous tasks): its ASYNC_STAGE_TRAIN plan's
// update is held, and the device checks in again saying so
// (devproto.Round.Hold); the server seats it in the open buffer's secure
// aggregation group with an ASYNC_STAGE_AGGREGATE plan, whose masked input
// is the held update, clipped and scaled by the plan's staleness weight,
// instead of a new training.

// heldUpdate is a trained update waiting for its group.
type heldUpdate struct {
	task     string
	round    uint64 // of the training plan
	delta    []float32
	examples int
	// model is the one it trained: a group's plan needs only its layout,
	// and the device need not download the buffer's model for that.
	model *model.Model
}

// ErrNoHeldUpdate is the cause of an ASYNC_STAGE_AGGREGATE plan the agent
// cannot carry out: it holds no update of the plan it names.
var ErrNoHeldUpdate = errors.New("edge: no held update for the group's plan")

// trainAndHold trains an ASYNC_STAGE_TRAIN plan and holds the update.
func (a *Agent) trainAndHold(ctx context.Context, r *devproto.Round, mod *wasm.Module, call wasm.Call) error {
	plan := r.Plan
	res, err := a.train(ctx, plan, mod, call)
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	a.scratch.delta = updateOf(a.scratch.delta, call.Model, res.Model, call.Trainable)
	a.held = &heldUpdate{task: plan.TaskId, round: plan.Round, delta: slices.Clone(a.scratch.delta), examples: res.NumExamples,
		model: call.Model}
	r.Hold()
	return nil
}

// planModel is the model plan works on: fetched, or for a group's plan the
// model its held update trained, whose layout is the update's.
func (a *Agent) planModel(ctx context.Context, js jetstream.JetStream, plan *pb.RoundPlan) (*model.Model, error) {
	if h := a.held; h != nil && plan.GetAsyncStage() == pb.AsyncStage_ASYNC_STAGE_AGGREGATE && h.task == plan.TaskId &&
		h.round == plan.GetTrainedRound() {
		return h.model, nil
	}
	return a.model(ctx, js, plan.GetModel().GetSha256())
}

// heldInput encodes the held update for an ASYNC_STAGE_AGGREGATE plan's
// masking: clipped to the plan's bound first, then scaled by its staleness
// weight, so that a stale update counts for less and never for more than
// a fresh one may. The held update is spent either way.
func (a *Agent) heldInput(_ context.Context, plan *pb.RoundPlan, _ *wasm.Module, _ wasm.Call, encode encoder) ([]uint32, func(), error) {
	h := a.held
	a.held = nil
	if h == nil || h.task != plan.TaskId || h.round != plan.GetTrainedRound() {
		return nil, nil, fmt.Errorf("%w: round %d of task %s", ErrNoHeldUpdate, plan.GetTrainedRound(), plan.TaskId)
	}
	s := plan.GetStalenessWeight()
	if !(s > 0 && s <= 1) || math.IsNaN(s) {
		return nil, nil, fmt.Errorf("edge: staleness weight %v, want (0, 1]", s)
	}
	if bound := plan.GetMaxUpdateNorm(); bound > 0 {
		if _, err := dp.ClipL2(h.delta, bound); err != nil {
			return nil, nil, fmt.Errorf("clip update: %w", err)
		}
	}
	for i := range h.delta {
		h.delta[i] = float32(float64(h.delta[i]) * s)
	}
	return encode(h.delta, h.examples)
}
