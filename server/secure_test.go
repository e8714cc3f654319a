package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestSecureRounds: rounds of a task with secure aggregation run over NATS
// through the SecAgg+ stages while one device vanishes after uploading its
// keys (and then sits a round out) and another after uploading its masked
// update every round; each round commits
// the sum of the survivors only, which the server learns unmasked: with the
// trivial module every update is +0.001 with weight 1, so the model moves by
// exactly that (up to quantization) per round.
func TestSecureRounds(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond))
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{4, 5}, Data: make([]float32, 20)},
		model.Tensor{Name: "b", Shape: []int{5}, Data: []float32{1, 2, 3, 4, 5}})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "secure", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	var drops atomic.Int64
	dropAt := func(at string) func(string, uint64, string) bool {
		return func(_ string, _ uint64, stage string) bool {
			if stage == at {
				drops.Add(1)
				return true
			}
			return false
		}
	}
	// dev-000 leaves every round after uploading its keys, dev-001 after its
	// masked update; the other six behave.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i := range 8 {
		opts := []edge.Option{edge.WithDataset(datatest.Synthetic(20, 4, 2, uint64(i+1))), edge.WithSandbox(sharedSandbox(t))}
		switch i {
		case 0:
			opts = append(opts, edge.WithDropout(dropAt(edge.DropAfterAdvertise)))
		case 1:
			opts = append(opts, edge.WithDropout(dropAt(edge.DropAfterMasked)))
		}
		id := fmt.Sprintf("dev-%03d", i)
		a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, id), DeviceID: id}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(ctx) }()
	}
	task := h.CreateTask(t, &pb.Task{Name: "secure", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 8, ReportGoal: 5, RoundsTotal: 2, SelectionTimeout: durationpb.New(10 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second),
		Secagg:        &pb.SecAggConfig{ClipRange: 0.01, MaxWeight: 1, StageTimeout: durationpb.New(2500 * time.Millisecond)}})
	done := h.WaitTask(t, task.Id, 90*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	committed := 0
	for _, r := range h.Rounds(t, task.Id) {
		t.Logf("round %d %v assigned %d reported %d dropped %d: %s", r.Round, r.State, r.Assigned, r.Reported, r.Dropped, r.Reason)
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
			continue
		}
		committed++
		// The one that left after its keys is not in the sum; the one that
		// left after its masked update is (its self mask is removed with
		// its neighbours' shares). Having held its seat in silence through
		// a stage's timeout, the first sits round 2 out.
		want := uint32(8)
		if r.Round == 2 {
			want = 7
		}
		if r.Assigned != want || r.Reported != 7 || !strings.Contains(r.Reason, "secure sum of 7") {
			t.Errorf("round %d: assigned %d, reported %d (%s), want %d and 7", r.Round, r.Assigned, r.Reported, r.Reason, want)
		}
	}
	if committed != 2 || drops.Load() < 3 {
		t.Fatalf("%d rounds committed, %d dropouts", committed, drops.Load())
	}
	// The audit log names each secure round's parameters by digest.
	res, err := apiv1.NewAuditServiceClient(h.Conn).QueryEntries(t.Context(), &pb.QueryEntriesRequest{
		Filter: &pb.AuditFilter{TaskId: task.Id, EventType: string(audit.TypeRoundOpened)}})
	if err != nil || len(res.GetEntries()) < 2 {
		t.Fatalf("round.opened entries: %d, %v", len(res.GetEntries()), err)
	}
	for _, e := range res.GetEntries() {
		if !bytes.Contains(e.GetJws(), []byte(".")) {
			t.Fatal("entry is not a JWS")
		}
		ev, err := audit.ParseEvent(jwsPayload(t, e.GetJws()))
		if err != nil {
			t.Fatal(err)
		}
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		if p.(audit.RoundOpened).SecAggSHA256 == "" {
			t.Fatalf("round %d opened without a SecAgg parameters digest", p.(audit.RoundOpened).Round)
		}
	}
	checkMovedBy(t, h, base, done.CurrentModel.GetVersion(), 2*wasmtest.TrivialStep)
}

// TestSecureRoundsInGroups: a cohort of 24 with a group size of 10 runs as
// three SecAgg+ instances of 8 (the plans give each device its group and
// its number in it); one device vanishes after its keys, another after its
// masked update. Each round commits the sum of the 23 survivors over all
// groups, and the model moves by exactly one step a round.
func TestSecureRoundsInGroups(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond))
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{4, 5}, Data: make([]float32, 20)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "grouped", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	const devices = 24
	for i := range devices {
		opts := []edge.Option{edge.WithDataset(datatest.Synthetic(20, 4, 2, uint64(i+1))), edge.WithSandbox(sharedSandbox(t))}
		switch i {
		case 0:
			opts = append(opts, edge.WithDropout(func(_ string, _ uint64, stage string) bool { return stage == edge.DropAfterAdvertise }))
		case 1:
			opts = append(opts, edge.WithDropout(func(_ string, _ uint64, stage string) bool { return stage == edge.DropAfterMasked }))
		}
		id := fmt.Sprintf("dev-%03d", i)
		a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, id), DeviceID: id}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(ctx) }()
	}
	task := h.CreateTask(t, &pb.Task{Name: "grouped", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: devices, ReportGoal: 15, RoundsTotal: 2, SelectionTimeout: durationpb.New(20 * time.Second),
		ReportTimeout: durationpb.New(30 * time.Second),
		Secagg: &pb.SecAggConfig{ClipRange: 0.01, MaxWeight: 1, GroupSize: 10,
			StageTimeout: durationpb.New(2500 * time.Millisecond)}})
	done := h.WaitTask(t, task.Id, 3*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	committed := 0
	for _, r := range h.Rounds(t, task.Id) {
		t.Logf("round %d %v assigned %d reported %d dropped %d: %s", r.Round, r.State, r.Assigned, r.Reported, r.Dropped, r.Reason)
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
			continue
		}
		committed++
		if r.Reported != devices-1 || !strings.Contains(r.Reason, fmt.Sprintf("secure sum of %d masked updates from 3 of 3 groups", devices-1)) {
			t.Errorf("round %d: reported %d (%s), want %d from 3 of 3 groups", r.Round, r.Reported, r.Reason, devices-1)
		}
	}
	if committed != 2 {
		t.Fatalf("%d rounds committed, want 2", committed)
	}
	checkMovedBy(t, h, base, done.CurrentModel.GetVersion(), 2*wasmtest.TrivialStep)
}

// checkMovedBy checks that every parameter of version is base's plus step
// (up to quantization): what rounds of the trivial module give.
func checkMovedBy(t *testing.T, h *servertest.Harness, base *model.Model, version string, step float64) {
	t.Helper()
	_, b, err := client.ExportModelBytes(t.Context(), h.Models, version, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.DecodeSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	want := base.Flatten()
	for i, v := range got.Flatten() {
		if d := float64(v - want[i]); math.Abs(d-step) > 1e-6 {
			t.Fatalf("parameter %d moved by %v, want %v", i, d, step)
		}
	}
}

// TestSecureTaskRefused: settings secure aggregation cannot honour are refused
// when the task is created.
func TestSecureTaskRefused(t *testing.T) {
	h := servertest.New(t)
	base, _ := model.New(model.Tensor{Name: "w", Shape: []int{2, 2}, Data: make([]float32, 4)})
	version := h.ImportModel(t, "secure", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	for _, tc := range []struct {
		name string
		edit func(*pb.Task)
		want string
	}{
		{"median", func(t *pb.Task) {
			t.Aggregation = &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_MEDIAN}
		}, "individual updates"},
		{"trimmed mean", func(t *pb.Task) {
			t.Aggregation = &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_TRIMMED_MEAN, TrimFraction: 0.1}
		}, "individual updates"},
		{"threshold at most k/2", func(t *pb.Task) { t.Secagg.K, t.Secagg.Threshold = 4, 2 }, "threshold"},
		{"too many bits", func(t *pb.Task) { t.Secagg.Bits = 33 }, "bits"},
		{"negative clip range", func(t *pb.Task) { t.Secagg.ClipRange = -1 }, "clip range"},
		{"NaN weight bound", func(t *pb.Task) { t.Secagg.MaxWeight = math.NaN() }, "max_weight"},
		{"one device", func(t *pb.Task) { t.CohortTarget, t.ReportGoal = 1, 1 }, "participants"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := &pb.Task{Name: "secure", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
				CohortTarget: 10, ReportGoal: 5, RoundsTotal: 1, Secagg: &pb.SecAggConfig{}}
			tc.edit(task)
			_, err := h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: task})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want InvalidArgument mentioning %q", err, tc.want)
			}
		})
	}
}

// jwsPayload returns the payload of a compact JWS without verifying it.
func jwsPayload(t *testing.T, jws []byte) []byte {
	t.Helper()
	parts := bytes.Split(jws, []byte("."))
	if len(parts) != 3 {
		t.Fatalf("JWS has %d parts", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(string(parts[1]))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSecAggUpRefused: stage messages that cannot count are answered with
// a refusal naming the reason, and the server stays up.
func TestSecAggUpRefused(t *testing.T) {
	h := servertest.New(t)
	d := newScripted(t, h, "dev-x")
	ask := func(subject string, body []byte) *pb.SecAggAck {
		t.Helper()
		msg, err := d.nc.Request(subject, body, 5*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", subject, err)
		}
		var ack pb.SecAggAck
		if err := proto.Unmarshal(msg.Data, &ack); err != nil {
			t.Fatal(err)
		}
		return &ack
	}
	subj := wire.SecAggUpSubject("t-none", 1, "dev-x")
	for _, tc := range []struct {
		name string
		body []byte
		want string
	}{
		{"not protobuf", []byte("GET / HTTP/1.1\r\n"), "malformed message"},
		{"body names another device", mustMarshal(t, &pb.SecAggUp{TaskId: "t-none", Round: 1, DeviceId: "dev-y"}), "message names"},
		{"no open secure round", mustMarshal(t, &pb.SecAggUp{TaskId: "t-none", Round: 1, DeviceId: "dev-x",
			Msg: &pb.SecAggUp_Advertise{Advertise: &pb.AdvertiseKeys{}}}), "not an open secure round"},
		{"oversized", make([]byte, 5<<20), "exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ack := ask(subj, tc.body)
			if ack.Accepted || !strings.Contains(ack.Reason, tc.want) {
				t.Fatalf("ack %+v, want a refusal naming %q", ack, tc.want)
			}
		})
	}
}
