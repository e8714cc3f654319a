// Package secagg is Fleetlearn's secure aggregation: the aggregator learns
// the sum of a cohort's model updates and nothing else about any one of
// them, even when devices drop out mid-round. It implements SecAgg
// (Bonawitz et al., CCS 2017) over the sparse neighbour graph of SecAgg+
// (Bell et al., CCS 2020) as two pure state machines, Client and Server,
// that consume and produce the fleetlearn.v1 SecAgg messages. It does no
// I/O: the round protocol carries the messages and tells the Server when a
// stage's deadline has passed.
//
// # A round
//
//	r, err := secagg.NewRound(plan.Secagg, plan.TaskId, plan.Round, n)
//
//	// device
//	c, err := secagg.NewClient(r, secagg.ClientOptions{ParticipantID: plan.ParticipantId,
//		Rand: crand.Reader, Identity: deviceKey, KeyID: keyID, VerifyPeer: verify})
//	ak, err := c.Advertise()                 // → server
//	sk, err := c.ShareKeys(peerKeys)         // ← PeerKeys, → server
//	mu, err := c.MaskedInput(fwd, quantized) // ← ForwardedShares, → server
//	cc, err := c.Consistency(survivors)      // ← SurvivorSet, → server
//	ur, err := c.Unmask(request)             // ← UnmaskRequest, → server
//
//	// aggregator, per stage: Add* each message that arrives, CloseStage at
//	// the deadline, then send each survivor its reply
//	s, err := secagg.NewServer(r, dim, secagg.ServerOptions{})
//	s.AddAdvertise(ak) ... s.CloseStage(); s.PeerKeys(id)
//	s.AddShares(sk)    ... s.CloseStage(); s.ForwardedShares(id)
//	s.AddMasked(mu)    ... s.CloseStage(); s.SurvivorSet(id)
//	s.AddConsistency(cc) . s.CloseStage(); s.UnmaskRequest(id)
//	s.AddUnmask(ur)    ... s.CloseStage()
//	sum, err := s.Result() // Σ inputs of s.Survivors() mod 2^bits
//
// Quantizer turns a float update and its example-count weight into the
// uint32 input and the sum back into Σ wₖ·Δₖ and Σ wₖ.
//
// # Cryptography
//
// Each client makes two X25519 key pairs per round, one to encrypt shares
// (AES-256-GCM, key from HKDF-SHA256 of the agreement, additional data
// binding task, round, sender and receiver) and one whose agreements seed
// the pairwise masks, plus a self-mask seed. The mask private key and the
// seed are Shamir-shared t-of-k among the client's graph neighbours over
// GF(2^255 − 19), participant numbers being the x-coordinates. Masks are
// AES-256-CTR streams keyed with full 256-bit HKDF outputs. Every
// derivation and signature binds a digest of the round: task, round,
// cohort size, k, t, bits, clip range and graph seed. Advertisements and
// consistency checks are signed with the devices' enrolled Ed25519 keys
// and every client verifies its neighbours' signatures, so the server can
// neither substitute keys nor, without colluding clients, show participants
// different survivor sets. With c colluding clients a malicious server can
// split the honest clients' views once c ≥ 2t + 2 − n on the complete
// graph: 3 colluders at the default t = k/2 + 1 (docs/SECAGG.md).
//
// Errors wrap the sentinels in errors.go. docs/SECAGG.md has the threat
// model, parameters, message flow and costs.
package secagg
