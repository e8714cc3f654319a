package secagg_test

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Where a participant stops. A participant with dropBefore* of a stage
// sends nothing from that stage on.
const (
	stayAll           = iota
	dropBeforeAdvert  // never advertises
	dropAfterAdvert   // advertises, sends no shares
	dropAfterShare    // shares, sends no masked input
	dropAfterMasked   // masked input, no consistency check
	dropDuringUnmask  // consistency check, no unmask response
	numDropoutChoices // for random draws
)

const testTask = "t-0123456789ab"

// cohort is n clients and a server for one round, all in memory.
type cohort struct {
	r       *secagg.Round
	srv     *secagg.Server
	clients []*secagg.Client // clients[id-1]
	idents  []ed25519.PrivateKey
	keys    map[uint32]ed25519.PublicKey
	// stop, when it is not StageDone, makes run return as soon as the
	// server reaches that stage, before any of its messages are exchanged.
	stop    secagg.Stage
	dim     int
	refused map[uint32]error // clients that refused a message, by id
	// beforeClose, when set, runs before each CloseStage, once the
	// stage's messages are in.
	beforeClose func()
}

func seededReader(seed uint64, id uint32) io.Reader {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	binary.LittleEndian.PutUint32(s[8:], id)
	s[31] = 0xa5
	return rand.NewChaCha8(s)
}

func identity(seed uint64, id uint32) ed25519.PrivateKey {
	s := make([]byte, ed25519.SeedSize)
	binary.LittleEndian.PutUint64(s, seed)
	binary.LittleEndian.PutUint32(s[8:], id)
	s[31] = 0x5a
	return ed25519.NewKeyFromSeed(s)
}

func newCohort(tb testing.TB, cfg secagg.Config, n, dim int, seed uint64) *cohort {
	tb.Helper()
	r, err := secagg.NewRound(cfg, testTask, 7, n)
	if err != nil {
		tb.Fatal(err)
	}
	c := &cohort{r: r, keys: map[uint32]ed25519.PublicKey{}, stop: secagg.StageDone, dim: dim}
	for id := uint32(1); int(id) <= n; id++ {
		k := identity(seed, id)
		c.idents = append(c.idents, k)
		c.keys[id] = k.Public().(ed25519.PublicKey)
	}
	verify := secagg.StaticVerifier(c.keys)
	for id := uint32(1); int(id) <= n; id++ {
		cl, err := secagg.NewClient(r, secagg.ClientOptions{ParticipantID: id, Rand: seededReader(seed, id),
			Identity: c.idents[id-1], KeyID: "dev-key", VerifyPeer: verify})
		if err != nil {
			tb.Fatal(err)
		}
		c.clients = append(c.clients, cl)
	}
	c.srv, err = secagg.NewServer(r, dim, secagg.ServerOptions{VerifyPeer: verify})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// outcome of a simulated round.
type outcome struct {
	sum       []uint32
	survivors []uint32
	err       error            // the server's abort, if any
	clientErr map[uint32]error // clients that refused a message
}

// run plays the round from the server's current stage, each participant
// stopping as plan says (plan[id-1]; nil means nobody drops), inputs[id-1]
// being its input. It returns when the round ends, aborts, or reaches
// c.stop; a server refusing an honest message fails the test.
func (c *cohort) run(tb testing.TB, plan []int, inputs [][]uint32) outcome {
	tb.Helper()
	if c.refused == nil {
		c.refused = map[uint32]error{}
	}
	out := outcome{clientErr: c.refused}
	stays := func(id uint32, drop int) bool {
		return c.refused[id] == nil && (plan == nil || plan[id-1] == stayAll || plan[id-1] > drop)
	}
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatalf("server refused an honest message: %v", err)
		}
	}
	// step runs one client's part of a stage: reply builds the server's
	// message for it, act the client's answer, add hands that to the server.
	step := func(drop int, act func(cl *secagg.Client) (proto.Message, error), add func(proto.Message) error) {
		for _, cl := range c.clients {
			id := cl.ParticipantID()
			if !stays(id, drop) {
				continue
			}
			m, err := act(cl)
			if err != nil {
				c.refused[id] = err
				continue
			}
			must(add(m))
		}
	}
	for {
		var err error
		switch c.srv.Stage() {
		case secagg.StageAdvertise:
			step(dropBeforeAdvert, func(cl *secagg.Client) (proto.Message, error) {
				ak, err := cl.Advertise()
				if err != nil {
					tb.Fatal(err)
				}
				return ak, nil
			}, func(m proto.Message) error { return c.srv.AddAdvertise(m.(*pb.AdvertiseKeys)) })
		case secagg.StageShareKeys:
			step(dropAfterAdvert, func(cl *secagg.Client) (proto.Message, error) {
				pk, err := c.srv.PeerKeys(cl.ParticipantID())
				if errors.Is(err, secagg.ErrNotParticipant) {
					return nil, err // dropped by the server
				}
				must(err)
				return cl.ShareKeys(pk)
			}, func(m proto.Message) error { return c.srv.AddShares(m.(*pb.ShareKeys)) })
		case secagg.StageMaskedInput:
			step(dropAfterShare, func(cl *secagg.Client) (proto.Message, error) {
				fs, err := c.srv.ForwardedShares(cl.ParticipantID())
				if errors.Is(err, secagg.ErrNotParticipant) {
					return nil, err
				}
				must(err)
				in := []uint32{1, 2, 3}[:min(3, c.dim)]
				if inputs != nil {
					in = inputs[cl.ParticipantID()-1]
				}
				return cl.MaskedInput(fs, in)
			}, func(m proto.Message) error { return c.srv.AddMasked(m.(*pb.MaskedUpdate)) })
		case secagg.StageConsistency:
			step(dropAfterMasked, func(cl *secagg.Client) (proto.Message, error) {
				ss, err := c.srv.SurvivorSet(cl.ParticipantID())
				must(err)
				return cl.Consistency(ss)
			}, func(m proto.Message) error { return c.srv.AddConsistency(m.(*pb.ConsistencyCheck)) })
		case secagg.StageUnmask:
			step(dropDuringUnmask, func(cl *secagg.Client) (proto.Message, error) {
				req, err := c.srv.UnmaskRequest(cl.ParticipantID())
				must(err)
				return cl.Unmask(req)
			}, func(m proto.Message) error { return c.srv.AddUnmask(m.(*pb.UnmaskResponse)) })
		case secagg.StageDone:
			out.sum, out.err = c.srv.Result()
			out.survivors, _ = c.srv.Survivors()
			return out
		}
		if c.beforeClose != nil {
			c.beforeClose()
		}
		if err = c.srv.CloseStage(); err != nil {
			out.err = err
			return out
		}
		if c.srv.Stage() == c.stop && c.stop != secagg.StageDone {
			return out
		}
	}
}

func randomInputs(r *rand.Rand, n, dim, bits int) [][]uint32 {
	m := uint32(1<<bits - 1)
	in := make([][]uint32, n)
	for i := range in {
		in[i] = make([]uint32, dim)
		for j := range in[i] {
			in[i][j] = r.Uint32() & m
		}
	}
	return in
}

// plainSum is the sum of the inputs of ids modulo 2^bits.
func plainSum(inputs [][]uint32, ids []uint32, bits int) []uint32 {
	s := make([]uint32, len(inputs[0]))
	for _, id := range ids {
		for j, v := range inputs[id-1] {
			s[j] += v
		}
	}
	for j := range s {
		s[j] &= uint32(1<<bits - 1)
	}
	return s
}
