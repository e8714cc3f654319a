package devproto

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Round is one attempt at a plan, as a Work sees it.
type Round struct {
	Plan *pb.RoundPlan
	// Attempt counts the attempts at this round's plan, from 1.
	Attempt int

	d         *Device
	nc        *nats.Conn
	js        jetstream.JetStream
	reportCtx context.Context // ends at the deadline, not when superseded
}

// Conn is the device's NATS connection.
func (r *Round) Conn() *nats.Conn { return r.nc }

// JetStream is the device's JetStream context, for blobs and reports.
func (r *Round) JetStream() jetstream.JetStream { return r.js }

// Hold says that the Work holds the update its ASYNC_STAGE_TRAIN plan
// trained instead of reporting it: the device checks in again at once with
// CheckIn.ready, to join a buffer's secure aggregation group with it, and
// keeps saying so until it gets that group's plan, a plan of the task
// that is neither, or the plan's report deadline passes.
func (r *Round) Hold() {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	r.d.held = &held{ready: &pb.AsyncReady{TaskId: r.Plan.TaskId, Round: r.Plan.Round}, until: r.Plan.GetReportDeadline().AsTime()}
}

// Publish stores the round's report (an UpdateReport for a training round,
// an EvaluationReport for an evaluation round), as PublishReport does, until
// the report deadline. A later round's announcement does not cancel it: the
// report may already be stored. Once it is, the device takes a plan for this
// round again as already served.
func (r *Round) Publish(payload []byte) error {
	ctx, span := r.d.tracer.Start(r.reportCtx, "upload", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(append(r.d.attrs(r.Plan), attribute.Int("fleetlearn.report.bytes", len(payload)))...))
	err := publishReport(ctx, r.d.clk, r.js, r.Plan, r.d.id, payload, r.d.jitter, r.d.chunkBytes)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	if err != nil {
		return err
	}
	r.d.mu.Lock()
	r.d.rounds.Reported(r.Plan.TaskId, r.Plan.Round)
	r.d.mu.Unlock()
	return nil
}

// Request is a NATS request on the device's connection bounded by
// RequestTimeout on its clock.
func (r *Round) Request(ctx context.Context, subj string, data []byte) (*nats.Msg, error) {
	return request(ctx, r.d.clk, r.nc, subj, data, RequestTimeout)
}

// Flush waits, at most RequestTimeout, until the server has processed
// everything sent on the device's connection (subscriptions included).
func (r *Round) Flush() error {
	if err := r.nc.FlushTimeout(RequestTimeout); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// reportSubject is where a device publishes its report for plan, and the
// report's JetStream message id.
func reportSubject(plan *pb.RoundPlan, device string) (subject, msgID string, err error) {
	switch plan.GetKind() {
	case pb.RoundKind_ROUND_KIND_TRAIN:
		return wire.ReportSubject(plan.TaskId, plan.Round, device), wire.MsgID("update", plan.TaskId, plan.Round, device), nil
	case pb.RoundKind_ROUND_KIND_EVALUATE:
		return wire.EvalSubject(plan.TaskId, plan.Round, device), wire.MsgID("evaluation", plan.TaskId, plan.Round, device), nil
	}
	return "", "", Permanent(fmt.Errorf("plan: unknown round kind %v", plan.GetKind()))
}

// PublishReport stores device's report for plan in the reports stream under
// its message id, so that a retry (or a re-run after a restart) is dropped
// as a duplicate if an earlier copy arrived. It retries through reconnects
// with back-off (100 ms doubling to 5 s, plus jitter; none when jitter is
// nil) until ctx ends; a report over the size limit fails at once with
// ErrTooLarge. A report larger than one message (the connection's max
// payload less wire.ChunkOverhead) is stored in chunks, see publishChunked.
func PublishReport(ctx context.Context, clk clock.Clock, js jetstream.JetStream, plan *pb.RoundPlan, device string,
	payload []byte, jitter func(time.Duration) time.Duration) error {
	return publishReport(ctx, clk, js, plan, device, payload, jitter, 0)
}

// publishReport is PublishReport with the chunk size of Config.ChunkBytes.
func publishReport(ctx context.Context, clk clock.Clock, js jetstream.JetStream, plan *pb.RoundPlan, device string,
	payload []byte, jitter func(time.Duration) time.Duration, chunkBytes int) error {
	subj, id, err := reportSubject(plan, device)
	if err != nil {
		return err
	}
	if size := chunkSize(js, chunkBytes); size > 0 && len(payload) > size {
		return publishChunked(ctx, clk, js, plan, device, id, payload, size, jitter)
	}
	if _, err := publishMsg(ctx, clk, js, &nats.Msg{Subject: subj, Data: payload, Header: tracing.Header(ctx)}, id, jitter); err != nil {
		if errors.Is(err, ErrTooLarge) {
			return fmt.Errorf("%w: %d bytes: %w", ErrTooLarge, len(payload), err)
		}
		return fmt.Errorf("publish report: %w", err)
	}
	return nil
}

// publishMsg stores m under msgID, retrying as PublishReport describes, and
// returns the stream's acknowledgement. A message over a size limit fails
// at once with ErrTooLarge.
func publishMsg(ctx context.Context, clk clock.Clock, js jetstream.JetStream, m *nats.Msg, msgID string,
	jitter func(time.Duration) time.Duration) (*jetstream.PubAck, error) {
	wait := backoff.New(publishBackoff, publishBackoffMax, jitter)
	for {
		pctx, cancel := withTimeout(ctx, clk, PublishTimeout, fmt.Errorf("%w after %v", errTimeout, PublishTimeout))
		// This loop is the only retry, on the device's clock.
		ack, err := js.PublishMsg(pctx, m, jetstream.WithMsgID(msgID), jetstream.WithRetryAttempts(0))
		if err != nil && ctx.Err() == nil && pctx.Err() != nil {
			err = context.Cause(pctx)
		}
		cancel()
		if err == nil {
			return ack, nil
		}
		if tooLarge(err) {
			return nil, fmt.Errorf("%w: %w", ErrTooLarge, err)
		}
		if !clock.Sleep(clk, wait.Next(), ctx.Done()) || ctx.Err() != nil {
			return nil, fmt.Errorf("%w (last error: %w)", context.Cause(ctx), err)
		}
	}
}

// tooLarge says whether a publish failed for the size of the message: over
// the connection's max payload (refused by the client before sending), or
// over the stream's maximum message size.
func tooLarge(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, nats.ErrMaxPayload) ||
		errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}
