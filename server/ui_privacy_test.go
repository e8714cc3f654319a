package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestDashboardPrivacySettings: a task's page shows its secure aggregation
// and DP settings as its rounds run them, defaults filled in, and says so
// when a task has neither.
func TestDashboardPrivacySettings(t *testing.T) {
	h := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.UIAddr = "127.0.0.1:0" }))
	base, _ := model.New(model.Tensor{Name: "w", Shape: []int{2, 2}, Data: make([]float32, 4)})
	version := h.ImportModel(t, "ui", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	task := func(name string) *pb.Task {
		return &pb.Task{Name: name, Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
			CohortTarget: 10, OverSelection: 0.3, ReportGoal: 8, RoundsTotal: 5}
	}
	private := task("private")
	private.Secagg = &pb.SecAggConfig{K: 4, Bits: 24, ClipRange: 0.5, StageTimeout: durationpb.New(30 * time.Second)}
	private.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, ClipNorm: 0.5,
		NoiseMultiplier: 1.2, TargetEpsilon: 40, Delta: 1e-6, MaxRoundsPerDevice: 3}
	privateID := h.CreateTask(t, private).Id
	centralTask := task("central")
	centralTask.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1,
		NoiseMultiplier: 1, TargetEpsilon: 8, Delta: 1e-5, SamplingRate: 0.05}
	centralID := h.CreateTask(t, centralTask).Id
	ftrl := task("ftrl")
	ftrl.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 2,
		TargetEpsilon: 8, Delta: 1e-6, MinSeparation: 2, Noise: pb.DPNoise_DP_NOISE_BLT}
	ftrlID := h.CreateTask(t, ftrl).Id
	plainID := h.CreateTask(t, task("plain")).Id
	grouped := task("grouped")
	grouped.Secagg = &pb.SecAggConfig{GroupSize: 10}
	groupedID := h.CreateTask(t, grouped).Id
	async := task("async")
	async.Async = &pb.AsyncConfig{Concurrency: 20, Buffer: 5, MaxStaleness: 3}
	asyncID := h.CreateTask(t, async).Id

	tok, err := h.MintToken("olga", []identity.Role{identity.RoleOperator}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, &dashboardFixture{h: h, url: h.UIURL()})
	b.login(tok)
	page := func(id string) string {
		code, body := b.get("/tasks/" + id)
		if code != 200 {
			t.Fatalf("task page %s: %d %s", id, code, body)
		}
		return body
	}
	check := func(id, body string, want []string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("task %s page lacks %s", id, w)
			}
		}
	}
	// 13 slots, k 4, threshold 4/2+1; the weight bound of DP and its
	// defaults from the server.
	check(privateID, page(privateID), []string{
		`id="secagg-participants">13 a round<`, `id="secagg-k">4 each<`, `id="secagg-threshold">3<`, `id="secagg-bits">24 bits<`,
		`id="secagg-clip-range">±0.5<`, `id="secagg-max-weight">1 (DP weighs every update 1)<`, `id="secagg-stage-timeout">30s<`,
		`id="dp-mechanism">distributed discrete gaussian: devices add shares of discrete Gaussian noise under secure aggregation<`,
		`id="dp-noise-multiplier">1.2<`, `id="dp-clip-norm">0.5<`, `id="dp-accountant">rdp, of the distributed mechanism<`,
		`id="dp-contributors">at least 8<`, `id="dp-max-rounds">at most 3<`, `id="epsilon-budget" data-value="40"`,
	})
	check(asyncID, page(asyncID), []string{
		`id="task-async">asynchronous: up to 20 devices training at once, a version every 5 reports, each weighted 1/√(1+staleness); reports more than 3 versions stale are refused<`,
		`id="task-async-last">none committed yet<`,
	})
	check(centralID, page(centralID), []string{
		"This task runs without secure aggregation", `id="dp-mechanism">central gaussian: the server adds Gaussian noise to the aggregate<`,
		`id="dp-accountant">rdp<`, `id="dp-sampling-rate">0.05 assumed<`,
	})
	check(ftrlID, page(ftrlID), []string{
		`id="dp-mechanism">central gaussian: the server adds Gaussian noise to the aggregate, correlated across rounds by a fitted BLT (DP-FTRL)<`,
		`id="dp-min-separation">at least 2 training rounds apart for a device<`, `id="epsilon-chart"`,
	})
	// ε against rounds for the chosen mechanism: the BLT task's plan and
	// budget are drawn before any round has run.
	if code, svg := b.get("/tasks/" + ftrlID + "/privacy/chart"); code != 200 || !strings.Contains(svg, "<svg") ||
		!strings.Contains(svg, "planned") || !strings.Contains(svg, "budget") {
		t.Errorf("privacy chart: %d %.300s", code, svg)
	}
	adaptive := task("adaptive")
	adaptive.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
		TargetEpsilon: 8, Delta: 1e-6, TargetUnclippedQuantile: 0.5}
	adaptiveID := h.CreateTask(t, adaptive).Id
	check(adaptiveID, page(adaptiveID), []string{
		`id="dp-clip-norm">1 in the first round, then adaptive: toward the 0.5 quantile of update norms at rate 0.2, count noise 1, updates noised at 1.1547 (`,
	})
	// 13 slots in groups of at most 10: two groups, of 7 and 6, each a
	// complete graph.
	check(groupedID, page(groupedID), []string{
		`id="secagg-participants">13 a round, in 2 groups of 6–7 (the server learns each group's sum)<`,
		`id="secagg-k">all (complete graph), recommended<`,
	})
	body := page(plainID)
	check(plainID, body, []string{"This task runs without secure aggregation", "This task runs without differential privacy"})
	if strings.Contains(body, `id="dp-mechanism"`) || strings.Contains(body, `id="secagg-k"`) {
		t.Errorf("the plain task's page shows privacy settings")
	}
}
