package cli_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// The tests in this file create tasks with secure aggregation and
// differential privacy through task create's flags, against a real server.

// TestTaskCreatePrivacyServer: every privacy flag reaches the task the
// server stores, and task get shows the settings as the server resolves them.
func TestTaskCreatePrivacyServer(t *testing.T) {
	h := servertest.New(t)
	h.ImportModel(t, "tiny", tinyModel(t, 1))
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	id := createTask(t, h, "--name", "private", "--model", "tiny", "--module", module, "--cohort", "10", "--rounds", "5",
		"--secure-aggregation", "--secagg-k", "4", "--secagg-threshold", "3", "--secagg-bits", "24",
		"--secagg-clip-range", "0.5", "--secagg-max-weight", "100", "--secagg-stage-timeout", "30s",
		"--dp", "central", "--dp-noise-multiplier", "1.2", "--dp-clip", "0.5", "--dp-delta", "1e-6",
		"--dp-epsilon-budget", "50", "--dp-accountant", "pld", "--dp-sampling-rate", "0.25", "--dp-max-rounds-per-device", "7")
	res, err := h.Tasks.GetTask(t.Context(), &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	task := res.GetTask()
	wantSecAgg := &pb.SecAggConfig{K: 4, Threshold: 3, Bits: 24, ClipRange: 0.5, MaxWeight: 100, StageTimeout: durationpb.New(30 * time.Second)}
	wantDP := &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, NoiseMultiplier: 1.2, ClipNorm: 0.5, Delta: 1e-6,
		TargetEpsilon: 50, Accountant: pb.Accountant_ACCOUNTANT_PLD, SamplingRate: 0.25, MaxRoundsPerDevice: 7}
	if !proto.Equal(task.GetSecagg(), wantSecAgg) {
		t.Errorf("secagg on the server:\n%v\nwant\n%v", task.GetSecagg(), wantSecAgg)
	}
	if !proto.Equal(task.GetDp(), wantDP) {
		t.Errorf("dp on the server:\n%v\nwant\n%v", task.GetDp(), wantDP)
	}

	out, err := runServer(t, h, "task", "get", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`(?m)^SECURE AGGREGATION +SecAgg\+ over 13 participants a round, 4 neighbours each, threshold 3, 24-bit ring, clip range 0\.5, max weight 1 \(DP weighs every update 1\), stage timeout 30s$`,
		`(?m)^DIFFERENTIAL PRIVACY +central \(the server adds Gaussian noise\), noise multiplier 1\.2, clip norm 0\.5, delta 1e-06, pld accountant, sampling rate 0\.25 assumed, at most 7 rounds per device$`,
		`(?m)^EPSILON SPENT +0 of budget 50 at delta 1e-06 \(0%\)$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("task get lacks %s:\n%s", want, out)
		}
	}

	// Defaults: the recommended graph and ring, the RDP accountant, no
	// amplification; k and the threshold as the server resolves them.
	id = createTask(t, h, "--name", "defaults", "--model", "tiny", "--module", module, "--cohort", "10", "--over-selection", "1",
		"--secure-aggregation", "--dp", "central", "--dp-epsilon-budget", "8")
	res, err = h.Tasks.GetTask(t.Context(), &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		t.Fatal(err)
	}
	wantSecAgg = &pb.SecAggConfig{ClipRange: 1, MaxWeight: 65536, StageTimeout: durationpb.New(10 * time.Second)}
	wantDP = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, NoiseMultiplier: 1, ClipNorm: 1, Delta: 1e-5,
		TargetEpsilon: 8, Accountant: pb.Accountant_ACCOUNTANT_RDP}
	if !proto.Equal(res.GetTask().GetSecagg(), wantSecAgg) || !proto.Equal(res.GetTask().GetDp(), wantDP) {
		t.Errorf("defaults on the server:\n%v\n%v\nwant\n%v\n%v", res.GetTask().GetSecagg(), res.GetTask().GetDp(), wantSecAgg, wantDP)
	}
	out, err = runServer(t, h, "task", "get", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`(?m)^SECURE AGGREGATION +SecAgg\+ over 10 participants a round, complete graph \(recommended\), threshold 5, 32-bit ring, clip range 1, max weight 1 \(DP weighs every update 1\), stage timeout 10s$`,
		`(?m)^DIFFERENTIAL PRIVACY +central \(the server adds Gaussian noise\), noise multiplier 1, clip norm 1, delta 1e-05, rdp accountant, no amplification by sampling$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("task get lacks %s:\n%s", want, out)
		}
	}
}

// TestTaskCreatePrivacyRefusedServer: the CLI refuses the privacy settings
// the API refuses, by the API's own rules, in terms of flags; the API
// refuses the same task in its terms.
func TestTaskCreatePrivacyRefusedServer(t *testing.T) {
	h := servertest.New(t)
	version := h.ImportModel(t, "tiny", tinyModel(t, 1))
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	central := func(t *pb.Task) {
		t.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
			TargetEpsilon: 10, Delta: 1e-5, Accountant: pb.Accountant_ACCOUNTANT_RDP}
	}
	secure := func(t *pb.Task) {
		t.Secagg = &pb.SecAggConfig{ClipRange: 1, MaxWeight: 65536, StageTimeout: durationpb.New(10 * time.Second)}
	}
	for _, tc := range []struct {
		name    string
		flags   []string
		api     func(*pb.Task) // the same settings, sent to the API directly
		wantCLI string
		wantAPI string
	}{
		{"distributed without secure aggregation", []string{"--dp", "distributed", "--dp-epsilon-budget", "10"},
			func(t *pb.Task) {
				central(t)
				t.Dp.Mechanism, t.Dp.Accountant = pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, 0
			},
			"--dp distributed adds noise on the devices and needs secure aggregation (--secure-aggregation)",
			"dp.mechanism DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN adds noise on the devices and needs secure aggregation (secagg)"},
		{"delta out of range", []string{"--dp", "central", "--dp-epsilon-budget", "10", "--dp-delta", "2"},
			func(t *pb.Task) { central(t); t.Dp.Delta = 2 },
			"--dp-delta 2 must be in (0, 1)", "dp.delta 2 must be in (0, 1)"},
		{"no noise with a budget", []string{"--dp", "central", "--dp-epsilon-budget", "10", "--dp-noise-multiplier", "0"},
			func(t *pb.Task) { central(t); t.Dp.NoiseMultiplier = 0 },
			"--dp-noise-multiplier 0 must be positive and finite", "dp.noise_multiplier 0 must be positive and finite"},
		{"negative budget", []string{"--dp", "central", "--dp-epsilon-budget", "-1"},
			func(t *pb.Task) { central(t); t.Dp.TargetEpsilon = -1 },
			"--dp-epsilon-budget -1 must be positive and finite", "dp.target_epsilon -1 must be positive and finite"},
		{"adaptive clipping's quantile", []string{"--dp", "central", "--dp-epsilon-budget", "10", "--dp-target-unclipped-quantile", "1.5"},
			func(t *pb.Task) { central(t); t.Dp.TargetUnclippedQuantile = 1.5 },
			"--dp-target-unclipped-quantile 1.5 must be in (0, 1)", "dp.target_unclipped_quantile 1.5 must be in (0, 1)"},
		{"adaptive clipping's count noise", []string{"--dp", "central", "--dp-epsilon-budget", "10", "--dp-target-unclipped-quantile", "0.5",
			"--dp-clip-count-stddev", "0.1"},
			func(t *pb.Task) { central(t); t.Dp.TargetUnclippedQuantile, t.Dp.ClipCountStddev = 0.5, 0.1 },
			"--dp-clip-count-stddev 0.1 must be finite and above --dp-noise-multiplier / 2",
			"dp.clip_count_stddev 0.1 must be finite and above dp.noise_multiplier / 2"},
		{"sampling rate above 1", []string{"--dp", "central", "--dp-epsilon-budget", "10", "--dp-sampling-rate", "1.5"},
			func(t *pb.Task) { central(t); t.Dp.SamplingRate = 1.5 },
			"--dp-sampling-rate 1.5 must be in [0, 1]", "dp.sampling_rate 1.5 must be in [0, 1]"},
		{"distributed claiming amplification", []string{"--secure-aggregation", "--dp", "distributed", "--dp-epsilon-budget", "10", "--dp-sampling-rate", "0.1"},
			func(t *pb.Task) {
				secure(t)
				central(t)
				t.Dp.Mechanism, t.Dp.Accountant, t.Dp.SamplingRate = pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, 0, 0.1
			},
			"distributed mechanisms claim no amplification by sampling; leave --dp-sampling-rate at 0",
			"distributed mechanisms claim no amplification by sampling; leave dp.sampling_rate at 0"},
		{"bits out of range", []string{"--secure-aggregation", "--secagg-bits", "33"},
			func(t *pb.Task) { secure(t); t.Secagg.Bits = 33 },
			"--secagg-bits 33: secagg: config: invalid configuration: bits 33, want 1..32",
			"secagg.bits 33: secagg: config: invalid configuration: bits 33, want 1..32"},
		{"threshold too low", []string{"--secure-aggregation", "--secagg-k", "4", "--secagg-threshold", "2"},
			func(t *pb.Task) { secure(t); t.Secagg.K, t.Secagg.Threshold = 4, 2 },
			"--secagg-threshold 2 does not fit 4 neighbours a participant (--secagg-k 4, 13 participants a round): " +
				"secagg: round: invalid configuration: threshold 2 with 4 neighbours, want 3..4",
			"secagg.threshold 2 does not fit 4 neighbours a participant (secagg.k 4, 13 participants a round)"},
		{"negative clip range", []string{"--secure-aggregation", "--secagg-clip-range", "-1"},
			func(t *pb.Task) { secure(t); t.Secagg.ClipRange = -1 },
			"--secagg-clip-range -1: secagg: config: invalid configuration: clip range -1", "secagg.clip_range -1"},
		{"NaN weight bound", []string{"--secure-aggregation", "--secagg-max-weight", "NaN"},
			func(t *pb.Task) { secure(t); t.Secagg.MaxWeight = math.NaN() },
			"--secagg-max-weight NaN must be positive and finite", "secagg.max_weight NaN must be positive and finite"},
		{"negative stage timeout", []string{"--secure-aggregation", "--secagg-stage-timeout", "-1s"},
			func(t *pb.Task) { secure(t); t.Secagg.StageTimeout = durationpb.New(-time.Second) },
			"--secagg-stage-timeout -1s must not be negative", "secagg.stage_timeout -1s must not be negative"},
		{"one participant", []string{"--secure-aggregation", "--cohort", "1", "--over-selection", "1"},
			func(t *pb.Task) { secure(t); t.CohortTarget, t.OverSelection, t.ReportGoal = 1, 0, 1 },
			"secure aggregation cannot run rounds of n = 1 participants (--cohort and --over-selection): secagg: round: invalid configuration: 1 participants, want 2..10000",
			"secure aggregation cannot run rounds of n = 1 participants (cohort_target and over_selection)"},
		{"median under secure aggregation", []string{"--secure-aggregation", "--rule", "median"},
			func(t *pb.Task) { secure(t); t.Aggregation.Rule = pb.AggregationRule_AGGREGATION_RULE_MEDIAN },
			"--rule median needs individual updates, which secure aggregation hides; use fedavg, fedavgm, fedadam, fedyogi or fedadagrad",
			"aggregation.rule AGGREGATION_RULE_MEDIAN needs individual updates, which secure aggregation hides"},
		{"int4 under secure aggregation", []string{"--secure-aggregation", "--update-encoding", "int4"},
			func(t *pb.Task) { secure(t); t.UpdateEncoding = pb.UpdateEncoding_UPDATE_ENCODING_INT4 },
			"--update-encoding: int4 cannot run with secure aggregation (a 4-bit ring holds sums of at most 6 devices); use int8, or drop --secure-aggregation",
			"update_encoding: int4 cannot run with secure aggregation"},
		{"int8 with a 16-bit ring", []string{"--secure-aggregation", "--update-encoding", "int8", "--secagg-bits", "16"},
			func(t *pb.Task) {
				secure(t)
				t.UpdateEncoding, t.Secagg.Bits = pb.UpdateEncoding_UPDATE_ENCODING_INT8, 16
			},
			"--update-encoding: int8 sets an 8-bit secure aggregation ring, but --secagg-bits is 16 (leave it 0 or set 8)",
			"update_encoding: int8 sets an 8-bit secure aggregation ring, but secagg.bits is 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"task", "create", "--name", "refused", "--model", "tiny", "--module", module, "--cohort", "10"}, tc.flags...)
			_, err := runServer(t, h, args...)
			if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.wantCLI) {
				t.Errorf("CLI: %v\nwant usage error with %q", err, tc.wantCLI)
			}
			task := &pb.Task{Name: "refused", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
				CohortTarget: 10, OverSelection: 0.3, ReportGoal: 8, RoundsTotal: 20,
				Aggregation: &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_FEDAVG, ServerLearningRate: 1}}
			tc.api(task)
			_, err = h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: task})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantAPI) {
				t.Errorf("API: %v\nwant InvalidArgument with %q", err, tc.wantAPI)
			}
		})
	}
	res, err := h.Tasks.ListTasks(t.Context(), &pb.ListTasksRequest{})
	if err != nil || len(res.GetTasks()) != 0 {
		t.Fatalf("tasks after the refusals: %v, %v", res.GetTasks(), err)
	}
}

// TestTaskCreatePrivacyFlagCombinations: flags that need another flag are
// refused with what to add, before anything is sent.
func TestTaskCreatePrivacyFlagCombinations(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("m", safetensors(1))
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--dp-delta", "1e-6"}, "--dp-delta applies to differential privacy; add --dp central, local, distributed or skellam"},
		{[]string{"--dp", "none", "--dp-epsilon-budget", "3"}, "--dp-epsilon-budget applies to differential privacy; add --dp central, local, distributed or skellam"},
		{[]string{"--secagg-bits", "16"}, "--secagg-bits applies to secure aggregation; add --secure-aggregation"},
		{[]string{"--secagg-stage-timeout", "1m", "--dp", "central", "--dp-epsilon-budget", "3"},
			"--secagg-stage-timeout applies to secure aggregation; add --secure-aggregation"},
		{[]string{"--dp", "central", "--rounds", "30"}, "--dp central needs --dp-epsilon-budget, the epsilon the task may spend at --dp-delta 1e-05 " +
			"('fleetlearn dp epsilon --q 1 --noise-multiplier 1 --steps 30 --delta 1e-05' prints what --rounds 30 rounds of central noise spend)"},
		{[]string{"--dp", "central", "--dp-epsilon-budget", "3", "--dp-clip-lr", "0.2"},
			"--dp-clip-lr applies to adaptive clipping; add --dp-target-unclipped-quantile"},
		{[]string{"--dp", "central", "--dp-epsilon-budget", "3", "--dp-min-noise-contributors", "5"},
			"--dp-min-noise-contributors applies to device-side noise; use --dp distributed or skellam, or drop it"},
		{[]string{"--secure-aggregation", "--dp", "skellam", "--dp-epsilon-budget", "3", "--dp-accountant", "pld"},
			"--dp-accountant applies to --dp central or local; --dp skellam accounts its own noise"},
		{[]string{"--dp", "gaussian"}, `--dp "gaussian" (want none|central|local|distributed|skellam)`},
		{[]string{"--dp", "central", "--dp-epsilon-budget", "3", "--dp-accountant", "moments"}, `--dp-accountant "moments" (want rdp or pld)`},
	} {
		_, err := run(t, addr, append([]string{"task", "create", "--name", "n", "--model", "m", "--module", moduleSHA}, tc.flags...)...)
		if !errors.Is(err, cli.ErrUsage) || err.Error() != "invalid usage: "+tc.want {
			t.Errorf("%v: %v\nwant %q", tc.flags, err, "invalid usage: "+tc.want)
		}
	}
	if f.created != nil {
		t.Errorf("a task was created: %v", f.created)
	}
}

// TestTaskCreateBudgetWarning: a budget that the task's rounds would
// exceed is accepted (the server stops the task at it) with a warning that
// says how many rounds it covers.
func TestTaskCreateBudgetWarning(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("m", safetensors(1))
	const z, delta, rounds = 1.0, 1e-5, 20
	eps := func(n int) float64 {
		e, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: z, Steps: n}}, delta)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// A budget between what 5 and 6 rounds spend covers 5.
	budget := (eps(5) + eps(6)) / 2
	_, stderr, err := runErr(t, addr, "task", "create", "--name", "n", "--model", "m", "--module", moduleSHA, "-o", "json",
		"--rounds", strconv.Itoa(rounds), "--dp", "central", "--dp-epsilon-budget", strconv.FormatFloat(budget, 'g', -1, 64))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("warning: --dp-epsilon-budget %g covers 5 rounds of the 20: --rounds 20 spend epsilon %.4g at delta 1e-05; "+
		"the server stops the task before a round would exceed the budget (raise it, or --dp-noise-multiplier)\n", budget, eps(rounds))
	if stderr != want {
		t.Errorf("stderr = %q\nwant %q", stderr, want)
	}
	if f.created.GetDp().GetTargetEpsilon() != budget {
		t.Errorf("sent %v", f.created.GetDp())
	}
	// A budget the rounds fit in warns of nothing.
	_, stderr, err = runErr(t, addr, "task", "create", "--name", "n", "--model", "m", "--module", moduleSHA, "-o", "json",
		"--rounds", strconv.Itoa(rounds), "--dp", "central", "--dp-epsilon-budget", strconv.FormatFloat(eps(rounds)*1.01, 'g', -1, 64))
	if err != nil || stderr != "" {
		t.Errorf("err %v, stderr %q", err, stderr)
	}
}

// TestTaskCreateUnknownModuleServer: a --module the server does not have is
// refused with where to find the modules.
func TestTaskCreateUnknownModuleServer(t *testing.T) {
	h := servertest.New(t)
	h.ImportModel(t, "tiny", tinyModel(t, 1))
	h.RegisterModule(t, "trivial", wasmtest.Trivial())
	missing := strings.Repeat("0f", 32)
	_, err := runServer(t, h, "task", "create", "--name", "n", "--model", "tiny", "--module", missing)
	want := "--module: no module " + missing + " is registered; fleetlearn module list shows the modules, fleetlearn module register adds one"
	if !errors.Is(err, cli.ErrUnknownModule) || err.Error() != want {
		t.Errorf("%v\nwant %q", err, want)
	}
}

// TestPrivateTaskRunsServer: a task with secure aggregation and central DP,
// created through the flags, runs its rounds on real agents; task get then
// shows the ε its rounds spent, the accountant's for two rounds, and the
// audit log has a dp.spent entry per round.
func TestPrivateTaskRunsServer(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond))
	h.ImportModel(t, "tiny", tinyModel(t, 1))
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	startAgents(t, h, 3)
	const z, delta = 1.0, 1e-5
	// A device that gives up on a stage (its request to a loaded server
	// timed out) costs the stage timeout; the round still commits with the
	// other two.
	id := createTask(t, h, "--name", "private", "--model", "tiny", "--module", module, "--cohort", "3", "--over-selection", "1",
		"--report-goal", "2", "--rounds", "2", "--selection-timeout", "10m", "--report-timeout", "10m",
		"--secure-aggregation", "--secagg-clip-range", "0.01", "--secagg-stage-timeout", "30s",
		"--dp", "central", "--dp-clip", "0.1", "--dp-noise-multiplier", fmt.Sprint(z), "--dp-delta", fmt.Sprint(delta), "--dp-epsilon-budget", "100")
	out, err := runServer(t, h, "task", "watch", id)
	if err != nil {
		t.Fatalf("watch: %v\n%s", err, out)
	}
	t.Logf("watch:\n%s", out)
	if !strings.Contains(out, "task "+id+" completed after 2/2 training rounds") {
		t.Fatalf("watch:\n%s", out)
	}
	spent, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: z, Steps: 2}}, delta)
	if err != nil {
		t.Fatal(err)
	}
	out, err = runServer(t, h, "task", "get", id)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("EPSILON SPENT +%s of budget 100 at delta 1e-05 \\(%.0f%%\\)", regexp.QuoteMeta(fmt.Sprintf("%.4g", spent)), spent)
	if spent <= 0 || !regexp.MustCompile(`(?m)^`+want+`$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^TRAINED +2/2 rounds$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^SECURE AGGREGATION +SecAgg\+ over 3 participants a round, complete graph \(recommended\), threshold 2, `).MatchString(out) {
		t.Errorf("task get, want %s:\n%s", want, out)
	}
	out, err = runServer(t, h, "audit", "query", "--task", id, "--type", "dp.spent")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "dp.spent"); n != 2 {
		t.Errorf("audit query: %d dp.spent entries, want 2:\n%s", n, out)
	}
}

// startAgents enrolls n edge agents and runs them until the test ends.
// The trivial module ignores the examples; each agent has a few.
func startAgents(t *testing.T, h *servertest.Harness, n int) {
	t.Helper()
	sandbox, err := wasm.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait(); sandbox.Close(context.Background()) })
	for i := range n {
		id := fmt.Sprintf("dev-%03d", i)
		tok, err := h.Devices.CreateEnrollmentToken(t.Context(), &pb.CreateEnrollmentTokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if _, err := edge.Enroll(t.Context(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(),
			Token: tok.GetToken(), DataDir: dir, DeviceID: id}); err != nil {
			t.Fatal(err)
		}
		ds := &data.Dataset{Dim: 4, NumClasses: 2, Features: make([]float32, 4*10), Labels: make([]uint8, 10)}
		a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: dir, DeviceID: id},
			edge.WithDataset(ds), edge.WithSandbox(sandbox))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(ctx) }()
	}
}
