package privacyconf

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// The rules a task's privacy settings must meet live here, once: the server
// refuses a task by them when it is created (and resolves each round by
// them), and the CLI refuses the same flags before it sends the task. Both
// spell the refusals in their user's terms through Names.

// Names spells a task's settings in refusals: the server writes the API's
// field paths and enum names, the CLI the flags that set them.
type Names interface {
	// Field names a setting by its path in a Task: "secagg" (the message),
	// "secagg.bits", "dp.delta", "cohort_target", "aggregation.rule", ...
	Field(path string) string
	// Value names an enum value a setting holds: a DPMechanism, an
	// AggregationRule or an UpdateEncoding.
	Value(v protoreflect.Enum) string
}

// APINames spells settings as the API does: "dp.delta",
// "DP_MECHANISM_CENTRAL_GAUSSIAN".
var APINames Names = apiNames{}

type apiNames struct{}

func (apiNames) Field(path string) string { return path }

func (apiNames) Value(v protoreflect.Enum) string {
	if d := v.Descriptor().Values().ByNumber(v.Number()); d != nil {
		return string(d.Name())
	}
	return fmt.Sprint(int32(v.Number()))
}

// Defaults for the SecAggConfig fields left zero that secagg.NewRound does
// not pick itself (k, threshold and bits).
const (
	DefaultSecAggStageTimeout = 10 * time.Second
	DefaultSecAggMaxWeight    = 65536
	DefaultSecAggClipRange    = 1.0
)

// SecAggInt8Bits is the SecAgg ring of a task whose updates travel as
// int8: one byte per masked value.
const SecAggInt8Bits = 8

// Participants is the number of cohort slots a round of t has, the n of its
// secure aggregation: cohort_target raised by over_selection.
func Participants(t *pb.Task) int {
	n := math.Ceil(float64(t.GetCohortTarget()) * (1 + t.GetOverSelection()))
	if !(n < math.MaxInt32) {
		return math.MaxInt32 // far past any limit, and refused as such
	}
	return int(n)
}

// CheckEncoding checks a task's update encoding against its other settings
// and fills in what it implies: an int8 task with secure aggregation gets an
// 8-bit ring (secagg.bits 0 or 8). In an 8-bit ring the quantizer keeps
// 2^7 − 1 − n of the 127 levels for n slots (secagg.NewQuantizer), so
// CheckSecAgg, which callers run next, refuses 126 slots or more, and each
// device's update gets only log2((127 − n)/n) bits of resolution: about 3.3
// for 10 slots, 0 at 63. A 4-bit ring would hold sums of at most 6 devices,
// so int4 is for plaintext rounds only; distributed DP picks its own ring
// and scale.
func CheckEncoding(t *pb.Task, names Names) error {
	enc := t.GetUpdateEncoding()
	field := names.Field("update_encoding")
	switch enc {
	case pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED:
		return nil
	case pb.UpdateEncoding_UPDATE_ENCODING_INT8, pb.UpdateEncoding_UPDATE_ENCODING_INT4:
	default:
		return fmt.Errorf("%s %s is not none, int8 or int4", field, names.Value(enc))
	}
	sa := t.GetSecagg()
	if sa == nil {
		return nil
	}
	if enc == pb.UpdateEncoding_UPDATE_ENCODING_INT4 {
		return fmt.Errorf("%s: int4 cannot run with secure aggregation (a 4-bit ring holds sums of at most 6 devices); use int8, or drop %s",
			field, names.Field("secagg"))
	}
	if mech := t.GetDp().GetMechanism(); isDistributed(mech) {
		return fmt.Errorf("%s: int8 cannot run with distributed DP (%s %s), whose encoder picks its own ring; leave %s unset",
			field, names.Field("dp.mechanism"), names.Value(mech), field)
	}
	switch sa.GetBits() {
	case 0:
		sa.Bits = SecAggInt8Bits
	case SecAggInt8Bits:
	default:
		return fmt.Errorf("%s: int8 sets an 8-bit secure aggregation ring, but %s is %d (leave it 0 or set 8)",
			field, names.Field("secagg.bits"), sa.GetBits())
	}
	return nil
}

// CheckSecAgg checks a task's secure aggregation settings: an aggregation
// rule that needs only the sum of the updates, and settings that a round of
// the task's cohort slots can run with.
func CheckSecAgg(t *pb.Task, names Names) error {
	sa := t.GetSecagg()
	if sa == nil {
		return nil
	}
	if rule := t.GetAggregation().GetRule(); rule != pb.AggregationRule_AGGREGATION_RULE_UNSPECIFIED && !aggregator.Kind(rule).Streaming() {
		var streaming []string
		values := rule.Descriptor().Values()
		for i := range values.Len() {
			if n := pb.AggregationRule(values.Get(i).Number()); n != pb.AggregationRule_AGGREGATION_RULE_UNSPECIFIED && aggregator.Kind(n).Streaming() {
				streaming = append(streaming, names.Value(n))
			}
		}
		return fmt.Errorf("%s %s needs individual updates, which secure aggregation hides; use %s",
			names.Field("aggregation.rule"), names.Value(rule), orList(streaming))
	}
	n := Participants(t)
	if _, err := secagg.NewRound(secagg.Config{}, "check", 1, n); err != nil {
		return fmt.Errorf("secure aggregation cannot run rounds of n = %d participants (%s and %s): %w",
			n, names.Field("cohort_target"), names.Field("over_selection"), err)
	}
	_, _, err := ResolveSecAggGroups(sa, "check", 1, n, 0, isDistributed(t.GetDp().GetMechanism()), names)
	return err
}

// RoundSecAgg is the secure aggregation settings t's rounds run with: the
// task's own, except under DP, where every update weighs 1 and so the
// weight bound is 1 too. It is nil for a task without secure aggregation.
func RoundSecAgg(t *pb.Task) *pb.SecAggConfig {
	sa := t.GetSecagg()
	if sa == nil || ResolveDP(t) == nil {
		return sa
	}
	sa = proto.Clone(sa).(*pb.SecAggConfig)
	sa.MaxWeight = 1
	return sa
}

// ResolveSecAgg returns the secure aggregation parameters of a round with n
// participants: c's settings with every default filled in, the round's
// graph seed and n. It fails for settings no round could use.
func ResolveSecAgg(c *pb.SecAggConfig, taskID string, round uint64, n int, seed uint64, names Names) (*secagg.Round, *pb.SecAggConfig, error) {
	cfg := SecAgg(c)
	cfg.GraphSeed = seed
	if cfg.ClipRange == 0 {
		cfg.ClipRange = DefaultSecAggClipRange
	}
	// Each field on its own first, so that a refusal names the setting.
	if err := (secagg.Config{Bits: cfg.Bits}).Validate(); err != nil {
		return nil, nil, fmt.Errorf("%s %d: %w", names.Field("secagg.bits"), c.GetBits(), err)
	}
	if err := (secagg.Config{ClipRange: cfg.ClipRange}).Validate(); err != nil {
		return nil, nil, fmt.Errorf("%s %v: %w", names.Field("secagg.clip_range"), c.GetClipRange(), err)
	}
	r, err := secagg.NewRound(cfg, taskID, round, n)
	if err != nil {
		// Defaults resolve for any cohort NewRound takes: what is left is
		// the neighbour count and threshold the task chose.
		if auto, autoErr := secagg.NewRound(secagg.Config{K: cfg.K}, taskID, round, n); autoErr == nil {
			return nil, nil, fmt.Errorf("%s %d does not fit %d neighbours a participant (%s %d, %d participants a round): %w",
				names.Field("secagg.threshold"), c.GetThreshold(), auto.K(), names.Field("secagg.k"), c.GetK(), n, err)
		}
		return nil, nil, fmt.Errorf("secure aggregation of %d participants: %w", n, err)
	}
	out := SecAggProto(r.Config())
	out.NumParticipants = uint32(n)
	out.MaxWeight = c.GetMaxWeight()
	if out.MaxWeight == 0 {
		out.MaxWeight = DefaultSecAggMaxWeight
	}
	if !(out.MaxWeight > 0) || math.IsInf(out.MaxWeight, 0) {
		return nil, nil, fmt.Errorf("%s %v must be positive and finite", names.Field("secagg.max_weight"), out.MaxWeight)
	}
	d := c.GetStageTimeout().AsDuration()
	if d < 0 {
		return nil, nil, fmt.Errorf("%s %v must not be negative", names.Field("secagg.stage_timeout"), d)
	}
	if d == 0 {
		d = DefaultSecAggStageTimeout
	}
	out.StageTimeout = durationpb.New(d)
	if _, err := secagg.NewQuantizer(r.Bits(), out.ClipRange, n, out.MaxWeight); err != nil {
		return nil, nil, fmt.Errorf("%s %d with %d participants a round: %w", names.Field("secagg.bits"), r.Bits(), n, err)
	}
	return r, out, nil
}

// ResolveDP fills in a task's DP defaults: the RDP accountant, at least
// report_goal noise contributors for distributed mechanisms. It returns nil
// for tasks without DP.
func ResolveDP(task *pb.Task) *pb.DPConfig {
	c := task.GetDp()
	if c == nil || c.GetMechanism() == pb.DPMechanism_DP_MECHANISM_NONE || c.GetMechanism() == pb.DPMechanism_DP_MECHANISM_UNSPECIFIED {
		return nil
	}
	out := proto.Clone(c).(*pb.DPConfig)
	if out.Accountant == pb.Accountant_ACCOUNTANT_UNSPECIFIED {
		out.Accountant = pb.Accountant_ACCOUNTANT_RDP
	}
	if isDistributed(out.Mechanism) && out.MinNoiseContributors == 0 {
		out.MinNoiseContributors = task.GetReportGoal()
	}
	if Adaptive(out) {
		if out.ClipLearningRate == 0 {
			out.ClipLearningRate = DefaultClipLearningRate
		}
		if out.ClipCountStddev == 0 {
			// Andrew et al.: σ_b = (devices a round) / 20; at least z, so
			// that the bits take at most a quarter of the budget.
			out.ClipCountStddev = max(float64(task.GetReportGoal())/20, out.NoiseMultiplier)
		}
	}
	return out
}

// DefaultClipLearningRate is adaptive clipping's geometric learning rate η
// when a task gives none (Andrew et al. 2021).
const DefaultClipLearningRate = 0.2

// Accounting is how a task's committed training rounds spend its privacy
// budget.
type Accounting struct {
	// Config is the task's DP settings with ResolveDP's defaults.
	Config *pb.DPConfig
	// Q is the sampling rate the accountant assumes: 1 (no amplification)
	// unless the task claims one.
	Q float64
	// Distributed is the devices' noise of a distributed mechanism; nil
	// for central and local noise, and where the update's size was not
	// known (NewAccounting with dim 0).
	Distributed *dp.Distributed
	// Correlated is the central noise's correlation across rounds (tree
	// or BLT; nil for independent noise).
	Correlated *Correlated
}

// Correlated is correlated central noise over a task's Rounds rounds, in
// which a device contributes to at most Participations rounds, any two at
// least Separation apart (it may return Separation rounds after its last).
type Correlated struct {
	Noise          pb.DPNoise // DP_NOISE_TREE or DP_NOISE_BLT
	Rounds         int
	Participations int
	Separation     int
	// BLT is the factorization fitted to Rounds, Participations and
	// Separation (DP_NOISE_BLT).
	BLT dp.BLT
}

// BLTBuffers is the buffers of a task's fitted BLT: more fit no better
// (docs/DP.md).
const BLTBuffers = 4

// MaxCorrelatedRounds bounds the rounds correlated noise is laid out over:
// fitting a BLT takes time linear in them (about 1.7 s for 20,000 rounds on
// one core), and task creation and every task load fit it.
const MaxCorrelatedRounds = 20000

// newCorrelated resolves the limits of correlated noise over rounds.
func newCorrelated(cfg *pb.DPConfig, rounds int) (*Correlated, error) {
	b := max(1, int(cfg.GetMinSeparation()))
	// A device fits at most ⌈T/b⌉ rounds b apart; a cap may lower that.
	k := (rounds + b - 1) / b
	if cap := int(cfg.GetMaxRoundsPerDevice()); cap > 0 && cap < k {
		k = cap
	}
	return NewCorrelated(cfg.GetNoise(), rounds, k, b)
}

// NewCorrelated is noise (DP_NOISE_TREE or DP_NOISE_BLT) over rounds in
// which a device takes part at most participations times, separation
// rounds apart; a BLT is fitted to them.
func NewCorrelated(noise pb.DPNoise, rounds, participations, separation int) (*Correlated, error) {
	c := &Correlated{Noise: noise, Rounds: rounds, Participations: participations, Separation: separation}
	if c.Noise != pb.DPNoise_DP_NOISE_TREE && c.Noise != pb.DPNoise_DP_NOISE_BLT {
		return nil, fmt.Errorf("noise %v is not correlated", noise)
	}
	if c.Noise == pb.DPNoise_DP_NOISE_BLT {
		b, err := dp.FitBLT(rounds, c.Participations, c.Separation, BLTBuffers)
		if err != nil {
			return nil, err
		}
		c.BLT = b
	}
	if _, err := c.Rho(1, rounds); err != nil {
		return nil, err
	}
	return c, nil
}

// Rho is the ρ-zCDP of the first n rounds at noise multiplier z.
func (c *Correlated) Rho(z float64, n int) (float64, error) {
	if c.Noise == pb.DPNoise_DP_NOISE_TREE {
		// TF-Privacy counts the rounds between two participations.
		return dp.TreeZCDP(z, n, c.Participations, c.Separation-1)
	}
	return c.BLT.ZCDP(z, n, c.Participations, c.Separation)
}

// ErrSizeUnknown is EpsilonAfter's error for a distributed mechanism whose
// Accounting was made without the update's size.
var ErrSizeUnknown = errors.New("the epsilon of distributed noise depends on the model's size, which is not known here")

// NewAccounting checks a task's DP settings for updates of dim elements and
// returns how its rounds are accounted; nil, nil for a task without DP. A
// dim of 0, for callers that do not know the model (the CLI), leaves out
// the checks of distributed mechanisms that depend on its size; the server
// makes them.
func NewAccounting(task *pb.Task, dim int, names Names) (*Accounting, error) {
	cfg := ResolveDP(task)
	if cfg == nil {
		return nil, nil
	}
	positive := func(path string, v float64) error {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%s %v must be positive and finite", names.Field(path), v)
		}
		return nil
	}
	for _, f := range []struct {
		path string
		v    float64
	}{{"dp.clip_norm", cfg.GetClipNorm()}, {"dp.noise_multiplier", cfg.GetNoiseMultiplier()}, {"dp.target_epsilon", cfg.GetTargetEpsilon()}} {
		if err := positive(f.path, f.v); err != nil {
			return nil, err
		}
	}
	mech := cfg.GetMechanism()
	switch {
	case !(cfg.GetDelta() > 0 && cfg.GetDelta() < 1):
		return nil, fmt.Errorf("%s %v must be in (0, 1), well below 1/(number of devices)", names.Field("dp.delta"), cfg.GetDelta())
	case !(cfg.GetSamplingRate() >= 0 && cfg.GetSamplingRate() <= 1):
		return nil, fmt.Errorf("%s %v must be in [0, 1]", names.Field("dp.sampling_rate"), cfg.GetSamplingRate())
	case Adaptive(cfg) && !(cfg.GetTargetUnclippedQuantile() > 0 && cfg.GetTargetUnclippedQuantile() < 1):
		return nil, fmt.Errorf("%s %v must be in (0, 1): the fraction of updates to leave unclipped",
			names.Field("dp.target_unclipped_quantile"), cfg.GetTargetUnclippedQuantile())
	case Adaptive(cfg) && (!(cfg.GetClipLearningRate() > 0) || math.IsInf(cfg.GetClipLearningRate(), 0)):
		return nil, fmt.Errorf("%s %v must be positive and finite", names.Field("dp.clip_learning_rate"), cfg.GetClipLearningRate())
	case !Adaptive(cfg) && cfg.GetClipCountStddev() != 0:
		return nil, fmt.Errorf("%s applies to adaptive clipping: set %s, or leave it at 0", names.Field("dp.clip_count_stddev"),
			names.Field("dp.target_unclipped_quantile"))
	case Adaptive(cfg) && (!(cfg.GetClipCountStddev() > cfg.GetNoiseMultiplier()/2) || math.IsInf(cfg.GetClipCountStddev(), 0)):
		return nil, fmt.Errorf("%s %v must be finite and above %s / 2 = %v: the clipping bits alone would spend the whole budget",
			names.Field("dp.clip_count_stddev"), cfg.GetClipCountStddev(), names.Field("dp.noise_multiplier"), cfg.GetNoiseMultiplier()/2)
	case Adaptive(cfg) && mech == pb.DPMechanism_DP_MECHANISM_LOCAL:
		return nil, fmt.Errorf("adaptive clipping (%s) needs a central or distributed %s: local noise leaves no count to noise once",
			names.Field("dp.target_unclipped_quantile"), names.Field("dp.mechanism"))
	case isDistributed(mech) && task.GetSecagg() == nil:
		return nil, fmt.Errorf("%s %s adds noise on the devices and needs secure aggregation (%s)",
			names.Field("dp.mechanism"), names.Value(mech), names.Field("secagg"))
	case isDistributed(mech) && cfg.GetSamplingRate() > 0:
		return nil, fmt.Errorf("distributed mechanisms claim no amplification by sampling; leave %s at 0", names.Field("dp.sampling_rate"))
	case !isDistributed(mech) && mech != pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN && mech != pb.DPMechanism_DP_MECHANISM_LOCAL:
		return nil, fmt.Errorf("%s %s is not a known mechanism", names.Field("dp.mechanism"), names.Value(mech))
	case cfg.GetAccountant() != pb.Accountant_ACCOUNTANT_RDP && cfg.GetAccountant() != pb.Accountant_ACCOUNTANT_PLD:
		return nil, fmt.Errorf("%s %s is not a known accountant; use %s or %s", names.Field("dp.accountant"), names.Value(cfg.GetAccountant()),
			names.Value(pb.Accountant_ACCOUNTANT_RDP), names.Value(pb.Accountant_ACCOUNTANT_PLD))
	case cfg.GetNoise() != pb.DPNoise_DP_NOISE_UNSPECIFIED && cfg.GetNoise() != pb.DPNoise_DP_NOISE_INDEPENDENT &&
		cfg.GetNoise() != pb.DPNoise_DP_NOISE_TREE && cfg.GetNoise() != pb.DPNoise_DP_NOISE_BLT:
		return nil, fmt.Errorf("%s %s is not a known noise; use %s, %s or %s", names.Field("dp.noise"), names.Value(cfg.GetNoise()),
			names.Value(pb.DPNoise_DP_NOISE_INDEPENDENT), names.Value(pb.DPNoise_DP_NOISE_TREE), names.Value(pb.DPNoise_DP_NOISE_BLT))
	case correlated(cfg) && mech != pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN:
		return nil, fmt.Errorf("%s %s is noise the server adds: it needs %s %s", names.Field("dp.noise"), names.Value(cfg.GetNoise()),
			names.Field("dp.mechanism"), names.Value(pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN))
	case correlated(cfg) && cfg.GetSamplingRate() > 0:
		return nil, fmt.Errorf("%s %s assumes no sampling; leave %s at 0", names.Field("dp.noise"), names.Value(cfg.GetNoise()),
			names.Field("dp.sampling_rate"))
	case correlated(cfg) && cfg.GetAccountant() != pb.Accountant_ACCOUNTANT_RDP:
		return nil, fmt.Errorf("%s %s is accounted in zCDP, converted as RDP: use %s %s", names.Field("dp.noise"), names.Value(cfg.GetNoise()),
			names.Field("dp.accountant"), names.Value(pb.Accountant_ACCOUNTANT_RDP))
	case correlated(cfg) && task.GetRoundsTotal() == 0:
		return nil, fmt.Errorf("%s %s is laid out over the task's rounds: give %s", names.Field("dp.noise"), names.Value(cfg.GetNoise()),
			names.Field("rounds_total"))
	case correlated(cfg) && task.GetRoundsTotal() > MaxCorrelatedRounds:
		return nil, fmt.Errorf("%s %s is laid out over at most %d rounds, not %s %d: run fewer rounds, or independent noise",
			names.Field("dp.noise"), names.Value(cfg.GetNoise()), MaxCorrelatedRounds, names.Field("rounds_total"), task.GetRoundsTotal())
	case isDistributed(mech) && task.GetCohortTarget() > 0 && cfg.GetMinNoiseContributors() > task.GetCohortTarget():
		// The noise is calibrated for that many reports and a round with
		// fewer is abandoned: no round could ever commit.
		return nil, fmt.Errorf("%s %d is more than %s %d: no round could ever have that many reports", names.Field("dp.min_noise_contributors"),
			cfg.GetMinNoiseContributors(), names.Field("cohort_target"), task.GetCohortTarget())
	}
	a := &Accounting{Config: cfg, Q: 1}
	if q := cfg.GetSamplingRate(); q > 0 {
		a.Q = q
	}
	if correlated(cfg) {
		c, err := newCorrelated(cfg, int(task.GetRoundsTotal()))
		if err != nil {
			return nil, fmt.Errorf("%s %s over %s %d with %s %d and %s %d: %w", names.Field("dp.noise"), names.Value(cfg.GetNoise()),
				names.Field("rounds_total"), task.GetRoundsTotal(), names.Field("dp.max_rounds_per_device"), cfg.GetMaxRoundsPerDevice(),
				names.Field("dp.min_separation"), cfg.GetMinSeparation(), err)
		}
		a.Correlated = c
	}
	if dc, ok := Distributed(cfg); ok {
		bits := toInt(task.GetSecagg().GetBits())
		if bits == 0 {
			bits = secagg.DefaultBits
		}
		if err := dc.Validate(); err != nil {
			return nil, fmt.Errorf("%s %s: %w", names.Field("dp.mechanism"), names.Value(mech), err)
		}
		if dim == 0 {
			return a, nil
		}
		dist, err := dp.DistributedFor(dc, dim, bits)
		if err != nil {
			return nil, fmt.Errorf("%s %s in a %d-bit ring (%s) with %d noise contributors (%s): %w", names.Field("dp.mechanism"),
				names.Value(mech), bits, names.Field("secagg.bits"), dc.Contributors, names.Field("dp.min_noise_contributors"), err)
		}
		a.Distributed = dist
	}
	if _, err := a.EpsilonAfter(1); err != nil {
		return nil, fmt.Errorf("%s, %s and %s cannot be accounted: %w", names.Field("dp.noise_multiplier"),
			names.Field("dp.delta"), names.Field("dp.sampling_rate"), err)
	}
	return a, nil
}

// EpsilonAfter is the task's ε at its δ after rounds committed training
// rounds.
func (a *Accounting) EpsilonAfter(rounds int) (float64, error) {
	if rounds <= 0 {
		return 0, nil
	}
	if _, ok := Mechanism(a.Config.GetMechanism()); ok {
		if a.Distributed == nil {
			return 0, ErrSizeUnknown
		}
		return a.Distributed.Epsilon(rounds, a.Config.GetDelta())
	}
	if c := a.Correlated; c != nil {
		// The prefix of the releases so far: past the task's rounds the
		// noise is not laid out, and those rounds are accounted as its end.
		n := min(rounds, c.Rounds)
		rho, err := c.Rho(UpdateNoiseMultiplier(a.Config), n)
		if err != nil {
			return 0, err
		}
		if Adaptive(a.Config) {
			// Each of a device's rounds releases its bit in a count with
			// independent noise σ_b: sensitivity ½ (the sum of centred
			// bits), ρ = (½)²/(2σ_b²) each.
			p := min(c.Participations, (n+c.Separation-1)/c.Separation)
			sb := a.Config.GetClipCountStddev()
			rho += float64(p) / (8 * sb * sb)
		}
		eps, _, err := dp.EpsilonFromZCDP(rho, a.Config.GetDelta(), nil)
		return eps, err
	}
	// With adaptive clipping the update noise is z_Δ and the bits' is σ_b:
	// together one Gaussian mechanism of multiplier z on the vector
	// (update/z_Δ, bit/(2σ_b)) (Andrew et al. 2021, Theorem 1), so z is
	// the exact account.
	acct := dp.RDP
	if a.Config.GetAccountant() == pb.Accountant_ACCOUNTANT_PLD {
		acct = dp.PLD
	}
	return dp.Epsilon([]dp.Event{{Q: a.Q, NoiseMultiplier: a.Config.GetNoiseMultiplier(), Steps: rounds}}, a.Config.GetDelta(),
		dp.WithAccountant(acct))
}

// correlated reports whether cfg's central noise is correlated across rounds.
func correlated(cfg *pb.DPConfig) bool {
	return cfg.GetNoise() == pb.DPNoise_DP_NOISE_TREE || cfg.GetNoise() == pb.DPNoise_DP_NOISE_BLT
}

func isDistributed(m pb.DPMechanism) bool {
	_, ok := Mechanism(m)
	return ok
}

// orList joins names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
