// Package edge is Fleetlearn's device agent. It checks in with the aggregator
// over NATS, and when selected for a round it fetches the round's model and
// update module by sha256 (cached on disk and verified), runs the module in the
// WASM sandbox on the device's local dataset under the task's limits, and
// publishes the update through JetStream. It never imports the server: the
// two share only the wire protocol (package proto/wire and the protobuf types).
package edge

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlearn/fleetlearn/model/kernel"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/internal/objfetch"
	"github.com/fleetlearn/fleetlearn/internal/sandboxlimits"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// Version is reported in check-ins.
const Version = "fleetlearn-edge/1"

// Config describes one device.
type Config struct {
	NATSURL    string
	DataDir    string   // cache and identity; created if missing
	DatasetDir string   // local dataset (docs/DATASET.md); not needed with WithDataset
	DeviceID   string   // pseudonymous id; empty means the one stored in DataDir (created on first start)
	TaskIDs    []string // tasks to join; empty means any
	// Attributes the device reports; examples_available is filled in from the dataset.
	DeviceClass string
	Charging    bool
	Idle        bool
	Unmetered   bool
	// Credentials is a NATS creds file; empty uses DataDir's device.creds
	// from enrollment. Without either, New fails with ErrNotEnrolled unless
	// InsecureNATS is set.
	Credentials string
	// InsecureNATS lets an agent without credentials connect anyway, to an
	// aggregator whose NATS runs without authorization
	// (fleetlearn-server --insecure-nats).
	InsecureNATS bool
	// ModulePublishers is a JWKS of trusted module publishers; empty uses
	// DataDir's publishers.jwks from enrollment when there is one. With
	// publishers set the agent runs only modules they signed.
	ModulePublishers []byte
	// WASMEngine is the sandbox's engine (wasm.EngineAuto, EngineCompiler
	// or EngineInterpreter); empty takes the sandbox's default, EngineAuto
	// where wazero compiles. Ignored with WithSandbox.
	WASMEngine string
}

// Option injects collaborators.
type Option func(*options)

type options struct {
	log     *slog.Logger
	sandbox *wasm.Sandbox
	dataset *data.Dataset
	rand    *mrand.Rand
	clock   clock.Clock
	dropout func(task string, round uint64, stage string) bool
	tracer  trace.TracerProvider
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithSandbox shares a sandbox (and its compiled code) between agents in one
// process, as the demo's simulated fleet does. By default each agent owns one.
func WithSandbox(s *wasm.Sandbox) Option { return func(o *options) { o.sandbox = s } }

// WithDataset gives the agent its local data directly instead of reading DatasetDir.
func WithDataset(d *data.Dataset) Option { return func(o *options) { o.dataset = d } }

// WithRand sets the randomness behind wake-up, back-off and retry jitter.
func WithRand(r *mrand.Rand) Option { return func(o *options) { o.rand = r } }

// WithClock sets the clock that times the protocol: waits, deadlines,
// retries (default: the system clock).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

// WithTracerProvider records the agent's part in rounds as OpenTelemetry
// spans, in each round's trace (docs/TRACING.md): "checkin", "training"
// (the module's run) and "upload". By default, or with nil, nothing is
// recorded.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) {
		if tp != nil {
			o.tracer = tp
		}
	}
}

// Stats count what an agent has done: check-ins answered, attempts at a
// round's plan, reports accepted and refused (by receipt), and rounds given
// up on after failed attempts.
type Stats struct {
	CheckIns, Rounds, Reports, Refused, Failures int64
}

// Agent is one device.
type Agent struct {
	cfg        Config
	o          options
	data       *data.Dataset
	own        bool               // the agent created its sandbox and must close it
	identity   ed25519.PrivateKey // key's private key: signs reports and secure aggregation messages
	key        *identity.UserKey
	publishers *identity.TrustedPublishers
	creds      string                            // NATS creds file, or ""
	jitter     func(time.Duration) time.Duration // from o.rand, for every back-off

	mu       sync.Mutex
	modules  map[string]*wasm.Module
	models   map[string]*model.Model
	bucket   *objfetch.Bucket // resolved once per connection
	bucketJS jetstream.JetStream

	// Buffers reused round after round, touched only by the goroutine running
	// the protocol (rounds are served one at a time): the update, its encoding and
	// the report. Fresh ones each round made every device allocate, fault in
	// and collect three model-sized buffers per round.
	scratch struct {
		delta   []float32
		values  []byte
		payload []byte
	}
	// held is the update of a secure async task's training plan, kept
	// until its buffer's group masks it (async.go); the protocol
	// goroutine's alone, like scratch.
	held *heldUpdate

	// feedbacks holds the error feedback of quantized updates, by task
	// (feedback.go); under mu.
	feedbacks    map[string]*feedbackState
	feedbackUses uint64

	checkIns, rounds, reports, refused, failures atomic.Int64
	lastReason                                   atomic.Value // string: last refusal reason
	conn                                         atomic.Pointer[nats.Conn]
}

// New prepares an agent: reads its identity and dataset. Run connects. An
// agent that is not enrolled is refused with ErrNotEnrolled before anything
// is written to its data directory.
func New(cfg Config, opts ...Option) (*Agent, error) {
	o := options{log: slog.New(slog.DiscardHandler), clock: clock.Real()}
	for _, opt := range opts {
		opt(&o)
	}
	o.tracer = tracing.Or(o.tracer)
	if o.rand == nil {
		var seed [32]byte
		rand.Read(seed[:])
		o.rand = mrand.New(mrand.NewChaCha8(seed))
	}
	if cfg.DataDir == "" {
		return nil, errors.New("edge: DataDir is required")
	}
	creds, err := credsFile(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "blobs"), 0o700); err != nil {
		return nil, fmt.Errorf("edge: data dir: %w", err)
	}
	if cfg.DeviceID == "" {
		id, err := loadOrCreateID(filepath.Join(cfg.DataDir, "device-id"))
		if err != nil {
			return nil, err
		}
		cfg.DeviceID = id
	}
	if err := wire.CheckToken("device", cfg.DeviceID); err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	key, err := identity.LoadOrCreateUserKey(filepath.Join(cfg.DataDir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("edge: device key: %w", err)
	}
	jwks := cfg.ModulePublishers
	if len(jwks) == 0 {
		if jwks, err = readOptional(cfg.DataDir, PublishersFile); err != nil {
			return nil, fmt.Errorf("edge: module publishers: %w", err)
		}
	}
	var publishers *identity.TrustedPublishers
	if len(jwks) > 0 {
		if publishers, err = identity.ParseTrustedPublishers(jwks); err != nil {
			return nil, fmt.Errorf("edge: module publishers: %w", err)
		}
	}
	a := &Agent{cfg: cfg, o: o, data: o.dataset, identity: key.PrivateKey(), key: key, publishers: publishers, creds: creds,
		jitter: backoff.Jitter(o.rand), modules: map[string]*wasm.Module{}, models: map[string]*model.Model{}}
	if a.data == nil {
		d, err := data.ReadDir(cfg.DatasetDir)
		if err != nil {
			return nil, fmt.Errorf("edge: dataset: %w", err)
		}
		a.data = d
	}
	if err := a.data.Validate(); err != nil {
		return nil, fmt.Errorf("edge: dataset: %w", err)
	}
	if o.sandbox == nil {
		s, err := wasm.New(wasm.WithCacheDir(filepath.Join(cfg.DataDir, "wasm-cache")), wasm.WithLogger(o.log),
			wasm.WithEngine(cfg.WASMEngine))
		if err != nil {
			return nil, fmt.Errorf("edge: sandbox: %w", err)
		}
		a.o.sandbox, a.own = s, true
	}
	return a, nil
}

// credsFile returns the creds file the agent connects with: the one
// named, else the one enrollment stored, else "" when cfg allows none.
func credsFile(cfg Config) (string, error) {
	if cfg.Credentials != "" {
		if _, err := os.Stat(cfg.Credentials); err != nil {
			return "", fmt.Errorf("edge: credentials: %w", err)
		}
		return cfg.Credentials, nil
	}
	path := filepath.Join(cfg.DataDir, CredsFile)
	switch _, err := os.Stat(path); {
	case err == nil:
		return path, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("edge: credentials: %w", err)
	case cfg.InsecureNATS:
		return "", nil
	}
	return "", fmt.Errorf("%w: %s holds no NATS credentials (%s)", ErrNotEnrolled, cfg.DataDir, CredsFile)
}

// loadOrCreateID returns the device's pseudonymous id, creating it once.
func loadOrCreateID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("edge: device id: %w", err)
	}
	var r [8]byte
	rand.Read(r[:])
	id := "d-" + hex.EncodeToString(r[:])
	// Written whole or not at all, and never over an id another start
	// wrote first: a device keeps one identity.
	if err := atomicfile.WriteNew(path, []byte(id+"\n"), 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadOrCreateID(path)
		}
		return "", fmt.Errorf("edge: device id: %w", err)
	}
	return id, nil
}

// ID is the device's id.
func (a *Agent) ID() string { return a.cfg.DeviceID }

// Stats returns the agent's counters.
func (a *Agent) Stats() Stats {
	return Stats{CheckIns: a.checkIns.Load(), Rounds: a.rounds.Load(), Reports: a.reports.Load(),
		Refused: a.refused.Load(), Failures: a.failures.Load()}
}

// Ready reports why the agent cannot take part in rounds now, or nil: Run
// has not connected to NATS yet, or the connection is down.
func (a *Agent) Ready(context.Context) error {
	nc := a.conn.Load()
	if nc == nil {
		return errors.New("not connected to NATS yet")
	}
	if !nc.IsConnected() {
		return fmt.Errorf("NATS is %s", nc.Status())
	}
	return nil
}

// LastRefusal is the reason the server gave for the last refused report.
func (a *Agent) LastRefusal() string {
	s, _ := a.lastReason.Load().(string)
	return s
}

// Run works until ctx ends: check in, train when selected, report, repeat.
// It waits for an unreachable NATS server with back-off, warning as it does,
// and survives server and NATS restarts by reconnecting. It stops with an
// error when the agent cannot go on without the operator: ErrRevoked when
// NATS refuses or revokes its credentials, ErrNotEnrolled when NATS wants
// credentials the agent does not have. It returns nil when ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	defer a.close()
	ctx, st := newStopper(ctx)
	defer st.cancel()
	opts := []nats.Option{
		nats.Name("fleetlearn-edge/" + a.cfg.DeviceID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectJitter(500*time.Millisecond, 2*time.Second),
		// A server that went silent (its host or network gone, no close
		// seen) is given up after two unanswered pings, and the agent
		// moves to another node of the cluster: nats.go's default of two
		// minutes a ping kept a device out of rounds for four or more.
		nats.PingInterval(agentPingInterval),
		nats.MaxPingsOutstanding(2),
		// A write that makes no progress for this long is to a server that
		// is gone; nats.go's default is a minute, and the blocked write
		// holds back the pings that would have noticed sooner. A slow
		// link still moves a buffer's worth in far less.
		nats.FlusherTimeout(agentWriteTimeout),
	}
	if a.creds != "" {
		// The device's user JWT lets it reply only on its own inbox prefix.
		opts = append(opts, nats.UserCredentials(a.creds), nats.CustomInboxPrefix(identity.DeviceInboxPrefix(a.cfg.DeviceID)))
	}
	if strings.HasPrefix(a.cfg.NATSURL, "tls://") {
		tc, err := a.natsTLS()
		if err != nil {
			return err
		}
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := a.connect(ctx, st, opts)
	if err != nil {
		return err
	}
	if nc == nil {
		return nil // ctx ended while waiting for the server
	}
	defer nc.Close()
	a.conn.Store(nc)
	defer a.conn.Store(nil)
	// A connection the handlers stopped fails what follows: their reason
	// is the one to give.
	failed := func(err error) error {
		if why := st.err(); why != nil {
			return why
		}
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return failed(fmt.Errorf("edge: jetstream: %w", err))
	}
	dev, err := devproto.New(devproto.Config{
		CheckIn: &pb.CheckIn{DeviceId: a.cfg.DeviceID, TaskIds: a.cfg.TaskIDs, Attributes: &pb.DeviceAttributes{
			DeviceClass: a.cfg.DeviceClass, ExamplesAvailable: uint64(a.data.Len()), Charging: a.cfg.Charging,
			Idle: a.cfg.Idle, Unmetered: a.cfg.Unmetered, AgentVersion: Version, SupportedAbiVersions: wasm.SupportedABIVersions()}},
		Work: a.participate, Clock: a.o.clock, Jitter: a.jitter, Log: a.o.log, TracerProvider: a.o.tracer,
		Observer: devproto.Observer{
			CheckedIn: func(*pb.CheckInResponse) { a.checkIns.Add(1) },
			GaveUp:    func(*pb.RoundPlan, int, error) { a.failures.Add(1) },
		},
	})
	if err != nil {
		return fmt.Errorf("edge: %w", err)
	}
	announce, err := devproto.SubscribeAnnouncements(nc, dev)
	if err != nil {
		return failed(fmt.Errorf("edge: %w", err))
	}
	defer announce.Unsubscribe()
	receipts, err := devproto.SubscribeReceipts(nc, a.cfg.DeviceID, a.onReceipt)
	if err != nil {
		return failed(fmt.Errorf("edge: %w", err))
	}
	defer receipts.Unsubscribe()
	a.o.log.Info("edge agent running", "device", a.cfg.DeviceID, "examples", a.data.Len(), "nats", a.cfg.NATSURL, "gemm_kernel", kernel.KernelName())
	dev.Run(ctx, nc, js)
	return st.err() // set when the connection's handlers stopped the agent
}

func (a *Agent) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.modules {
		m.Close(context.Background())
	}
	if a.own {
		a.o.sandbox.Close(context.Background())
	}
}

func (a *Agent) onReceipt(r *pb.ReportReceipt) {
	if r.Accepted {
		a.reports.Add(1)
		return
	}
	a.refused.Add(1)
	reason := wire.FailureReason(r.Reason)
	a.lastReason.Store(reason)
	a.o.log.Warn("report refused", "task", r.TaskId, "round", r.Round, "reason", reason)
}

// participate is the agent's part in a round (devproto.Work): it runs the
// plan's module on the device's data and publishes the report.
func (a *Agent) participate(ctx context.Context, r *devproto.Round) error {
	a.rounds.Add(1)
	plan, js := r.Plan, r.JetStream()
	if err := errors.Join(wire.CheckSHA256("model", plan.GetModel().GetSha256()),
		wire.CheckSHA256("module", plan.GetModule().GetSha256())); err != nil {
		return devproto.Permanent(fmt.Errorf("plan: %w", err))
	}
	if err := a.checkModule(plan.GetModule()); err != nil {
		return devproto.Permanent(fmt.Errorf("plan: %w", err))
	}
	// Checked before anything is downloaded: a plan no sandbox can run
	// costs no fetch.
	lim, err := sandboxlimits.FromProto(plan.GetLimits())
	if err != nil {
		return devproto.Permanent(fmt.Errorf("plan: %w", err))
	}
	m, err := a.planModel(ctx, js, plan)
	if err != nil {
		return err
	}
	mod, err := a.module(ctx, js, plan.GetModule().GetSha256())
	if err != nil {
		return err
	}
	train, sub, err := trainable(plan, m)
	if err != nil {
		return devproto.Permanent(fmt.Errorf("plan: %w", err))
	}
	call := wasm.Call{Model: m, Data: a.data, Hyper: plan.Hyperparameters, Seed: wire.DeviceSeed(plan.Seed, a.cfg.DeviceID),
		Limits: lim, Trainable: train}
	switch {
	case plan.GetAsyncStage() == pb.AsyncStage_ASYNC_STAGE_TRAIN:
		return a.trainAndHold(ctx, r, mod, call)
	case plan.Kind == pb.RoundKind_ROUND_KIND_TRAIN && plan.GetSecagg() != nil:
		// A secure round's stages move on without the device: another
		// attempt would find them closed.
		err := a.secureRound(ctx, r, mod, call)
		if err == nil || errors.Is(err, devproto.ErrLeft) {
			return err
		}
		return devproto.Permanent(err)
	case plan.Kind == pb.RoundKind_ROUND_KIND_TRAIN:
		res, err := a.train(ctx, plan, mod, call)
		if err != nil {
			return fmt.Errorf("train: %w", err)
		}
		a.scratch.delta = updateOf(a.scratch.delta, m, res.Model, train)
		enc := plan.GetUpdateEncoding()
		var ef *feedbackState
		if enc == pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
			a.dropFeedback(plan.TaskId)
		} else {
			// The residual joins the update before the clip and any local
			// noise, so that what is sent obeys the same bounds as a float32
			// update would.
			ef = a.feedback(plan.TaskId, sub)
			if err := ef.fb.AddTo(a.scratch.delta); err != nil {
				ef.fb.Reset()
			}
		}
		delta, bit, err := a.privatize(a.scratch.delta, plan)
		if err != nil {
			return err
		}
		layout := make([]*pb.TensorSpec, len(sub.Tensors))
		for i, t := range sub.Tensors {
			shape := make([]uint64, len(t.Shape))
			for j, d := range t.Shape {
				shape[j] = uint64(d)
			}
			layout[i] = &pb.TensorSpec{Name: t.Name, Shape: shape}
		}
		rep := &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: a.cfg.DeviceID,
			ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
			NumExamples: uint64(res.NumExamples), Metrics: &pb.Metrics{Values: res.Metrics}, KeyId: a.key.ID(), ClipBit: bit}
		var sent []float32
		if ef == nil {
			a.scratch.values = wire.AppendDense(a.scratch.values[:0], delta)
			values := a.scratch.values
			rep.Payload = &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: values, Layout: layout}}
			rep.PayloadSha256 = wire.SHA256(values)
		} else {
			bits, err := encodingBits(enc)
			if err != nil {
				return devproto.Permanent(err)
			}
			src, err := quantRand()
			if err != nil {
				return err
			}
			var data []byte
			if data, sent, err = quant.Encode(delta, bits, quant.DefaultBlock, src); err != nil {
				return fmt.Errorf("quantize update: %w", err)
			}
			rep.Payload = &pb.UpdateReport_Quantized{Quantized: &pb.QuantizedUpdate{Encoding: enc, Data: data, Layout: layout}}
			// The signature covers the quantized bytes themselves.
			rep.PayloadSha256 = wire.SHA256(data)
		}
		if rep.Signature, err = a.signReport(identity.UpdateStatement(rep)); err != nil {
			return err
		}
		if a.scratch.payload, err = (proto.MarshalOptions{}).MarshalAppend(a.scratch.payload[:0], rep); err != nil {
			return err
		}
		if err := r.Publish(a.scratch.payload); err != nil {
			return err
		}
		if ef != nil {
			// Kept only once published: a retried attempt starts from the
			// residual the server's last update left.
			if err := ef.fb.Keep(delta, sent); err != nil {
				ef.fb.Reset()
			}
		}
		return nil
	case plan.Kind == pb.RoundKind_ROUND_KIND_EVALUATE:
		span := a.startRun(ctx, "evaluation", plan)
		res, err := mod.Evaluate(ctx, call)
		endRun(span, res, err)
		if err != nil {
			return fmt.Errorf("evaluate: %w", err)
		}
		rep := &pb.EvaluationReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: a.cfg.DeviceID,
			ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
			NumExamples: uint64(res.NumExamples), Metrics: &pb.Metrics{Values: res.Metrics}, KeyId: a.key.ID()}
		if rep.Signature, err = a.signReport(identity.EvalStatement(rep)); err != nil {
			return err
		}
		payload, err := proto.Marshal(rep)
		if err != nil {
			return err
		}
		return r.Publish(payload)
	}
	return devproto.Permanent(fmt.Errorf("plan: unknown round kind %v", plan.Kind))
}

// moduleBytes returns the module bytes named sha, verified against the hash, from
// the disk cache (modules are large and stable) or else from the object store.
func (a *Agent) moduleBytes(ctx context.Context, js jetstream.JetStream, sha string) ([]byte, error) {
	path := filepath.Join(a.cfg.DataDir, "blobs", sha)
	if b, err := os.ReadFile(path); err == nil {
		if wire.SHA256(b) == sha {
			return b, nil
		}
		os.Remove(path) // corrupt cache entry: fetch again
	}
	bk, err := a.bucketFor(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", sha, err)
	}
	b, err := bk.Get(ctx, sha, devproto.MaxBlobBytes)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", sha, err)
	}
	if got := wire.SHA256(b); got != sha {
		return nil, fmt.Errorf("fetch %s: content hashes to %s", sha, got)
	}
	// A cache: a failed write costs a download next time, nothing more.
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		a.o.log.Warn("module not cached", "sha256", sha, "err", err)
	}
	return b, nil
}

// bucketFor returns the blob bucket, resolved once per connection.
func (a *Agent) bucketFor(ctx context.Context, js jetstream.JetStream) (*objfetch.Bucket, error) {
	a.mu.Lock()
	bk := a.bucket
	if bk == nil || a.bucketJS != js {
		bk = nil
	}
	a.mu.Unlock()
	if bk == nil {
		var err error
		if bk, err = objfetch.Open(ctx, js, wire.BlobBucket); err != nil {
			return nil, err
		}
		a.mu.Lock()
		a.bucket, a.bucketJS = bk, js
		a.mu.Unlock()
	}
	return bk, nil
}

func (a *Agent) model(ctx context.Context, js jetstream.JetStream, sha string) (*model.Model, error) {
	a.mu.Lock()
	m := a.models[sha]
	a.mu.Unlock()
	if m != nil {
		return m, nil
	}
	// A new model every round, needed once: decoded and hashed as its chunks
	// arrive instead of first being gathered, and used only if the hash holds.
	bk, err := a.bucketFor(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("model: fetch %s: %w", sha, err)
	}
	r, err := bk.Open(ctx, sha, devproto.MaxBlobBytes)
	if err != nil {
		return nil, fmt.Errorf("model: fetch %s: %w", sha, err)
	}
	h := sha256.New()
	if m, err = model.ReadSafetensors(io.TeeReader(r, h), model.WithInputSize(int64(r.Size()))); err != nil {
		return nil, fmt.Errorf("model %s: %w", sha, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha {
		return nil, fmt.Errorf("model: fetch %s: content hashes to %s", sha, got)
	}
	a.mu.Lock()
	clear(a.models) // only the current round's model is worth keeping
	a.models[sha] = m
	a.mu.Unlock()
	return m, nil
}

func (a *Agent) module(ctx context.Context, js jetstream.JetStream, sha string) (*wasm.Module, error) {
	a.mu.Lock()
	mod := a.modules[sha]
	a.mu.Unlock()
	if mod != nil {
		return mod, nil
	}
	b, err := a.moduleBytes(ctx, js, sha)
	if err != nil {
		return nil, fmt.Errorf("module: %w", err)
	}
	if mod, err = a.o.sandbox.Load(ctx, b, sha); err != nil {
		return nil, fmt.Errorf("module: %w", err)
	}
	a.mu.Lock()
	a.modules[sha] = mod
	a.mu.Unlock()
	return mod, nil
}
