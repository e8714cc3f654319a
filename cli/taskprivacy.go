package cli

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// privacyFlags are task create's secure aggregation and differential
// privacy flags: the Task's secagg and dp settings, all of them but the
// ones the server sets per round.
type privacyFlags struct {
	secure             bool
	k, threshold       uint32
	bits               uint32
	clipRange          float64
	maxWeight          float64
	stageTimeout       time.Duration
	groupSize          uint32
	dp                 string
	noise, clip        float64
	quantile, clipLR   float64
	countStddev        float64
	delta, budget      float64
	accountant         string
	contributors       uint32
	sampling           float64
	maxRoundsPerDevice uint32
	minSeparation      uint32
	noiseKind          string

	// accounting is the accounting of the task the flags built, for the
	// budget warning; nil without DP.
	accounting *privacyconf.Accounting
}

// dpMechanisms are the values of --dp; none sends no DP settings.
var dpMechanisms = map[string]pb.DPMechanism{
	"none":        pb.DPMechanism_DP_MECHANISM_UNSPECIFIED,
	"central":     pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN,
	"local":       pb.DPMechanism_DP_MECHANISM_LOCAL,
	"distributed": pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN,
	"skellam":     pb.DPMechanism_DP_MECHANISM_SKELLAM,
}

const dpMechanismNames = "none|central|local|distributed|skellam"

// dpNoises are the values of --dp-noise.
var dpNoises = map[string]pb.DPNoise{"independent": pb.DPNoise_DP_NOISE_UNSPECIFIED, "tree": pb.DPNoise_DP_NOISE_TREE,
	"blt": pb.DPNoise_DP_NOISE_BLT}

// accountants are the values of --dp-accountant.
var accountants = map[string]pb.Accountant{"rdp": pb.Accountant_ACCOUNTANT_RDP, "pld": pb.Accountant_ACCOUNTANT_PLD}

// secaggSubFlags and dpSubFlags need --secure-aggregation and --dp.
var (
	secaggSubFlags = []string{"secagg-k", "secagg-threshold", "secagg-bits", "secagg-clip-range", "secagg-max-weight", "secagg-stage-timeout", "secagg-group-size"}
	dpSubFlags     = []string{"dp-noise-multiplier", "dp-clip", "dp-target-unclipped-quantile", "dp-clip-lr", "dp-delta",
		"dp-epsilon-budget", "dp-accountant", "dp-min-noise-contributors", "dp-sampling-rate", "dp-max-rounds-per-device",
		"dp-min-separation", "dp-noise", "dp-clip-count-stddev"}
)

// Defaults of the DP flags. The noise multiplier is the usual DP-FedAvg
// choice (noise as large as one device's clipped update); the demo's 0.1
// buys accuracy with an ε no one would promise.
const (
	defaultDPNoise = 1.0
	defaultDPClip  = 1.0
	defaultDPDelta = 1e-5
)

func (f *privacyFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.secure, "secure-aggregation", false,
		"run training rounds through SecAgg+ secure aggregation: the server learns only the sum of each round's updates (needs a streaming --rule: fedavg, fedavgm or a FedOpt rule)")
	fl.Uint32Var(&f.k, "secagg-k", 0, "with --secure-aggregation, neighbours of each participant; 0 picks the recommended 2⌈3·log2 n⌉ for n participants, n-1 or more is the complete graph")
	fl.Uint32Var(&f.threshold, "secagg-threshold", 0, "with --secure-aggregation, shares needed to reconstruct a secret, more than half the neighbours and at most all; 0 picks ⌊k/2⌋+1")
	fl.Uint32Var(&f.bits, "secagg-bits", 0, "with --secure-aggregation, bits of the ring updates are summed in, 1 to 32; 0 picks 32 (8 with --update-encoding int8)")
	fl.Float64Var(&f.clipRange, "secagg-clip-range", privacyconf.DefaultSecAggClipRange, "with --secure-aggregation, each update element is clipped to ±this before it is quantized")
	fl.Float64Var(&f.maxWeight, "secagg-max-weight", privacyconf.DefaultSecAggMaxWeight, "with --secure-aggregation, cap on a device's weight (its example count) in the masked sum; with --dp every update weighs 1")
	fl.DurationVar(&f.stageTimeout, "secagg-stage-timeout", privacyconf.DefaultSecAggStageTimeout, "with --secure-aggregation, how long each key-exchange, consistency and unmask stage waits for devices")
	fl.Uint32Var(&f.groupSize, "secagg-group-size", 0, fmt.Sprintf("with --secure-aggregation, largest group: a larger cohort runs as groups of near-equal size, each its own SecAgg+ instance, and the server learns each group's sum; at least %d, 0 picks %d (distributed DP stays one group)",
		privacyconf.MinSecAggGroupSize, privacyconf.DefaultSecAggGroupSize))
	fl.StringVar(&f.dp, "dp", "none", "differential privacy: none; central (devices clip, the server adds Gaussian noise); local (each device noises its own update); "+
		"distributed or skellam (devices add discrete Gaussian or Skellam noise under --secure-aggregation)")
	fl.Float64Var(&f.noise, "dp-noise-multiplier", defaultDPNoise, "with --dp, noise standard deviation over the clip norm")
	fl.Float64Var(&f.clip, "dp-clip", defaultDPClip, "with --dp, L2 norm bound of each device's update")
	fl.Float64Var(&f.quantile, "dp-target-unclipped-quantile", 0, "with --dp central, distributed or skellam, adaptive clipping: the fraction of updates to leave unclipped, in (0, 1); --dp-clip is then the first round's bound")
	fl.Float64Var(&f.clipLR, "dp-clip-lr", 0, "with --dp-target-unclipped-quantile, adaptive clipping's geometric learning rate (0: 0.2)")
	fl.Float64Var(&f.countStddev, "dp-clip-count-stddev", 0, "with --dp-target-unclipped-quantile, the noise on each round's count of unclipped updates, in devices "+
		"(0: the larger of --report-goal/20 and --dp-noise-multiplier); above --dp-noise-multiplier/2")
	fl.Float64Var(&f.delta, "dp-delta", defaultDPDelta, "with --dp, delta of the (epsilon, delta) guarantee, well below 1/(number of devices)")
	fl.Float64Var(&f.budget, "dp-epsilon-budget", 0, "with --dp (required), the epsilon the task may spend at --dp-delta; the server stops it before a round would exceed it")
	fl.StringVar(&f.accountant, "dp-accountant", "rdp", "with --dp central or local, how epsilon is accounted: rdp or pld (distributed mechanisms account their own noise)")
	fl.Uint32Var(&f.contributors, "dp-min-noise-contributors", 0, "with --dp distributed or skellam, devices whose noise shares make up the noise; a round with fewer reports is abandoned; 0 picks --report-goal")
	fl.Float64Var(&f.sampling, "dp-sampling-rate", 0, "with --dp central or local, the Poisson sampling rate the accountant may assume, in [0, 1]; 0 claims no amplification, the honest choice unless devices join rounds at random")
	fl.Uint32Var(&f.maxRoundsPerDevice, "dp-max-rounds-per-device", 0, "with --dp, rounds one device may take part in over the task; 0 is no cap")
	fl.StringVar(&f.noiseKind, "dp-noise", "independent", "with --dp central, how the server's noise relates across rounds: independent, "+
		"tree (tree aggregation) or blt (a buffered linear Toeplitz factorization fitted to --rounds and the participation limits); "+
		"tree and blt correlate the noise across rounds (DP-FTRL), need no sampling, and are accounted with --dp-max-rounds-per-device "+
		"and --dp-min-separation ('fleetlearn dp epsilon --mechanism tree|blt' plans them)")
	fl.Uint32Var(&f.minSeparation, "dp-min-separation", 0, "with --dp, training rounds that must pass between two a device takes part in "+
		"(it may return b rounds after its last); the server refuses it at check-in before then, and the audit log records the refusal; 0 is none")
}

// apply checks the privacy flags and sets t's secagg and dp settings. The
// rules are the API's own (privacyconf), spelled in flags; only what
// combines flags is checked here.
func (f *privacyFlags) apply(cmd *cobra.Command, t *pb.Task) error {
	changed := cmd.Flags().Changed
	usage := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, args...)...)
	}
	if !f.secure {
		for _, n := range secaggSubFlags {
			if changed(n) {
				return usage("--%s applies to secure aggregation; add --secure-aggregation", n)
			}
		}
	}
	mech, ok := dpMechanisms[f.dp]
	if !ok {
		return usage("--dp %q (want %s)", f.dp, dpMechanismNames)
	}
	_, distributed := privacyconf.Mechanism(mech)
	if mech == pb.DPMechanism_DP_MECHANISM_UNSPECIFIED {
		for _, n := range dpSubFlags {
			if changed(n) {
				return usage("--%s applies to differential privacy; add --dp central, local, distributed or skellam", n)
			}
		}
	} else {
		switch {
		case !changed("dp-epsilon-budget"):
			return usage("--dp %s needs --dp-epsilon-budget, the epsilon the task may spend at --dp-delta %g "+
				"('fleetlearn dp epsilon --q 1 --noise-multiplier %g --steps %d --delta %g' prints what --rounds %d rounds of central noise spend)",
				f.dp, f.delta, f.noise, t.GetRoundsTotal(), f.delta, t.GetRoundsTotal())
		case changed("dp-clip-lr") && !changed("dp-target-unclipped-quantile"):
			return usage("--dp-clip-lr applies to adaptive clipping; add --dp-target-unclipped-quantile")
		case changed("dp-clip-count-stddev") && !changed("dp-target-unclipped-quantile"):
			return usage("--dp-clip-count-stddev applies to adaptive clipping; add --dp-target-unclipped-quantile")
		case changed("dp-min-noise-contributors") && !distributed:
			return usage("--dp-min-noise-contributors applies to device-side noise; use --dp distributed or skellam, or drop it")
		case changed("dp-accountant") && distributed:
			return usage("--dp-accountant applies to --dp central or local; --dp %s accounts its own noise", f.dp)
		}
	}
	acct, ok := accountants[f.accountant]
	if !ok {
		return usage("--dp-accountant %q (want rdp or pld)", f.accountant)
	}
	noiseKind, ok := dpNoises[f.noiseKind]
	if !ok {
		return usage("--dp-noise %q (want independent, tree or blt)", f.noiseKind)
	}
	if f.secure {
		t.Secagg = &pb.SecAggConfig{K: f.k, Threshold: f.threshold, Bits: f.bits, ClipRange: f.clipRange,
			MaxWeight: f.maxWeight, StageTimeout: durationpb.New(f.stageTimeout), GroupSize: f.groupSize}
	}
	if mech != pb.DPMechanism_DP_MECHANISM_UNSPECIFIED {
		t.Dp = &pb.DPConfig{Mechanism: mech, ClipNorm: f.clip, TargetUnclippedQuantile: f.quantile,
			ClipLearningRate: f.clipLR, ClipCountStddev: f.countStddev, NoiseMultiplier: f.noise, TargetEpsilon: f.budget, Delta: f.delta,
			MinNoiseContributors: f.contributors, SamplingRate: f.sampling, MaxRoundsPerDevice: f.maxRoundsPerDevice,
			MinSeparation: f.minSeparation, Noise: noiseKind}
		if !distributed {
			t.Dp.Accountant = acct
		}
	}
	// The API's checks, in its order, on a copy: what is sent is what the
	// flags say, and the server fills in the same implied settings.
	check := proto.Clone(t).(*pb.Task)
	if err := privacyconf.CheckEncoding(check, flagNames{}); err != nil {
		return usage("%v", err)
	}
	if err := privacyconf.CheckSecAgg(check, flagNames{}); err != nil {
		return usage("%v", err)
	}
	a, err := privacyconf.NewAccounting(check, 0, flagNames{})
	if err != nil {
		return usage("%v", err)
	}
	f.accounting = a
	return nil
}

// budgetWarning says when the ε budget runs out before the task's rounds
// do: the server then stops the task early. It is "" when the budget
// covers them, or when ε cannot be computed here (distributed noise
// depends on the model's size).
func (f *privacyFlags) budgetWarning(rounds uint32) string {
	a := f.accounting
	if a == nil || rounds == 0 {
		return ""
	}
	budget := a.Config.GetTargetEpsilon()
	all, err := a.EpsilonAfter(int(rounds))
	if err != nil || all <= budget {
		return ""
	}
	// ε grows with every round: the first round count past the budget.
	fit := sort.Search(int(rounds), func(k int) bool {
		e, err := a.EpsilonAfter(k + 1)
		return err != nil || e > budget
	})
	return fmt.Sprintf("--dp-epsilon-budget %g covers %s of the %d: --rounds %d spend epsilon %.4g at delta %g; "+
		"the server stops the task before a round would exceed the budget (raise it, or --dp-noise-multiplier)",
		budget, plural(fit, "round"), rounds, rounds, all, a.Config.GetDelta())
}

// taskFlagNames are task create's flags by the Task field they set.
var taskFlagNames = map[string]string{
	"cohort_target":                "--cohort",
	"over_selection":               "--over-selection",
	"report_goal":                  "--report-goal",
	"aggregation.rule":             "--rule",
	"update_encoding":              "--update-encoding",
	"secagg":                       "--secure-aggregation",
	"secagg.k":                     "--secagg-k",
	"secagg.threshold":             "--secagg-threshold",
	"secagg.bits":                  "--secagg-bits",
	"secagg.clip_range":            "--secagg-clip-range",
	"secagg.max_weight":            "--secagg-max-weight",
	"secagg.stage_timeout":         "--secagg-stage-timeout",
	"secagg.group_size":            "--secagg-group-size",
	"dp":                           "--dp",
	"dp.mechanism":                 "--dp",
	"dp.clip_norm":                 "--dp-clip",
	"dp.target_unclipped_quantile": "--dp-target-unclipped-quantile",
	"dp.clip_learning_rate":        "--dp-clip-lr",
	"dp.clip_count_stddev":         "--dp-clip-count-stddev",
	"dp.noise_multiplier":          "--dp-noise-multiplier",
	"dp.target_epsilon":            "--dp-epsilon-budget",
	"dp.delta":                     "--dp-delta",
	"dp.accountant":                "--dp-accountant",
	"dp.min_noise_contributors":    "--dp-min-noise-contributors",
	"dp.sampling_rate":             "--dp-sampling-rate",
	"dp.max_rounds_per_device":     "--dp-max-rounds-per-device",
	"dp.min_separation":            "--dp-min-separation",
	"dp.noise":                     "--dp-noise",
	"rounds_total":                 "--rounds",
}

// flagNames spells the API's refusals (privacyconf) in task create's flags.
type flagNames struct{}

func (flagNames) Field(path string) string {
	if f, ok := taskFlagNames[path]; ok {
		return f
	}
	return path
}

func (flagNames) Value(v protoreflect.Enum) string {
	switch v := v.(type) {
	case pb.DPMechanism:
		return mechanismName(v)
	case pb.AggregationRule:
		for name, r := range rules {
			if r == v {
				return name
			}
		}
	case pb.UpdateEncoding:
		return encodingFlag{&v}.String()
	case pb.DPNoise:
		for name, n := range dpNoises {
			if n == v {
				return name
			}
		}
	}
	return privacyconf.APINames.Value(v)
}

// mechanismName is a mechanism as --dp spells it.
func mechanismName(m pb.DPMechanism) string {
	for name, v := range dpMechanisms {
		if v == m && m != pb.DPMechanism_DP_MECHANISM_UNSPECIFIED {
			return name
		}
	}
	return enumName(m.String(), "DP_MECHANISM_")
}

// secureAggregation describes a task's secure aggregation as its rounds run
// it, resolved for the task's cohort slots.
func secureAggregation(t *pb.Task) string {
	sa := t.GetSecagg()
	if sa == nil {
		return "off"
	}
	n := privacyconf.Participants(t)
	r, c, err := privacyconf.ResolveSecAgg(privacyconf.RoundSecAgg(t), "task", 1, n, 0, privacyconf.APINames)
	if err != nil {
		return "on; its settings do not resolve: " + err.Error()
	}
	graph := fmt.Sprintf("%d neighbours each", r.K())
	if r.K() >= n-1 {
		graph = "complete graph"
	}
	if sa.GetK() == 0 {
		graph += " (recommended)"
	}
	weight := fmt.Sprintf("max weight %g", c.GetMaxWeight())
	if privacyconf.ResolveDP(t) != nil {
		weight += " (DP weighs every update 1)"
	}
	return fmt.Sprintf("SecAgg+ over %d participants a round, %s, threshold %d, %d-bit ring, clip range %g, %s, stage timeout %v",
		n, graph, r.Threshold(), r.Bits(), c.GetClipRange(), weight, c.GetStageTimeout().AsDuration())
}

// differentialPrivacy describes a task's DP settings with the server's
// defaults filled in.
func differentialPrivacy(t *pb.Task) string {
	c := privacyconf.ResolveDP(t)
	if c == nil {
		return "off"
	}
	mech := c.GetMechanism()
	_, distributed := privacyconf.Mechanism(mech)
	parts := []string{mechanismName(mech) + map[pb.DPMechanism]string{
		pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN:              " (the server adds Gaussian noise)",
		pb.DPMechanism_DP_MECHANISM_LOCAL:                         " (each device noises its own update)",
		pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN: " (devices add discrete Gaussian noise under secure aggregation)",
		pb.DPMechanism_DP_MECHANISM_SKELLAM:                       " (devices add Skellam noise under secure aggregation)",
	}[mech],
		fmt.Sprintf("noise multiplier %g", c.GetNoiseMultiplier()), fmt.Sprintf("clip norm %g", c.GetClipNorm())}
	if q := c.GetTargetUnclippedQuantile(); q != 0 {
		parts = append(parts, fmt.Sprintf("adaptive clipping to quantile %g at rate %g, count noise %g (updates noised at multiplier %.4g)",
			q, c.GetClipLearningRate(), c.GetClipCountStddev(), privacyconf.UpdateNoiseMultiplier(c)))
	}
	parts = append(parts, fmt.Sprintf("delta %g", c.GetDelta()))
	if distributed {
		parts = append(parts, fmt.Sprintf("at least %d noise contributors", c.GetMinNoiseContributors()),
			"rdp accountant of the distributed mechanism")
	} else {
		parts = append(parts, enumName(c.GetAccountant().String(), "ACCOUNTANT_")+" accountant")
		if q := c.GetSamplingRate(); q > 0 {
			parts = append(parts, fmt.Sprintf("sampling rate %g assumed", q))
		} else {
			parts = append(parts, "no amplification by sampling")
		}
	}
	if n := c.GetMaxRoundsPerDevice(); n > 0 {
		parts = append(parts, fmt.Sprintf("at most %s per device", plural(int(n), "round")))
	}
	switch c.GetNoise() {
	case pb.DPNoise_DP_NOISE_TREE:
		parts = append(parts, "noise correlated across rounds by tree aggregation")
	case pb.DPNoise_DP_NOISE_BLT:
		parts = append(parts, "noise correlated across rounds by a fitted BLT")
	}
	if b := c.GetMinSeparation(); b > 0 {
		parts = append(parts, fmt.Sprintf("at least %s between a device's", plural(int(b), "training round")))
	}
	return strings.Join(parts, ", ")
}

// epsilonSpent describes the ε a task spent against its budget.
func epsilonSpent(t *pb.Task, spent float64) string {
	c := privacyconf.ResolveDP(t)
	budget := c.GetTargetEpsilon()
	s := fmt.Sprintf("%s of budget %s at delta %g", formatFloat(spent), formatFloat(budget), c.GetDelta())
	if budget > 0 && !math.IsInf(budget, 0) {
		s += fmt.Sprintf(" (%.0f%%)", 100*spent/budget)
	}
	return s
}
