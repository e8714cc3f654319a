package server_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/identity"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// scripted is a device driven by the test over the wire protocol, to send
// what a real edge agent never would (or to vanish when one would not). What
// it sends as an agent would (check-ins, accepted reports) goes through the
// agent's own protocol code, internal/devproto; the rest is built by hand.
type scripted struct {
	id       string
	dir      string // its agent data directory: key and credentials
	nc       *nats.Conn
	js       jetstream.JetStream
	receipts chan *pb.ReportReceipt
}

// newScripted connects a device and listens on its receipt subject before
// anything is published, so no receipt can be missed.
func newScripted(t testing.TB, h *servertest.Harness, id string) *scripted {
	t.Helper()
	dir := enrollDir(t, h, id)
	nc, err := nats.Connect(h.NATSURL(), nats.Name("scripted/"+id), nats.UserCredentials(filepath.Join(dir, edge.CredsFile)),
		nats.CustomInboxPrefix(identity.DeviceInboxPrefix(id)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	d := &scripted{id: id, dir: dir, nc: nc, js: js, receipts: make(chan *pb.ReportReceipt, 64)}
	if _, err := nc.Subscribe(wire.ReceiptSubject(id), func(m *nats.Msg) {
		var r pb.ReportReceipt
		if err := proto.Unmarshal(m.Data, &r); err != nil {
			r = pb.ReportReceipt{Reason: "undecodable receipt: " + err.Error()}
		}
		d.receipts <- &r
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return d
}

// checkIn sends one CheckIn as an agent does and returns the response.
func (d *scripted) checkIn(t testing.TB, ci *pb.CheckIn) *pb.CheckInResponse {
	t.Helper()
	resp, err := devproto.CheckIn(context.Background(), clock.Real(), d.nc, ci)
	if err != nil {
		t.Fatalf("%s: %v", d.id, err)
	}
	return resp
}

// checkInRaw sends b, whatever it holds, as a check-in.
func (d *scripted) checkInRaw(t testing.TB, b []byte) *pb.CheckInResponse {
	t.Helper()
	msg, err := d.nc.Request(wire.CheckInSubject(d.id), b, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: check-in: %v", d.id, err)
	}
	var resp pb.CheckInResponse
	if err := proto.Unmarshal(msg.Data, &resp); err != nil {
		t.Fatalf("%s: check-in response: %v", d.id, err)
	}
	return &resp
}

// eligibleCheckIn is what a capable device with data says.
func (d *scripted) eligibleCheckIn(task string) *pb.CheckIn {
	return &pb.CheckIn{DeviceId: d.id, TaskIds: []string{task}, Attributes: &pb.DeviceAttributes{
		ExamplesAvailable: 200, AgentVersion: "scripted/1", SupportedAbiVersions: wasm.SupportedABIVersions()}}
}

// join checks in until the device is in the cohort of the given round.
func (d *scripted) join(t testing.TB, task string, round uint64) *pb.RoundPlan {
	t.Helper()
	end := time.Now().Add(scriptedWait)
	for {
		resp := d.checkIn(t, d.eligibleCheckIn(task))
		if p := resp.GetPlan(); p != nil {
			if p.Round == round {
				return p
			}
			if p.Round > round {
				t.Fatalf("%s: got the plan of round %d, wanted round %d", d.id, p.Round, round)
			}
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not selected for round %d of %s: %v", d.id, round, task, resp.GetRetryAfter())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sign signs a report with the device's enrolled key, as an agent does.
func (d *scripted) sign(t testing.TB, r *pb.UpdateReport) *pb.UpdateReport {
	t.Helper()
	key, err := identity.LoadOrCreateUserKey(filepath.Join(d.dir, edge.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return signed(t, key, r)
}

// publish stores a report in the reports stream as an agent would.
func (d *scripted) publish(subject string, body []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return d.js.Publish(ctx, subject, body, opts...)
}

// scriptedWait bounds a scripted device's wait for the server's answer. It
// only turns a lost answer into a failure with a message rather than go
// test's timeout: a round's work (a module interpreted under the race
// detector, on a loaded 2-core machine) can take tens of seconds.
const scriptedWait = 2 * time.Minute

// receipt waits for the device's next receipt.
func (d *scripted) receipt(t testing.TB) *pb.ReportReceipt {
	t.Helper()
	select {
	case r := <-d.receipts:
		return r
	case <-time.After(scriptedWait):
		t.Fatalf("%s: no receipt within %v", d.id, scriptedWait)
		return nil
	}
}

// refused publishes body on subject and expects a refusal receipt for the
// given task and round whose reason contains want.
func (d *scripted) refused(t testing.TB, subject string, body []byte, task string, round uint64, want string) {
	t.Helper()
	if _, err := d.publish(subject, body); err != nil {
		t.Fatalf("%s: publish %s: %v", d.id, subject, err)
	}
	r := d.receipt(t)
	switch {
	case r.Accepted:
		t.Errorf("report on %s was accepted, want refused with %q", subject, want)
	case r.TaskId != task || r.Round != round || r.DeviceId != d.id:
		t.Errorf("receipt is for %s/%d/%s, want %s/%d/%s (%s)", r.TaskId, r.Round, r.DeviceId, task, round, d.id, r.Reason)
	case !strings.Contains(r.Reason, want):
		t.Errorf("refused with %q, want a reason naming %q", r.Reason, want)
	}
}

// accepted publishes a report on subject as an agent does (under its
// message id, retried until stored) and expects it to count.
func (d *scripted) accepted(t testing.TB, subject string, body []byte) {
	t.Helper()
	task, round, device, err := wire.ParseReportSubject(subject)
	if err != nil {
		t.Fatal(err)
	}
	plan := &pb.RoundPlan{TaskId: task, Round: round, Kind: pb.RoundKind_ROUND_KIND_TRAIN}
	if wire.IsEvalSubject(subject) {
		plan.Kind = pb.RoundKind_ROUND_KIND_EVALUATE
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := devproto.PublishReport(ctx, clock.Real(), d.js, plan, device, body, nil); err != nil {
		t.Fatalf("%s: publish %s: %v", d.id, subject, err)
	}
	if r := d.receipt(t); !r.Accepted {
		t.Fatalf("%s: report refused: %s", d.id, r.Reason)
	}
}

// noMoreReceipts checks that nothing unexpected was said to the device.
func (d *scripted) noMoreReceipts(t testing.TB) {
	t.Helper()
	select {
	case r := <-d.receipts:
		t.Errorf("%s: unexpected receipt %v", d.id, r)
	case <-time.After(100 * time.Millisecond):
	}
}

// rogueUpdate is a well-formed report for plan: the given value for every
// parameter of m, which must be the plan's model.
func rogueUpdate(plan *pb.RoundPlan, device string, m *model.Model, value float32, examples uint64) *pb.UpdateReport {
	delta := make([]float32, m.Layout().Size())
	for i := range delta {
		delta[i] = value
	}
	values := wire.EncodeDense(delta)
	var layout []*pb.TensorSpec
	for _, e := range m.Layout().Entries {
		shape := make([]uint64, len(e.Shape))
		for j, s := range e.Shape {
			shape[j] = uint64(s)
		}
		layout = append(layout, &pb.TensorSpec{Name: e.Name, Shape: shape})
	}
	return &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: device,
		ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
		NumExamples: examples, Metrics: &pb.Metrics{Values: map[string]float64{"loss": 1}},
		Payload:       &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: values, Layout: layout}},
		PayloadSha256: wire.SHA256(values)}
}

// setDense replaces a report's dense values and keeps its hash consistent,
// so that the check under test is the one that fires.
func setDense(r *pb.UpdateReport, b []byte) {
	r.GetDense().Values = b
	r.PayloadSha256 = wire.SHA256(b)
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fetchModel exports a model version through the API and decodes it.
func fetchModel(t testing.TB, h *servertest.Harness, version string) *model.Model {
	t.Helper()
	st, err := h.Models.ExportModel(context.Background(), &pb.ExportModelRequest{Version: version})
	if err != nil {
		t.Fatal(err)
	}
	var buf []byte
	for {
		resp, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("export %s: %v", version, err)
		}
		buf = append(buf, resp.GetChunk()...)
	}
	m, err := model.DecodeSafetensors(buf)
	if err != nil {
		t.Fatalf("model %s: %v", version, err)
	}
	return m
}

// withMaxMessageBytes lowers the NATS max payload so that oversized reports
// are cheap to build.
func withMaxMessageBytes(n int32) servertest.Option {
	return func(c *server.Config) { c.MaxMessageBytes = n }
}

// TestBadReportsAreRefused: a scripted device in the cohort, and others that
// are not, send every kind of bad report while four honest edge agents train.
// Each bad report gets a refusal receipt naming the problem, none counts, and
// both rounds commit with the honest reports alone; the model stays finite
// and moves only by what the accepted reports say.
func TestBadReportsAreRefused(t *testing.T) {
	const maxMsg = 1 << 20
	h := servertest.New(t, withMaxMessageBytes(maxMsg))
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "synthetic", init)
	code := wasmtest.Build(t, wasmtest.Softmax)
	module := h.RegisterModule(t, "softmax", code)
	warmModule(t, code)

	spec := baseTask("bad-input", version, module, 2)
	// Six seats: the rogue, a scripted device that reports correctly, and four
	// honest agents. The target of five is reached only once the honest four
	// and the correct scripted device have all reported, so a refused report
	// counted by mistake would show in the counts below.
	spec.CohortTarget, spec.ReportGoal, spec.OverSelection = 5, 2, 0.1
	spec.SelectionTimeout, spec.ReportTimeout = durationpb.New(30*time.Second), durationpb.New(30*time.Second)
	spec.Aggregation = &pb.AggregationConfig{MaxUpdateNorm: 50}
	task := h.CreateTask(t, spec).Id

	rogue := newScripted(t, h, "rogue-1")
	loyal := newScripted(t, h, "loyal-1")
	stranger := newScripted(t, h, "stranger-1")

	t.Run("check-in", func(t *testing.T) {
		// None of these may join the cohort: the seat counts below depend on it.
		d := &scripted{id: rogue.id, nc: rogue.nc}
		long := d.eligibleCheckIn(task)
		long.Attributes.DeviceClass = strings.Repeat("x", 20<<10)
		oldABI := d.eligibleCheckIn(task)
		oldABI.Attributes.SupportedAbiVersions = []uint32{wasm.ABIVersion + 1} // none the task's module declares
		noData := d.eligibleCheckIn(task)
		noData.Attributes.ExamplesAvailable = 0
		badID := d.eligibleCheckIn(task)
		badID.DeviceId = "fl.report.>"
		impersonation := d.eligibleCheckIn(task)
		impersonation.DeviceId = loyal.id // its own subject, another device's body
		const notEligible, noABI = pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE, pb.RetryReason_RETRY_REASON_UNSUPPORTED_ABI
		for _, c := range []struct {
			name   string
			body   []byte
			reason pb.RetryReason
			want   string
		}{
			{"garbage", []byte{0x0a, 0x40, 'x'}, notEligible, "malformed check-in"},
			{"oversized", mustMarshal(t, long), notEligible, "exceeds"},
			{"device id", mustMarshal(t, badID), notEligible, "a device checks in only as itself"},
			{"impersonation", mustMarshal(t, impersonation), notEligible, "a device checks in only as itself"},
			{"no ABI", mustMarshal(t, oldABI), noABI, "device does not support module ABI v"},
			{"no examples", mustMarshal(t, noData), notEligible, "needs at least 1 examples"},
		} {
			resp := d.checkInRaw(t, c.body)
			r := resp.GetRetryAfter()
			switch {
			case r == nil:
				t.Errorf("%s: got %v, want a retry", c.name, resp)
			case r.Reason != c.reason:
				t.Errorf("%s: reason %v (%s), want %v", c.name, r.Reason, r.Detail, c.reason)
			case !strings.Contains(r.Detail, c.want):
				t.Errorf("%s: detail %q, want it to name %q", c.name, r.Detail, c.want)
			}
		}
	})

	plan := rogue.join(t, task, 1)
	loyalPlan := loyal.join(t, task, 1)
	base := fetchModel(t, h, version)
	dim := base.Layout().Size()
	open := wire.ReportSubject(task, 1, rogue.id)
	good := func() *pb.UpdateReport { return rogueUpdate(plan, rogue.id, base, 0.01, 200) }
	rogueKey, err := identity.LoadOrCreateUserKey(filepath.Join(rogue.dir, edge.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	// with is a well-formed report changed by mut and signed by the rogue
	// device, so that what is checked is the change, not the signature.
	with := func(mut func(r *pb.UpdateReport)) []byte {
		r := good()
		mut(r)
		if r.PayloadSha256 == "" {
			return mustMarshal(t, r) // nothing a device could sign
		}
		return mustMarshal(t, signed(t, rogueKey, r))
	}
	f32 := func(i int, v float32) []byte {
		d := make([]float32, dim)
		d[i] = v
		return wire.EncodeDense(d)
	}
	// A report a little under the max payload whose values are not dim floats.
	nearMax := with(func(r *pb.UpdateReport) { setDense(r, make([]byte, (maxMsg-proto.Size(r)-1024)&^3)) })

	t.Run("in cohort", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			subject string
			body    []byte
			want    string
		}{
			{"tensor count", open, with(func(r *pb.UpdateReport) { r.GetDense().Layout = r.GetDense().Layout[:1] }), "update has 1 tensors, the task trains 2"},
			{"tensor shape", open, with(func(r *pb.UpdateReport) { r.GetDense().Layout[0].Shape = []uint64{8, 3} }), "has shape"},
			{"tensor rank", open, with(func(r *pb.UpdateReport) { r.GetDense().Layout[0].Shape = []uint64{24} }), "fc1.weight"},
			{"tensor name", open, with(func(r *pb.UpdateReport) { r.GetDense().Layout[1].Name = "fc9.bias" }), "fc9.bias"},
			{"value count short", open, with(func(r *pb.UpdateReport) { setDense(r, r.GetDense().Values[4:]) }), fmt.Sprintf("%d bytes for %d float32 values", 4*dim-4, dim)},
			{"value count long", open, with(func(r *pb.UpdateReport) { setDense(r, append(r.GetDense().Values, 0, 0, 0, 0)) }), fmt.Sprintf("%d bytes for %d float32 values", 4*dim+4, dim)},
			{"ragged values", open, with(func(r *pb.UpdateReport) { setDense(r, append(r.GetDense().Values, 0)) }), "float32 values"},
			{"no payload", open, with(func(r *pb.UpdateReport) { r.Payload = nil }), "no dense payload"},
			{"masked payload", open, with(func(r *pb.UpdateReport) {
				r.Payload = &pb.UpdateReport_Masked{Masked: &pb.MaskedUpdate{}}
			}), "no dense payload"},
			{"NaN", open, with(func(r *pb.UpdateReport) { setDense(r, f32(3, float32(math.NaN()))) }), "value 3 is NaN"},
			{"+Inf", open, with(func(r *pb.UpdateReport) { setDense(r, f32(5, float32(math.Inf(1)))) }), "value 5 is +Inf"},
			{"-Inf", open, with(func(r *pb.UpdateReport) { setDense(r, f32(0, float32(math.Inf(-1)))) }), "value 0 is -Inf"},
			{"norm bound", open, with(func(r *pb.UpdateReport) { setDense(r, f32(7, 1e6)) }), "norm"},
			{"no examples", open, with(func(r *pb.UpdateReport) { r.NumExamples = 0 }), "num_examples 0"},
			{"too many examples", open, with(func(r *pb.UpdateReport) { r.NumExamples = 1 << 41 }), "num_examples"},
			{"more examples than at check-in", open, with(func(r *pb.UpdateReport) { r.NumExamples = 201 }), "examples available at check-in"},
			{"body names another device", open, with(func(r *pb.UpdateReport) { r.DeviceId = loyal.id }), `names device "loyal-1"`},
			{"body names another task", open, with(func(r *pb.UpdateReport) { r.TaskId = "t-other" }), "t-other"},
			{"body names another round", open, with(func(r *pb.UpdateReport) { r.Round = 7 }), "/7"},
			{"wrong model version", open, with(func(r *pb.UpdateReport) { r.ModelVersion = strings.Repeat("ab", 32) }), "trained on model"},
			{"wrong module", open, with(func(r *pb.UpdateReport) { r.ModuleSha256 = strings.Repeat("cd", 32) }), "ran module"},
			{"payload sha256 mismatch", open, with(func(r *pb.UpdateReport) { r.PayloadSha256 = wire.SHA256([]byte("other")) }), "does not match"},
			{"payload sha256 missing", open, with(func(r *pb.UpdateReport) { r.PayloadSha256 = "" }), "not signed"},
			{"truncated protobuf", open, []byte{0x0a, 0x40, 'x'}, "decode update report"},
			{"invalid wire type", open, []byte{0x0f, 0x01, 0x02}, "decode update report"},
			{"not protobuf", open, []byte("GET / HTTP/1.1\r\n\r\n"), "decode update report"},
			{"empty", open, nil, "refused"},
			{"evaluation on a training round", wire.EvalSubject(task, 1, rogue.id), mustMarshal(t, &pb.EvaluationReport{
				TaskId: task, Round: 1, DeviceId: rogue.id, ModelVersion: version, ModuleSha256: module, NumExamples: 5}), "evaluation report"},
			{"long metric name", open, with(func(r *pb.UpdateReport) {
				setDense(r, make([]byte, 4*dim))
				r.Metrics.Values[strings.Repeat("m", 65)] = 1
			}), "metric"},
			// A delta the aggregate would notice (norm ~47, under the bound)
			// with a heavy weight: refused for its metric, it must not move
			// the model (checked after the commit).
			{"NaN metric", open, with(func(r *pb.UpdateReport) {
				setDense(r, wire.EncodeDense(filled(dim, 9)))
				r.NumExamples = 10000
				r.Metrics.Values["loss"] = math.NaN()
			}), "metric"},
			{"just under the max payload, wrong value count", open, nearMax, "float32 values"},
		} {
			t.Run(c.name, func(t *testing.T) {
				rogue.refused(t, c.subject, c.body, task, 1, c.want)
			})
		}
	})

	t.Run("oversized", func(t *testing.T) {
		if got := rogue.nc.MaxPayload(); got != maxMsg {
			t.Fatalf("server max payload %d, want %d", got, maxMsg)
		}
		_, err := rogue.publish(open, make([]byte, maxMsg+1))
		if !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("publishing %d bytes: %v, want %v", maxMsg+1, err, nats.ErrMaxPayload)
		}
		if !rogue.nc.IsConnected() {
			t.Fatal("an oversized publish cost the device its connection")
		}
		// A client that skips the check is cut off by the server.
		if got := rawPublish(t, h.NATSURL(), rogue, open, maxMsg+1); !strings.Contains(got, "Maximum Payload") {
			t.Fatalf("server answered an oversized PUB with %q", got)
		}
	})

	t.Run("not in cohort", func(t *testing.T) {
		r := rogueUpdate(plan, stranger.id, base, 0.01, 200)
		stranger.refused(t, wire.ReportSubject(task, 1, stranger.id), mustMarshal(t, r), task, 1, `device "stranger-1" is not in the cohort of round 1`)
	})

	t.Run("unknown round and task", func(t *testing.T) {
		r := good()
		r.Round = 99
		rogue.refused(t, wire.ReportSubject(task, 99, rogue.id), mustMarshal(t, r), task, 99, fmt.Sprintf("round 99 of task %q is not open", task))
		r.TaskId = "t-unknown"
		rogue.refused(t, wire.ReportSubject("t-unknown", 1, rogue.id), mustMarshal(t, r), "t-unknown", 1, `task "t-unknown" has no open round`)
	})

	t.Run("duplicate", func(t *testing.T) {
		subj := wire.ReportSubject(task, 1, loyal.id)
		body := mustMarshal(t, loyal.sign(t, rogueUpdate(loyalPlan, loyal.id, base, 0, 10)))
		loyal.accepted(t, subj, body)
		// The same message id again is dropped by the stream itself.
		id := wire.MsgID("update", task, 1, loyal.id)
		ack, err := loyal.publish(subj, body, jetstream.WithMsgID(id))
		if err != nil || !ack.Duplicate {
			t.Fatalf("re-sent report: ack %+v, %v; want a duplicate ack", ack, err)
		}
		// A second report under another id reaches the round and is refused.
		loyal.refused(t, subj, body, task, 1, `device "loyal-1" already reported for round 1`)
	})

	// Reports on subjects that do not parse cannot be answered, but must not
	// stay in the stream either. Devices may not publish there at all (their
	// NATS permissions name their own report subjects only), so a client with
	// wider rights tries.
	wide, err := nats.Connect(h.NATSURL(), h.ServiceNATSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	wideJS, err := jetstream.New(wide)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"fl.report." + task + ".1.rogue-1.extra", "fl.report." + task + ".one.rogue-1", "fl.report." + task} {
		if _, err := wideJS.Publish(t.Context(), s, []byte("x")); err != nil {
			t.Fatalf("publish %s: %v", s, err)
		}
	}

	// Only now do the honest agents arrive; the round still has its seats.
	fl := startFleet(t, h, 4, func(i int) *data.Dataset { return datatest.Synthetic(200, 8, 3, uint64(i+1)) })

	// Round 2: the loyal device joins again, the rogue does not.
	loyalPlan = loyal.join(t, task, 2)
	r1 := h.Rounds(t, task)[0]
	t.Logf("round 1: %v assigned %d reported %d dropped %d (%s)", r1.State, r1.Assigned, r1.Reported, r1.Dropped, r1.Reason)
	if r1.State != pb.RoundState_ROUND_STATE_COMMITTED || r1.Assigned != 6 || r1.Reported != 5 || r1.Dropped != 1 {
		t.Errorf("round 1: %v assigned %d reported %d dropped %d, want COMMITTED 6/5/1", r1.State, r1.Assigned, r1.Reported, r1.Dropped)
	}
	// Every accepted update is small: the scripted ones are 0 or 0.01 per
	// value, an edge agent's has norm about 1. A step of norm 10 can only come
	// from a refused report (the NaN-metric one above has norm 47).
	checkStep(t, fetchModel(t, h, r1.Model.GetVersion()), base, 10)

	t.Run("closed round", func(t *testing.T) {
		rogue.refused(t, open, mustMarshal(t, good()), task, 1, fmt.Sprintf("round 1 of task %q is not open", task))
	})
	t.Run("cohort of another round", func(t *testing.T) {
		r := rogueUpdate(loyalPlan, rogue.id, fetchModel(t, h, loyalPlan.GetModel().GetVersion()), 0.01, 200)
		rogue.refused(t, wire.ReportSubject(task, 2, rogue.id), mustMarshal(t, r), task, 2, `device "rogue-1" is not in the cohort of round 2`)
	})
	loyal.accepted(t, wire.ReportSubject(task, 2, loyal.id),
		mustMarshal(t, loyal.sign(t, rogueUpdate(loyalPlan, loyal.id, fetchModel(t, h, loyalPlan.GetModel().GetVersion()), 0, 10))))

	done := h.WaitTask(t, task, 30*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	rounds := h.Rounds(t, task)
	if len(rounds) != 2 {
		t.Fatalf("%d rounds, want 2", len(rounds))
	}
	r2 := rounds[1]
	if r2.State != pb.RoundState_ROUND_STATE_COMMITTED || r2.Assigned != 5 || r2.Reported != 5 {
		t.Errorf("round 2: %v assigned %d reported %d, want COMMITTED 5/5", r2.State, r2.Assigned, r2.Reported)
	}
	if done.CurrentModel.GetVersion() != r2.Model.GetVersion() || r2.Model.GetParentVersion() != r1.Model.GetVersion() {
		t.Errorf("task ended on %s; round 2 made %s from %s, round 1 made %s", done.CurrentModel.GetVersion(),
			r2.Model.GetVersion(), r2.Model.GetParentVersion(), r1.Model.GetVersion())
	}
	checkStep(t, fetchModel(t, h, r2.Model.GetVersion()), fetchModel(t, h, r1.Model.GetVersion()), 10)
	for _, a := range fl.agents {
		if s := a.Stats(); s.Refused != 0 {
			t.Errorf("honest %s was refused: %s (%+v)", a.ID(), a.LastRefusal(), s)
		}
	}

	t.Run("finished task", func(t *testing.T) {
		r := good()
		r.Round = 3
		if _, err := rogue.publish(wire.ReportSubject(task, 3, rogue.id), mustMarshal(t, r)); err != nil {
			t.Fatal(err)
		}
		// Between the task's completion and its runner's exit the reason may
		// still say "round 3 ... is not open"; both name the task and round.
		if rc := rogue.receipt(t); rc.Accepted || !strings.Contains(rc.Reason, task) || !strings.Contains(rc.Reason, "open") {
			t.Errorf("report for a finished task: %+v", rc)
		}
	})
	rogue.noMoreReceipts(t)
	loyal.noMoreReceipts(t)
	stranger.noMoreReceipts(t)

	// Settled rounds leave nothing in the reports stream.
	ctx := context.Background()
	st, err := wideJS.Stream(ctx, wire.StreamReports)
	if err != nil {
		t.Fatal(err)
	}
	var left map[string]uint64
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("fl.>"))
		if err != nil {
			t.Fatal(err)
		}
		left = info.State.Subjects
		if len(left) == 0 || time.Now().After(end) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("%s still holds %v after the task finished", wire.StreamReports, left)
	}
}

func filled(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func nonFiniteAt(v []float32) int {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return i
		}
	}
	return -1
}

// checkStep checks a committed model against its parent: finite, and moved
// by a step of L2 norm at most bound.
func checkStep(t testing.TB, next, parent *model.Model, bound float64) {
	t.Helper()
	a, b := next.Flatten(), parent.Flatten()
	if i := nonFiniteAt(a); i >= 0 {
		t.Fatalf("committed model has %v at %d", a[i], i)
	}
	if len(a) != len(b) {
		t.Fatalf("committed model has %d values, parent %d", len(a), len(b))
	}
	var ss float64
	for i := range a {
		d := float64(a[i] - b[i])
		ss += d * d
	}
	if n := math.Sqrt(ss); !(n <= bound) {
		t.Errorf("the committed step has norm %.3g, more than the accepted reports allow (%.3g)", n, bound)
	}
}

var (
	warmMu      sync.Mutex
	warmModules = map[string]*wasm.Module{}
)

// warmModule compiles a module into the shared sandbox and keeps it loaded
// for the life of the process, like the sandbox itself, so that agents'
// first round does not wait for the compiler.
func warmModule(t testing.TB, code []byte) {
	t.Helper()
	warmMu.Lock()
	defer warmMu.Unlock()
	sha := wasm.Hash(code)
	if warmModules[sha] != nil {
		return
	}
	m, err := sharedSandbox(t).Load(context.Background(), code, sha)
	if err != nil {
		t.Fatal(err)
	}
	warmModules[sha] = m
}

// rawPublish speaks the NATS protocol directly, announcing a PUB of size
// bytes, and returns the server's answer.
func rawPublish(t testing.TB, natsURL string, as *scripted, subject string, size int) string {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("nats greeting %q: %v", line, err)
	}
	// Authenticate as the device: its user JWT and a signature of the nonce.
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "INFO ")), &info); err != nil {
		t.Fatal(err)
	}
	creds, err := os.ReadFile(filepath.Join(as.dir, edge.CredsFile))
	if err != nil {
		t.Fatal(err)
	}
	userJWT, err := natsjwt.ParseDecoratedJWT(creds)
	if err != nil {
		t.Fatal(err)
	}
	key, err := identity.LoadOrCreateUserKey(filepath.Join(as.dir, edge.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	sig, err := key.Sign([]byte(info.Nonce))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"protocol\":1,\"jwt\":%q,\"sig\":%q}\r\nPUB %s %d\r\n",
		userJWT, base64.RawURLEncoding.EncodeToString(sig), subject, size)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return "error: " + err.Error()
		}
		if strings.HasPrefix(line, "-ERR") {
			return strings.TrimSpace(line)
		}
	}
}
