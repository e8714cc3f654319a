package dp

import (
	"fmt"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// MechanismOf maps a task's distributed DP mechanism to this package's; ok
// is false for mechanisms that are not distributed.
func MechanismOf(m pb.DPMechanism) (mech Mechanism, ok bool) {
	switch m {
	case pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN:
		return DiscreteGaussian, true
	case pb.DPMechanism_DP_MECHANISM_SKELLAM:
		return Skellam, true
	}
	return 0, false
}

// DistributedFor returns the distributed mechanism a round's DPConfig
// describes for dim-element updates summed in Z_{2^bits}: noise calibrated
// for cfg.min_noise_contributors devices, clip norm cfg.clip_norm and noise
// multiplier cfg.noise_multiplier. The server and every device of the round
// derive the same parameters from the same plan.
func DistributedFor(cfg *pb.DPConfig, dim, bits int) (*Distributed, error) {
	mech, ok := MechanismOf(cfg.GetMechanism())
	if !ok {
		return nil, fmt.Errorf("dp: %w: mechanism %v is not distributed", ErrInvalid, cfg.GetMechanism())
	}
	return NewDistributed(mech, dim, bits, int(cfg.GetMinNoiseContributors()), cfg.GetClipNorm(), cfg.GetNoiseMultiplier())
}
