package server_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// dpHarness is a server with the trivial module, a small model and n agents.
func dpHarness(t *testing.T, n int) (h *servertest.Harness, version, module string, base *model.Model) {
	t.Helper()
	h = servertest.New(t, servertest.WithPace(50*time.Millisecond))
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{4, 5}, Data: make([]float32, 20)})
	if err != nil {
		t.Fatal(err)
	}
	version = h.ImportModel(t, "dp", base)
	module = h.RegisterModule(t, "trivial", wasmtest.Trivial())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
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
	return h, version, module, base
}

// TestDPBudget: a central-DP task whose ε target is reached after round k
// runs exactly k training rounds, then stops with the refusal recorded; each
// committed round states the ε spent so far, as the accountant computes it.
func TestDPBudget(t *testing.T) {
	const z, delta, k = 1.0, 1e-5, 3
	eps := func(rounds int) float64 {
		e, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: z, Steps: rounds}}, delta)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	target := (eps(k) + eps(k+1)) / 2
	h, version, module, _ := dpHarness(t, 4)
	task := h.CreateTask(t, &pb.Task{Name: "dp", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 3, ReportGoal: 3, RoundsTotal: 10, SelectionTimeout: durationpb.New(10 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second),
		Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 0.1, NoiseMultiplier: z,
			TargetEpsilon: target, Delta: delta}})
	done := h.WaitTask(t, task.Id, 60*time.Second, pb.TaskState_TASK_STATE_STOPPED, pb.TaskState_TASK_STATE_COMPLETED,
		pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_STOPPED || !strings.Contains(done.StateReason, "privacy budget") {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	committed := 0
	for _, r := range h.Rounds(t, task.Id) {
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
			continue
		}
		committed++
		if want := eps(committed); math.Abs(r.EpsilonSpent-want) > 1e-9*want {
			t.Errorf("round %d: epsilon %v, want %v", r.Round, r.EpsilonSpent, want)
		}
	}
	if committed != k {
		t.Fatalf("%d rounds committed, want exactly %d (target %v)", committed, k, target)
	}
	res, err := apiv1.NewAuditServiceClient(h.Conn).QueryEntries(t.Context(), &pb.QueryEntriesRequest{
		Filter: &pb.AuditFilter{TaskId: task.Id, EventType: string(audit.TypeBudgetRefused)}})
	if err != nil || len(res.GetEntries()) != 1 {
		t.Fatalf("budget refusals in the audit log: %d, %v", len(res.GetEntries()), err)
	}
	spent, err := apiv1.NewAuditServiceClient(h.Conn).QueryEntries(t.Context(), &pb.QueryEntriesRequest{
		Filter: &pb.AuditFilter{TaskId: task.Id, EventType: string(audit.TypePrivacySpent)}})
	if err != nil || len(spent.GetEntries()) != k {
		t.Fatalf("privacy spent entries: %d, %v", len(spent.GetEntries()), err)
	}
}

// TestDistributedDP: with secure aggregation and the distributed discrete
// Gaussian, each device noises its own update and the server decodes the
// noised sum: the model moves by the devices' mean update within the noise,
// and each round's ε is the mechanism's.
func TestDistributedDP(t *testing.T) {
	const clip, z, delta = 0.01, 0.5, 1e-5
	h, version, module, base := dpHarness(t, 6)
	task := h.CreateTask(t, &pb.Task{Name: "ddg", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 6, ReportGoal: 5, RoundsTotal: 2, SelectionTimeout: durationpb.New(10 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second),
		Secagg:        &pb.SecAggConfig{StageTimeout: durationpb.New(3 * time.Second)},
		Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, ClipNorm: clip,
			NoiseMultiplier: z, TargetEpsilon: 1e6, Delta: delta}})
	done := h.WaitTask(t, task.Id, 90*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED,
		pb.TaskState_TASK_STATE_STOPPED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	dist, err := dp.NewDistributed(dp.DiscreteGaussian, 20, 32, 5, clip, z)
	if err != nil {
		t.Fatal(err)
	}
	committed := 0
	var reported []float64
	for _, r := range h.Rounds(t, task.Id) {
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
			continue
		}
		committed++
		reported = append(reported, float64(r.Reported))
		want, err := dist.Epsilon(committed, delta)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(r.EpsilonSpent-want) > 1e-9*want {
			t.Errorf("round %d: epsilon %v, want %v", r.Round, r.EpsilonSpent, want)
		}
	}
	if committed != 2 {
		t.Fatalf("%d rounds committed", committed)
	}
	_, b, err := client.ExportModelBytes(t.Context(), h.Models, done.CurrentModel.GetVersion(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.DecodeSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	// Each round moves every parameter by 0.001 plus noise of std z·C/n on
	// the mean; over 20 parameters and 2 rounds the average move is within
	// 5 standard errors of 0.002.
	var move, noiseVar float64
	for i, v := range got.Flatten() {
		move += float64(v - base.Flatten()[i])
	}
	move /= 20
	for _, n := range reported {
		noiseVar += (z * clip / n) * (z * clip / n)
	}
	if se := math.Sqrt(noiseVar / 20); math.Abs(move-2*wasmtest.TrivialStep) > 5*se+1e-4 {
		t.Fatalf("mean parameter move %v, want %v ± %v", move, 2*wasmtest.TrivialStep, 5*se)
	}
}

// TestDPTaskRefused: DP settings that cannot be honoured are refused at task
// creation.
func TestDPTaskRefused(t *testing.T) {
	h := servertest.New(t)
	base, _ := model.New(model.Tensor{Name: "w", Shape: []int{2, 2}, Data: make([]float32, 4)})
	version := h.ImportModel(t, "dp", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	central := func() *pb.DPConfig {
		return &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
			TargetEpsilon: 5, Delta: 1e-5}
	}
	for _, tc := range []struct {
		name string
		edit func(*pb.Task)
		want string
	}{
		{"distributed without secagg", func(t *pb.Task) {
			t.Dp.Mechanism = pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN
		}, "needs secure aggregation"},
		{"skellam claiming amplification", func(t *pb.Task) {
			t.Dp.Mechanism, t.Dp.SamplingRate = pb.DPMechanism_DP_MECHANISM_SKELLAM, 0.1
			t.Secagg = &pb.SecAggConfig{}
		}, "amplification"},
		{"zero clip norm", func(t *pb.Task) { t.Dp.ClipNorm = 0 }, "clip_norm"},
		{"NaN noise", func(t *pb.Task) { t.Dp.NoiseMultiplier = math.NaN() }, "noise_multiplier"},
		{"no delta", func(t *pb.Task) { t.Dp.Delta = 0 }, "delta"},
		{"no target", func(t *pb.Task) { t.Dp.TargetEpsilon = -1 }, "target_epsilon"},
		{"sampling rate above 1", func(t *pb.Task) { t.Dp.SamplingRate = 1.5 }, "sampling_rate"},
		{"adaptive clipping with local noise", func(t *pb.Task) {
			t.Dp.TargetUnclippedQuantile, t.Dp.Mechanism = 0.5, pb.DPMechanism_DP_MECHANISM_LOCAL
		}, "adaptive clipping"},
		{"adaptive clipping's quantile", func(t *pb.Task) { t.Dp.TargetUnclippedQuantile = 1 }, "target_unclipped_quantile"},
		{"adaptive clipping's count noise", func(t *pb.Task) { t.Dp.TargetUnclippedQuantile, t.Dp.ClipCountStddev = 0.5, 0.01 },
			"clip_count_stddev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := &pb.Task{Name: "dp", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
				CohortTarget: 10, ReportGoal: 5, RoundsTotal: 1, Dp: central()}
			tc.edit(task)
			_, err := h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: task})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want InvalidArgument mentioning %q", err, tc.want)
			}
		})
	}
}

// TestDPParticipationCap: with max_rounds_per_device 1, no device
// contributes to two rounds: four devices fill two rounds of two, and the
// third round finds nobody left to select.
func TestDPParticipationCap(t *testing.T) {
	h, version, module, _ := dpHarness(t, 4)
	task := h.CreateTask(t, &pb.Task{Name: "cap", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 2, ReportGoal: 2, RoundsTotal: 3, SelectionTimeout: durationpb.New(2 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second),
		Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 0.1, NoiseMultiplier: 1,
			TargetEpsilon: 1e6, Delta: 1e-5, MaxRoundsPerDevice: 1}})
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rs := h.Rounds(t, task.Id)
		if len(rs) >= 3 && rs[2].State == pb.RoundState_ROUND_STATE_ABANDONED {
			for _, r := range rs[:2] {
				if r.State != pb.RoundState_ROUND_STATE_COMMITTED || r.Reported != 2 {
					t.Fatalf("round %d: %v with %d reports", r.Round, r.State, r.Reported)
				}
			}
			// The reason tells the operator why: the fleet is used up, not absent.
			if rs[2].Assigned != 0 || !strings.Contains(rs[2].Reason, "selection closed with 0") ||
				!strings.Contains(rs[2].Reason, "devices checked in but had reached the task's cap of 1 rounds each") {
				t.Fatalf("round 3: %+v", rs[2])
			}
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no round found the fleet exhausted: %+v", rs)
		}
	}
}
