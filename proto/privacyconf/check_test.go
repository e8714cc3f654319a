package privacyconf_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// upper spells settings in capitals, to show that every refusal takes its
// names from the Names it is given.
type upper struct{}

func (upper) Field(p string) string            { return "<" + strings.ToUpper(p) + ">" }
func (upper) Value(v protoreflect.Enum) string { return "<" + privacyconf.APINames.Value(v) + ">" }

func privateTask() *pb.Task {
	return &pb.Task{CohortTarget: 10, ReportGoal: 8, OverSelection: 0.3,
		Aggregation: &pb.AggregationConfig{Rule: pb.AggregationRule_AGGREGATION_RULE_FEDAVG},
		Secagg:      &pb.SecAggConfig{},
		Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1,
			TargetEpsilon: 5, Delta: 1e-5}}
}

// TestChecksNameSettings: each refusal names the settings it is about in
// the caller's terms.
func TestChecksNameSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*pb.Task)
		want string
	}{
		{"bits", func(t *pb.Task) { t.Secagg.Bits = 40 }, "<SECAGG.BITS> 40: secagg: config: invalid configuration: bits 40, want 1..32"},
		{"threshold", func(t *pb.Task) { t.Secagg.K, t.Secagg.Threshold = 6, 2 },
			"<SECAGG.THRESHOLD> 2 does not fit 6 neighbours a participant (<SECAGG.K> 6, 13 participants a round)"},
		{"threshold above k", func(t *pb.Task) { t.Secagg.K, t.Secagg.Threshold = 6, 7 }, "<SECAGG.THRESHOLD> 7 does not fit 6 neighbours"},
		{"cohort", func(t *pb.Task) { t.CohortTarget, t.OverSelection = 20000, 0 },
			"secure aggregation cannot run rounds of n = 20000 participants (<COHORT_TARGET> and <OVER_SELECTION>)"},
		{"rule", func(t *pb.Task) { t.Aggregation.Rule = pb.AggregationRule_AGGREGATION_RULE_TRIMMED_MEAN },
			"<AGGREGATION.RULE> <AGGREGATION_RULE_TRIMMED_MEAN> needs individual updates, which secure aggregation hides; use " +
				"<AGGREGATION_RULE_FEDAVG>, <AGGREGATION_RULE_FEDAVGM>, <AGGREGATION_RULE_FEDADAM>, <AGGREGATION_RULE_FEDYOGI> or <AGGREGATION_RULE_FEDADAGRAD>"},
		{"ring too small", func(t *pb.Task) { t.Secagg.Bits = 4 }, "<SECAGG.BITS> 4 with 13 participants a round: secagg: quantizer: invalid configuration: 4 bits cannot hold a sum of 13 values"},
		{"weight", func(t *pb.Task) { t.Secagg.MaxWeight = -1 }, "<SECAGG.MAX_WEIGHT> -1 must be positive and finite"},
		{"stage timeout", func(t *pb.Task) { t.Secagg.StageTimeout = durationpb.New(-time.Second) }, "<SECAGG.STAGE_TIMEOUT> -1s must not be negative"},
		{"int8 ring", func(t *pb.Task) { t.UpdateEncoding, t.Secagg.Bits = pb.UpdateEncoding_UPDATE_ENCODING_INT8, 12 },
			"<UPDATE_ENCODING>: int8 sets an 8-bit secure aggregation ring, but <SECAGG.BITS> is 12 (leave it 0 or set 8)"},
		{"int8 slots", func(t *pb.Task) { t.UpdateEncoding, t.CohortTarget = pb.UpdateEncoding_UPDATE_ENCODING_INT8, 100 },
			"<SECAGG.BITS> 8 with 130 participants a round: secagg: quantizer: invalid configuration: 8 bits cannot hold a sum of 130 values"},
		{"clip norm", func(t *pb.Task) { t.Dp.ClipNorm = 0 }, "<DP.CLIP_NORM> 0 must be positive and finite"},
		{"budget", func(t *pb.Task) { t.Dp.TargetEpsilon = 0 }, "<DP.TARGET_EPSILON> 0 must be positive and finite"},
		{"delta", func(t *pb.Task) { t.Dp.Delta = 1 }, "<DP.DELTA> 1 must be in (0, 1), well below 1/(number of devices)"},
		{"distributed without secagg", func(t *pb.Task) {
			t.Secagg, t.Dp.Mechanism = nil, pb.DPMechanism_DP_MECHANISM_SKELLAM
		}, "<DP.MECHANISM> <DP_MECHANISM_SKELLAM> adds noise on the devices and needs secure aggregation (<SECAGG>)"},
		{"unknown mechanism", func(t *pb.Task) { t.Dp.Mechanism = 42 }, "<DP.MECHANISM> <42> is not a known mechanism"},
		{"unknown accountant", func(t *pb.Task) { t.Dp.Accountant = 7 }, "<DP.ACCOUNTANT> <7> is not a known accountant; use <ACCOUNTANT_RDP> or <ACCOUNTANT_PLD>"},
		{"contributors beyond the cohort", func(t *pb.Task) {
			t.Dp.Mechanism, t.Dp.MinNoiseContributors = pb.DPMechanism_DP_MECHANISM_SKELLAM, 11
		}, "<DP.MIN_NOISE_CONTRIBUTORS> 11 is more than <COHORT_TARGET> 10: no round could ever have that many reports"},
		{"unknown noise", func(t *pb.Task) { t.Dp.Noise = 9 }, "<DP.NOISE> <9> is not a known noise"},
		{"tree with local noise", func(t *pb.Task) {
			t.RoundsTotal, t.Dp.Noise, t.Dp.Mechanism = 10, pb.DPNoise_DP_NOISE_TREE, pb.DPMechanism_DP_MECHANISM_LOCAL
		}, "<DP.NOISE> <DP_NOISE_TREE> is noise the server adds: it needs <DP.MECHANISM> <DP_MECHANISM_CENTRAL_GAUSSIAN>"},
		{"blt with sampling", func(t *pb.Task) { t.RoundsTotal, t.Dp.Noise, t.Dp.SamplingRate = 10, pb.DPNoise_DP_NOISE_BLT, 0.1 },
			"<DP.NOISE> <DP_NOISE_BLT> assumes no sampling; leave <DP.SAMPLING_RATE> at 0"},
		{"tree with pld", func(t *pb.Task) {
			t.RoundsTotal, t.Dp.Noise, t.Dp.Accountant = 10, pb.DPNoise_DP_NOISE_TREE, pb.Accountant_ACCOUNTANT_PLD
		}, "<DP.NOISE> <DP_NOISE_TREE> is accounted in zCDP, converted as RDP: use <DP.ACCOUNTANT> <ACCOUNTANT_RDP>"},
		{"blt without rounds", func(t *pb.Task) { t.Dp.Noise = pb.DPNoise_DP_NOISE_BLT },
			"<DP.NOISE> <DP_NOISE_BLT> is laid out over the task's rounds: give <ROUNDS_TOTAL>"},
		{"blt over too many rounds", func(t *pb.Task) { t.Dp.Noise, t.RoundsTotal = pb.DPNoise_DP_NOISE_BLT, 1_000_000 },
			"<DP.NOISE> <DP_NOISE_BLT> is laid out over at most 20000 rounds, not <ROUNDS_TOTAL> 1000000"},
		{"quantile", func(t *pb.Task) { t.Dp.TargetUnclippedQuantile = 1 },
			"<DP.TARGET_UNCLIPPED_QUANTILE> 1 must be in (0, 1): the fraction of updates to leave unclipped"},
		{"clip learning rate", func(t *pb.Task) { t.Dp.TargetUnclippedQuantile, t.Dp.ClipLearningRate = 0.5, -1 },
			"<DP.CLIP_LEARNING_RATE> -1 must be positive and finite"},
		{"count noise without adaptive clipping", func(t *pb.Task) { t.Dp.ClipCountStddev = 3 },
			"<DP.CLIP_COUNT_STDDEV> applies to adaptive clipping: set <DP.TARGET_UNCLIPPED_QUANTILE>, or leave it at 0"},
		{"count noise too small", func(t *pb.Task) { t.Dp.TargetUnclippedQuantile, t.Dp.ClipCountStddev = 0.5, 0.5 },
			"<DP.CLIP_COUNT_STDDEV> 0.5 must be finite and above <DP.NOISE_MULTIPLIER> / 2 = 0.5"},
		{"adaptive local", func(t *pb.Task) {
			t.Dp.TargetUnclippedQuantile, t.Dp.Mechanism = 0.5, pb.DPMechanism_DP_MECHANISM_LOCAL
		}, "adaptive clipping (<DP.TARGET_UNCLIPPED_QUANTILE>) needs a central or distributed <DP.MECHANISM>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := privateTask()
			tc.edit(task)
			err := privacyconf.CheckEncoding(task, upper{})
			if err == nil {
				err = privacyconf.CheckSecAgg(task, upper{})
			}
			if err == nil {
				_, err = privacyconf.NewAccounting(task, 100, upper{})
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v\nwant %q", err, tc.want)
			}
		})
	}
	// A task the rules accept passes all three.
	task := privateTask()
	if err := privacyconf.CheckEncoding(task, upper{}); err != nil {
		t.Fatal(err)
	}
	if err := privacyconf.CheckSecAgg(task, upper{}); err != nil {
		t.Fatal(err)
	}
	if a, err := privacyconf.NewAccounting(task, 100, upper{}); err != nil || a == nil {
		t.Fatal(a, err)
	}
}

func TestCheckEncodingSetsTheRing(t *testing.T) {
	task := privateTask()
	task.UpdateEncoding = pb.UpdateEncoding_UPDATE_ENCODING_INT8
	if err := privacyconf.CheckEncoding(task, privacyconf.APINames); err != nil || task.GetSecagg().GetBits() != privacyconf.SecAggInt8Bits {
		t.Fatalf("int8 under secure aggregation: %v, bits %d", err, task.GetSecagg().GetBits())
	}
}

func TestResolveSecAggDefaults(t *testing.T) {
	r, c, err := privacyconf.ResolveSecAgg(&pb.SecAggConfig{}, "task", 1, 100, 7, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	k := secagg.RecommendedK(100)
	if r.K() != k || r.Threshold() != k/2+1 || r.Bits() != secagg.DefaultBits || c.GetClipRange() != privacyconf.DefaultSecAggClipRange ||
		c.GetMaxWeight() != privacyconf.DefaultSecAggMaxWeight || c.GetStageTimeout().AsDuration() != privacyconf.DefaultSecAggStageTimeout ||
		c.GetNumParticipants() != 100 || c.GetGraphSeed() != 7 {
		t.Errorf("resolved k %d t %d bits %d, config %v", r.K(), r.Threshold(), r.Bits(), c)
	}
}

func TestResolveDPDefaults(t *testing.T) {
	task := privateTask()
	if c := privacyconf.ResolveDP(task); c.GetAccountant() != pb.Accountant_ACCOUNTANT_RDP || c.GetMinNoiseContributors() != 0 {
		t.Errorf("central: %v", c)
	}
	task.Dp.Mechanism = pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN
	if c := privacyconf.ResolveDP(task); c.GetMinNoiseContributors() != task.GetReportGoal() {
		t.Errorf("distributed: %v, want report_goal contributors", c)
	}
	for _, m := range []pb.DPMechanism{pb.DPMechanism_DP_MECHANISM_UNSPECIFIED, pb.DPMechanism_DP_MECHANISM_NONE} {
		task.Dp.Mechanism = m
		if c := privacyconf.ResolveDP(task); c != nil {
			t.Errorf("%v: %v, want no DP", m, c)
		}
	}
}

// TestAccounting: central noise is accounted without the model's size;
// distributed noise only with it.
func TestAccounting(t *testing.T) {
	task := privateTask()
	task.Dp.SamplingRate = 0.1
	a, err := privacyconf.NewAccounting(task, 0, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.EpsilonAfter(10)
	want, werr := dp.Epsilon([]dp.Event{{Q: 0.1, NoiseMultiplier: 1, Steps: 10}}, 1e-5)
	if err != nil || werr != nil || got != want || a.Q != 0.1 {
		t.Errorf("central: %v, %v; want %v (q %v)", got, err, want, a.Q)
	}
	task.Dp.SamplingRate = 0
	task.Dp.Mechanism = pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN
	a, err = privacyconf.NewAccounting(task, 0, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.EpsilonAfter(3); !errors.Is(err, privacyconf.ErrSizeUnknown) {
		t.Errorf("distributed without the size: %v, want ErrSizeUnknown", err)
	}
	a, err = privacyconf.NewAccounting(task, 1000, privacyconf.APINames)
	if err != nil || a.Distributed == nil {
		t.Fatal(a, err)
	}
	want, werr = a.Distributed.Epsilon(3, 1e-5)
	if got, err := a.EpsilonAfter(3); err != nil || werr != nil || got != want || !(got > 0) {
		t.Errorf("distributed: %v, %v; want %v", got, err, want)
	}
	if a, err := privacyconf.NewAccounting(&pb.Task{}, 1000, privacyconf.APINames); a != nil || err != nil {
		t.Errorf("no DP: %v, %v", a, err)
	}
}

// TestRoundSecAgg: under DP every update weighs 1, so rounds bound weights
// at 1; without DP they keep the task's bound, and the task is not changed.
func TestRoundSecAgg(t *testing.T) {
	task := privateTask()
	task.Secagg.MaxWeight = 100
	if got := privacyconf.RoundSecAgg(task).GetMaxWeight(); got != 1 || task.Secagg.MaxWeight != 100 {
		t.Errorf("with DP: max weight %v (task %v), want 1 (100)", got, task.Secagg.MaxWeight)
	}
	task.Dp = nil
	if got := privacyconf.RoundSecAgg(task); got != task.Secagg {
		t.Errorf("without DP: %v, want the task's own settings", got)
	}
	task.Secagg = nil
	if got := privacyconf.RoundSecAgg(task); got != nil {
		t.Errorf("without secure aggregation: %v", got)
	}
}

// TestCorrelatedAccounting: tree and BLT noise account the rounds so far
// with the participations the limits allow (⌈T/b⌉, or the cap below it),
// and the same noise multiplier spends less on the limited device than
// independent noise on one that takes part in every round.
func TestCorrelatedAccounting(t *testing.T) {
	for _, noise := range []pb.DPNoise{pb.DPNoise_DP_NOISE_TREE, pb.DPNoise_DP_NOISE_BLT} {
		task := privateTask()
		task.Secagg, task.RoundsTotal = nil, 100
		task.Dp.Noise, task.Dp.MinSeparation, task.Dp.MaxRoundsPerDevice, task.Dp.NoiseMultiplier = noise, 10, 4, 2
		a, err := privacyconf.NewAccounting(task, 100, privacyconf.APINames)
		if err != nil {
			t.Fatal(err)
		}
		if c := a.Correlated; c == nil || c.Participations != 4 || c.Separation != 10 || c.Rounds != 100 {
			t.Fatalf("%v: %+v", noise, a.Correlated)
		}
		task.Dp.MaxRoundsPerDevice = 0
		if a, err := privacyconf.NewAccounting(task, 100, privacyconf.APINames); err != nil || a.Correlated.Participations != 10 {
			t.Fatalf("%v without a cap: %+v, %v; want ⌈100/10⌉ = 10 participations", noise, a.Correlated, err)
		}
		task.Dp.MaxRoundsPerDevice = 4
		eps, err := a.EpsilonAfter(100)
		if err != nil {
			t.Fatal(err)
		}
		indep, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: 2, Steps: 100}}, 1e-5)
		if err != nil || !(eps > 0 && eps < indep) {
			t.Errorf("%v: ε %v after 100 rounds, independent noise on every round %v (%v)", noise, eps, indep, err)
		}
		if early, err := a.EpsilonAfter(5); err != nil || !(early > 0 && early <= eps) {
			t.Errorf("%v: ε %v after 5 rounds, %v after 100 (%v)", noise, early, eps, err)
		}
	}
}

// Adaptive clipping: defaults after Andrew et al.; the updates' noise is
// z_Δ, and ε is z's for independent noise, and grows by the bits' share
// for correlated noise and distributed noise.
func TestAdaptiveClippingAccounting(t *testing.T) {
	task := privateTask()
	task.Secagg, task.ReportGoal = nil, 100
	task.Dp.NoiseMultiplier, task.Dp.TargetUnclippedQuantile = 1, 0.5
	cfg := privacyconf.ResolveDP(task)
	if cfg.GetClipLearningRate() != privacyconf.DefaultClipLearningRate || cfg.GetClipCountStddev() != 5 {
		t.Fatalf("defaults: rate %v, count stddev %v; want 0.2 and 100/20", cfg.GetClipLearningRate(), cfg.GetClipCountStddev())
	}
	want := 1 / math.Sqrt(1-1/(4*25.0))
	if got := privacyconf.UpdateNoiseMultiplier(cfg); math.Abs(got-want) > 1e-12 {
		t.Errorf("update noise multiplier %v, want %v", got, want)
	}
	if small := privacyconf.ResolveDP(&pb.Task{ReportGoal: 3, Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN,
		NoiseMultiplier: 2, TargetUnclippedQuantile: 0.5}}); small.GetClipCountStddev() != 2 {
		t.Errorf("a small cohort's count stddev %v, want z = 2", small.GetClipCountStddev())
	}
	a, err := privacyconf.NewAccounting(task, 100, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	fixed := privateTask()
	fixed.Secagg, fixed.ReportGoal = nil, 100
	b, err := privacyconf.NewAccounting(fixed, 100, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	ea, _ := a.EpsilonAfter(20)
	eb, _ := b.EpsilonAfter(20)
	if ea != eb {
		t.Errorf("independent noise: ε %v with adaptive clipping, %v without; want equal", ea, eb)
	}
	// Correlated: ρ(z_Δ) plus p/(8σ_b²) for p participations.
	task.RoundsTotal, task.Dp.Noise, task.Dp.MinSeparation = 40, pb.DPNoise_DP_NOISE_BLT, 10
	a, err = privacyconf.NewAccounting(task, 100, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	rho, err := a.Correlated.Rho(want, 40)
	if err != nil {
		t.Fatal(err)
	}
	wantEps, _, _ := dp.EpsilonFromZCDP(rho+4/(8*25.0), task.Dp.Delta, nil)
	if got, err := a.EpsilonAfter(40); err != nil || math.Abs(got-wantEps) > 1e-9*wantEps {
		t.Errorf("correlated: ε %v (%v), want %v", got, err, wantEps)
	}
	// Distributed: the vectors carry the count, and ε is above the same
	// mechanism's without it.
	dist := privateTask()
	dist.Dp.Mechanism, dist.Dp.TargetUnclippedQuantile, dist.Secagg.Bits = pb.DPMechanism_DP_MECHANISM_SKELLAM, 0.5, 20
	a, err = privacyconf.NewAccounting(dist, 1000, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Distributed.Counts() {
		t.Fatal("distributed mechanism without the count")
	}
	dist.Dp.TargetUnclippedQuantile = 0
	b, err = privacyconf.NewAccounting(dist, 1000, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	ea, _ = a.EpsilonAfter(10)
	eb, _ = b.EpsilonAfter(10)
	if !(ea > eb) || ea > 1.1*eb {
		t.Errorf("distributed: ε %v with adaptive clipping, %v without", ea, eb)
	}
}
