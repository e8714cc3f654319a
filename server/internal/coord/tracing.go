package coord

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Tracing (docs/TRACING.md). Each round is one trace: its root span "round"
// opens with the round and ends when the round closes, with child spans
// "selection", "validation" (one per report), "aggregation", "commit" and
// "audit". The round's span context travels in the RoundPlan reply's
// headers, so the devices' spans join the trace. Spans name tasks, rounds,
// devices and counts, never data.

const tracerName = "github.com/fleetlearn/fleetlearn/server/internal/coord"

var attrOutcome = attribute.Key("fleetlearn.round.outcome")

func newTracer(tp trace.TracerProvider) trace.Tracer {
	return tracing.Or(tp).Tracer(tracerName)
}

// roundTrace is a round's spans. The round span is the runner's; the
// others are ended once (sync.Once), by whichever goroutine gets there
// first, and all of them when the round's run ends.
type roundTrace struct {
	span    trace.Span  // "round"
	header  nats.Header // the round's trace context, for plan replies; nil when untraced
	sel     trace.Span  // "selection"
	selOnce sync.Once
	agg     trace.Span // "aggregation", once started
	aggOnce sync.Once
}

// startRound opens the round's root span. A round resumed after a restart
// (or after its step failed) gets a new root span, so its trace begins
// where the resumed run does: spans of the earlier run went with it, and
// devices already holding a plan carry the earlier trace context (their
// reports are linked to it).
func (t *taskRun) startRound(ctx context.Context, round uint64, kind pb.RoundKind, resumed bool) context.Context {
	ctx, span := t.c.tracer.Start(ctx, "round", trace.WithNewRoot(), trace.WithAttributes(tracing.AttrTask.String(t.id),
		tracing.AttrRound.Int64(int64(round)), tracing.AttrKind.String(kindName(kind)), attribute.Bool("fleetlearn.round.resumed", resumed)))
	t.span = span
	return ctx
}

// endRound ends the round's span; err is why the run ended with the round
// still open.
func (t *taskRun) endRound(err error) {
	if t.span == nil {
		return
	}
	if err != nil {
		t.span.SetAttributes(attrOutcome.String("interrupted"))
		t.span.SetStatus(codes.Error, err.Error())
	}
	t.span.End()
	t.span = nil
}

// traceRound prepares r's spans under the round span in ctx.
func (t *taskRun) traceRound(ctx context.Context, r *roundRun) {
	r.tr.span = trace.SpanFromContext(ctx)
	r.tr.header = tracing.Header(ctx)
	_, r.tr.sel = t.c.tracer.Start(ctx, "selection", trace.WithAttributes(attribute.Int("fleetlearn.cohort.wanted", r.cohort.Wanted())))
}

// roundCtx is a context holding r's round span, for its child spans.
func (r *roundRun) roundCtx() context.Context {
	return trace.ContextWithSpan(context.Background(), r.tr.span)
}

// selectionDone ends the selection span once, with the cohort it chose.
func (r *roundRun) selectionDone(assigned int) {
	r.tr.selOnce.Do(func() {
		r.tr.sel.SetAttributes(attribute.Int("fleetlearn.cohort.assigned", assigned))
		r.tr.sel.End()
	})
}

// planHanded notes a plan given to a device at check-in.
func (r *roundRun) planHanded(device string, participant uint32) {
	if r.tr.sel.IsRecording() {
		r.tr.sel.AddEvent("plan", trace.WithAttributes(tracing.AttrDevice.String(device),
			attribute.Int64("fleetlearn.participant", int64(participant))))
	}
}

// aggregation returns the round's aggregation span, started on first use.
// The runner alone starts it.
func (t *taskRun) aggregation(r *roundRun) trace.Span {
	if r.tr.agg == nil {
		_, r.tr.agg = t.c.tracer.Start(r.roundCtx(), "aggregation",
			trace.WithAttributes(attribute.Bool("fleetlearn.secure", r.secure != nil)))
	}
	return r.tr.agg
}

// stageClosed notes a closed SecAgg stage on the aggregation span: who
// answered it, and who the next stage waits for.
func (t *taskRun) stageClosed(r *roundRun, stage string, answered, next int) {
	if span := t.aggregation(r); span.IsRecording() {
		span.AddEvent("secagg.stage_closed", trace.WithAttributes(attribute.String("fleetlearn.secagg.stage", stage),
			attribute.Int("fleetlearn.secagg.answered", answered), attribute.Int("fleetlearn.secagg.next", next)))
	}
}

// aggregationDone ends the aggregation span, if started.
func (r *roundRun) aggregationDone() {
	if r.tr.agg != nil {
		r.tr.aggOnce.Do(func() { r.tr.agg.End() })
	}
}

// endSpans ends whatever of r's spans is still open when its run ends.
func (t *taskRun) endSpans(r *roundRun) {
	t.mu.Lock()
	n := r.cohort.Assigned()
	t.mu.Unlock()
	r.selectionDone(n)
	r.aggregationDone()
}

// validation starts the span of one report's checks, linked to the
// device's upload span when the message carries one.
func (t *taskRun) validation(r *roundRun, kind string, h nats.Header) trace.Span {
	if !r.tr.span.IsRecording() {
		return r.tr.span // untraced: nothing to start, nothing to end
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(tracing.AttrTask.String(t.id),
		tracing.AttrRound.Int64(int64(r.row.Round)), attribute.String("fleetlearn.report.kind", kind))}
	if sc := tracing.Remote(h); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	_, span := t.c.tracer.Start(r.roundCtx(), "validation", opts...)
	return span
}

// endValidation ends a validation span with its device and verdict; the
// refusal's reason stays out (it can quote what a report held).
func endValidation(span trace.Span, device string, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(tracing.AttrDevice.String(device), attribute.Bool("fleetlearn.report.accepted", err == nil))
	if err != nil {
		span.SetStatus(codes.Error, "report refused")
	}
	span.End()
}

// auditSpan starts the span of recording events in the audit log.
func (t *taskRun) auditSpan(ctx context.Context, events []audit.Payload) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, trace.SpanFromContext(ctx)
	}
	types := make([]string, len(events))
	for i, e := range events {
		types[i] = string(e.EventType())
	}
	return t.c.tracer.Start(ctx, "audit", trace.WithAttributes(attribute.StringSlice("fleetlearn.audit.events", types)))
}

// endSpan ends a span this package started, with err as its status. A
// non-recording span is the caller's context span (or the no-op one) and is
// left alone.
func endSpan(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func kindName(k pb.RoundKind) string {
	switch k {
	case pb.RoundKind_ROUND_KIND_TRAIN:
		return "train"
	case pb.RoundKind_ROUND_KIND_EVALUATE:
		return "evaluate"
	}
	return k.String()
}
