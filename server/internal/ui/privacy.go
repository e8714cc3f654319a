package ui

import (
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// secAggView is a task's secure aggregation as its rounds run it, resolved
// for the task's cohort slots by the rules the server runs them with.
type secAggView struct {
	Participants, K, Threshold, Bits int
	Complete, RecommendedK           bool
	// Groups are the sizes of the SecAgg+ instances a round runs as (one
	// for a cohort within the group size); K, Threshold and Complete are
	// the first group's.
	Groups             int
	GroupMin, GroupMax int
	// DP says every update weighs 1, so MaxWeight is 1.
	DP                   bool
	ClipRange, MaxWeight float64
	StageTimeout         time.Duration
	// Err says why the settings do not resolve; the other fields are then
	// unset.
	Err string
}

func secAggViewOf(t *pb.Task) *secAggView {
	sa := t.GetSecagg()
	if sa == nil {
		return nil
	}
	n := privacyconf.Participants(t)
	_, distributed := privacyconf.Distributed(privacyconf.ResolveDP(t))
	rs, cs, err := privacyconf.ResolveSecAggGroups(privacyconf.RoundSecAgg(t), "task", 1, n, 0, distributed, privacyconf.APINames)
	if err != nil {
		return &secAggView{Err: err.Error()}
	}
	r, c := rs[0], cs[0]
	v := &secAggView{Participants: n, K: r.K(), Threshold: r.Threshold(), Bits: r.Bits(),
		Complete: r.K() >= r.N()-1, RecommendedK: sa.GetK() == 0, ClipRange: c.GetClipRange(), MaxWeight: c.GetMaxWeight(),
		StageTimeout: c.GetStageTimeout().AsDuration(), DP: privacyconf.ResolveDP(t) != nil}
	v.Groups, v.GroupMin, v.GroupMax = len(rs), rs[len(rs)-1].N(), rs[0].N() // the first groups are the larger
	return v
}

// dpView is a task's differential privacy with the server's defaults
// filled in.
type dpView struct {
	Mechanism, Noise, Accountant string
	Distributed                  bool
	NoiseMultiplier, ClipNorm    float64
	SamplingRate                 float64
	Contributors, MaxRounds      uint32
	MinSeparation                uint32
	// Adaptive clipping: the target quantile (0 without), its rate and
	// count noise, and the multiplier the updates are noised at.
	Quantile, ClipRate, CountStddev, UpdateNoise float64
}

func dpViewOf(t *pb.Task) *dpView {
	c := privacyconf.ResolveDP(t)
	if c == nil {
		return nil
	}
	v := &dpView{Mechanism: enum(c.GetMechanism(), "DP_MECHANISM_"), NoiseMultiplier: c.GetNoiseMultiplier(),
		ClipNorm: c.GetClipNorm(), SamplingRate: c.GetSamplingRate(), MaxRounds: c.GetMaxRoundsPerDevice(),
		MinSeparation: c.GetMinSeparation(), Accountant: enum(c.GetAccountant(), "ACCOUNTANT_")}
	if privacyconf.Adaptive(c) {
		v.Quantile, v.ClipRate, v.CountStddev = c.GetTargetUnclippedQuantile(), c.GetClipLearningRate(), c.GetClipCountStddev()
		v.UpdateNoise = privacyconf.UpdateNoiseMultiplier(c)
	}
	switch c.GetMechanism() {
	case pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN:
		v.Noise = "the server adds Gaussian noise to the aggregate"
		switch c.GetNoise() {
		case pb.DPNoise_DP_NOISE_TREE:
			v.Noise += ", correlated across rounds by tree aggregation (DP-FTRL)"
		case pb.DPNoise_DP_NOISE_BLT:
			v.Noise += ", correlated across rounds by a fitted BLT (DP-FTRL)"
		}
	case pb.DPMechanism_DP_MECHANISM_LOCAL:
		v.Noise = "each device adds Gaussian noise to its own update"
	case pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN:
		v.Noise = "devices add shares of discrete Gaussian noise under secure aggregation"
	case pb.DPMechanism_DP_MECHANISM_SKELLAM:
		v.Noise = "devices add shares of Skellam noise under secure aggregation"
	}
	if _, ok := privacyconf.Mechanism(c.GetMechanism()); ok {
		v.Distributed, v.Contributors = true, c.GetMinNoiseContributors()
		v.Accountant = "rdp, of the distributed mechanism"
	}
	return v
}
