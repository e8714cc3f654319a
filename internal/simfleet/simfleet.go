// Package simfleet simulates a fleet of Fleetlearn devices for benchmarks
// and demos. Each simulated device runs the edge agent's protocol code
// (internal/devproto) over NATS: it checks in, and when selected it fetches
// the round's model from the blob store and publishes an update report to
// JetStream under its message id. It runs no module: every report carries
// the same precomputed update (float32, or already quantized), so what a
// benchmark measures is the server, the transport and aggregation rather
// than training.
package simfleet

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/internal/objfetch"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// AgentVersion is what simulated devices report in check-ins.
const AgentVersion = "fleetlearn-simfleet/1"

// Config describes a simulated fleet.
type Config struct {
	NATSURL string
	// NATSOptions authenticate the fleet's connections (with NATS
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
	// Uploads is how many further NATS connections carry the devices'
	// reports, shared round-robin; 0 publishes each report on its device's
	// connection. nats.go keeps a connection's write buffer at the size of
	// the largest message it sent, so once every device has reported on
	// its own connection the fleet holds a report-sized buffer per device
	// (4 GB for 10,000 devices of 400 KB reports); with Uploads it holds
	// one per upload connection. Check-ins, downloads and receipts stay on
	// the devices' connections.
	Uploads int
	// Layout and Delta are the update every device reports: the model's
	// tensor layout, and as many values as it holds, in its order. The fleet
	// encodes Delta once and keeps no reference to it.
	Layout []*pb.TensorSpec
	Delta  []float32
	// Encoding is how reports carry the update, as the task's
	// update_encoding asks: unspecified sends Delta as float32 values;
	// UPDATE_ENCODING_INT8 or _INT4 send Quantized instead, the update
	// already in that encoding (aggregator/quant's Encode, as an agent
	// makes it), which every device reports. Delta is then left empty.
	Encoding  pb.UpdateEncoding
	Quantized []byte
	// MaxPublishing bounds how many devices build and publish a training
	// report at the same time (0: no bound). Each one being built holds a
	// marshaled copy of the update, so with large models this bounds the
	// fleet's memory; the others wait their turn after their download.
	MaxPublishing int
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
	log   *slog.Logger
	clock clock.Clock
	rand  *rand.Rand
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock sets the clock that times the devices and stamps the round
// traces (default: the system clock).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

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
	// PeakPublishing is the most devices that were building or publishing
	// a training report at the same time.
	PeakPublishing int64
	// Disconnects counts connections the server dropped (a slow consumer, say);
	// they reconnect on their own.
	Disconnects int64
}

// RoundTrace times one round as the devices saw it.
type RoundTrace struct {
	Plans, Reports      int
	FirstPlan, LastPlan time.Time // plans worked on
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
	jitter func(time.Duration) time.Duration
	values []byte // encoded update (Delta, or Quantized), shared by every report
	sha    string
	// publishing holds a token per device building or publishing a training
	// report, when Config.MaxPublishing bounds them (nil otherwise); buffers
	// keeps the marshaled reports' buffers for reuse.
	publishing           chan struct{}
	buffers              sync.Pool
	inFlight, peakFlight atomic.Int64

	conns  []*nats.Conn // the devices', then the upload connections
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   sync.Once

	checkIns, plans, fetches, reports, accepted, refused, failures, disconnects atomic.Int64

	traceMu sync.Mutex
	traces  map[roundKey]*RoundTrace
	lastErr atomic.Value // string: the latest device failure
}

type device struct {
	f      *Fleet
	id     string
	nc     *nats.Conn
	js     jetstream.JetStream // on nc: downloads; reports go on the one Run was given
	proto  *devproto.Device
	bucket *objfetch.Bucket // touched only by the device's Run goroutine, as is model
	model  string           // sha256 of the model fetched last
}

// Start connects the fleet and sets every device checking in until Stop.
func Start(cfg Config, opts ...Option) (*Fleet, error) {
	o := options{log: slog.New(slog.DiscardHandler), clock: clock.Real()}
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
	values := cfg.Quantized
	if cfg.Encoding == pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
		values = wire.EncodeDense(cfg.Delta)
	}
	cfg.Delta = nil
	f := &Fleet{cfg: cfg, o: o, jitter: backoff.Jitter(o.rand), values: values, sha: wire.SHA256(values),
		traces: map[roundKey]*RoundTrace{}}
	if cfg.MaxPublishing > 0 {
		f.publishing = make(chan struct{}, cfg.MaxPublishing)
	}

	jss := make([]jetstream.JetStream, cfg.Conns+cfg.Uploads)
	for i := range jss {
		name := "fleetlearn-simfleet/" + strconv.Itoa(i)
		if i >= cfg.Conns {
			name = "fleetlearn-simfleet/upload/" + strconv.Itoa(i-cfg.Conns)
		}
		nc, err := nats.Connect(cfg.NATSURL, append([]nats.Option{nats.Name(name),
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
			return nil, fmt.Errorf("simfleet: connect: %w", err)
		}
		f.conns = append(f.conns, nc)
		if jss[i], err = jetstream.New(nc); err != nil {
			f.closeConns()
			return nil, fmt.Errorf("simfleet: jetstream: %w", err)
		}
	}
	ids := cfg.DeviceIDs()
	devs := make([]*device, cfg.Devices)
	byConn := make([][]*devproto.Device, cfg.Conns)
	for i := range devs {
		c := i % cfg.Conns
		d := &device{f: f, id: ids[i], nc: f.conns[c], js: jss[c]}
		var err error
		d.proto, err = devproto.New(devproto.Config{
			CheckIn: &pb.CheckIn{DeviceId: d.id, Attributes: &pb.DeviceAttributes{
				ExamplesAvailable: cfg.Examples, Charging: true, Idle: true, Unmetered: true,
				AgentVersion: AgentVersion, SupportedAbiVersions: wasm.SupportedABIVersions()}},
			Work: d.work, Clock: o.clock, Jitter: f.jitter, Log: o.log,
			Observer: devproto.Observer{CheckedIn: f.onCheckIn, GaveUp: func(plan *pb.RoundPlan, attempts int, err error) {
				f.failures.Add(1)
				f.lastErr.Store(fmt.Sprintf("device %s, round %s/%d, after %d attempts: %v", d.id, plan.TaskId, plan.Round, attempts, err))
			}},
		})
		if err == nil {
			_, err = devproto.SubscribeReceipts(d.nc, d.id, f.onReceipt)
		}
		if err != nil {
			f.closeConns()
			return nil, fmt.Errorf("simfleet: %w", err)
		}
		devs[i] = d
		byConn[c] = append(byConn[c], d.proto)
	}
	// One announcement subscription per connection, fanned out to its devices.
	for c, nc := range f.conns[:cfg.Conns] {
		if _, err := devproto.SubscribeAnnouncements(nc, byConn[c]...); err != nil {
			f.closeConns()
			return nil, fmt.Errorf("simfleet: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for i, d := range devs {
		// Reports go through the JetStream context Run is given.
		up := d.js
		if cfg.Uploads > 0 {
			up = jss[cfg.Conns+i%cfg.Uploads]
		}
		f.wg.Add(1)
		go func() { defer f.wg.Done(); d.proto.Run(ctx, d.nc, up) }()
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
	case cfg.Uploads < 0 || cfg.Uploads > cfg.Devices:
		return fmt.Errorf("%w: %d upload connections for %d devices (0 for none)", ErrConfig, cfg.Uploads, cfg.Devices)
	case cfg.MaxPublishing < 0:
		return fmt.Errorf("%w: MaxPublishing %d (0 for no bound)", ErrConfig, cfg.MaxPublishing)
	}
	switch cfg.Encoding {
	case pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED:
		switch {
		case len(cfg.Delta) == 0:
			return fmt.Errorf("%w: empty update", ErrConfig)
		case len(cfg.Quantized) > 0:
			return fmt.Errorf("%w: a quantized update needs its Encoding (int8 or int4)", ErrConfig)
		}
		if len(cfg.Layout) == 0 || layoutSize(cfg.Layout, len(cfg.Delta)) != len(cfg.Delta) {
			return fmt.Errorf("%w: layout of %d tensors does not hold %d values", ErrConfig, len(cfg.Layout), len(cfg.Delta))
		}
	case pb.UpdateEncoding_UPDATE_ENCODING_INT8, pb.UpdateEncoding_UPDATE_ENCODING_INT4:
		switch {
		case len(cfg.Quantized) == 0:
			return fmt.Errorf("%w: empty update: %v needs the encoded update in Quantized", ErrConfig, cfg.Encoding)
		case len(cfg.Delta) > 0:
			return fmt.Errorf("%w: %v sends Quantized; leave Delta empty", ErrConfig, cfg.Encoding)
		}
		// The encoding's header holds the count, which the server checks
		// against the model; here the layout need only be sane.
		if len(cfg.Layout) == 0 || layoutSize(cfg.Layout, math.MaxInt32) < 1 {
			return fmt.Errorf("%w: layout of %d tensors does not hold 1 to %d values", ErrConfig, len(cfg.Layout), math.MaxInt32)
		}
	default:
		return fmt.Errorf("%w: update encoding %v (want unspecified, int8 or int4)", ErrConfig, cfg.Encoding)
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
		PeakPublishing: f.peakFlight.Load(), Disconnects: f.disconnects.Load()}
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
	now := f.o.clock.Now()
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

func (f *Fleet) onCheckIn(resp *pb.CheckInResponse) {
	f.checkIns.Add(1)
	if resp.GetPlan() != nil {
		f.plans.Add(1)
	}
}

func (f *Fleet) onReceipt(r *pb.ReportReceipt) {
	if r.Accepted {
		f.accepted.Add(1)
		return
	}
	f.refused.Add(1)
	f.lastErr.Store(fmt.Sprintf("report of %s for %s/%d refused: %s", r.DeviceId, r.TaskId, r.Round, wire.FailureReason(r.Reason)))
}

// sign signs a report statement with the device's key, if it has one.
func (d *device) sign(s identity.ReportStatement) ([]byte, error) {
	key, ok := d.f.cfg.Keys[d.id]
	if !ok {
		return nil, nil
	}
	return identity.SignReport(key, s)
}

// work is a simulated device's part in a round: the model download an agent
// would make, then the fleet's precomputed report.
func (d *device) work(ctx context.Context, r *devproto.Round) error {
	plan := r.Plan
	if plan.GetSecagg() != nil {
		return devproto.Permanent(errors.New("simulated devices take no part in secure rounds"))
	}
	d.f.note(plan.TaskId, plan.Round, true)
	if sha := plan.GetModel().GetSha256(); d.f.cfg.FetchModel && sha != d.model {
		if err := d.fetch(ctx, sha, plan.GetModel().GetSizeBytes()); err != nil {
			return err
		}
		d.model = sha
	}
	var (
		payload []byte
		err     error
	)
	switch plan.Kind {
	case pb.RoundKind_ROUND_KIND_TRAIN:
		release, err := d.f.startPublishing(ctx)
		if err != nil {
			return err
		}
		defer release()
		return d.publishUpdate(r)
	case pb.RoundKind_ROUND_KIND_EVALUATE:
		rep := &pb.EvaluationReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id,
			ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
			NumExamples: d.f.cfg.Examples, Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0}}}
		if rep.Signature, err = d.sign(identity.EvalStatement(rep)); err != nil {
			return err
		}
		payload, err = proto.Marshal(rep)
	default:
		return devproto.Permanent(fmt.Errorf("unknown round kind %v", plan.Kind))
	}
	if err != nil {
		return err
	}
	if err := r.Publish(payload); err != nil {
		return err
	}
	d.f.reports.Add(1)
	d.f.note(plan.TaskId, plan.Round, false)
	return nil
}

// startPublishing waits for a turn to build and publish a training report
// under Config.MaxPublishing, and returns the function that ends it.
func (f *Fleet) startPublishing(ctx context.Context) (func(), error) {
	if f.publishing != nil {
		select {
		case f.publishing <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait to publish: %w", context.Cause(ctx))
		}
	}
	n := f.inFlight.Add(1)
	for peak := f.peakFlight.Load(); n > peak && !f.peakFlight.CompareAndSwap(peak, n); peak = f.peakFlight.Load() {
	}
	return func() {
		f.inFlight.Add(-1)
		if f.publishing != nil {
			<-f.publishing
		}
	}, nil
}

// publishUpdate signs, marshals and publishes the fleet's update as d's
// report for r, into a buffer it then returns for the next report.
func (d *device) publishUpdate(r *devproto.Round) error {
	plan := r.Plan
	rep := &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id,
		ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
		NumExamples: d.f.cfg.Examples, Metrics: &pb.Metrics{}, PayloadSha256: d.f.sha}
	if d.f.cfg.Encoding == pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
		rep.Payload = &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: d.f.values, Layout: d.f.cfg.Layout}}
	} else {
		rep.Payload = &pb.UpdateReport_Quantized{Quantized: &pb.QuantizedUpdate{Encoding: d.f.cfg.Encoding,
			Data: d.f.values, Layout: d.f.cfg.Layout}}
	}
	var err error
	if rep.Signature, err = d.sign(identity.UpdateStatement(rep)); err != nil {
		return err
	}
	buf, _ := d.f.buffers.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	defer d.f.buffers.Put(buf)
	if *buf, err = (proto.MarshalOptions{}).MarshalAppend((*buf)[:0], rep); err != nil {
		return err
	}
	if err := r.Publish(*buf); err != nil {
		return err
	}
	d.f.reports.Add(1)
	d.f.note(plan.TaskId, plan.Round, false)
	return nil
}

// fetch downloads the model blob sha as an agent would, a chunk at a time
// without keeping it: only its length is checked.
func (d *device) fetch(ctx context.Context, sha string, size uint64) error {
	if err := wire.CheckSHA256("model", sha); err != nil {
		return devproto.Permanent(fmt.Errorf("plan: %w", err))
	}
	if d.bucket == nil {
		bk, err := objfetch.Open(ctx, d.js, wire.BlobBucket)
		if err != nil {
			return fmt.Errorf("fetch model %s: %w", sha, err)
		}
		d.bucket = bk
	}
	rd, err := d.bucket.Open(ctx, sha, devproto.MaxBlobBytes)
	if err != nil {
		return fmt.Errorf("fetch model %s: %w", sha, err)
	}
	n, err := io.Copy(io.Discard, rd)
	if err != nil {
		return fmt.Errorf("fetch model %s: %w", sha, err)
	}
	if size != 0 && uint64(n) != size {
		return fmt.Errorf("fetch model %s: %d bytes, plan says %d", sha, n, size)
	}
	d.f.fetches.Add(1)
	return nil
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
