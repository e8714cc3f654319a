package devproto_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

// bound is how long a test waits for something the device does in real
// time (NATS round trips), generous for a loaded machine. Protocol time is
// the fake clock's.
const bound = 30 * time.Second

// half is the tests' jitter: deterministic, and in [0, d) as jitter must be.
func half(d time.Duration) time.Duration { return d / 2 }

// fixture is a real NATS server with the reports stream, a responder that
// stands in for the aggregator (answering check-ins with whatever answer
// holds, acknowledging plan failures), and a device's connection.
type fixture struct {
	t *testing.T
	// chunkBytes is the device's Config.ChunkBytes.
	chunkBytes int
	clk        *clock.Fake
	srv        *nats.Conn // the responder's
	srvJS      jetstream.JetStream
	nc         *nats.Conn // the device's
	js         jetstream.JetStream
	mu         sync.Mutex
	answer     *pb.CheckInResponse

	checkIns chan *nats.Msg
	failures chan *nats.Msg
}

func newFixture(t *testing.T, streamSubjects ...string) *fixture {
	t.Helper()
	opts := natstest.Options(t)
	opts.MaxPayload = 64 << 10
	ns := natstest.Run(t, opts)
	connect := func() (*nats.Conn, jetstream.JetStream) { return natstest.Connect(t, ns) }
	f := &fixture{t: t, clk: clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)),
		checkIns: make(chan *nats.Msg, 64), failures: make(chan *nats.Msg, 64)}
	f.srv, f.srvJS = connect()
	f.nc, f.js = connect()
	if len(streamSubjects) > 0 {
		f.stream(streamSubjects...)
	}
	if _, err := f.srv.Subscribe(wire.SubjectCheckIns, func(m *nats.Msg) {
		f.mu.Lock()
		answer := f.answer
		f.mu.Unlock()
		if answer == nil {
			t.Error("a check-in before the test set an answer")
		}
		b, err := proto.Marshal(answer)
		if err != nil {
			t.Error(err)
			return
		}
		f.checkIns <- m
		m.Respond(b)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.Subscribe(wire.SubjectFailures, func(m *nats.Msg) {
		f.failures <- m
		b, _ := proto.Marshal(&pb.PlanFailureAck{Accepted: true})
		m.Respond(b)
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// stream creates or updates the reports stream with the given subjects and
// a 1 KiB message limit.
func (f *fixture) stream(subjects ...string) {
	f.t.Helper()
	if _, err := f.srvJS.CreateOrUpdateStream(context.Background(), jetstream.StreamConfig{Name: wire.StreamReports,
		Subjects: subjects, MaxMsgSize: 1 << 10, Duplicates: time.Hour}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) setAnswer(a *pb.CheckInResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = a
}

func retryAfter(d time.Duration) *pb.CheckInResponse {
	return &pb.CheckInResponse{Result: &pb.CheckInResponse_RetryAfter{RetryAfter: &pb.RetryAfter{Duration: durationpb.New(d)}}}
}

func (f *fixture) plan(task string, round uint64, deadline time.Duration) *pb.CheckInResponse {
	return &pb.CheckInResponse{Result: &pb.CheckInResponse_Plan{Plan: &pb.RoundPlan{TaskId: task, Round: round,
		Kind: pb.RoundKind_ROUND_KIND_TRAIN, ReportDeadline: timestamppb.New(f.clk.Now().Add(deadline))}}}
}

// start runs a device dev-1 with work until the test ends.
func (f *fixture) start(work devproto.Work, tasks ...string) *devproto.Device {
	f.t.Helper()
	log := &syncBuffer{}
	f.t.Cleanup(func() {
		if f.t.Failed() {
			f.t.Logf("device log:\n%s", log.String())
		}
	})
	d, err := devproto.New(devproto.Config{CheckIn: &pb.CheckIn{DeviceId: "dev-1", TaskIds: tasks}, Work: work,
		Clock: f.clk, Jitter: half, ChunkBytes: f.chunkBytes, Log: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := devproto.SubscribeAnnouncements(f.nc, d); err != nil {
		f.t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx, f.nc, f.js) }()
	f.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(bound):
			f.t.Error("the device did not stop")
		}
	})
	return d
}

// checkIn waits for the device's next check-in and returns its body.
func (f *fixture) checkIn() *pb.CheckIn {
	f.t.Helper()
	select {
	case m := <-f.checkIns:
		if m.Subject != wire.CheckInSubject("dev-1") {
			f.t.Errorf("check-in on %q, want %q", m.Subject, wire.CheckInSubject("dev-1"))
		}
		var ci pb.CheckIn
		if err := proto.Unmarshal(m.Data, &ci); err != nil {
			f.t.Fatal(err)
		}
		if ci.DeviceId != "dev-1" {
			f.t.Errorf("check-in body names %q", ci.DeviceId)
		}
		return &ci
	case <-time.After(bound):
		f.t.Fatalf("no check-in (timers pending at %v)", f.offsets())
		return nil
	}
}

func (f *fixture) noCheckIn() {
	f.t.Helper()
	select {
	case <-f.checkIns:
		f.t.Fatal("unexpected check-in")
	default:
	}
}

func (f *fixture) announce(task string, round uint64, spread time.Duration) {
	f.t.Helper()
	b, _ := proto.Marshal(&pb.RoundAnnouncement{TaskId: task, Round: round, CheckInSpread: durationpb.New(spread)})
	if err := f.srv.Publish(wire.SubjectAnnounce, b); err != nil {
		f.t.Fatal(err)
	}
	if err := f.srv.Flush(); err != nil {
		f.t.Fatal(err)
	}
}

// offsets are the pending timers, as durations from now.
func (f *fixture) offsets() []time.Duration {
	now := f.clk.Now()
	var out []time.Duration
	for _, d := range f.clk.Deadlines() {
		out = append(out, d.Sub(now))
	}
	return out
}

// waitTimers waits until the pending timers are due exactly at want from
// now (in any order).
func (f *fixture) waitTimers(want ...time.Duration) {
	f.t.Helper()
	slices.Sort(want)
	giveUp := time.After(bound)
	for {
		changed := f.clk.Changed()
		if slices.Equal(f.offsets(), want) {
			return
		}
		select {
		case <-changed:
		case <-giveUp:
			f.t.Fatalf("pending timers at %v, want %v", f.offsets(), want)
		}
	}
}

// sleeping waits until the device sleeps for d between check-ins (its only
// timer) and lets that time pass.
func (f *fixture) sleeping(d time.Duration) {
	f.t.Helper()
	f.waitTimers(d)
	f.clk.Advance(d)
}

// syncBuffer collects a device's log, shown when a test fails.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// recv receives from ch, within bound.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(bound):
		t.Fatalf("no %s within %v", what, bound)
		panic("unreachable")
	}
}

func (f *fixture) failure() *pb.PlanFailure {
	f.t.Helper()
	select {
	case m := <-f.failures:
		var pf pb.PlanFailure
		if err := proto.Unmarshal(m.Data, &pf); err != nil {
			f.t.Fatal(err)
		}
		if want := wire.FailureSubject(pf.TaskId, pf.Round, "dev-1"); m.Subject != want || pf.DeviceId != "dev-1" {
			f.t.Errorf("plan failure of %q on %q, want dev-1 on %q", pf.DeviceId, m.Subject, want)
		}
		return &pf
	case <-time.After(bound):
		f.t.Fatal("no plan failure")
		return nil
	}
}

func (f *fixture) noFailure() {
	f.t.Helper()
	select {
	case m := <-f.failures:
		f.t.Fatalf("unexpected plan failure on %s", m.Subject)
	default:
	}
}

// TestCheckInAndWake: a device checks in on its own subject, waits what the
// server says within the clamp, and wakes early, after a jittered part of
// the spread, for an announcement of a task it serves.
func TestCheckInAndWake(t *testing.T) {
	f := newFixture(t)
	f.setAnswer(retryAfter(time.Hour)) // before the device starts: its first check-in gets it
	f.start(func(context.Context, *devproto.Round) error { return errors.New("no plan expected") }, "t-1")
	if ci := f.checkIn(); !slices.Equal(ci.TaskIds, []string{"t-1"}) {
		t.Errorf("check-in task filter %v", ci.TaskIds)
	}
	f.waitTimers(devproto.MaxRetryAfter)

	// Another task's announcement does not wake it; its own task's does,
	// after half (the test's jitter) of the announced spread. Had the first
	// woken it, the timer would be at 5 s.
	f.announce("t-other", 3, 10*time.Second)
	f.announce("t-1", 3, 4*time.Second)
	f.setAnswer(retryAfter(time.Millisecond))
	f.sleeping(2 * time.Second)
	f.checkIn()
	f.sleeping(devproto.MinRetryAfter)
	f.checkIn()
	f.noFailure()
}

// TestSupersede: the announcement of a later round of the task cancels work
// on the earlier one, and the device checks in again at once; a report
// being published is not cancelled, and once stored the device does not
// work on that round's plan again.
func TestSupersede(t *testing.T) {
	f := newFixture(t, "fl.eval.>") // no stream for updates yet: their publish retries
	type result struct {
		round      uint64
		publishErr error
		cause      error
	}
	started := make(chan uint64, 8)
	results := make(chan result, 8)
	ended := make(chan error, 8) // the cause with which round 2's work context ended
	var works atomic.Int32
	f.setAnswer(f.plan("t-1", 1, time.Hour))
	f.start(func(ctx context.Context, r *devproto.Round) error {
		works.Add(1)
		started <- r.Plan.Round
		if r.Plan.Round == 1 {
			<-ctx.Done()
			results <- result{round: 1, cause: context.Cause(ctx)}
			return ctx.Err()
		}
		go func() { <-ctx.Done(); ended <- context.Cause(ctx) }()
		err := r.Publish([]byte("update of round 2"))
		results <- result{round: r.Plan.Round, publishErr: err, cause: context.Cause(ctx)}
		return err
	})
	f.checkIn()
	if r := recv(t, started, "work"); r != 1 {
		t.Fatalf("working on round %d", r)
	}
	f.setAnswer(f.plan("t-1", 2, time.Hour))
	f.announce("t-0", 5, time.Second) // another task: no effect on the work
	f.announce("t-1", 2, 2*time.Second)
	if r := recv(t, results, "result"); !errors.Is(r.cause, devproto.ErrSuperseded) {
		t.Fatalf("round 1 work ended with cause %v", r.cause)
	}
	// Straight to the next check-in: no clock time passes.
	f.checkIn()
	if r := recv(t, started, "work"); r != 2 {
		t.Fatalf("working on round %d", r)
	}
	// The publish finds no stream and backs off (100 ms + half): the round's
	// deadline and that back-off are pending.
	f.waitTimers(150*time.Millisecond, time.Hour)
	f.announce("t-1", 3, 2*time.Second)
	if cause := recv(t, ended, "end of the work's context"); !errors.Is(cause, devproto.ErrSuperseded) {
		t.Fatalf("round 2's work ended with %v while publishing", cause)
	}
	f.stream("fl.eval.>", "fl.report.>")
	// Once the stream stores updates for another device, it takes this one's.
	if _, err := f.srvJS.Publish(context.Background(), wire.ReportSubject("t-1", 2, "dev-2"), nil); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(150 * time.Millisecond)
	r := recv(t, results, "result")
	if r.publishErr != nil || !errors.Is(r.cause, devproto.ErrSuperseded) {
		t.Fatalf("round 2: publish %v with the work's context ended by %v; want the publish through a supersession", r.publishErr, r.cause)
	}
	st, err := f.srvJS.Stream(context.Background(), wire.StreamReports)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetLastMsgForSubject(context.Background(), wire.ReportSubject("t-1", 2, "dev-1"))
	if err != nil {
		t.Fatal(err)
	}
	if id := msg.Header.Get(jetstream.MsgIDHeader); id != wire.MsgID("update", "t-1", 2, "dev-1") || string(msg.Data) != "update of round 2" {
		t.Fatalf("stored %q with msg id %q", msg.Data, id)
	}
	// Done with round 2, it waits for the next round; the announcement of
	// round 3 came during the publish, so it wakes after half its spread.
	f.sleeping(time.Second)
	f.checkIn()
	// Handed round 2's plan again, it does not work on it and waits,
	// longer each time.
	f.sleeping(375 * time.Millisecond)
	f.checkIn()
	f.sleeping(750 * time.Millisecond)
	f.checkIn()
	if n := works.Load(); n != 2 {
		t.Fatalf("worked %d times, want once per round", n)
	}
	f.noFailure()
}

// TestFailingPlanBacksOff: a plan that keeps failing is attempted
// DefaultMaxAttempts times with doubling waits, then given up with one
// PlanFailure that carries the reason, cut to its limit on a character
// boundary; later check-ins handed the same plan leave it alone.
func TestFailingPlanBacksOff(t *testing.T) {
	f := newFixture(t, "fl.report.>", "fl.eval.>")
	var attempts atomic.Int32
	reason := "fetch failed: " + strings.Repeat("€", 100) // a € straddles the limit
	f.setAnswer(f.plan("t-1", 1, time.Hour))
	f.start(func(ctx context.Context, r *devproto.Round) error {
		want := int(attempts.Add(1))
		if r.Plan.Round == 2 {
			want -= devproto.DefaultMaxAttempts
		}
		if r.Attempt != want {
			t.Errorf("round %d: attempt %d says it is attempt %d", r.Plan.Round, want, r.Attempt)
		}
		return errors.New(reason)
	})
	f.checkIn()
	for _, wait := range []time.Duration{1500 * time.Millisecond, 3 * time.Second, 6 * time.Second} {
		f.sleeping(wait) // back-off 1 s doubling, plus half
		f.checkIn()
	}
	pf := f.failure()
	if pf.TaskId != "t-1" || pf.Round != 1 || pf.Attempts != devproto.DefaultMaxAttempts {
		t.Errorf("plan failure %v", pf)
	}
	if len(pf.Reason) > wire.MaxFailureReason || !utf8.ValidString(pf.Reason) || !strings.HasPrefix(reason, pf.Reason) ||
		len(pf.Reason) < wire.MaxFailureReason-3 {
		t.Errorf("reason %q (%d bytes), want a prefix of %q up to %d bytes", pf.Reason, len(pf.Reason), reason, wire.MaxFailureReason)
	}
	// Given up, it sleeps towards the next round (30 s + half a second) and,
	// given the plan again, only waits again.
	for range 3 {
		f.sleeping(devproto.MaxIdleWait + 500*time.Millisecond)
		f.checkIn()
	}
	f.waitTimers(devproto.MaxIdleWait + 500*time.Millisecond)
	if n := attempts.Load(); n != devproto.DefaultMaxAttempts {
		t.Fatalf("%d attempts, want %d", n, devproto.DefaultMaxAttempts)
	}
	f.noFailure()

	// A new round starts over.
	f.setAnswer(f.plan("t-1", 2, time.Hour))
	f.clk.Advance(devproto.MaxIdleWait + 500*time.Millisecond)
	f.checkIn()
	f.waitTimers(1500 * time.Millisecond)
	if n := attempts.Load(); n != devproto.DefaultMaxAttempts+1 {
		t.Fatalf("%d attempts after round 2's first, want %d", n, devproto.DefaultMaxAttempts+1)
	}
}

// TestFailingPlanStopsAtDeadline: the retries of a failing plan stop short
// of the report deadline, which bounds them before the attempt limit does.
func TestFailingPlanStopsAtDeadline(t *testing.T) {
	f := newFixture(t, "fl.report.>", "fl.eval.>")
	var attempts atomic.Int32
	f.setAnswer(f.plan("t-1", 1, 5*time.Second))
	f.start(func(ctx context.Context, r *devproto.Round) error {
		attempts.Add(1)
		return errors.New("module trapped")
	})
	f.checkIn()
	f.sleeping(1500 * time.Millisecond)
	f.checkIn()
	f.sleeping(3 * time.Second)
	f.checkIn()
	// At 4.5 s the next attempt would come at 10.5 s, past the deadline.
	if pf := f.failure(); pf.Attempts != 3 || pf.Reason != "module trapped" {
		t.Errorf("plan failure %v", pf)
	}
	f.waitTimers(time.Second + 500*time.Millisecond) // 0.5 s to the deadline: the 1 s floor
	if n := attempts.Load(); n != 3 {
		t.Fatalf("%d attempts", n)
	}
}

// TestTooLargeNotRetried: a report over the stream's message limit or over
// NATS's max payload (with chunking off, or chunks over the stream's limit)
// fails at once with ErrTooLarge, is not retried, and the round is given up
// and reported after one attempt.
func TestTooLargeNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size       int
		chunkBytes int
	}{
		{"stream limit", 2 << 10, 0},   // the stream refuses it
		{"max payload", 100 << 10, -1}, // the client refuses it before sending
		{"chunk over the stream limit", 100 << 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "fl.report.>", "fl.eval.>", "fl.chunk.>")
			f.chunkBytes = tc.chunkBytes
			errs := make(chan error, 8)
			f.setAnswer(f.plan("t-1", 1, time.Hour))
			f.start(func(ctx context.Context, r *devproto.Round) error {
				err := r.Publish(make([]byte, tc.size))
				errs <- err
				return err
			})
			f.checkIn()
			// The publish returns without the clock moving: no back-off.
			if err := recv(t, errs, "publish"); !errors.Is(err, devproto.ErrTooLarge) {
				t.Fatalf("publish: %v, want ErrTooLarge", err)
			}
			pf := f.failure()
			if pf.Attempts != 1 || !strings.Contains(pf.Reason, "too large") || !strings.Contains(pf.Reason, fmt.Sprint(tc.size)) {
				t.Errorf("plan failure %v", pf)
			}
			f.sleeping(devproto.MaxIdleWait + 500*time.Millisecond)
			f.checkIn()
			f.waitTimers(devproto.MaxIdleWait + 500*time.Millisecond)
			select {
			case err := <-errs:
				t.Fatalf("published again: %v", err)
			default:
			}
			f.noFailure()
		})
	}
}

// TestLeftAndPermanent: a Work that leaves a round on purpose is neither
// retried nor reported; one that fails permanently is reported at once.
func TestLeftAndPermanent(t *testing.T) {
	f := newFixture(t, "fl.report.>", "fl.eval.>")
	var attempts atomic.Int32
	f.setAnswer(f.plan("t-1", 1, time.Hour))
	f.start(func(ctx context.Context, r *devproto.Round) error {
		attempts.Add(1)
		if r.Plan.Round == 1 {
			return fmt.Errorf("dropping out: %w", devproto.ErrLeft)
		}
		return devproto.Permanent(errors.New("module not signed by a trusted publisher"))
	})
	f.checkIn()
	f.setAnswer(f.plan("t-1", 2, time.Hour))
	f.sleeping(devproto.MaxIdleWait + 500*time.Millisecond)
	f.checkIn()
	if pf := f.failure(); pf.Round != 2 || pf.Attempts != 1 || pf.Reason != "module not signed by a trusted publisher" {
		t.Errorf("plan failure %v", pf)
	}
	f.waitTimers(devproto.MaxIdleWait + 500*time.Millisecond)
	if n := attempts.Load(); n != 2 {
		t.Fatalf("%d attempts, want one per round", n)
	}
	f.noFailure()
}

// TestHoldAndJoin: a Work that holds its training plan's update makes the
// device check in again at once saying so, and again after a retry while
// the group is full; the group's plan (of the same round, in another
// memory) runs, and then the device says nothing more. An async round's
// announcement does not stop work on an earlier round.
func TestHoldAndJoin(t *testing.T) {
	f := newFixture(t)
	works := make(chan *pb.RoundPlan, 4)
	release := make(chan struct{})
	f.setAnswer(f.trainPlan(1, pb.AsyncStage_ASYNC_STAGE_TRAIN))
	f.start(func(ctx context.Context, r *devproto.Round) error {
		works <- r.Plan
		if r.Plan.GetAsyncStage() == pb.AsyncStage_ASYNC_STAGE_TRAIN {
			select {
			case <-release:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			r.Hold()
		}
		return nil
	}, "t-1")
	if ci := f.checkIn(); ci.Ready != nil {
		t.Fatalf("first check-in says it holds %v", ci.Ready)
	}
	recv(t, works, "the training plan")
	f.setAnswer(retryAfter(time.Second))
	b, _ := proto.Marshal(&pb.RoundAnnouncement{TaskId: "t-1", Round: 2, Async: true})
	if err := f.srv.Publish(wire.SubjectAnnounce, b); err != nil {
		t.Fatal(err)
	}
	f.srv.Flush()
	close(release) // had the announcement superseded the work, Hold never ran
	if ci := f.checkIn(); ci.GetReady().GetRound() != 1 || ci.GetReady().GetTaskId() != "t-1" {
		t.Fatalf("check-in after holding: %v", ci.GetReady())
	}
	group := f.trainPlan(1, pb.AsyncStage_ASYNC_STAGE_AGGREGATE)
	group.GetPlan().TrainedRound = 1
	f.setAnswer(group)
	// The retry's second, or less if the announcement woke the device
	// only now.
	for giveUp := time.After(bound); ; {
		changed := f.clk.Changed()
		if o := f.offsets(); len(o) == 1 && o[0] <= time.Second {
			break
		}
		select {
		case <-changed:
		case <-giveUp:
			t.Fatalf("pending timers at %v", f.offsets())
		}
	}
	f.clk.Advance(time.Second)
	if ci := f.checkIn(); ci.GetReady().GetRound() != 1 {
		t.Fatalf("check-in after a retry: %v", ci.GetReady())
	}
	if p := recv(t, works, "the group plan"); p.GetAsyncStage() != pb.AsyncStage_ASYNC_STAGE_AGGREGATE {
		t.Fatalf("second work: %v", p)
	}
	f.setAnswer(retryAfter(time.Second))
	f.clk.Advance(round.MaxIdleWait + time.Second)
	if ci := f.checkIn(); ci.Ready != nil {
		t.Fatalf("check-in after the group's plan says it holds %v", ci.Ready)
	}
}

// trainPlan is an async plan of t-1's round at stage.
func (f *fixture) trainPlan(round uint64, stage pb.AsyncStage) *pb.CheckInResponse {
	a := f.plan("t-1", round, time.Hour)
	a.GetPlan().AsyncStage = stage
	return a
}
