package server_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

const (
	int8Enc = pb.UpdateEncoding_UPDATE_ENCODING_INT8
	int4Enc = pb.UpdateEncoding_UPDATE_ENCODING_INT4
)

// TestQuantizedRounds: tasks whose devices send int8 and int4 updates run
// real rounds (server, five agents, embedded NATS): every round commits
// with quantized reports the server decodes, and the model learns.
func TestQuantizedRounds(t *testing.T) {
	if testing.Short() {
		t.Skip("two tasks of three real rounds each")
	}
	for _, enc := range []pb.UpdateEncoding{int8Enc, int4Enc} {
		t.Run(enc.String(), func(t *testing.T) {
			h := servertest.New(t)
			init, _ := train.InitMLP([]int{8, 3}, 1)
			version := h.ImportModel(t, "synthetic", init)
			module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
			startFleet(t, h, 5, func(i int) *data.Dataset { return datatest.Synthetic(200, 8, 3, uint64(i+1)) })
			spec := baseTask("quantized", version, module, 3)
			spec.UpdateEncoding = enc
			task := h.CreateTask(t, spec)
			if task.UpdateEncoding != enc {
				t.Fatalf("task has encoding %v, want %v", task.UpdateEncoding, enc)
			}
			done := h.WaitTask(t, task.Id, 60*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
			if done.State != pb.TaskState_TASK_STATE_COMPLETED {
				t.Fatalf("task %v: %s", done.State, done.StateReason)
			}
			rounds := h.Rounds(t, task.Id)
			for _, r := range rounds {
				t.Logf("round %d %v reported %d metrics %v %s %v", r.Round, r.State, r.Reported, r.Metrics.GetValues(), r.Reason, r.Failures)
				if r.State != pb.RoundState_ROUND_STATE_COMMITTED || r.Reported < 2 || len(r.Failures) > 0 {
					t.Fatalf("round %d: %v with %d reports, failures %v", r.Round, r.State, r.Reported, r.Failures)
				}
			}
			first, last := rounds[0].Metrics.GetValues()["train_loss"], rounds[len(rounds)-1].Metrics.GetValues()["train_loss"]
			if !(last < first) {
				t.Fatalf("train loss did not fall: %v -> %v", first, last)
			}
		})
	}
}

// TestSecureInt8Rounds: an int8 task with secure aggregation runs in an
// 8-bit ring (bits left 0 become 8), its devices send packed one-byte
// masked values and keep their rounding residual, and the model moves by
// what the trivial module adds, within the 8-bit ring's step.
func TestSecureInt8Rounds(t *testing.T) {
	if testing.Short() {
		t.Skip("secure rounds take several stage timeouts")
	}
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond))
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{4, 5}, Data: make([]float32, 20)},
		model.Tensor{Name: "b", Shape: []int{5}, Data: []float32{1, 2, 3, 4, 5}})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "secure", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	const n = 6
	for i := range n {
		id := fmt.Sprintf("dev-%03d", i)
		a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, id), DeviceID: id},
			edge.WithDataset(datatest.Synthetic(20, 4, 2, uint64(i+1))), edge.WithSandbox(sharedSandbox(t)))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(ctx) }()
	}
	const clip, rounds = 0.01, 3
	task := h.CreateTask(t, &pb.Task{Name: "secure-int8", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: n, ReportGoal: n, RoundsTotal: rounds, SelectionTimeout: durationpb.New(10 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second), UpdateEncoding: int8Enc,
		Secagg: &pb.SecAggConfig{ClipRange: clip, MaxWeight: 1, StageTimeout: durationpb.New(2500 * time.Millisecond)}})
	if task.GetSecagg().GetBits() != 8 {
		t.Fatalf("int8 task has a %d-bit ring, want 8", task.GetSecagg().GetBits())
	}
	done := h.WaitTask(t, task.Id, 90*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	for _, r := range h.Rounds(t, task.Id) {
		t.Logf("round %d %v reported %d: %s", r.Round, r.State, r.Reported, r.Reason)
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED || r.Reported != n {
			t.Fatalf("round %d %v with %d reports: %s", r.Round, r.State, r.Reported, r.Reason)
		}
	}
	_, b, err := client.ExportModelBytes(t.Context(), h.Models, done.CurrentModel.GetVersion(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.DecodeSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	q, err := secagg.NewQuantizer(8, clip, n, 1)
	if err != nil {
		t.Fatal(err)
	}
	// With error feedback each device's sent updates sum to what it trained
	// minus its last residual (under one step); the weights' own rounding
	// (1/wscale of 6) moves the mean by a few percent more.
	want, tol := rounds*wasmtest.TrivialStep, q.Step()+0.1*rounds*wasmtest.TrivialStep
	for i, v := range got.Flatten() {
		if d := float64(v - base.Flatten()[i]); math.Abs(d-want) > tol {
			t.Fatalf("parameter %d moved by %v, want %v ± %v", i, d, want, tol)
		}
	}
}

// TestEncodingTaskRefused: encodings that cannot run with a task's other
// settings are refused when the task is created, naming the conflict.
func TestEncodingTaskRefused(t *testing.T) {
	h := servertest.New(t)
	base, _ := model.New(model.Tensor{Name: "w", Shape: []int{2, 2}, Data: make([]float32, 4)})
	version := h.ImportModel(t, "enc", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	for _, tc := range []struct {
		name string
		edit func(*pb.Task)
		want string
	}{
		{"unknown encoding", func(t *pb.Task) { t.UpdateEncoding = 9 }, "is not none, int8 or int4"},
		{"int4 with secagg", func(t *pb.Task) { t.UpdateEncoding, t.Secagg = int4Enc, &pb.SecAggConfig{} }, "int4 cannot run with secure aggregation"},
		{"int8 with a 16-bit ring", func(t *pb.Task) { t.UpdateEncoding, t.Secagg = int8Enc, &pb.SecAggConfig{Bits: 16} }, "secagg.bits is 16"},
		// 2^7 − 1 − n must stay positive: 130 slots leave no headroom.
		{"int8 with 130 slots", func(t *pb.Task) {
			t.UpdateEncoding, t.Secagg, t.CohortTarget, t.ReportGoal = int8Enc, &pb.SecAggConfig{}, 130, 100
		}, "8 bits cannot hold a sum of 130"},
		{"int8 with distributed DP", func(t *pb.Task) {
			t.UpdateEncoding, t.Secagg = int8Enc, &pb.SecAggConfig{}
			t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
				TargetEpsilon: 10, Delta: 1e-5, MinNoiseContributors: 5}
		}, "distributed DP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := &pb.Task{Name: "enc", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
				CohortTarget: 10, ReportGoal: 5, RoundsTotal: 1}
			tc.edit(task)
			_, err := h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: task})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want InvalidArgument mentioning %q", err, tc.want)
			}
		})
	}
}

// quantizedUpdate turns a well-formed float32 report into a quantized one
// of encoding enc (its values quantized with bits).
func quantizedUpdate(t testing.TB, r *pb.UpdateReport, enc pb.UpdateEncoding, bits int) *pb.UpdateReport {
	t.Helper()
	d := r.GetDense()
	v, err := wire.DecodeDense(d.Values, len(d.Values)/4)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := quant.Encode(v, bits, quant.DefaultBlock, rand.NewPCG(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	r.Payload = &pb.UpdateReport_Quantized{Quantized: &pb.QuantizedUpdate{Encoding: enc, Data: b, Layout: d.Layout}}
	r.PayloadSha256 = wire.SHA256(b)
	return r
}

func setQuantized(r *pb.UpdateReport, b []byte) {
	r.GetQuantized().Data = b
	r.PayloadSha256 = wire.SHA256(b)
}

// TestBadQuantizedReportsAreRefused: in an int8 task a scripted device in
// the cohort sends quantized reports that are malformed, of another
// encoding or for another layout; each is refused with a receipt naming the
// problem, and a well-formed one from the same device then counts.
func TestBadQuantizedReportsAreRefused(t *testing.T) {
	h := servertest.New(t)
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "synthetic", init)
	code := wasmtest.Build(t, wasmtest.Softmax)
	module := h.RegisterModule(t, "softmax", code)
	spec := baseTask("bad-quantized", version, module, 1)
	spec.UpdateEncoding = int8Enc
	spec.CohortTarget, spec.ReportGoal, spec.OverSelection = 1, 1, 0
	spec.SelectionTimeout, spec.ReportTimeout = durationpb.New(30*time.Second), durationpb.New(30*time.Second)
	spec.Aggregation = &pb.AggregationConfig{MaxUpdateNorm: 50}
	task := h.CreateTask(t, spec).Id
	rogue := newScripted(t, h, "rogue-q")
	plan := rogue.join(t, task, 1)
	if plan.UpdateEncoding != int8Enc {
		t.Fatalf("plan has encoding %v, want int8", plan.UpdateEncoding)
	}
	base := fetchModel(t, h, version)
	dim := base.Layout().Size()
	key, err := identity.LoadOrCreateUserKey(filepath.Join(rogue.dir, edge.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	good := func() *pb.UpdateReport {
		return quantizedUpdate(t, rogueUpdate(plan, rogue.id, base, 0.01, 200), int8Enc, 8)
	}
	with := func(mut func(r *pb.UpdateReport)) []byte {
		r := good()
		mut(r)
		return mustMarshal(t, signed(t, key, r))
	}
	data := good().GetQuantized().Data
	nanScale := append([]byte(nil), data...)
	copy(nanScale[13:17], []byte{0, 0, 0xc0, 0x7f})
	open := wire.ReportSubject(task, 1, rogue.id)
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"float32 in an int8 task", mustMarshal(t, signed(t, key, rogueUpdate(plan, rogue.id, base, 0.01, 200))), "update is float32, task " + task + " takes int8 updates"},
		{"int4 in an int8 task", with(func(r *pb.UpdateReport) { r.GetQuantized().Encoding = int4Enc }), "update is int4-quantized, task " + task + " takes int8 updates"},
		{"int4 bytes labelled int8", with(func(r *pb.UpdateReport) {
			q := quantizedUpdate(t, rogueUpdate(plan, rogue.id, base, 0.01, 200), int4Enc, 4)
			setQuantized(r, q.GetQuantized().Data)
		}), `magic "FLQ4", want "FLQ8"`},
		{"truncated", with(func(r *pb.UpdateReport) { setQuantized(r, data[:len(data)-1]) }), fmt.Sprintf("%d bytes, want %d", len(data)-1, len(data))},
		{"oversized", with(func(r *pb.UpdateReport) { setQuantized(r, append(append([]byte(nil), data...), 0)) }), fmt.Sprintf("%d bytes, want %d", len(data)+1, len(data))},
		{"header only", with(func(r *pb.UpdateReport) { setQuantized(r, data[:5]) }), "shorter than the 13-byte header"},
		{"NaN scale", with(func(r *pb.UpdateReport) { setQuantized(r, nanScale) }), "scale 0 = NaN"},
		{"another model's length", with(func(r *pb.UpdateReport) {
			b, _, _ := quant.Encode(make([]float32, dim+1), 8, quant.DefaultBlock, rand.NewPCG(1, 1))
			setQuantized(r, b)
		}), fmt.Sprintf("%d values, want %d", dim+1, dim)},
		{"layout mismatch", with(func(r *pb.UpdateReport) { r.GetQuantized().Layout[0].Shape = []uint64{8, 3} }), "has shape"},
		{"layout short", with(func(r *pb.UpdateReport) { r.GetQuantized().Layout = r.GetQuantized().Layout[:1] }), "update has 1 tensors"},
		{"hash of other bytes", with(func(r *pb.UpdateReport) { r.PayloadSha256 = wire.SHA256([]byte("x")) }), "does not match"},
		{"bytes altered after signing", func() []byte {
			r := signed(t, key, good())
			r.GetQuantized().Data[len(data)-1] ^= 1
			r.PayloadSha256 = wire.SHA256(r.GetQuantized().Data)
			return mustMarshal(t, r)
		}(), "signature does not verify"},
	} {
		t.Run(c.name, func(t *testing.T) { rogue.refused(t, open, c.body, task, 1, c.want) })
	}
	rogue.accepted(t, open, mustMarshal(t, signed(t, key, good())))
	done := h.WaitTask(t, task, 30*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	next := fetchModel(t, h, done.CurrentModel.GetVersion())
	for i, v := range next.Flatten() {
		// One report of 0.01 everywhere, quantized: every value moves by
		// 0.01 within one int8 step of its block (0.01/127).
		if d := float64(v - base.Flatten()[i]); math.Abs(d-0.01) > 0.01/127*1.01 {
			t.Fatalf("parameter %d moved by %v, want 0.01", i, d)
		}
	}
}

// TestReportBytes measures a report's protobuf size as an agent publishes
// it (the same UpdateReport fields, signature included) for the demo's
// 784-128-10 MLP: float32, int8 and int4 in plaintext rounds, and the
// masked update of a secure round as fixed32 values and packed in 32-, 20-
// and 8-bit rings. docs/BENCHMARKS.md quotes it.
func TestReportBytes(t *testing.T) {
	m, err := train.InitMLP([]int{784, 128, 10}, 1)
	if err != nil {
		t.Fatal(err)
	}
	dim := m.Layout().Size()
	r := rand.New(rand.NewPCG(3, 4))
	delta := make([]float32, dim)
	for i := range delta {
		delta[i] = float32(r.NormFloat64() * 0.01)
	}
	plan := &pb.RoundPlan{TaskId: "t-0123456789ab", Round: 17, Model: &pb.ModelRef{Version: strings.Repeat("ab", 32)},
		Module: &pb.ModuleRef{Sha256: strings.Repeat("cd", 32)}}
	key, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	report := func(r *pb.UpdateReport) int {
		r = signed(t, key, r)
		return proto.Size(r)
	}
	dense := rogueUpdate(plan, "dev-042", m, 0, 550)
	setDense(dense, wire.EncodeDense(delta))
	f32 := report(proto.Clone(dense).(*pb.UpdateReport))
	i8 := report(quantizedUpdate(t, proto.Clone(dense).(*pb.UpdateReport), int8Enc, 8))
	i4 := report(quantizedUpdate(t, proto.Clone(dense).(*pb.UpdateReport), int4Enc, 4))
	t.Logf("plaintext, %d parameters: float32 %d B, int8 %d B (%.2fx), int4 %d B (%.2fx)", dim, f32, i8, float64(f32)/float64(i8), i4, float64(f32)/float64(i4))
	if float64(f32)/float64(i8) < 3.5 {
		t.Fatalf("int8 report is only %.2fx smaller than float32", float64(f32)/float64(i8))
	}
	masked := func(bits int, pack bool) int {
		v := make([]uint32, dim+1) // the update and its weight
		for i := range v {
			v[i] = r.Uint32() & uint32(1<<bits-1) // masked values are uniform in the ring
		}
		mu := &pb.MaskedUpdate{ParticipantId: 17, Bits: uint32(bits), Values: v}
		sum := wire.MaskedSHA256(mu)
		if pack {
			if err := secagg.Pack(mu); err != nil {
				t.Fatal(err)
			}
		}
		return report(&pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: "dev-042",
			ModelVersion: plan.Model.Version, ModuleSha256: plan.Module.Sha256,
			Payload: &pb.UpdateReport_Masked{Masked: mu}, PayloadSha256: sum})
	}
	fixed32, p32, p20, p8 := masked(32, false), masked(32, true), masked(20, true), masked(8, true)
	t.Logf("secure: fixed32 %d B; packed 32-bit %d B, 20-bit %d B (%.2fx), 8-bit %d B (%.2fx)", fixed32, p32, p20,
		float64(fixed32)/float64(p20), p8, float64(fixed32)/float64(p8))
}
