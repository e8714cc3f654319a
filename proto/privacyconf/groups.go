package privacyconf

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Group sizes of secure aggregation (SecAggConfig.group_size).
const (
	// DefaultSecAggGroupSize is the largest group when a task leaves
	// group_size zero: cohorts up to it run as one SecAgg+ instance.
	DefaultSecAggGroupSize = 500
	// MinSecAggGroupSize is the smallest group_size a task may set. The
	// server learns each group's sum, so a group is the crowd a device's
	// update hides in; groups are at least half of group_size (a cohort
	// just above it splits in two).
	MinSecAggGroupSize = 10
)

// GroupSizes splits a round's n participants into the groups its secure
// aggregation runs as: ⌈n / size⌉ groups (size 0: DefaultSecAggGroupSize)
// of near-equal size, the first n mod that count one larger, numbered from
// participant 1 on. A round is one group when n fits or when oneGroup
// (distributed DP, whose noise is calibrated to the whole sum).
func GroupSizes(n int, size uint32, oneGroup bool) []int {
	s := int(size)
	if s == 0 {
		s = DefaultSecAggGroupSize
	}
	if oneGroup || n <= s {
		return []int{n}
	}
	g := (n + s - 1) / s
	out := make([]int, g)
	for i := range out {
		out[i] = n / g
		if i < n%g {
			out[i]++
		}
	}
	return out
}

// GroupOf maps a round's participant p (1-based) to its group (1-based;
// 0 for a round of one group) and its participant number within it, for
// the sizes GroupSizes gave. ok is false for a p outside the round.
func GroupOf(sizes []int, p uint32) (group, local uint32, ok bool) {
	if p == 0 {
		return 0, 0, false
	}
	if len(sizes) == 1 {
		return 0, p, int(p) <= sizes[0]
	}
	rest := int(p)
	for i, s := range sizes {
		if rest <= s {
			return uint32(i + 1), uint32(rest), true
		}
		rest -= s
	}
	return 0, 0, false
}

// ResolveSecAggGroups is ResolveSecAgg for a round that may run as groups
// (GroupSizes): the SecAgg+ instance and the plan's configuration of each
// group, in group order. A round of one group gets ResolveSecAgg's round
// and configuration unchanged. A group's configuration keeps the round's
// num_participants, which sizes quantization (the groups' sums add up to
// the round's), and sets group, group_participants and the group's own
// neighbour count and threshold.
func ResolveSecAggGroups(c *pb.SecAggConfig, taskID string, round uint64, n int, seed uint64, oneGroup bool, names Names) ([]*secagg.Round, []*pb.SecAggConfig, error) {
	whole, out, err := ResolveSecAgg(c, taskID, round, n, seed, names)
	if err != nil {
		return nil, nil, err
	}
	if gs := c.GetGroupSize(); gs != 0 && gs < MinSecAggGroupSize {
		return nil, nil, fmt.Errorf("%s %d is below %d: the server learns each group's sum", names.Field("secagg.group_size"), gs, MinSecAggGroupSize)
	}
	out.GroupSize = c.GetGroupSize()
	sizes := GroupSizes(n, c.GetGroupSize(), oneGroup)
	if len(sizes) == 1 {
		return []*secagg.Round{whole}, []*pb.SecAggConfig{out}, nil
	}
	rounds := make([]*secagg.Round, len(sizes))
	cfgs := make([]*pb.SecAggConfig, len(sizes))
	for i, size := range sizes {
		cfg := SecAgg(c)
		cfg.GraphSeed, cfg.ClipRange, cfg.Bits, cfg.Group = seed, out.GetClipRange(), int(out.GetBits()), uint32(i+1)
		r, err := secagg.NewRound(cfg, taskID, round, size)
		if err != nil {
			return nil, nil, fmt.Errorf("secure aggregation group %d of %d participants (%s %d): %w",
				i+1, size, names.Field("secagg.group_size"), c.GetGroupSize(), err)
		}
		g := proto.Clone(out).(*pb.SecAggConfig)
		rc := r.Config()
		g.K, g.Threshold, g.Group, g.GroupParticipants = uint32(rc.K), uint32(rc.Threshold), uint32(i+1), uint32(size)
		rounds[i], cfgs[i] = r, g
	}
	return rounds, cfgs, nil
}

// DeviceRound is the SecAgg+ instance a device's plan puts it in: its
// group's (group_participants of them), or the whole round's when the round
// is one group.
//
// A device refuses a group smaller than any task's groups can be (half of
// MinSecAggGroupSize) or larger than the round: the server learns each
// group's sum, so a group of a few would reveal little less than each
// update.
func DeviceRound(c *pb.SecAggConfig, taskID string, round uint64) (*secagg.Round, error) {
	n := int(c.GetNumParticipants())
	if c.GetGroup() != 0 {
		g := int(c.GetGroupParticipants())
		if g < (MinSecAggGroupSize+1)/2 || g > n {
			return nil, fmt.Errorf("secure aggregation group %d of %d participants in a round of %d: a group has %d to %d",
				c.GetGroup(), g, n, (MinSecAggGroupSize+1)/2, n)
		}
		n = g
	}
	return secagg.NewRound(SecAgg(c), taskID, round, n)
}
