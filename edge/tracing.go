package edge

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetlearn/fleetlearn/internal/tracing"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/wasm"
)

const tracerName = "github.com/fleetlearn/fleetlearn/edge"

// startRun starts the span of one run of the module (name "training" or
// "evaluation"), under the check-in span the protocol put in ctx.
func (a *Agent) startRun(ctx context.Context, name string, plan *pb.RoundPlan) trace.Span {
	_, span := a.o.tracer.Tracer(tracerName).Start(ctx, name, trace.WithAttributes(tracing.AttrDevice.String(a.cfg.DeviceID),
		tracing.AttrTask.String(plan.GetTaskId()), tracing.AttrRound.Int64(int64(plan.GetRound()))))
	return span
}

// endRun ends a module run's span with how many examples it used; the
// module's metrics and outputs stay out of it.
func endRun(span trace.Span, res *wasm.Result, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else if res != nil {
		span.SetAttributes(attribute.Int("fleetlearn.examples", res.NumExamples))
	}
	span.End()
}

// train runs the module's training under a "training" span.
func (a *Agent) train(ctx context.Context, plan *pb.RoundPlan, mod *wasm.Module, call wasm.Call) (*wasm.Result, error) {
	span := a.startRun(ctx, "training", plan)
	res, err := mod.Train(ctx, call)
	endRun(span, res, err)
	return res, err
}
