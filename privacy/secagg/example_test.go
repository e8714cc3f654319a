package secagg_test

import (
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

// A round of four devices, one of which drops out after sharing its keys.
// The server learns the weighted sum of the other three updates and their
// total weight, and nothing about any one of them.
func Example() {
	const n = 4
	cfg := secagg.Config{Bits: 32, ClipRange: 1, GraphSeed: 2024}
	r, err := secagg.NewRound(cfg, "t-example", 1, n)
	if err != nil {
		panic(err)
	}
	// Enrolled device keys; in production the verifier looks them up.
	keys := map[uint32]ed25519.PublicKey{}
	var clients []*secagg.Client
	for id := uint32(1); id <= n; id++ {
		ident := identity(1, id)
		keys[id] = ident.Public().(ed25519.PublicKey)
		c, err := secagg.NewClient(r, secagg.ClientOptions{ParticipantID: id, Rand: seededReader(1, id),
			Identity: ident, VerifyPeer: secagg.StaticVerifier(keys)})
		if err != nil {
			panic(err)
		}
		clients = append(clients, c)
	}
	q, err := secagg.NewQuantizer(r.Bits(), cfg.ClipRange, n, 100)
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	updates := [][]float32{{0.5, -0.25}, {0.25, 0.25}, {-1, 1}, {0.1, 0.1}}
	weights := []float64{10, 30, 60, 5}

	s, err := secagg.NewServer(r, 3, secagg.ServerOptions{})
	if err != nil {
		panic(err)
	}
	check := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	for _, c := range clients {
		ak, err := c.Advertise()
		check(err)
		check(s.AddAdvertise(ak))
	}
	check(s.CloseStage())
	for _, c := range clients {
		pk, err := s.PeerKeys(c.ParticipantID())
		check(err)
		sk, err := c.ShareKeys(pk)
		check(err)
		check(s.AddShares(sk))
	}
	check(s.CloseStage())
	for i, c := range clients[:3] { // device 4 drops out here
		fs, err := s.ForwardedShares(c.ParticipantID())
		check(err)
		in, err := q.Quantize(updates[i], weights[i], rng)
		check(err)
		mu, err := c.MaskedInput(fs, in)
		check(err)
		check(s.AddMasked(mu))
	}
	check(s.CloseStage())
	for _, c := range clients[:3] {
		ss, err := s.SurvivorSet(c.ParticipantID())
		check(err)
		cc, err := c.Consistency(ss)
		check(err)
		check(s.AddConsistency(cc))
	}
	check(s.CloseStage())
	for _, c := range clients[:3] {
		req, err := s.UnmaskRequest(c.ParticipantID())
		check(err)
		resp, err := c.Unmask(req)
		check(err)
		check(s.AddUnmask(resp))
	}
	check(s.CloseStage())
	sum, err := s.Result()
	check(err)
	weighted, total, err := q.Dequantize(sum)
	check(err)
	survivors, _ := s.Survivors()
	fmt.Println("survivors:", survivors)
	fmt.Printf("weighted sum: [%.3f %.3f], total weight %.1f\n", weighted[0], weighted[1], total)
	fmt.Printf("mean update: [%.3f %.3f]\n", weighted[0]/total, weighted[1]/total)
	// Output:
	// survivors: [1 2 3]
	// weighted sum: [-47.500 65.000], total weight 100.0
	// mean update: [-0.475 0.650]
}
