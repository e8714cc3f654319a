// Package privacyconf turns the privacy settings of the wire protocol
// (SecAggConfig, DPConfig) into the privacy libraries' own configurations,
// secagg.Config and dp.DistributedConfig. The aggregator and the device agent
// both convert through it, once, where a task or a round plan enters them:
// both sides must derive a round's parameters from a plan by the same rules,
// and privacy/secagg and privacy/dp stay free of protobuf configuration.
// It also holds the rules a task's privacy settings must meet (CheckSecAgg,
// NewAccounting): the server refuses tasks by them and the CLI refuses its
// flags by them, each naming the settings in its own terms (Names).
//
// It lives beside the protocol (like proto/wire) rather than in internal/,
// which holds leaf helpers: it is part of what the wire messages mean, and
// server/ and edge/, which share no code by import, may both use it.
package privacyconf

import (
	"math"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// SecAgg returns the secure aggregation settings c carries; a nil c is all
// defaults. The fields that only the services use (num_participants,
// max_weight, stage_timeout) are not part of a secagg.Config: the round's
// cohort size is NewRound's n, the others go to the Quantizer and the
// server's stage timer. Validation is NewRound's.
func SecAgg(c *pb.SecAggConfig) secagg.Config {
	return secagg.Config{
		K:         toInt(c.GetK()),
		Threshold: toInt(c.GetThreshold()),
		Bits:      toInt(c.GetBits()),
		ClipRange: c.GetClipRange(),
		GraphSeed: c.GetGraphSeed(),
		Group:     c.GetGroup(),
	}
}

// SecAggProto is the inverse of SecAgg for the fields a secagg.Config
// holds: the server writes a round's resolved configuration into its plans
// with it, and each device's SecAgg of the plan gives the same Config back.
func SecAggProto(c secagg.Config) *pb.SecAggConfig {
	return &pb.SecAggConfig{
		K:         toUint32(c.K),
		Threshold: toUint32(c.Threshold),
		Bits:      toUint32(c.Bits),
		ClipRange: c.ClipRange,
		GraphSeed: c.GraphSeed,
		Group:     c.Group,
	}
}

// Mechanism maps a task's DP mechanism to privacy/dp's distributed
// mechanism; ok is false for mechanisms that are not distributed (central,
// local, none, unknown).
func Mechanism(m pb.DPMechanism) (mech dp.Mechanism, ok bool) {
	switch m {
	case pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN:
		return dp.DiscreteGaussian, true
	case pb.DPMechanism_DP_MECHANISM_SKELLAM:
		return dp.Skellam, true
	}
	return 0, false
}

// Distributed returns the distributed DP settings c carries: its mechanism,
// min_noise_contributors, clip_norm and noise multiplier for updates
// (UpdateNoiseMultiplier), and with adaptive clipping the count's noise
// (clip_count_stddev). ok is false when
// c is nil or its mechanism is not distributed. Validation is
// dp.DistributedFor's.
func Distributed(c *pb.DPConfig) (cfg dp.DistributedConfig, ok bool) {
	mech, ok := Mechanism(c.GetMechanism())
	if !ok {
		return dp.DistributedConfig{}, false
	}
	cfg = dp.DistributedConfig{
		Mechanism:       mech,
		Contributors:    toInt(c.GetMinNoiseContributors()),
		ClipNorm:        c.GetClipNorm(),
		NoiseMultiplier: UpdateNoiseMultiplier(c),
	}
	if Adaptive(c) {
		cfg.CountStddev = c.GetClipCountStddev()
	}
	return cfg, true
}

// Adaptive reports whether c clips adaptively (target_unclipped_quantile).
func Adaptive(c *pb.DPConfig) bool { return c.GetTargetUnclippedQuantile() != 0 }

// UpdateNoiseMultiplier is the multiplier of the noise on updates: the
// task's noise_multiplier z, or with adaptive clipping the z_Δ at which
// updates and clipping bits together cost what z alone would
// (dp.AdjustedNoiseMultiplier with clip_count_stddev). NaN where c's
// settings admit none; task creation refuses those.
func UpdateNoiseMultiplier(c *pb.DPConfig) float64 {
	z := c.GetNoiseMultiplier()
	if !Adaptive(c) {
		return z
	}
	zd, err := dp.AdjustedNoiseMultiplier(z, c.GetClipCountStddev())
	if err != nil {
		return math.NaN()
	}
	return zd
}

// toInt clamps instead of wrapping where int is 32 bits, so a count too
// large for any round reads as too large, never as negative or small.
func toInt(v uint32) int { return int(min(v, math.MaxInt32)) }

// toUint32 clamps a count into the wire's range.
func toUint32(v int) uint32 { return uint32(min(max(int64(v), 0), math.MaxUint32)) }
