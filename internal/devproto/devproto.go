// Package devproto is the device side of the round protocol (docs/PROTOCOL.md),
// written once for the edge agent and the simulated fleet: check-ins on the
// device's own subject, waits as the server steers them, wake-ups on round
// announcements, supersession of work on a closed round, report publishing
// into JetStream and the bounded retry of a plan that fails, which the
// device then reports once with a PlanFailure.
//
// What a device does with a plan (fetch the model, run a module, build and
// sign its report) is the caller's Work. All timing goes through an injected
// clock.Clock and all randomness through an injected jitter, so tests drive
// a device with a fake clock and never sleep.
package devproto

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// Timing. docs/PROTOCOL.md (Timeouts and defaults) lists these; keep both in step.
const (
	// RequestTimeout bounds a check-in and any other request a device makes.
	RequestTimeout = 10 * time.Second
	// PublishTimeout bounds one attempt to store a report.
	PublishTimeout = 5 * time.Second
	// FailureTimeout bounds the PlanFailure request, which is a courtesy.
	FailureTimeout = 5 * time.Second
	// The waits and attempts of the device's side of the round protocol
	// (round.Devices decides them).
	MinRetryAfter      = round.MinRetryAfter
	MaxRetryAfter      = round.MaxRetryAfter
	MaxIdleWait        = round.MaxIdleWait
	DefaultMaxAttempts = round.DefaultMaxAttempts
)

// Back-off schedules: initial step, cap.
const (
	checkInBackoff, checkInBackoffMax = 250 * time.Millisecond, 30 * time.Second
	publishBackoff, publishBackoffMax = 100 * time.Millisecond, 5 * time.Second
)

var (
	// ErrSuperseded is the cause with which a Work's context ends when a later
	// round of the same task is announced: the plan's round has closed.
	ErrSuperseded = errors.New("devproto: round closed before the report")
	// ErrLeft is what a Work returns to leave a round on purpose (a simulated
	// dropout): it is neither retried nor reported as a failure.
	ErrLeft = errors.New("devproto: left the round")
	// ErrTooLarge reports a report over the server's or the stream's size
	// limit; it is not retried.
	ErrTooLarge = errors.New("devproto: report too large")
	// errDeadline is the cause with which work ends at the report deadline.
	errDeadline = errors.New("report deadline passed")
)

// permanent marks an error that another attempt at the same plan would repeat.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent marks err as one that retrying the plan cannot cure (an
// untrusted module, an invalid plan): the device gives up on the round at
// once and reports it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

func isPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p) || errors.Is(err, ErrTooLarge)
}

// Work carries out one attempt at a plan: it fetches what the plan names,
// runs it, and stores its report with r.Publish. ctx ends at the report
// deadline, when the device stops, or with cause ErrSuperseded when a later
// round of the task is announced; r.Publish outlives the supersession. A
// nil return means the device is done with the round.
type Work func(ctx context.Context, r *Round) error

// Observer is told what a device does; every field is optional. The calls
// come from the device's Run goroutine.
type Observer struct {
	// CheckedIn is called with every check-in response.
	CheckedIn func(resp *pb.CheckInResponse)
	// GaveUp is called once per round the device stops trying, with the
	// attempts made and the last error (which the server was sent).
	GaveUp func(plan *pb.RoundPlan, attempts int, err error)
}

// Config describes a device.
type Config struct {
	// CheckIn is what the device says at every check-in. Its device_id names
	// the device, and so the subject it checks in on; its task_ids, when set,
	// also filter the announcements the device wakes up for.
	CheckIn *pb.CheckIn
	Work    Work
	// Clock times everything (default: the system clock).
	Clock clock.Clock
	// Jitter returns a uniform duration in [0, d) (default: seeded from
	// crypto/rand). It must be safe for concurrent use; see Jitter.
	Jitter func(d time.Duration) time.Duration
	// MaxAttempts bounds the attempts at one round's plan (default
	// DefaultMaxAttempts).
	MaxAttempts int
	Log         *slog.Logger
	Observer    Observer
	// ChunkBytes is the data per chunk of a report larger than one message
	// (default: the connection's max payload less wire.ChunkOverhead); a
	// negative value stores every report as one message, so that one over
	// the limit fails with ErrTooLarge.
	ChunkBytes int
	// TracerProvider records the device's part in rounds: a "checkin" span
	// per check-in that yields a plan, in the round's trace when the reply
	// carries its traceparent, and an "upload" span per report under it;
	// the report's messages carry the upload's trace context. The Work's
	// context holds the checkin span. nil records nothing.
	TracerProvider trace.TracerProvider
}

// Device is one device's protocol state. Run drives it; Announce feeds it
// round announcements (SubscribeAnnouncements does so for a connection).
type Device struct {
	id         string
	checkIn    []byte
	filter     []string
	work       Work
	clk        clock.Clock
	jitter     func(time.Duration) time.Duration
	log        *slog.Logger
	obs        Observer
	chunkBytes int
	tracer     trace.Tracer

	wake chan time.Duration // check-in spread of an announcement

	base *pb.CheckIn // what checkIn holds, to add ready to

	mu     sync.Mutex
	held   *held          // the update a Work holds (Round.Hold), if any
	cur    *current       // the attempt in progress, if any
	rounds *round.Devices // what to do with plans; Run's goroutine and Round.Publish
}

// held is the update of an async plan the device holds until its group's
// plan comes.
type held struct {
	ready *pb.AsyncReady
	until time.Time
}

// current is the attempt in progress, which a later round's announcement cancels.
type current struct {
	task   string
	round  uint64
	cancel context.CancelCauseFunc
}

// New checks cfg and returns a device; Run starts it.
func New(cfg Config) (*Device, error) {
	if cfg.CheckIn == nil || cfg.Work == nil {
		return nil, errors.New("devproto: CheckIn and Work are required")
	}
	id := cfg.CheckIn.GetDeviceId()
	if err := wire.CheckToken("device", id); err != nil {
		return nil, fmt.Errorf("devproto: %w", err)
	}
	b, err := proto.Marshal(cfg.CheckIn)
	if err != nil {
		return nil, fmt.Errorf("devproto: check-in: %w", err)
	}
	d := &Device{id: id, checkIn: b, base: proto.Clone(cfg.CheckIn).(*pb.CheckIn), filter: slices.Clone(cfg.CheckIn.GetTaskIds()), work: cfg.Work,
		clk: clock.Or(cfg.Clock), jitter: cfg.Jitter, log: cfg.Log, obs: cfg.Observer, chunkBytes: cfg.ChunkBytes,
		wake: make(chan time.Duration, 1)}
	if d.jitter == nil {
		var seed [32]byte
		crand.Read(seed[:])
		d.jitter = backoff.Jitter(rand.New(rand.NewChaCha8(seed)))
	}
	d.rounds = round.NewDevices(cfg.MaxAttempts, d.jitter)
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	d.tracer = tracing.Or(cfg.TracerProvider).Tracer("github.com/fleetlearn/fleetlearn/internal/devproto")
	return d, nil
}

// SubscribeAnnouncements feeds the round announcements nc receives to devs:
// one subscription for all the devices sharing a connection.
func SubscribeAnnouncements(nc *nats.Conn, devs ...*Device) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(wire.SubjectAnnounce, func(m *nats.Msg) {
		var ann pb.RoundAnnouncement
		if proto.Unmarshal(m.Data, &ann) != nil {
			return
		}
		for _, d := range devs {
			d.Announce(&ann)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("devproto: subscribe announcements: %w", err)
	}
	return sub, nil
}

// SubscribeReceipts calls f with every receipt the server sends device.
func SubscribeReceipts(nc *nats.Conn, device string, f func(*pb.ReportReceipt)) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(wire.ReceiptSubject(device), func(m *nats.Msg) {
		var r pb.ReportReceipt
		if proto.Unmarshal(m.Data, &r) == nil {
			f(&r)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("devproto: subscribe receipts: %w", err)
	}
	return sub, nil
}

// Announce tells the device a round opened: work on an earlier round of the
// same task stops, unless the task is asynchronous (its server takes the
// report of an earlier round's plan until it is stale), and a waiting
// device checks in soon.
func (d *Device) Announce(ann *pb.RoundAnnouncement) {
	if len(d.filter) > 0 && !slices.Contains(d.filter, ann.GetTaskId()) {
		return
	}
	if !ann.GetAsync() {
		d.supersede(ann.GetTaskId(), ann.GetRound())
	}
	spread := ann.GetCheckInSpread().AsDuration()
	if spread <= 0 || spread > time.Minute {
		spread = time.Second
	}
	select {
	case d.wake <- spread:
	default:
	}
}

// supersede cancels work on a round of task older than round: the server
// opens a round only after closing the previous one, so that work is moot.
func (d *Device) supersede(task string, round uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur != nil && d.cur.task == task && d.cur.round < round {
		d.log.Info("round closed before this device reported; stopping", "device", d.id, "task", task, "round", d.cur.round)
		d.cur.cancel(ErrSuperseded)
		d.cur = nil
	}
}

// Run checks in, works on the plans it is handed and waits as told, until
// ctx ends. A failed check-in (the server or NATS away) is retried with
// back-off; nc reconnects on its own.
func (d *Device) Run(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) {
	fail := backoff.New(checkInBackoff, checkInBackoffMax, d.jitter)
	for ctx.Err() == nil {
		wait, err := d.cycle(ctx, nc, js)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.Debug("check-in cycle failed", "device", d.id, "err", err)
			wait = fail.Next()
		} else {
			fail.Reset()
		}
		d.sleep(ctx, wait)
	}
}

// sleep waits wait, or less once a round is announced: then the device checks
// in after a random part of the announced spread, so that the fleet does not
// arrive in lockstep.
func (d *Device) sleep(ctx context.Context, wait time.Duration) {
	if wait <= 0 {
		return
	}
	end := d.clk.Now().Add(wait)
	t := d.clk.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C():
		return
	case spread := <-d.wake:
		if !t.Stop() {
			select {
			case <-t.C():
			default:
			}
		}
		t.Reset(d.jitter(min(end.Sub(d.clk.Now()), spread)))
	}
	select {
	case <-ctx.Done():
	case <-t.C():
	}
}

// cycle is one check-in and what follows from its answer. It returns how
// long to wait before the next one.
func (d *Device) cycle(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) (time.Duration, error) {
	// An announcement before this check-in is answered by it.
	select {
	case <-d.wake:
	default:
	}
	// Span times are the wall clock's, whatever clock times the protocol.
	sent := time.Now()
	ans, reply, err := checkIn(ctx, d.clk, nc, d.id, d.checkInBytes())
	if err != nil {
		return 0, err
	}
	if f := d.obs.CheckedIn; f != nil {
		f(ans)
	}
	if r := ans.GetRetryAfter(); r != nil {
		return round.RetryWait(r.GetDuration().AsDuration()), nil
	}
	plan := ans.GetPlan()
	if plan == nil {
		return 0, errors.New("check-in response has neither plan nor retry")
	}
	// The task id goes into the subjects the device publishes on.
	if err := wire.CheckToken("task", plan.TaskId); err != nil {
		return 0, fmt.Errorf("check-in response: plan: %w", err)
	}
	p := round.Plan{Task: plan.TaskId, Round: plan.Round, Deadline: plan.GetReportDeadline().AsTime()}
	if plan.GetAsyncStage() == pb.AsyncStage_ASYNC_STAGE_AGGREGATE {
		// A group's plan may be for the very round whose training plan the
		// device is done with: its memory is another's.
		p.Task += "/aggregate"
	}
	d.mu.Lock()
	if h := d.held; h != nil && h.ready.TaskId == plan.TaskId &&
		(plan.GetAsyncStage() != pb.AsyncStage_ASYNC_STAGE_AGGREGATE || plan.GetTrainedRound() != h.ready.Round) {
		// The server took the held update into no group: it gave up the seat.
		d.held = nil
	}
	step := d.rounds.Planned(p, d.clk.Now())
	d.mu.Unlock()
	if !step.Work {
		return step.Wait, nil
	}
	err = d.attempt(d.traceCheckIn(ctx, plan, reply, sent), nc, js, plan, step.Attempt)
	outcome := round.Failed
	switch {
	case err == nil:
		outcome = round.Done
	case ctx.Err() != nil:
		outcome = round.Stopped
	case errors.Is(err, ErrSuperseded):
		outcome = round.Superseded
	case errors.Is(err, ErrLeft):
		outcome = round.Left
	case isPermanent(err):
		outcome = round.Fatal
	}
	d.mu.Lock()
	next := d.rounds.Attempted(p, d.clk.Now(), outcome)
	if plan.GetAsyncStage() == pb.AsyncStage_ASYNC_STAGE_AGGREGATE && (outcome != round.Failed || next.GiveUp) {
		d.held = nil // the group had it, or never will
	}
	if h := d.held; h != nil && h.ready.TaskId == plan.TaskId && h.ready.Round == plan.Round && outcome == round.Done {
		next.Wait = 0 // held: check in at once to join a group
	}
	d.mu.Unlock()
	switch {
	case outcome != round.Failed && outcome != round.Fatal:
	case !next.GiveUp:
		d.log.Warn("round attempt failed; retrying", "device", d.id, "task", plan.TaskId, "round", plan.Round,
			"attempt", next.Attempt, "retry_in", next.Wait, "err", err)
	default:
		d.log.Warn("giving up on the round", "device", d.id, "task", plan.TaskId, "round", plan.Round, "attempts", next.Attempt, "err", err)
		d.reportFailure(ctx, nc, plan, next.Attempt, err)
		if f := d.obs.GaveUp; f != nil {
			f(plan, next.Attempt, err)
		}
	}
	return next.Wait, nil
}

// attempt runs the Work once for plan, bounded by the report deadline and
// cancelled by a later round's announcement.
func (d *Device) attempt(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, plan *pb.RoundPlan, attempt int) error {
	deadline := plan.GetReportDeadline().AsTime()
	left := deadline.Sub(d.clk.Now())
	if left <= 0 {
		return Permanent(fmt.Errorf("report deadline %v already passed on the device clock", deadline))
	}
	// A later round's announcement cancels the work, not a report in flight:
	// the report may already be stored, and its acknowledgement on its way.
	reportCtx, cancel := withTimeout(ctx, d.clk, left, errDeadline)
	defer cancel()
	workCtx, supersede := context.WithCancelCause(reportCtx)
	defer supersede(nil)
	d.mu.Lock()
	d.cur = &current{task: plan.TaskId, round: plan.Round, cancel: supersede}
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.cur = nil
		d.mu.Unlock()
	}()
	r := &Round{Plan: plan, Attempt: attempt, d: d, nc: nc, js: js, reportCtx: reportCtx}
	err := d.work(workCtx, r)
	if err == nil {
		return nil
	}
	switch cause := context.Cause(workCtx); {
	case errors.Is(cause, ErrSuperseded):
		return ErrSuperseded
	case errors.Is(cause, errDeadline):
		return Permanent(fmt.Errorf("%w: %w", errDeadline, err))
	}
	return err
}

// reportFailure tells the server, once per round, why the device gave up on
// it. The server may not answer (not listening, or away): the round goes on
// without the reason, so that is only logged.
func (d *Device) reportFailure(ctx context.Context, nc *nats.Conn, plan *pb.RoundPlan, attempts int, cause error) {
	b, err := proto.Marshal(&pb.PlanFailure{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id,
		Reason: wire.FailureReason(cause.Error()), Attempts: uint32(min(uint64(max(attempts, 0)), math.MaxUint32))})
	if err != nil {
		d.log.Error("plan failure: marshal", "err", err)
		return
	}
	m, err := request(ctx, d.clk, nc, wire.FailureSubject(plan.TaskId, plan.Round, d.id), b, FailureTimeout)
	if err != nil {
		d.log.Debug("plan failure not delivered", "device", d.id, "task", plan.TaskId, "round", plan.Round, "err", err)
		return
	}
	var ack pb.PlanFailureAck
	if err := proto.Unmarshal(m.Data, &ack); err != nil || !ack.Accepted {
		d.log.Debug("plan failure not recorded", "device", d.id, "task", plan.TaskId, "round", plan.Round,
			"reason", wire.FailureReason(ack.Reason), "err", err)
	}
}

// MaxBlobBytes bounds what a device downloads for one model or module.
const MaxBlobBytes = 4 << 30

// errTimeout is the cause with which a request's context ends at its timeout.
var errTimeout = errors.New("timed out")

// request is a NATS request whose timeout runs on clk.
func request(ctx context.Context, clk clock.Clock, nc *nats.Conn, subj string, data []byte, timeout time.Duration) (*nats.Msg, error) {
	rctx, cancel := withTimeout(ctx, clk, timeout, fmt.Errorf("%w after %v", errTimeout, timeout))
	defer cancel()
	m, err := nc.RequestWithContext(rctx, subj, data)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		return nil, fmt.Errorf("request %s: %w", subj, context.Cause(rctx))
	}
	return m, err
}

// CheckIn sends one check-in on the device's own subject (ci.device_id
// names it) and returns the server's answer.
func CheckIn(ctx context.Context, clk clock.Clock, nc *nats.Conn, ci *pb.CheckIn) (*pb.CheckInResponse, error) {
	b, err := proto.Marshal(ci)
	if err != nil {
		return nil, fmt.Errorf("check-in: %w", err)
	}
	resp, _, err := checkIn(ctx, clk, nc, ci.GetDeviceId(), b)
	return resp, err
}

// checkInBytes is the device's check-in, saying which update it holds.
func (d *Device) checkInBytes() []byte {
	d.mu.Lock()
	h := d.held
	if h != nil && !d.clk.Now().Before(h.until) {
		d.held, h = nil, nil
	}
	d.mu.Unlock()
	if h == nil {
		return d.checkIn
	}
	ci := proto.Clone(d.base).(*pb.CheckIn)
	ci.Ready = h.ready
	b, err := proto.Marshal(ci)
	if err != nil {
		return d.checkIn
	}
	return b
}

// checkIn returns the answer with the reply's headers, which carry the
// round's trace context.
func checkIn(ctx context.Context, clk clock.Clock, nc *nats.Conn, device string, ci []byte) (*pb.CheckInResponse, nats.Header, error) {
	m, err := request(ctx, clk, nc, wire.CheckInSubject(device), ci, RequestTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("check-in: %w", err)
	}
	var resp pb.CheckInResponse
	if err := proto.Unmarshal(m.Data, &resp); err != nil {
		return nil, nil, fmt.Errorf("check-in response: %w", err)
	}
	return &resp, m.Header, nil
}

// withTimeout is context.WithTimeout on clk: ctx ends with cause once d has
// passed on clk.
func withTimeout(ctx context.Context, clk clock.Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := clk.AfterFunc(d, func() { cancel(cause) })
	return ctx, func() { t.Stop(); cancel(nil) }
}

// traceCheckIn records the check-in that yielded plan (and an attempt at it)
// as a span, from when it
// was sent to now, continuing the round's trace from the reply's headers,
// and returns ctx holding it.
func (d *Device) traceCheckIn(ctx context.Context, plan *pb.RoundPlan, reply nats.Header, sent time.Time) context.Context {
	ctx, span := d.tracer.Start(tracing.Extract(ctx, reply), "checkin", trace.WithTimestamp(sent),
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(d.attrs(plan)...))
	span.End()
	return ctx
}

func (d *Device) attrs(plan *pb.RoundPlan) []attribute.KeyValue {
	return []attribute.KeyValue{tracing.AttrDevice.String(d.id), tracing.AttrTask.String(plan.GetTaskId()),
		tracing.AttrRound.Int64(int64(plan.GetRound()))}
}
