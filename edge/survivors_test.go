package edge

import (
	"crypto/ed25519"
	"errors"
	mrand "math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// TestAgentRefusesThinSurvivorSet: under distributed DP an agent's
// SecAgg client refuses to sign (and so ever to unmask) a survivor set of
// fewer devices than the noise was split across, however many of its
// neighbours the set holds: a server declaring the rest dropped would get
// a sum with too little noise. Without distributed DP the threshold is
// the only floor.
func TestAgentRefusesThinSurvivorSet(t *testing.T) {
	const n = 7
	secure := &pb.SecAggConfig{NumParticipants: n, K: n - 1, Threshold: 4, ClipRange: 1, MaxWeight: 1}
	for _, tc := range []struct {
		name string
		dp   *pb.DPConfig
		want int
	}{
		{"no DP", nil, 0},
		{"central DP", &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, MinNoiseContributors: 6}, 0},
		{"distributed DP", &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_SKELLAM, MinNoiseContributors: 6}, 6},
		{"distributed DP, more contributors than seats", &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_SKELLAM, MinNoiseContributors: 9}, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := &pb.RoundPlan{TaskId: "t-1", Round: 3, Secagg: secure, Dp: tc.dp, ParticipantId: 1}
			if got := minSurvivors(plan, n); got != tc.want {
				t.Fatalf("minSurvivors = %d, want %d", got, tc.want)
			}
		})
	}

	// The refusal, through the client the agent builds: five survivors
	// hold four of participant 1's neighbours (the threshold) but are
	// fewer than the six contributors.
	plan := &pb.RoundPlan{TaskId: "t-1", Round: 3, Secagg: secure, ParticipantId: 1,
		Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_SKELLAM, MinNoiseContributors: 6}}
	r, err := secagg.NewRound(privacyconf.SecAgg(plan.GetSecagg()), plan.TaskId, plan.Round, n)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[uint32]ed25519.PublicKey{}
	idents := map[uint32]ed25519.PrivateKey{}
	for id := uint32(1); id <= n; id++ {
		seed := make([]byte, ed25519.SeedSize)
		seed[0] = byte(id)
		idents[id] = ed25519.NewKeyFromSeed(seed)
		keys[id] = idents[id].Public().(ed25519.PublicKey)
	}
	srv, err := secagg.NewServer(r, 2, secagg.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clients := map[uint32]*secagg.Client{}
	for id := uint32(1); id <= n; id++ {
		o := secagg.ClientOptions{ParticipantID: id, Rand: mrand.NewChaCha8([32]byte{byte(id)}), Identity: idents[id], VerifyPeer: secagg.StaticVerifier(keys)}
		if id == 1 {
			o.MinSurvivors = minSurvivors(plan, n)
		}
		if clients[id], err = secagg.NewClient(r, o); err != nil {
			t.Fatal(err)
		}
		ak, err := clients[id].Advertise()
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.AddAdvertise(ak); err != nil {
			t.Fatal(err)
		}
	}
	closeStage := func() {
		if err := srv.CloseStage(); err != nil {
			t.Fatal(err)
		}
	}
	closeStage()
	for id, c := range clients {
		pk, _ := srv.PeerKeys(id)
		sk, err := c.ShareKeys(pk)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.AddShares(sk); err != nil {
			t.Fatal(err)
		}
	}
	closeStage()
	for id, c := range clients {
		fs, _ := srv.ForwardedShares(id)
		if _, err := c.MaskedInput(fs, []uint32{1, 2}); err != nil {
			t.Fatal(err)
		}
	}
	thin := &pb.SurvivorSet{TaskId: "t-1", Round: 3, ParticipantIds: []uint32{1, 2, 3, 4, 5}}
	if _, err := clients[1].Consistency(thin); !errors.Is(err, secagg.ErrTooFewSurvivors) {
		t.Fatalf("the agent's client signed a set of 5 under 6 noise contributors: %v", err)
	}
	// A client without the floor (no distributed DP) signs the same set.
	if _, err := clients[2].Consistency(thin); err != nil {
		t.Fatalf("without distributed DP: %v", err)
	}
}
