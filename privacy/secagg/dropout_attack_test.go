package secagg_test

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Strategic dropout: a malicious server, with colluding participants
// (Sybils whose identity keys it holds), declares participants dropped or
// alive as suits it so that the unmasking reveals one honest input. The
// round is the complete graph of 7 (k = 6, t = 4); the target, 4, sent
// its masked input, so the server holds y₄ and needs both its self-mask
// seed b₄ (asked of those told 4 survived) and its mask key s₄ (asked of
// those told 4 dropped), t shares of each; each colluder holds one share
// of both.

const (
	target   = 4
	sdN      = 7
	sdThresh = 4
)

var sdConfig = secagg.Config{K: sdN - 1, Threshold: sdThresh, GraphSeed: 9}

// atConsistency is a fresh round after every participant sent its masked
// input.
func atConsistency(t *testing.T) *cohort {
	t.Helper()
	c := newCohort(t, sdConfig, sdN, 3, 31)
	c.stop = secagg.StageConsistency
	if out := c.run(t, nil, randomInputs(rand.New(rand.NewPCG(5, 5)), sdN, 3, 32)); out.err != nil || len(out.clientErr) > 0 {
		t.Fatalf("setup: %v %v", out.err, out.clientErr)
	}
	return c
}

// sybilCheck is colluder id's consistency signature over set, made with
// the identity key the server holds.
func sybilCheck(c *cohort, id uint32, set []uint32) *pb.ConsistencyCheck {
	return &pb.ConsistencyCheck{TaskId: testTask, Round: 7, ParticipantId: id, KeyId: "dev-key",
		Signature: ed25519.Sign(c.idents[id-1], secagg.ConsistencyMessage(c.r, id, set))}
}

func union(sets ...[]uint32) []uint32 {
	var out []uint32
	for _, s := range sets {
		out = append(out, s...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func without(set []uint32, id uint32) []uint32 {
	return slices.DeleteFunc(slices.Clone(set), func(x uint32) bool { return x == id })
}

// splitView plays the split-view attack on a fresh round: the target and
// the honest participants in a are shown S_A, everyone (the target
// survived), those in b are shown S_B, everyone but the target (it
// dropped). Both views name every other participant, so each honest one
// finds its neighbours surviving. Every honest participant that signs its
// view is sent the unmask request that view allows, with every signature
// over that view the server has: the self-mask seed share of the target
// from a, its mask key share from b. It returns how many of each honest
// participants gave.
func splitView(t *testing.T, a, b, sybils []uint32) (seeds, keys int) {
	t.Helper()
	c := atConsistency(t)
	sA := union(a, b, []uint32{target}, sybils)
	sB := without(sA, target)
	checks := map[string][]*pb.ConsistencyCheck{}
	signed := map[uint32][]uint32{}
	for _, v := range []struct {
		who, set []uint32
		name     string
	}{{union(a, []uint32{target}), sA, "A"}, {b, sB, "B"}} {
		for _, id := range v.who {
			cc, err := c.clients[id-1].Consistency(&pb.SurvivorSet{TaskId: testTask, Round: 7, ParticipantIds: v.set})
			if err != nil {
				if !errors.Is(err, secagg.ErrTooFewSurvivors) {
					t.Fatalf("participant %d shown %v: %v", id, v.set, err)
				}
				continue
			}
			checks[v.name] = append(checks[v.name], cc)
			signed[id] = v.set
		}
		for _, s := range sybils {
			checks[v.name] = append(checks[v.name], sybilCheck(c, s, v.set))
		}
	}
	ask := func(id uint32, set []uint32, dropped []uint32, cs []*pb.ConsistencyCheck) *pb.UnmaskResponse {
		req := &pb.UnmaskRequest{TaskId: testTask, Round: 7, ParticipantId: id, SurvivorIds: without(set, id),
			DroppedIds: dropped, ConsistencyChecks: cs}
		resp, err := c.clients[id-1].Unmask(req)
		if err != nil {
			if !errors.Is(err, secagg.ErrTooFewSurvivors) && !errors.Is(err, secagg.ErrForged) {
				t.Fatalf("participant %d: %v", id, err)
			}
			return nil
		}
		return resp
	}
	for _, id := range a {
		if signed[id] == nil {
			continue
		}
		if resp := ask(id, sA, nil, checks["A"]); resp != nil {
			for _, s := range resp.SelfMaskShares {
				if s.OwnerId == target {
					seeds++
				}
			}
		}
	}
	for _, id := range b {
		if signed[id] == nil {
			continue
		}
		if resp := ask(id, sB, []uint32{target}, checks["B"]); resp != nil {
			for _, s := range resp.PairwiseKeyShares {
				if s.OwnerId == target {
					keys++
				}
			}
		}
	}
	return seeds, keys
}

// TestStrategicDropoutSplitView tries every way of splitting the honest
// participants between "the target survived" and "the target dropped"
// (with no split, every honest participant but the target declared
// dropped: a sum of the target and the colluders alone) for 0 to 3
// colluders. Honest clients sign one survivor set, require t neighbours'
// signatures over exactly it, and never give both shares of a peer; so
// the server obtains t shares of both of the target's secrets only with
// at least 2t + 2 − n colluders (3 here, and 3 for t = k/2 + 1 whatever
// k), the bound docs/SECAGG.md states. A client that counted signatures
// over another set, or none, would let 2 colluders do it.
func TestStrategicDropoutSplitView(t *testing.T) {
	bound := 2*sdThresh + 2 - sdN
	for c := 0; c <= 3; c++ {
		sybils := []uint32{7, 6, 5}[:c]
		var honest []uint32
		for id := uint32(1); id <= sdN; id++ {
			if id != target && !slices.Contains(sybils, id) {
				honest = append(honest, id)
			}
		}
		t.Run(fmt.Sprintf("%d colluders", c), func(t *testing.T) {
			revealed := 0
			for mask := 0; mask < 1<<len(honest); mask++ {
				var a, b []uint32
				for i, id := range honest {
					if mask&(1<<i) != 0 {
						a = append(a, id)
					} else {
						b = append(b, id)
					}
				}
				seeds, keys := splitView(t, a, b, sybils)
				if seeds+c >= sdThresh && keys+c >= sdThresh {
					revealed++
					if c < bound {
						t.Fatalf("shown survived: %v, dropped: %v: the server holds %d seed and %d key shares of participant %d, threshold %d",
							a, b, seeds+c, keys+c, target, sdThresh)
					}
				}
			}
			if c >= bound && revealed == 0 {
				t.Fatalf("with %d colluders no split revealed the target; the documented bound 2t+2−n = %d is stale", c, bound)
			}
		})
	}
}

// TestStrategicDropoutAllButOne: the server declares every honest
// participant but the target dropped after they sent their masked inputs,
// so the "sum" would be the target's input plus its colluders'. The
// target refuses a survivor set with fewer than t of its neighbours; and a
// device with a floor of its own (MinSurvivors, the contributors its DP
// noise was calibrated for) refuses any smaller set even when t
// neighbours survive, before it signs and so before it could unmask.
func TestStrategicDropoutAllButOne(t *testing.T) {
	c := atConsistency(t)
	set := []uint32{1, 2, 3, target} // three neighbours: colluders 1, 2, 3
	if _, err := c.clients[target-1].Consistency(&pb.SurvivorSet{TaskId: testTask, Round: 7, ParticipantIds: set}); !errors.Is(err, secagg.ErrTooFewSurvivors) {
		t.Fatalf("a survivor set of the target and 3 others: %v", err)
	}
	if _, err := c.clients[target-1].Unmask(&pb.UnmaskRequest{TaskId: testTask, Round: 7, ParticipantId: target,
		SurvivorIds: []uint32{1, 2, 3}, DroppedIds: []uint32{5, 6, 7}}); !errors.Is(err, secagg.ErrAborted) {
		t.Fatalf("unmask after refusing the survivor set: %v", err)
	}

	// With MinSurvivors 6, five survivors (t = 4 neighbours each) are too
	// few; six are enough, and the round completes with the sum of their
	// inputs.
	floor := func(t *testing.T) *cohort {
		c := newCohort(t, sdConfig, sdN, 3, 32)
		for id := uint32(1); id <= sdN; id++ {
			cl, err := secagg.NewClient(c.r, secagg.ClientOptions{ParticipantID: id, Rand: seededReader(32, id),
				Identity: c.idents[id-1], KeyID: "dev-key", VerifyPeer: secagg.StaticVerifier(c.keys), MinSurvivors: 6})
			if err != nil {
				t.Fatal(err)
			}
			c.clients[id-1] = cl
		}
		return c
	}
	inputs := randomInputs(rand.New(rand.NewPCG(6, 6)), sdN, 3, 32)
	c = floor(t)
	out := c.run(t, []int{0, 0, 0, 0, 0, dropAfterShare, dropAfterShare}, inputs)
	if !errors.Is(out.err, secagg.ErrTooFewSurvivors) || len(out.clientErr) != 5 {
		t.Fatalf("five survivors under a floor of six: server %v, %d clients refused", out.err, len(out.clientErr))
	}
	for id, err := range out.clientErr {
		if !errors.Is(err, secagg.ErrTooFewSurvivors) {
			t.Fatalf("participant %d: %v", id, err)
		}
	}
	c = floor(t)
	out = c.run(t, []int{0, 0, 0, 0, 0, 0, dropAfterShare}, inputs)
	if out.err != nil || len(out.clientErr) > 0 || !slices.Equal(out.sum, plainSum(inputs, out.survivors, 32)) || len(out.survivors) != 6 {
		t.Fatalf("six survivors under a floor of six: %v %v, survivors %v", out.err, out.clientErr, out.survivors)
	}

	for _, m := range []int{-1, sdN + 1} {
		if _, err := secagg.NewClient(c.r, secagg.ClientOptions{ParticipantID: 1, Rand: seededReader(1, 1), Identity: c.idents[0],
			VerifyPeer: secagg.StaticVerifier(c.keys), MinSurvivors: m}); !errors.Is(err, secagg.ErrConfig) {
			t.Fatalf("MinSurvivors %d: %v", m, err)
		}
	}
}
