// Package loadgen simulates a fleet of Fleetlearn devices for benchmarks. Each
// simulated device speaks the real device protocol over NATS with the edge
// agent's timing (retry windows from the server, wake-up on round
// announcements after a random delay): it checks in, and when selected it
// fetches the round's model from the blob store and publishes an update report
// to JetStream under its message id. It runs no module: every report carries
// the same precomputed dense update, so what a benchmark measures is the
// server, the transport and aggregation rather than training.
package loadgen

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/objfetch"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// AgentVersion is what simulated devices report in check-ins.
const AgentVersion = "fleetlearn-loadgen/1"

// Config describes a simulated fleet.
type Config struct {
	NATSURL string
	// NATSOptions authenticate the load generator's connections (with NATS
	// authorization on, a user allowed to act for every simulated device).
	NATSOptions []nats.Option
	// Keys are the simulated devices' enrolled keys by device id; each
	// report is signed with its device's key as an agent's is. Devices
	// without one send unsigned reports.
	Keys    map[string]ed25519.PrivateKey
	Devices int
	// Conns is how many NATS connections the devices share, round-robin; 0
	// gives every device its own, as separate agents have.
	Conns int
	// Layout and Delta are the update every device reports: the model's
	// tensor layout, and as many values as it holds, in its order.
	Layout []*pb.TensorSpec
	Delta  []float32
	// Examples is each device's example count and report weight (default 1).
	Examples uint64
	// FetchModel makes a selected device download the round's model blob by
	// its sha256, once per model version, as an agent does. The bytes are not
	// decoded: that is device work, not the system's.
	FetchModel bool
	// IDPrefix starts every device id (default "sim-"); ids are the prefix and
	// a zero-padded index.
	IDPrefix string
}

// Option injects a collaborator.
type Option func(*options)

type options struct {
	log  *slog.Logger
	now  func() time.Time
	rand *rand.Rand
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock sets the clock the round traces are stamped with (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithRand sets the randomness behind wake-up and back-off jitter.
func WithRand(r *rand.Rand) Option { return func(o *options) { o.rand = r } }

// Stats count what the fleet has done.
type Stats struct {
	CheckIns int64 // check-ins answered
	Plans    int64 // check-ins answered with a round plan
	Fetches  int64 // model blobs downloaded
	Reports  int64 // reports stored by JetStream
	Accepted int64 // receipts accepting a report
	Refused  int64 // receipts refusing one
	Failures int64 // rounds a device gave up on
	// Disconnects counts connections the server dropped (a slow consumer, say);
	// they reconnect on their own.
	Disconnects int64
}

// RoundTrace times one round as the devices saw it.
type RoundTrace struct {
	Plans, Reports      int
	FirstPlan, LastPlan time.Time // plans received
	LastReport          time.Time // last report stored by JetStream
}

type roundKey struct {
	task  string
	round uint64
}

// Fleet is a running set of simulated devices.
type Fleet struct {
	cfg    Config
	o      options
	values []byte // encoded Delta, shared by every report
	sha    string

	conns  []*nats.Conn
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   sync.Once

	randMu sync.Mutex // guards o.rand

	checkIns, plans, fetches, reports, accepted, refused, failures, disconnects atomic.Int64

	traceMu sync.Mutex
	traces  map[roundKey]*RoundTrace
	lastErr atomic.Value // string: the latest device failure
}

type device struct {
	f       *Fleet
	id      string
	nc      *nats.Conn
	js      jetstream.JetStream
	bucket  *objfetch.Bucket
	checkIn []byte             // the device's CheckIn, constant
	wake    chan time.Duration // check-in spread of an announcement
	model   string             // sha256 of the model fetched last

	mu        sync.Mutex
	reported  map[string]uint64 // task → last round reported
	curTask   string            // the round being worked on, if any
	curRound  uint64
	curCancel func()
}

// Start connects the fleet and sets every device checking in until Stop.
func Start(cfg Config, opts ...Option) (*Fleet, error) {
	o := options{log: slog.New(slog.DiscardHandler), now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.rand == nil {
		o.rand = rand.New(rand.NewPCG(1, 2))
	}
	if cfg.Examples == 0 {
		cfg.Examples = 1
	}
	if cfg.IDPrefix == "" {
		cfg.IDPrefix = "sim-"
	}
	if cfg.Conns == 0 {
		cfg.Conns = cfg.Devices
	}
	if err := check(cfg); err != nil {
		return nil, err
	}
	values := wire.EncodeDense(cfg.Delta)
	f := &Fleet{cfg: cfg, o: o, values: values, sha: wire.SHA256(values), traces: map[roundKey]*RoundTrace{}}

	devs := make([]*device, cfg.Devices)
	jss := make([]jetstream.JetStream, cfg.Conns)
	byConn := make([][]*device, cfg.Conns)
	for i := range cfg.Conns {
		nc, err := nats.Connect(cfg.NATSURL, append([]nats.Option{nats.Name("fleetlearn-loadgen/" + strconv.Itoa(i)),
			nats.MaxReconnects(-1), nats.ReconnectWait(500 * time.Millisecond), nats.Timeout(10 * time.Second),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					f.disconnects.Add(1)
					o.log.Warn("disconnected", "err", err)
				}
			}),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { o.log.Warn("nats", "err", err) })},
			cfg.NATSOptions...)...)
		if err != nil {
			f.closeConns()
			return nil, fmt.Errorf("loadgen: connect: %w", err)
		}
		f.conns = append(f.conns, nc)
		if jss[i], err = jetstream.New(nc); err != nil {
			f.closeConns()
			return nil, fmt.Errorf("loadgen: jetstream: %w", err)
		}
	}
	ids := cfg.DeviceIDs()
	for i := range devs {
		c := i % cfg.Conns
		d := &device{f: f, id: ids[i], nc: f.conns[c], js: jss[c],
			wake: make(chan time.Duration, 1), reported: map[string]uint64{}}
		d.checkIn, _ = proto.Marshal(&pb.CheckIn{DeviceId: d.id, Attributes: &pb.DeviceAttributes{
			ExamplesAvailable: cfg.Examples, Charging: true, Idle: true, Unmetered: true,
			AgentVersion: AgentVersion, SupportedAbiVersions: []uint32{wasm.ABIVersion}}})
		if _, err := d.nc.Subscribe(wire.ReceiptSubject(d.id), f.onReceipt); err != nil {
			f.closeConns()
			return nil, fmt.Errorf("loadgen: subscribe: %w", err)
		}
		devs[i] = d
		byConn[c] = append(byConn[c], d)
	}
	// One announcement subscription per connection, fanned out to its devices.
	for c, nc := range f.conns {
		ds := byConn[c]
		if _, err := nc.Subscribe(wire.SubjectAnnounce, func(m *nats.Msg) {
			var ann pb.RoundAnnouncement
			if proto.Unmarshal(m.Data, &ann) != nil {
				return
			}
			spread := ann.GetCheckInSpread().AsDuration()
			if spread <= 0 || spread > time.Minute {
				spread = time.Second
			}
			for _, d := range ds {
				d.supersede(ann.TaskId, ann.Round)
				select {
				case d.wake <- spread:
				default:
				}
			}
		}); err != nil {
			f.closeConns()
			return nil, fmt.Errorf("loadgen: subscribe: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for _, d := range devs {
		f.wg.Add(1)
		go func() { defer f.wg.Done(); d.run(ctx) }()
	}
	return f, nil
}

func check(cfg Config) error {
	switch {
	case cfg.NATSURL == "":
		return fmt.Errorf("%w: NATSURL is required", ErrConfig)
	case cfg.Devices < 1:
		return fmt.Errorf("%w: %d devices", ErrConfig, cfg.Devices)
	case cfg.Conns < 1 || cfg.Conns > cfg.Devices:
		return fmt.Errorf("%w: %d connections for %d devices", ErrConfig, cfg.Conns, cfg.Devices)
	case len(cfg.Delta) == 0:
		return fmt.Errorf("%w: empty update", ErrConfig)
	}
	if len(cfg.Layout) == 0 || layoutSize(cfg.Layout, len(cfg.Delta)) != len(cfg.Delta) {
		return fmt.Errorf("%w: layout of %d tensors does not hold %d values", ErrConfig, len(cfg.Layout), len(cfg.Delta))
	}
	if err := wire.CheckToken("device", fmt.Sprintf("%s%d", cfg.IDPrefix, cfg.Devices-1)); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// layoutSize counts the values a layout holds, or returns -1 once the count
// passes limit (so that absurd shapes cannot overflow).
func layoutSize(layout []*pb.TensorSpec, limit int) int {
	total := 0
	for _, t := range layout {
		size := 1
		for _, d := range t.GetShape() {
			if d > uint64(limit) || (d > 0 && size > limit/int(d)) {
				return -1
			}
			size *= int(d)
		}
		if total += size; total > limit {
			return -1
		}
	}
	return total
}

// Stop ends every device and closes the connections. Safe to call twice.
func (f *Fleet) Stop() {
	f.stop.Do(func() {
		f.cancel()
		f.wg.Wait()
		f.closeConns()
	})
}

func (f *Fleet) closeConns() {
	for _, nc := range f.conns {
		nc.Close()
	}
}

// Stats returns the fleet's counters.
func (f *Fleet) Stats() Stats {
	return Stats{CheckIns: f.checkIns.Load(), Plans: f.plans.Load(), Fetches: f.fetches.Load(),
		Reports: f.reports.Load(), Accepted: f.accepted.Load(), Refused: f.refused.Load(), Failures: f.failures.Load(),
		Disconnects: f.disconnects.Load()}
}

// LastFailure describes the latest round a device gave up on, or a refusal.
func (f *Fleet) LastFailure() string {
	s, _ := f.lastErr.Load().(string)
	return s
}

// Trace returns what the devices saw of a round.
func (f *Fleet) Trace(task string, round uint64) (RoundTrace, bool) {
	f.traceMu.Lock()
	defer f.traceMu.Unlock()
	t, ok := f.traces[roundKey{task, round}]
	if !ok {
		return RoundTrace{}, false
	}
	return *t, true
}

func (f *Fleet) note(task string, round uint64, plan bool) {
	now := f.o.now()
	f.traceMu.Lock()
	defer f.traceMu.Unlock()
	k := roundKey{task, round}
	t := f.traces[k]
	if t == nil {
		t = &RoundTrace{FirstPlan: now}
		f.traces[k] = t
	}
	if plan {
		t.Plans++
		t.LastPlan = now
	} else {
		t.Reports++
		t.LastReport = now
	}
}

func (f *Fleet) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	f.randMu.Lock()
	defer f.randMu.Unlock()
	return time.Duration(f.o.rand.Int64N(int64(d)))
}

func (f *Fleet) onReceipt(m *nats.Msg) {
	var r pb.ReportReceipt
	if proto.Unmarshal(m.Data, &r) != nil {
		return
	}
	if r.Accepted {
		f.accepted.Add(1)
		return
	}
	f.refused.Add(1)
	f.lastErr.Store(fmt.Sprintf("report of %s for %s/%d refused: %s", r.DeviceId, r.TaskId, r.Round, r.Reason))
}

// run mirrors the edge agent's loop: check in, take part when selected, and
// otherwise wait as told, waking early (after a random delay of up to a
// second) when a round is announced.
func (d *device) run(ctx context.Context) {
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		wait, err := d.cycle(ctx)
		if err != nil && ctx.Err() == nil {
			d.f.o.log.Debug("check-in cycle failed", "device", d.id, "err", err)
			wait = backoff + d.f.jitter(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			backoff = 250 * time.Millisecond
		}
		if wait <= 0 {
			continue
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-timer.C:
		case spread := <-d.wake:
			timer.Stop()
			select {
			case <-ctx.Done():
			case <-time.After(d.f.jitter(min(wait, spread))):
			}
		}
		timer.Stop()
	}
}

func (d *device) cycle(ctx context.Context) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	msg, err := d.nc.RequestWithContext(rctx, wire.CheckInSubject(d.id), d.checkIn)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("check-in: %w", err)
	}
	d.f.checkIns.Add(1)
	var resp pb.CheckInResponse
	if err := proto.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("check-in response: %w", err)
	}
	if r := resp.GetRetryAfter(); r != nil {
		return min(max(r.GetDuration().AsDuration(), 50*time.Millisecond), 10*time.Minute), nil
	}
	plan := resp.GetPlan()
	if plan == nil {
		return 0, errors.New("check-in response has neither plan nor retry")
	}
	d.f.plans.Add(1)
	// Like an agent, take a plan for a round already reported (the server
	// has not counted the report yet) as a reason to wait.
	d.mu.Lock()
	done := d.reported[plan.TaskId] >= plan.Round
	d.mu.Unlock()
	if done {
		return 250*time.Millisecond + d.f.jitter(250*time.Millisecond), nil
	}
	if err := d.participate(ctx, plan); err != nil {
		if errors.Is(err, errSuperseded) {
			return 0, nil
		}
		if ctx.Err() == nil {
			d.f.failures.Add(1)
			d.f.lastErr.Store(fmt.Sprintf("device %s, round %s/%d: %v", d.id, plan.TaskId, plan.Round, err))
		}
		return time.Second, nil
	}
	// Like an agent, sleep until the next round's announcement.
	return min(max(time.Until(plan.GetReportDeadline().AsTime()), time.Second), 30*time.Second) + d.f.jitter(time.Second), nil
}

// errSuperseded marks work cancelled because a later round was announced.
var errSuperseded = errors.New("loadgen: round closed before the report")

// supersede cancels work on an older round of the task, as an agent does: the
// server opens a round only after closing the previous one.
func (d *device) supersede(task string, round uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.curCancel != nil && d.curTask == task && d.curRound < round {
		d.curCancel()
		d.curCancel = nil
	}
}

// sign signs a report statement with the device's key, if it has one.
func (d *device) sign(s identity.ReportStatement) ([]byte, error) {
	key, ok := d.f.cfg.Keys[d.id]
	if !ok {
		return nil, nil
	}
	return identity.SignReport(key, s)
}

func (d *device) participate(ctx context.Context, plan *pb.RoundPlan) (err error) {
	deadline := plan.GetReportDeadline().AsTime()
	if !d.f.o.now().Before(deadline) {
		return fmt.Errorf("report deadline %v already passed", deadline)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	reportCtx := ctx // a report in flight is not cancelled by a later round
	ctx, supersede := context.WithCancelCause(ctx)
	d.mu.Lock()
	d.curTask, d.curRound = plan.TaskId, plan.Round
	d.curCancel = func() { supersede(errSuperseded) }
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.curCancel = nil
		d.mu.Unlock()
		if err != nil && errors.Is(context.Cause(ctx), errSuperseded) {
			err = errSuperseded
		}
		supersede(nil)
	}()
	d.f.note(plan.TaskId, plan.Round, true)
	if sha := plan.GetModel().GetSha256(); d.f.cfg.FetchModel && sha != d.model {
		if err := d.fetch(ctx, sha, plan.GetModel().GetSizeBytes()); err != nil {
			return err
		}
		d.model = sha
	}
	var (
		payload    []byte
		subj, kind string
	)
	switch plan.Kind {
	case pb.RoundKind_ROUND_KIND_TRAIN:
		rep := &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id,
			ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
			NumExamples: d.f.cfg.Examples, Metrics: &pb.Metrics{},
			Payload:       &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: d.f.values, Layout: d.f.cfg.Layout}},
			PayloadSha256: d.f.sha}
		if rep.Signature, err = d.sign(identity.UpdateStatement(rep)); err != nil {
			return err
		}
		payload, err = proto.Marshal(rep)
		subj, kind = wire.ReportSubject(plan.TaskId, plan.Round, d.id), "update"
	case pb.RoundKind_ROUND_KIND_EVALUATE:
		rep := &pb.EvaluationReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id,
			ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
			NumExamples: d.f.cfg.Examples, Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0}}}
		if rep.Signature, err = d.sign(identity.EvalStatement(rep)); err != nil {
			return err
		}
		payload, err = proto.Marshal(rep)
		subj, kind = wire.EvalSubject(plan.TaskId, plan.Round, d.id), "evaluation"
	default:
		return fmt.Errorf("unknown round kind %v", plan.Kind)
	}
	if err != nil {
		return err
	}
	if err := d.publish(reportCtx, subj, payload, wire.MsgID(kind, plan.TaskId, plan.Round, d.id)); err != nil {
		return err
	}
	d.mu.Lock()
	d.reported[plan.TaskId] = plan.Round
	d.mu.Unlock()
	d.f.reports.Add(1)
	d.f.note(plan.TaskId, plan.Round, false)
	return nil
}

func (d *device) fetch(ctx context.Context, sha string, size uint64) error {
	if d.bucket == nil {
		bk, err := objfetch.Open(ctx, d.js, wire.BlobBucket)
		if err != nil {
			return err
		}
		d.bucket = bk
	}
	b, err := d.bucket.Get(ctx, sha, max(size, 1<<30))
	if err != nil {
		return fmt.Errorf("fetch model %s: %w", sha, err)
	}
	if size != 0 && uint64(len(b)) != size {
		return fmt.Errorf("fetch model %s: %d bytes, plan says %d", sha, len(b), size)
	}
	d.f.fetches.Add(1)
	return nil
}

// publish stores a report, retrying like an agent until the round's deadline.
func (d *device) publish(ctx context.Context, subj string, payload []byte, id string) error {
	backoff := 100 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := d.js.Publish(pctx, subj, payload, jetstream.WithMsgID(id))
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, nats.ErrMaxPayload) || strings.Contains(err.Error(), "message size exceeds") {
			return fmt.Errorf("report of %d bytes is too large: %w", len(payload), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish report: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(backoff + d.f.jitter(backoff)):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// DeviceIDs are the ids of the simulated devices: the prefix (default
// "sim-") and a zero-padded number.
func (c Config) DeviceIDs() []string {
	prefix := c.IDPrefix
	if prefix == "" {
		prefix = "sim-"
	}
	width := len(strconv.Itoa(c.Devices - 1))
	out := make([]string, c.Devices)
	for i := range out {
		out[i] = fmt.Sprintf("%s%0*d", prefix, width, i)
	}
	return out
}
