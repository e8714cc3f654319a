// Package coord runs federated rounds: it answers device check-ins with round
// plans or paced retry windows, consumes reports from JetStream, validates and
// aggregates them, and commits model versions. State lives in SQLite and the
// reports stream, so a restarted coordinator resumes an open round where it was:
// the round's cohort is in the database and its reports are replayed from the
// stream. docs/PROTOCOL.md describes the protocol.
//
// The files follow a round's stages: checkin.go (selection), plan.go (what a
// round asks of devices), round.go (the plaintext round loop), validate.go
// (report checks), secure.go (SecAgg+ stages), dp.go (privacy), commit.go
// (one aggregation result, noised once, checked, audited and committed),
// failure.go (devices' failure reports) and pause.go (tasks the fleet cannot
// serve). Every deadline runs on Deps.Clock.
package coord

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/memlimit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/blobs"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// Deps are the coordinator's collaborators, all injected.
type Deps struct {
	Store   *store.Store
	NC      *nats.Conn
	JS      jetstream.JetStream
	Stream  jetstream.Stream
	Blobs   *blobs.Store
	Sandbox *wasm.Sandbox // server-side evaluation
	Metrics *metrics.M
	Log     *slog.Logger
	// Clock decides every deadline and stamps every time (default: the
	// system clock).
	Clock clock.Clock
	Rand  *rand.Rand // guarded by the coordinator's mutex
	// PaceWindow spreads the check-ins of devices that were not selected:
	// each retries after the current round is expected to end plus a uniform
	// delay in [0, PaceWindow). It also caps the spread a round's
	// announcement gives the devices it wakes (see CheckInRate).
	PaceWindow time.Duration
	// CheckInRate is the rate, in check-ins per second, at which a round's
	// announcement spreads the check-ins of the devices it wakes: the
	// announced spread is the devices seen within SeenWindow divided by
	// it, at least MinCheckInSpread and at most PaceWindow (default
	// DefaultCheckInRate).
	CheckInRate float64
	// Audit records events in the audit log, all of one call in one batch
	// (all or none); nil records nothing.
	Audit func(ctx context.Context, actor audit.Actor, ps ...audit.Payload) error
	// Audited reports whether the audit log holds a round's close. A
	// restarted coordinator that finds a close prepared but not committed
	// asks it whether the close was recorded (then it commits it) or not
	// (then it replays the round). nil answers "not recorded".
	Audited func(ctx context.Context, task string, round uint64) (bool, error)
	// DeviceKey returns an enrolled device's public key, or an error for a
	// device that is not enrolled or was revoked. With it, reports and SecAgg
	// keys of enrolled devices must be signed by their key; nil skips the
	// checks.
	DeviceKey func(ctx context.Context, device string) (ed25519.PublicKey, error)
	// RequireEnrollment refuses devices DeviceKey does not vouch for: they are
	// not selected and their reports are refused.
	RequireEnrollment bool
	// Memory is told the bytes of each task's model, optimizer state and
	// round sum (memlimit), so that the garbage the server lets grow before
	// it collects stays a fixed headroom however large the model; nil
	// leaves the runtime's limit alone.
	Memory *memlimit.Limit
	// Tracer records each round as a trace (tracing.go); nil records nothing.
	Tracer trace.TracerProvider
	// SecretReader supplies a task's secret for correlated DP noise when it
	// has none yet (default crypto/rand; tests fix it to compare runs).
	SecretReader io.Reader
	// Pseudonym names a device as the audit log does (its pseudonym); nil
	// leaves devices out of the audit events that would list them.
	Pseudonym func(device string) (string, error)
	// ShardAggregation hands the update reports of plaintext training
	// rounds to the aggregation workers' queue group (shard.go, and
	// StartShardWorkers); without a worker the leader reads them itself.
	ShardAggregation bool
}

// auditActor is who the coordinator's audit events name.
var auditActor = audit.Service("coordinator")

// record appends events to the audit log in one batch. The failure is
// logged (by the recorder) and counted; callers whose state change must not
// happen unaudited act on the error (see commit.go).
func (c *Coordinator) record(ps ...audit.Payload) error {
	if c.d.Audit == nil || len(ps) == 0 {
		return nil
	}
	if err := c.d.Audit(c.ctx, auditActor, ps...); err != nil {
		c.d.Metrics.AuditFailures.Inc()
		return err
	}
	return nil
}

// now is the coordinator's time.
func (c *Coordinator) now() time.Time { return c.d.Clock.Now() }

// Coordinator runs every running task's rounds.
type Coordinator struct {
	d      Deps
	tracer trace.Tracer

	mu       sync.Mutex
	tasks    map[string]*taskRun
	watchers map[string]map[chan *pb.WatchTaskResponse]struct{}
	seen     map[string]time.Time // devices recently written to the store
	unseen   map[string]sighting  // sightings the writer has yet to store
	// swept is when seen last lost its devices older than SeenWindow;
	// stored counts the devices the store had seen within SeenWindow when
	// the coordinator started (-1: unknown), which a restarted coordinator
	// has yet to hear from (see announceSpread).
	swept    time.Time
	stored   int
	started  time.Time
	seenKick chan struct{}
	checkins chan *nats.Msg
	subs     []*nats.Subscription
	wg       sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc
}

// New returns a coordinator; Start begins serving.
func New(d Deps) *Coordinator {
	if d.PaceWindow <= 0 {
		d.PaceWindow = 2 * time.Second
	}
	if !(d.CheckInRate > 0) {
		d.CheckInRate = DefaultCheckInRate
	}
	d.Clock = clock.Or(d.Clock)
	c := &Coordinator{d: d, tracer: newTracer(d.Tracer), tasks: map[string]*taskRun{}, watchers: map[string]map[chan *pb.WatchTaskResponse]struct{}{},
		seen: map[string]time.Time{}, unseen: map[string]sighting{}, seenKick: make(chan struct{}, 1),
		checkins: make(chan *nats.Msg, checkInQueue)}
	d.Metrics.SetFleet(c.fleetCounts)
	d.Metrics.SetTasks(c.taskCounts)
	return c
}

// Start subscribes to check-ins and stray reports and resumes running tasks.
func (c *Coordinator) Start(ctx context.Context) error {
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c.started, c.stored = c.now(), -1
	if _, seen, err := c.d.Store.FleetSize(ctx, c.started.Add(-SeenWindow), false); err != nil {
		c.d.Log.Warn("counting the devices seen lately; announcements spread check-ins over the pace window for now", "err", err)
	} else {
		c.stored = seen
	}
	c.wg.Add(1 + checkInWorkers)
	go c.writeSeen()
	for range checkInWorkers {
		go c.serveCheckIns()
	}
	sub, err := c.d.NC.QueueSubscribe(wire.SubjectCheckIns, wire.QueueServers, c.handleCheckIn)
	if err != nil {
		return fmt.Errorf("coord: subscribe check-ins: %w", err)
	}
	c.subs = append(c.subs, sub)
	up, err := c.d.NC.QueueSubscribe(wire.SubjectSecAggUp, wire.QueueServers, c.handleSecAggUp)
	if err != nil {
		return fmt.Errorf("coord: subscribe %s: %w", wire.SubjectSecAggUp, err)
	}
	c.subs = append(c.subs, up)
	failures, err := c.d.NC.QueueSubscribe(wire.SubjectFailures, wire.QueueServers, c.handleFailure)
	if err != nil {
		return fmt.Errorf("coord: subscribe %s: %w", wire.SubjectFailures, err)
	}
	c.subs = append(c.subs, failures)
	stored, err := c.d.NC.Subscribe(wire.SubjectStored, c.handleStored)
	if err != nil {
		return fmt.Errorf("coord: subscribe %s: %w", wire.SubjectStored, err)
	}
	c.subs = append(c.subs, stored)
	rows, err := c.d.Store.Tasks(ctx, pb.TaskState_TASK_STATE_RUNNING, "", 1<<20)
	if err != nil {
		return err
	}
	for _, r := range rows {
		c.StartTask(r.Spec.Id)
	}
	return nil
}

// Shutdown stops all task runners (open rounds stay open in the store, to be
// resumed) and waits for them. Safe to call twice.
func (c *Coordinator) Shutdown() {
	if c.cancel == nil {
		return
	}
	for _, s := range c.subs {
		s.Unsubscribe()
	}
	c.cancel()
	c.wg.Wait()
}

// StartTask begins running a task's rounds if it is not running already.
func (c *Coordinator) StartTask(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.tasks[id]; ok || c.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	tr := &taskRun{c: c, id: id, cancel: cancel, exited: make(chan struct{})}
	c.tasks[id] = tr
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(tr.exited)
		tr.run(ctx)
		// In one step with the delete: once the task has no runner, the
		// watchers of this one are closed, and a watch that begins later
		// (of a resumed task's new runner) is not.
		c.mu.Lock()
		delete(c.tasks, id)
		if !tr.stopping { // StopTask closes them after its own event
			c.closeWatchersLocked(id)
		}
		c.mu.Unlock()
	}()
}

// StopTask stops a task's runner and abandons its open round, if any: the
// round is closed with its cohort size, its reports are dropped from the
// stream, and watchers get an ABANDONED event before their stream ends. The
// caller has already marked the task stopped in the store.
func (c *Coordinator) StopTask(ctx context.Context, id, reason string) error {
	c.mu.Lock()
	tr := c.tasks[id]
	if tr != nil {
		tr.stopping = true
	}
	c.mu.Unlock()
	if tr != nil {
		tr.cancel()
		<-tr.exited
	}
	defer c.closeWatchers(id)
	task, err := c.d.Store.Task(ctx, id)
	if err != nil || task.CurrentRound == 0 {
		return err
	}
	row, err := c.d.Store.Round(ctx, id, task.CurrentRound)
	if err != nil || row.State != pb.RoundState_ROUND_STATE_OPEN {
		return err
	}
	assigned, err := c.d.Store.Assignments(ctx, id, row.Round)
	if err != nil {
		return err
	}
	row.State, row.Close, row.Reason = pb.RoundState_ROUND_STATE_ABANDONED, c.now(), reason
	row.Assigned, row.Dropped = uint32(len(assigned)), uint32(len(assigned))
	// Audited first: a round the log does not show closed must not be closed.
	if err := c.record(audit.RoundClosed{Task: id, Round: row.Round, Outcome: audit.RoundAbandoned, Dropouts: uint64(row.Dropped),
		AggregationRule: task.Spec.GetAggregation().GetRule().String(), Reason: reason}); err != nil {
		return fmt.Errorf("coord: stop task %s: audit: %w", id, err)
	}
	if err := c.d.Store.CloseRound(ctx, row, nil, nil, c.now()); err != nil {
		return err
	}
	c.purgeRound(id, row.Round)
	if task.Spec.GetAsync() != nil {
		// Reports of earlier rounds' plans wait for buffers no more.
		c.purgeTask(id)
	}
	c.emit(&pb.RoundEvent{TaskId: id, Round: row.Round, Type: pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED, Kind: row.Kind,
		Time: timestamppb.New(row.Close), Assigned: row.Assigned, Dropped: row.Dropped, Reason: reason})
	return nil
}

// purgeRound drops a settled round's reports from the stream.
func (c *Coordinator) purgeRound(task string, round uint64) {
	c.purgeFilters(task, round, append(wire.RoundFilters(task, round), wire.ChunkFilter(task, round))...)
}

// purgeTask drops every report and chunk of every round of task from the
// stream: an async task's, once it stopped or completed.
func (c *Coordinator) purgeTask(task string) {
	c.purgeFilters(task, 0, wire.TaskReportFilter(task), wire.TaskChunkFilter(task))
}

// purgeFilters drops the messages on filters, for task's round.
func (c *Coordinator) purgeFilters(task string, round uint64, filters ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, f := range filters {
		if err := c.d.Stream.Purge(ctx, jetstream.WithPurgeSubject(f)); err != nil {
			c.d.Log.Warn("purging round reports", "task", task, "round", round, "err", err)
		}
	}
}

// Watch returns a channel of the task's round events (and of the task when
// it pauses) and a function that ends the subscription. The channel closes
// when the task's runner stops: the task ended or paused.
func (c *Coordinator) Watch(id string) (<-chan *pb.WatchTaskResponse, func()) {
	ch := make(chan *pb.WatchTaskResponse, 64)
	c.mu.Lock()
	if c.watchers[id] == nil {
		c.watchers[id] = map[chan *pb.WatchTaskResponse]struct{}{}
	}
	c.watchers[id][ch] = struct{}{}
	c.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			c.mu.Lock()
			if _, ok := c.watchers[id][ch]; ok {
				delete(c.watchers[id], ch)
				close(ch)
			}
			c.mu.Unlock()
		})
	}
}

// Running reports whether a task has a runner.
func (c *Coordinator) Running(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.tasks[id]
	return ok
}

func (c *Coordinator) closeWatchers(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeWatchersLocked(id)
}

func (c *Coordinator) closeWatchersLocked(id string) {
	for ch := range c.watchers[id] {
		close(ch)
	}
	delete(c.watchers, id)
}

// emit delivers an event to watchers (dropping it for a watcher that is not
// keeping up, rather than stalling the round) and publishes it on NATS.
func (c *Coordinator) emit(ev *pb.RoundEvent) {
	c.deliver(ev.TaskId, &pb.WatchTaskResponse{Event: ev})
	if b, err := proto.Marshal(ev); err == nil {
		c.d.NC.Publish(wire.EventsSubject(ev.TaskId), b)
	}
}

// deliver hands a message to the task's watchers, dropping it for a
// watcher that is not keeping up.
func (c *Coordinator) deliver(task string, m *pb.WatchTaskResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ch := range c.watchers[task] {
		select {
		case ch <- m:
		default:
			c.d.Log.Warn("watcher is not keeping up; event dropped", "task", task, "round", m.GetEvent().GetRound())
		}
	}
}

func (c *Coordinator) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Duration(c.d.Rand.Int64N(int64(d)))
}

func (c *Coordinator) seed() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.d.Rand.Uint64()
}

// receipt tells a device what became of its report.
func (c *Coordinator) receipt(task string, round uint64, device string, reason string) {
	if wire.CheckToken("device", device) != nil {
		return
	}
	b, err := proto.Marshal(&pb.ReportReceipt{TaskId: task, Round: round, DeviceId: device, Accepted: reason == "", Reason: reason})
	if err == nil {
		c.d.NC.Publish(wire.ReceiptSubject(device), b)
	}
}

// handleStored sees a headers-only notice for every report the stream stores
// and refuses those for rounds that are not open: the open round's runner
// consumes its own reports from the stream and ignores this path.
//
// The stored subject is the notice's own, which nats-server sets: a
// Nats-Subject header may have come from the publisher.
func (c *Coordinator) handleStored(m *nats.Msg) {
	subj := strings.TrimPrefix(m.Subject, wire.SubjectStoredPrefix)
	if wire.IsChunkSubject(subj) {
		c.handleStoredChunk(subj, m.Header)
		return
	}
	task, round, device, err := wire.ParseReportSubject(subj)
	if err != nil {
		c.d.Log.Warn("report on a malformed subject", "subject", subj, "err", err)
		c.purgeStored(subj, 0)
		return
	}
	c.mu.Lock()
	tr := c.tasks[task]
	c.mu.Unlock()
	if tr != nil && tr.isOpen(round) {
		c.charge(tr, subj, round, device, m.Header)
		return
	}
	// The notice of a report the round's runner took and answered may
	// come after the round closed: the device has its receipt already,
	// and a second, contradicting one would tell it the report was lost.
	if n, err := parseNotice(subj, m.Header); err == nil && tr != nil && tr.wasAnswered(round, n.seq) {
		c.purgeStored(subj, 0)
		return
	}
	reason := fmt.Sprintf("round %d of task %q is not open", round, task)
	if tr == nil {
		reason = fmt.Sprintf("task %q has no open round (round %d)", task, round)
	}
	kind := "update"
	if wire.IsEvalSubject(subj) {
		kind = "evaluation"
	}
	c.d.Metrics.Reports.WithLabelValues(kind, "not_open").Inc()
	c.d.Metrics.Refused(metrics.RefusedNotOpen)
	c.d.Log.Info("report refused", "task", task, "round", round, "device", device, "reason", reason)
	c.receipt(task, round, device, reason)
	c.purgeStored(subj, 0)
}

var errStopped = errors.New("coord: stopped")
