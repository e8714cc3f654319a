package privacyconf_test

import (
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

func TestSecAgg(t *testing.T) {
	got := privacyconf.SecAgg(&pb.SecAggConfig{K: 6, Threshold: 4, Bits: 20, ClipRange: 0.5, GraphSeed: 99,
		NumParticipants: 30, MaxWeight: 100})
	want := secagg.Config{K: 6, Threshold: 4, Bits: 20, ClipRange: 0.5, GraphSeed: 99}
	if got != want {
		t.Errorf("SecAgg = %+v, want %+v", got, want)
	}
	if got := privacyconf.SecAgg(nil); got != (secagg.Config{}) {
		t.Errorf("SecAgg(nil) = %+v, want the zero Config", got)
	}
	// The largest counts a peer can send stay large: a complete graph, and
	// a threshold and modulus no round accepts.
	huge := privacyconf.SecAgg(&pb.SecAggConfig{K: math.MaxUint32, Threshold: math.MaxUint32, Bits: math.MaxUint32})
	if huge.K < secagg.MaxParticipants || huge.Threshold < secagg.MaxParticipants || huge.Bits <= 32 {
		t.Errorf("SecAgg of maximal counts = %+v", huge)
	}
	if _, err := secagg.NewRound(huge, "t", 1, 10); !errors.Is(err, secagg.ErrConfig) {
		t.Errorf("NewRound of maximal counts: %v, want ErrConfig", err)
	}
	r, err := secagg.NewRound(privacyconf.SecAgg(&pb.SecAggConfig{K: math.MaxUint32}), "t", 1, 10)
	if err != nil || r.K() != 9 {
		t.Errorf("k = MaxUint32 for 10 participants: %v, %v; want the complete graph", r, err)
	}
}

// A device that converts the plan the server wrote resolves the round the
// server resolved.
func TestSecAggPlanRoundTrip(t *testing.T) {
	for _, task := range []*pb.SecAggConfig{
		{},
		{K: 5, Bits: 16, ClipRange: 2},
		{K: 500, Threshold: 300, GraphSeed: 7},
		{K: 10, Threshold: 10, Bits: 1, ClipRange: 0.25, GraphSeed: math.MaxUint64},
	} {
		server, err := secagg.NewRound(privacyconf.SecAgg(task), "task", 3, 400)
		if err != nil {
			t.Fatalf("%v: %v", task, err)
		}
		plan := privacyconf.SecAggProto(server.Config())
		device, err := secagg.NewRound(privacyconf.SecAgg(plan), "task", 3, 400)
		if err != nil {
			t.Fatalf("%v: device: %v", task, err)
		}
		if server.Config() != device.Config() {
			t.Errorf("%v: server resolved %+v, device %+v", task, server.Config(), device.Config())
		}
		if plan.GetK() != uint32(server.K()) || plan.GetThreshold() != uint32(server.Threshold()) ||
			plan.GetBits() != uint32(server.Bits()) {
			t.Errorf("%v: plan %v for k=%d t=%d b=%d", task, plan, server.K(), server.Threshold(), server.Bits())
		}
	}
	if p := privacyconf.SecAggProto(secagg.Config{K: -1, Threshold: math.MaxInt}); p.GetK() != 0 || p.GetThreshold() != math.MaxUint32 {
		t.Errorf("SecAggProto clamps to %v", p)
	}
}

func TestMechanism(t *testing.T) {
	want := map[pb.DPMechanism]dp.Mechanism{
		pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN: dp.DiscreteGaussian,
		pb.DPMechanism_DP_MECHANISM_SKELLAM:                       dp.Skellam,
	}
	// Every value the enum defines, and one it does not.
	ms := []pb.DPMechanism{pb.DPMechanism(len(pb.DPMechanism_name) + 1)}
	for v := range pb.DPMechanism_name {
		ms = append(ms, pb.DPMechanism(v))
	}
	for _, m := range ms {
		got, ok := privacyconf.Mechanism(m)
		w, distributed := want[m]
		if ok != distributed || got != w {
			t.Errorf("Mechanism(%v) = %v, %v; want %v, %v", m, got, ok, w, distributed)
		}
	}
}

func TestDistributed(t *testing.T) {
	c := &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_SKELLAM, ClipNorm: 0.7, NoiseMultiplier: 1.2,
		MinNoiseContributors: 25, TargetEpsilon: 8, Delta: 1e-6}
	got, ok := privacyconf.Distributed(c)
	want := dp.DistributedConfig{Mechanism: dp.Skellam, Contributors: 25, ClipNorm: 0.7, NoiseMultiplier: 1.2}
	if !ok || got != want {
		t.Errorf("Distributed = %+v, %v; want %+v", got, ok, want)
	}
	if _, err := dp.DistributedFor(got, 1000, 20); err != nil {
		t.Errorf("DistributedFor: %v", err)
	}
	for _, c := range []*pb.DPConfig{nil, {}, {Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1}} {
		if got, ok := privacyconf.Distributed(c); ok || got != (dp.DistributedConfig{}) {
			t.Errorf("Distributed(%v) = %+v, %v; want not distributed", c, got, ok)
		}
	}
	// A plan without contributors converts; the library refuses it.
	zero, ok := privacyconf.Distributed(&pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_DISTRIBUTED_DISCRETE_GAUSSIAN, ClipNorm: 1, NoiseMultiplier: 1})
	if _, err := dp.DistributedFor(zero, 10, 16); !ok || !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("zero contributors: ok %v, DistributedFor %v; want ErrInvalid", ok, err)
	}
}
