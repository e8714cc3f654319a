package coord

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/internal/testwait"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/blobs"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/natsx"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// The harness runs a real coordinator against a real embedded NATS with
// JetStream and a real SQLite store, on a fake clock. Devices are driven by
// the test: each check-in and report is one explicit step, so a round's
// course is exactly what the test says.

var epoch = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

const testModule = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

type harness struct {
	t     *testing.T
	clk   *clock.Fake
	nc    *nats.Conn
	js    jetstream.JetStream
	st    *store.Store
	c     *Coordinator
	deps  Deps
	model *model.Model
	ver   string // the base model's version

	mu         sync.Mutex
	keys       map[string]ed25519.PrivateKey // enrolled devices
	audited    []audit.Payload
	auditFails int // appends to refuse before accepting again
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	nc, js := natstest.Connect(t, natstest.Start(t))
	ctx := t.Context()
	stream, obs, err := natsx.Setup(ctx, js, wire.MaxMessageBytes, 1, -1)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sb, err := wasm.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	h := &harness{t: t, clk: clock.NewFake(epoch), nc: nc, js: js, st: st, keys: map[string]ed25519.PrivateKey{}}
	bl := blobs.New(js, obs)
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		model.Tensor{Name: "b", Shape: []int{2}, Data: []float32{0.5, -0.5}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	if h.ver, err = bl.Put(ctx, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	h.model = m
	if err := st.InsertModel(ctx, &store.ModelRow{Version: h.ver, Name: "base", Source: pb.ModelSource_MODEL_SOURCE_IMPORTED,
		Tensors: 2, Params: 8, Size: int64(buf.Len()), Created: epoch}); err != nil {
		t.Fatal(err)
	}
	h.deps = Deps{Store: st, NC: nc, JS: js, Stream: stream, Blobs: bl, Sandbox: sb, Metrics: metrics.New(),
		Log: slog.New(slog.DiscardHandler), Clock: h.clk, Rand: mrand.New(mrand.NewPCG(1, 2)), PaceWindow: time.Second,
		Audit: h.audit, Audited: h.auditedClose, DeviceKey: h.deviceKey, RequireEnrollment: true,
		Pseudonym: func(d string) (string, error) { return audit.PseudonymizeDevice([]byte("harness"), d), nil }}
	h.restart()
	return h
}

// restart starts a new coordinator on the same store and NATS, as a
// restarted server does (the previous one, if any, already shut down).
func (h *harness) restart() {
	h.t.Helper()
	h.c = New(h.deps)
	if err := h.c.Start(h.t.Context()); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(h.c.Shutdown)
}

func (h *harness) audit(_ context.Context, _ audit.Actor, ps ...audit.Payload) error {
	for _, p := range ps {
		if _, err := audit.NewEvent(auditActor, p); err != nil {
			return err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.auditFails > 0 {
		h.auditFails--
		return errors.New("audit log unavailable")
	}
	h.audited = append(h.audited, ps...)
	return nil
}

func (h *harness) auditedClose(_ context.Context, task string, round uint64) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.audited {
		if c, ok := p.(audit.RoundClosed); ok && c.Task == task && c.Round == round {
			return true, nil
		}
	}
	return false, nil
}

func (h *harness) deviceKey(_ context.Context, device string) (ed25519.PublicKey, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k, ok := h.keys[device]
	if !ok {
		return nil, errors.New("not enrolled")
	}
	return k.Public().(ed25519.PublicKey), nil
}

// events returns the audit events of a type recorded so far.
func (h *harness) events(typ audit.EventType) []audit.Payload {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []audit.Payload
	for _, p := range h.audited {
		if p.EventType() == typ {
			out = append(out, p)
		}
	}
	return out
}

// baseTask is a task over the harness model: cohort 3, goal 2, no
// over-selection, the default robustness settings resolved as task
// creation resolves them.
func (h *harness) baseTask(mod func(*pb.Task)) *pb.Task {
	task := &pb.Task{Id: "t-test", Name: "test", State: pb.TaskState_TASK_STATE_RUNNING,
		Model: &pb.ModelRef{Sha256: h.ver, Version: h.ver}, Module: &pb.ModuleRef{Sha256: testModule},
		CohortTarget: 3, ReportGoal: 2, RoundsTotal: 1,
		SelectionTimeout: durationpb.New(10 * time.Second), ReportTimeout: durationpb.New(20 * time.Second),
		Aggregation: &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_FEDAVG}}
	if mod != nil {
		mod(task)
	}
	return task
}

// start stores the task (robustness resolved as task creation does) and
// starts its runner; it returns once round 1 is open.
func (h *harness) start(task *pb.Task) *pb.Task {
	h.t.Helper()
	rb, err := ResolveRobustness(task, h.model)
	if err != nil {
		h.t.Fatal(err)
	}
	rb.Apply(task)
	if err := h.st.InsertTask(h.t.Context(), task, h.clk.Now()); err != nil {
		h.t.Fatal(err)
	}
	h.c.StartTask(task.Id)
	h.awaitOpen(task.Id, 1)
	return task
}

// watch subscribes to a task's round events.
func (h *harness) watch(task string) <-chan *pb.RoundEvent {
	in := h.watchAll(task)
	out := make(chan *pb.RoundEvent, 64)
	go func() {
		defer close(out)
		for m := range in {
			if ev := m.GetEvent(); ev != nil {
				out <- ev
			}
		}
	}()
	return out
}

// watchAll subscribes to everything watchers of a task get: round events
// and the task when it pauses.
func (h *harness) watchAll(task string) <-chan *pb.WatchTaskResponse {
	ch, stop := h.c.Watch(task)
	h.t.Cleanup(stop)
	return ch
}

// awaitOpen waits until round is the task's open round (and its timers are
// armed, so that the clock may move).
func (h *harness) awaitOpen(task string, round uint64) {
	h.t.Helper()
	h.until(fmt.Sprintf("round %d of %s open", round, task), func() bool {
		h.c.mu.Lock()
		tr := h.c.tasks[task]
		h.c.mu.Unlock()
		if tr == nil {
			return false
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.round != nil && tr.round.row.Round == round && h.clk.Pending() > 0
	})
}

// until polls cond, yielding to the code under test, until the test
// binary's deadline is near: a bound for hangs only (a 67 MB model opens
// its round slowly on a loaded machine).
func (h *harness) until(what string, cond func() bool) {
	h.t.Helper()
	limit := time.Now().Add(testwait.Limit(h.t))
	for !cond() {
		if time.Now().After(limit) {
			h.t.Fatalf("timed out waiting for %s", what)
		}
		select {
		case <-h.clk.Changed():
		case <-time.After(time.Millisecond):
		}
	}
}

// next returns the next round event that is not OPENED.
func (h *harness) next(ch <-chan *pb.RoundEvent) *pb.RoundEvent {
	h.t.Helper()
	limit := testwait.After(h.t)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				h.t.Fatal("watch ended")
			}
			if ev.Type != pb.RoundEventType_ROUND_EVENT_TYPE_OPENED {
				return ev
			}
		case <-limit:
			h.t.Fatal("timed out waiting for a round event")
		}
	}
}

// device is a device the test drives by hand.
type device struct {
	h        *harness
	id       string
	key      ed25519.PrivateKey
	examples uint64
	receipts chan *pb.ReportReceipt
}

// enroll makes an enrolled device with examples examples.
// joinCohort enrolls devices dev-0 … dev-(n-1), 10 examples each, and has
// each join the open round, one after another.
func (h *harness) joinCohort(n int) ([]*device, []*pb.RoundPlan) {
	devs := make([]*device, n)
	plans := make([]*pb.RoundPlan, n)
	for i := range devs {
		devs[i] = h.enroll(fmt.Sprintf("dev-%d", i), 10)
		plans[i] = devs[i].join()
	}
	return devs, plans
}

func (h *harness) enroll(id string, examples uint64) *device {
	h.t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.keys[id] = key
	h.mu.Unlock()
	// In the registry too, where the fleet is counted (Coordinator.Fleet).
	if err := h.st.InsertDevice(h.t.Context(), &store.DeviceRow{ID: id, KeyID: "key-" + id, Fleet: "test", TokenID: "tok-" + id,
		Enrolled: h.clk.Now()}); err != nil {
		h.t.Fatal(err)
	}
	d := &device{h: h, id: id, key: key, examples: examples, receipts: make(chan *pb.ReportReceipt, 16)}
	sub, err := h.nc.Subscribe(wire.ReceiptSubject(id), func(m *nats.Msg) {
		var r pb.ReportReceipt
		if proto.Unmarshal(m.Data, &r) == nil {
			d.receipts <- &r
		}
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { sub.Unsubscribe() })
	if err := h.nc.Flush(); err != nil {
		h.t.Fatal(err)
	}
	return d
}

func (d *device) attrs() *pb.DeviceAttributes {
	return &pb.DeviceAttributes{ExamplesAvailable: d.examples, SupportedAbiVersions: wasm.SupportedABIVersions()}
}

// checkInAs sends a check-in on subject's device with the body's device id
// body (an impersonation when they differ).
func (d *device) checkInRaw(subjectDevice string, ci *pb.CheckIn) *pb.CheckInResponse {
	d.h.t.Helper()
	b, _ := proto.Marshal(ci)
	msg, err := d.h.nc.Request(wire.CheckInSubject(subjectDevice), b, 30*time.Second)
	if err != nil {
		d.h.t.Fatalf("%s: check-in: %v", d.id, err)
	}
	var resp pb.CheckInResponse
	if err := proto.Unmarshal(msg.Data, &resp); err != nil {
		d.h.t.Fatal(err)
	}
	return &resp
}

func (d *device) checkIn() *pb.CheckInResponse {
	return d.checkInRaw(d.id, &pb.CheckIn{DeviceId: d.id, Attributes: d.attrs()})
}

// join checks in and expects a plan.
func (d *device) join() *pb.RoundPlan {
	d.h.t.Helper()
	resp := d.checkIn()
	if resp.GetPlan() == nil {
		d.h.t.Fatalf("%s: no plan: %v", d.id, resp.GetRetryAfter())
	}
	return resp.GetPlan()
}

// update publishes a signed update report of delta for plan.
func (d *device) update(plan *pb.RoundPlan, delta []float32, examples uint64, metrics map[string]float64) {
	d.h.t.Helper()
	d.send(d.signedUpdate(plan, delta, examples, metrics))
}

// send publishes an update report.
func (d *device) send(rep *pb.UpdateReport) {
	d.h.t.Helper()
	d.publish(wire.ReportSubject(rep.TaskId, rep.Round, d.id), rep, wire.MsgID("update", rep.TaskId, rep.Round, d.id))
}

// signedUpdate is the device's signed update report of delta for plan.
func (d *device) signedUpdate(plan *pb.RoundPlan, delta []float32, examples uint64, metrics map[string]float64) *pb.UpdateReport {
	d.h.t.Helper()
	values := wire.EncodeDense(delta)
	layout := make([]*pb.TensorSpec, len(d.h.model.Tensors))
	for i, t := range d.h.model.Tensors {
		shape := make([]uint64, len(t.Shape))
		for j, s := range t.Shape {
			shape[j] = uint64(s)
		}
		layout[i] = &pb.TensorSpec{Name: t.Name, Shape: shape}
	}
	rep := &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id, ModelVersion: plan.GetModel().GetVersion(),
		ModuleSha256: plan.GetModule().GetSha256(), NumExamples: examples, Metrics: &pb.Metrics{Values: metrics},
		Payload:       &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: values, Layout: layout}},
		PayloadSha256: wire.SHA256(values)}
	if privacyconf.Adaptive(plan.GetDp()) {
		// An honest device's bit; the update is the test's as given.
		rep.ClipBit = pb.ClipBit_CLIP_BIT_CLIPPED
		if n, _ := dp.L2Norm(delta); n <= plan.GetMaxUpdateNorm() {
			rep.ClipBit = pb.ClipBit_CLIP_BIT_UNCLIPPED
		}
	}
	sig, err := identity.SignReport(d.key, identity.UpdateStatement(rep))
	if err != nil {
		d.h.t.Fatal(err)
	}
	rep.Signature = sig
	return rep
}

// evaluate publishes a signed evaluation report for plan.
func (d *device) evaluate(plan *pb.RoundPlan, examples uint64, metrics map[string]float64) {
	d.h.t.Helper()
	rep := &pb.EvaluationReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id, ModelVersion: plan.GetModel().GetVersion(),
		ModuleSha256: plan.GetModule().GetSha256(), NumExamples: examples, Metrics: &pb.Metrics{Values: metrics}}
	sig, err := identity.SignReport(d.key, identity.EvalStatement(rep))
	if err != nil {
		d.h.t.Fatal(err)
	}
	rep.Signature = sig
	d.publish(wire.EvalSubject(plan.TaskId, plan.Round, d.id), rep, wire.MsgID("evaluation", plan.TaskId, plan.Round, d.id))
}

func (d *device) publish(subj string, m proto.Message, id string) {
	d.h.t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		d.h.t.Fatal(err)
	}
	if _, err := d.h.js.Publish(d.h.t.Context(), subj, b, jetstream.WithMsgID(id)); err != nil {
		d.h.t.Fatal(err)
	}
}

// receipt waits for the device's next receipt.
func (d *device) receipt() *pb.ReportReceipt {
	d.h.t.Helper()
	select {
	case r := <-d.receipts:
		return r
	case <-testwait.After(d.h.t):
		d.h.t.Fatalf("%s: no receipt", d.id)
		return nil
	}
}

// fail reports that the device could not carry out plan.
func (d *device) fail(plan *pb.RoundPlan, reason string) *pb.PlanFailureAck {
	d.h.t.Helper()
	b, _ := proto.Marshal(&pb.PlanFailure{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id, Reason: reason, Attempts: 3})
	msg, err := d.h.nc.Request(wire.FailureSubject(plan.TaskId, plan.Round, d.id), b, 30*time.Second)
	if err != nil {
		d.h.t.Fatal(err)
	}
	var ack pb.PlanFailureAck
	if err := proto.Unmarshal(msg.Data, &ack); err != nil {
		d.h.t.Fatal(err)
	}
	return &ack
}

// current is the task's current model.
func (h *harness) current(task string) *model.Model {
	h.t.Helper()
	row, err := h.st.Task(h.t.Context(), task)
	if err != nil {
		h.t.Fatal(err)
	}
	tr := &taskRun{c: h.c, id: task}
	m, err := tr.loadModel(h.t.Context(), row.CurrentModel)
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

func (h *harness) round(task string, n uint64) *store.RoundRow {
	h.t.Helper()
	r, err := h.st.Round(h.t.Context(), task, n)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func constant(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func containsAll(s string, parts ...string) bool {
	return !slices.ContainsFunc(parts, func(p string) bool { return !bytes.Contains([]byte(s), []byte(p)) })
}
