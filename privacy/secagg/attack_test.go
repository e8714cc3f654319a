package secagg_test

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// atUnmask plays a 7-participant complete-graph round (t = 4) up to the
// unmask stage, participant 7 dropping after it shared.
func atUnmask(t *testing.T) (*cohort, [][]uint32) {
	t.Helper()
	c := newCohort(t, secagg.Config{K: 6, Threshold: 4, GraphSeed: 1}, 7, 3, 21)
	c.stop = secagg.StageUnmask
	inputs := randomInputs(rand.New(rand.NewPCG(2, 2)), 7, 3, 32)
	out := c.run(t, []int{0, 0, 0, 0, 0, 0, dropAfterShare}, inputs)
	if out.err != nil || len(out.clientErr) > 0 || c.srv.Stage() != secagg.StageUnmask {
		t.Fatalf("setup: %v %v", out.err, out.clientErr)
	}
	return c, inputs
}

// TestRefusesDoubleShareRequest: a server that asks one client for both
// secrets' shares of a peer, or for shares that contradict the survivor
// set the client signed, gets nothing, and the client ends its round.
func TestRefusesDoubleShareRequest(t *testing.T) {
	for _, tc := range []struct {
		name               string
		survivors, dropped []uint32
	}{
		{"same peer in both lists", []uint32{2, 3, 4, 5, 6}, []uint32{3, 7}},
		{"survivor asked as dropped", []uint32{2, 4, 5, 6}, []uint32{3, 7}},
		{"dropped asked as survivor", []uint32{2, 3, 4, 5, 6, 7}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := atUnmask(t)
			honest, err := c.srv.UnmaskRequest(1)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(honest.SurvivorIds, []uint32{2, 3, 4, 5, 6}) || !slices.Equal(honest.DroppedIds, []uint32{7}) {
				t.Fatalf("honest request: %v / %v", honest.SurvivorIds, honest.DroppedIds)
			}
			evil := proto.Clone(honest).(*pb.UnmaskRequest)
			evil.SurvivorIds, evil.DroppedIds = tc.survivors, tc.dropped
			resp, err := c.clients[0].Unmask(evil)
			if !errors.Is(err, secagg.ErrDoubleShareRequest) || resp != nil {
				t.Fatalf("got %v, %v", resp, err)
			}
			if _, err := c.clients[0].Unmask(honest); !errors.Is(err, secagg.ErrAborted) {
				t.Fatalf("honest request after refusal: %v", err)
			}
		})
	}
	t.Run("second request", func(t *testing.T) {
		c, _ := atUnmask(t)
		req, _ := c.srv.UnmaskRequest(1)
		if _, err := c.clients[0].Unmask(req); err != nil {
			t.Fatal(err)
		}
		again := proto.Clone(req).(*pb.UnmaskRequest)
		again.SurvivorIds, again.DroppedIds = nil, []uint32{2}
		if _, err := c.clients[0].Unmask(again); !errors.Is(err, secagg.ErrStage) {
			t.Fatalf("second request: %v", err)
		}
	})
}

// TestRefusesSplitSurvivorView: the server tells participant 1 that 2
// dropped while everyone else saw 2 survive, then asks 1 for 2's mask key
// share (which, with 2's self-mask seed from the others, would unmask 2's
// input). The request agrees with what 1 saw, but the neighbours'
// consistency signatures are over another set.
func TestRefusesSplitSurvivorView(t *testing.T) {
	c := newCohort(t, secagg.Config{K: 6, Threshold: 4, GraphSeed: 1}, 7, 3, 22)
	c.stop = secagg.StageConsistency
	out := c.run(t, nil, randomInputs(rand.New(rand.NewPCG(3, 3)), 7, 3, 32))
	if out.err != nil {
		t.Fatal(out.err)
	}
	honestChecks := map[uint32]*pb.ConsistencyCheck{}
	for _, cl := range c.clients[1:] {
		ss, _ := c.srv.SurvivorSet(cl.ParticipantID())
		cc, err := cl.Consistency(ss)
		if err != nil {
			t.Fatal(err)
		}
		honestChecks[cl.ParticipantID()] = cc
	}
	lie := &pb.SurvivorSet{TaskId: testTask, Round: 7, ParticipantIds: []uint32{1, 3, 4, 5, 6, 7}}
	if _, err := c.clients[0].Consistency(lie); err != nil {
		t.Fatal(err)
	}
	req := &pb.UnmaskRequest{TaskId: testTask, Round: 7, ParticipantId: 1,
		SurvivorIds: []uint32{3, 4, 5, 6, 7}, DroppedIds: []uint32{2}}
	for id := uint32(3); id <= 7; id++ {
		req.ConsistencyChecks = append(req.ConsistencyChecks, honestChecks[id])
	}
	if _, err := c.clients[0].Unmask(req); !errors.Is(err, secagg.ErrForged) {
		t.Fatalf("split view with honest checks: %v", err)
	}

	// Without the others' checks the server cannot show t confirmations.
	c2 := newCohort(t, secagg.Config{K: 6, Threshold: 4, GraphSeed: 1}, 7, 3, 22)
	c2.stop = secagg.StageConsistency
	c2.run(t, nil, randomInputs(rand.New(rand.NewPCG(3, 3)), 7, 3, 32))
	own, err := c2.clients[0].Consistency(lie)
	if err != nil {
		t.Fatal(err)
	}
	req.ConsistencyChecks = []*pb.ConsistencyCheck{own}
	if _, err := c2.clients[0].Unmask(req); !errors.Is(err, secagg.ErrTooFewSurvivors) {
		t.Fatalf("split view without checks: %v", err)
	}
}

// TestRefusesForgedPeer: the server cannot substitute, re-sign or relabel
// a neighbour's keys, nor alter or redirect a share.
func TestRefusesForgedPeer(t *testing.T) {
	serverKey := identity(999, 999)
	fresh := func() []byte {
		k, err := ecdh.X25519().NewPrivateKey(make([]byte, 32))
		if err != nil {
			t.Fatal(err)
		}
		return k.PublicKey().Bytes()
	}
	atShare := func(t *testing.T) *cohort {
		c := newCohort(t, secagg.Config{K: 6, Threshold: 4, GraphSeed: 1}, 7, 3, 23)
		c.stop = secagg.StageShareKeys
		c.run(t, nil, nil)
		if c.srv.Stage() != secagg.StageShareKeys {
			t.Fatal("setup")
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		tamper func(pk *pb.PeerKeys)
	}{
		{"substituted mask key", func(pk *pb.PeerKeys) { pk.Peers[0].MaskPublicKey = fresh() }},
		{"substituted cipher key", func(pk *pb.PeerKeys) { pk.Peers[0].CipherPublicKey = fresh() }},
		{"re-signed by the server", func(pk *pb.PeerKeys) {
			a := pk.Peers[0]
			a.MaskPublicKey = fresh()
			r, _ := secagg.NewRound(secagg.Config{K: 6, Threshold: 4, GraphSeed: 1}, testTask, 7, 7)
			a.Signature = ed25519.Sign(serverKey, secagg.AdvertiseMessage(r, a))
		}},
		{"relabelled peer", func(pk *pb.PeerKeys) {
			// Peer 2's signed keys presented as peer 3's.
			pk.Peers[0].ParticipantId = pk.Peers[1].ParticipantId
			pk.Peers = append(pk.Peers[:1], pk.Peers[2:]...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := atShare(t)
			pk, _ := c.srv.PeerKeys(1)
			tc.tamper(pk)
			if _, err := c.clients[0].ShareKeys(pk); !errors.Is(err, secagg.ErrForged) {
				t.Fatalf("got %v", err)
			}
			honest, _ := c.srv.PeerKeys(1)
			if _, err := c.clients[0].ShareKeys(honest); !errors.Is(err, secagg.ErrAborted) {
				t.Fatalf("after forgery: %v", err)
			}
		})
	}

	t.Run("peer under another configuration", func(t *testing.T) {
		c := atShare(t)
		// Participant 2 was shown a different graph seed; its signature
		// binds the configuration it saw.
		other, _ := secagg.NewRound(secagg.Config{K: 6, Threshold: 4, GraphSeed: 2}, testTask, 7, 7)
		cl, _ := secagg.NewClient(other, secagg.ClientOptions{ParticipantID: 2, Rand: seededReader(5, 2),
			Identity: c.idents[1], VerifyPeer: secagg.StaticVerifier(c.keys)})
		ak, _ := cl.Advertise()
		pk, _ := c.srv.PeerKeys(1)
		pk.Peers[0] = ak
		if _, err := c.clients[0].ShareKeys(pk); !errors.Is(err, secagg.ErrForged) {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("server verifies too", func(t *testing.T) {
		c := newCohort(t, secagg.Config{K: 6, Threshold: 4, GraphSeed: 1}, 7, 3, 23)
		ak, _ := c.clients[1].Advertise()
		ak.MaskPublicKey = fresh()
		if err := c.srv.AddAdvertise(ak); !errors.Is(err, secagg.ErrForged) {
			t.Fatalf("got %v", err)
		}
	})

	for _, tc := range []struct {
		name   string
		tamper func(fs *pb.ForwardedShares)
	}{
		{"altered share", func(fs *pb.ForwardedShares) { fs.Shares[0].Ciphertext[5] ^= 1 }},
		{"share redirected from another receiver", func(fs *pb.ForwardedShares) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCohort(t, secagg.Config{K: 6, Threshold: 4, GraphSeed: 1}, 7, 3, 24)
			c.stop = secagg.StageMaskedInput
			c.run(t, nil, nil)
			fs, _ := c.srv.ForwardedShares(1)
			if tc.name == "share redirected from another receiver" {
				// The share 3 made for 2, relabelled as 3's share for 1.
				other, _ := c.srv.ForwardedShares(2)
				for _, s := range other.Shares {
					if s.SenderId == 3 {
						s.ReceiverId = 1
						fs.Shares[1] = s
					}
				}
			}
			tc.tamper(fs)
			if _, err := c.clients[0].MaskedInput(fs, []uint32{1, 2, 3}); !errors.Is(err, secagg.ErrForged) {
				t.Fatalf("got %v", err)
			}
		})
	}
}

// TestBadShareDetected: a participant that answers the unmask request with
// a wrong share of a dropped peer's key makes the reconstruction disagree
// with the advertised key, and the round fails instead of returning a
// wrong sum.
func TestBadShareDetected(t *testing.T) {
	c, _ := atUnmask(t)
	for _, cl := range c.clients[:6] {
		req, _ := c.srv.UnmaskRequest(cl.ParticipantID())
		resp, err := cl.Unmask(req)
		if err != nil {
			t.Fatal(err)
		}
		if cl.ParticipantID() == 1 {
			resp.PairwiseKeyShares[0].Share[0] ^= 1
		}
		if err := c.srv.AddUnmask(resp); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, c.srv)
	if sum, err := c.srv.Result(); !errors.Is(err, secagg.ErrForged) {
		t.Fatalf("got %v, %v", sum, err)
	}
}
