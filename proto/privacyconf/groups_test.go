package privacyconf_test

import (
	"slices"
	"testing"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

func TestGroupSizes(t *testing.T) {
	for _, c := range []struct {
		n        int
		size     uint32
		oneGroup bool
		want     []int
	}{
		{1000, 0, false, []int{500, 500}},
		{500, 0, false, []int{500}},
		{1001, 0, false, []int{334, 334, 333}},
		{1000, 0, true, []int{1000}},
		{25, 10, false, []int{9, 8, 8}},
		{10, 10, false, []int{10}},
		{11, 10, false, []int{6, 5}},
	} {
		got := privacyconf.GroupSizes(c.n, c.size, c.oneGroup)
		if !slices.Equal(got, c.want) {
			t.Errorf("GroupSizes(%d, %d, %v) = %v, want %v", c.n, c.size, c.oneGroup, got, c.want)
		}
		sum := 0
		for _, s := range got {
			sum += s
		}
		if sum != c.n {
			t.Errorf("GroupSizes(%d, …) sums to %d", c.n, sum)
		}
		// Every participant lands in exactly one group, in order.
		next := map[uint32]uint32{}
		for p := uint32(1); int(p) <= c.n; p++ {
			g, local, ok := privacyconf.GroupOf(got, p)
			if !ok || local != next[g]+1 || (len(got) == 1) != (g == 0) {
				t.Fatalf("GroupOf(%v, %d) = %d, %d, %v", got, p, g, local, ok)
			}
			next[g] = local
		}
		if _, _, ok := privacyconf.GroupOf(got, uint32(c.n+1)); ok {
			t.Errorf("GroupOf(%v, %d) is in a group", got, c.n+1)
		}
		if _, _, ok := privacyconf.GroupOf(got, 0); ok {
			t.Errorf("GroupOf(%v, 0) is in a group", got)
		}
	}
}

func TestResolveSecAggGroups(t *testing.T) {
	rounds, cfgs, err := privacyconf.ResolveSecAggGroups(&pb.SecAggConfig{GroupSize: 10}, "t-1", 3, 25, 99, false, privacyconf.APINames)
	if err != nil {
		t.Fatal(err)
	}
	if len(rounds) != 3 || len(cfgs) != 3 {
		t.Fatalf("%d rounds, %d configs, want 3", len(rounds), len(cfgs))
	}
	for i, c := range cfgs {
		g := uint32(i + 1)
		if c.Group != g || c.NumParticipants != 25 || int(c.GroupParticipants) != rounds[i].N() || rounds[i].Group() != g ||
			c.K != uint32(rounds[i].K()) || c.Threshold != uint32(rounds[i].Threshold()) || c.GraphSeed != 99 || c.GroupSize != 10 {
			t.Errorf("group %d: config %v, round n %d k %d t %d group %d", g, c, rounds[i].N(), rounds[i].K(), rounds[i].Threshold(), rounds[i].Group())
		}
		// A device rebuilds its group's round from the plan alone.
		again, err := privacyconf.DeviceRound(c, "t-1", 3)
		if err != nil || again.Group() != g || again.N() != rounds[i].N() || again.K() != rounds[i].K() {
			t.Errorf("group %d: the device's round %v, %v", g, again, err)
		}
	}
	one, oneCfg, err := privacyconf.ResolveSecAggGroups(&pb.SecAggConfig{}, "t-1", 3, 25, 99, false, privacyconf.APINames)
	if err != nil || len(one) != 1 || oneCfg[0].Group != 0 || oneCfg[0].GroupParticipants != 0 || one[0].N() != 25 {
		t.Fatalf("one group: %v, %v, %v", one, oneCfg, err)
	}
	if _, _, err := privacyconf.ResolveSecAggGroups(&pb.SecAggConfig{GroupSize: 4}, "t-1", 3, 25, 99, false, privacyconf.APINames); err == nil {
		t.Error("a group size of 4 accepted")
	}
	// A device refuses a plan that puts it in a group too small to hide in,
	// or larger than the round.
	for _, bad := range []struct{ group, n, total uint32 }{{1, 2, 25}, {1, 4, 25}, {2, 30, 25}} {
		c := &pb.SecAggConfig{Group: bad.group, GroupParticipants: bad.n, NumParticipants: bad.total, GraphSeed: 1}
		if _, err := privacyconf.DeviceRound(c, "t-1", 3); err == nil {
			t.Errorf("a device took group %d of %d in a round of %d", bad.group, bad.n, bad.total)
		}
	}
}
