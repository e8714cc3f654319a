package secagg_test

import (
	"errors"
	"math"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestNewRoundConfig(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      secagg.Config
		n        int
		k, th, b int
		err      error
	}{
		{"defaults", secagg.Config{}, 1000, 60, 31, 32, nil},
		{"small cohort is complete", secagg.Config{}, 20, 19, 10, 32, nil},
		{"odd k rounds up", secagg.Config{K: 5, Bits: 16}, 50, 6, 4, 16, nil},
		{"k beyond n", secagg.Config{K: 500}, 50, 49, 25, 32, nil},
		{"explicit threshold", secagg.Config{K: 10, Threshold: 10}, 50, 10, 10, 32, nil},
		{"threshold at half", secagg.Config{K: 10, Threshold: 5}, 50, 0, 0, 0, secagg.ErrConfig},
		{"threshold above k", secagg.Config{K: 10, Threshold: 11}, 50, 0, 0, 0, secagg.ErrConfig},
		{"bits", secagg.Config{Bits: 33}, 50, 0, 0, 0, secagg.ErrConfig},
		{"negative clip", secagg.Config{ClipRange: -1}, 50, 0, 0, 0, secagg.ErrConfig},
		{"one participant", secagg.Config{}, 1, 0, 0, 0, secagg.ErrConfig},
		{"too many", secagg.Config{}, secagg.MaxParticipants + 1, 0, 0, 0, secagg.ErrConfig},
		{"huge k is the complete graph", secagg.Config{K: 1 << 40}, 50, 49, 25, 32, nil},
		{"huge threshold", secagg.Config{K: 10, Threshold: 1 << 40}, 50, 0, 0, 0, secagg.ErrConfig},
		{"negative k", secagg.Config{K: -1}, 50, 0, 0, 0, secagg.ErrConfig},
		{"negative threshold", secagg.Config{Threshold: -1}, 50, 0, 0, 0, secagg.ErrConfig},
		{"negative bits", secagg.Config{Bits: -1}, 50, 0, 0, 0, secagg.ErrConfig},
		{"NaN clip", secagg.Config{ClipRange: math.NaN()}, 50, 0, 0, 0, secagg.ErrConfig},
		{"infinite clip", secagg.Config{ClipRange: math.Inf(1)}, 50, 0, 0, 0, secagg.ErrConfig},
	} {
		r, err := secagg.NewRound(tc.cfg, testTask, 1, tc.n)
		if !errors.Is(err, tc.err) || (tc.err != nil) != (err != nil) {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if err == nil && (r.K() != tc.k || r.Threshold() != tc.th || r.Bits() != tc.b) {
			t.Errorf("%s: k=%d t=%d b=%d, want %d %d %d", tc.name, r.K(), r.Threshold(), r.Bits(), tc.k, tc.th, tc.b)
		}
		if err == nil {
			// The resolved configuration is a fixed point: it describes the
			// same round again.
			want := secagg.Config{K: tc.k, Threshold: tc.th, Bits: tc.b, ClipRange: tc.cfg.ClipRange, GraphSeed: tc.cfg.GraphSeed}
			if got := r.Config(); got != want {
				t.Errorf("%s: Config() = %+v, want %+v", tc.name, got, want)
			}
			again, err := secagg.NewRound(r.Config(), testTask, 1, tc.n)
			if err != nil || again.Config() != r.Config() {
				t.Errorf("%s: round from its own Config: %+v, %v", tc.name, again, err)
			}
		}
	}
	if _, err := secagg.NewRound(secagg.Config{}, "", 1, 5); !errors.Is(err, secagg.ErrConfig) {
		t.Errorf("empty task: %v", err)
	}
}

// TestGraph: every participant has k distinct neighbours, the relation is
// symmetric, and the graph depends on the seed.
func TestGraph(t *testing.T) {
	for _, n := range []int{3, 10, 101, 1000} {
		r, err := secagg.NewRound(secagg.Config{GraphSeed: 42}, testTask, 1, n)
		if err != nil {
			t.Fatal(err)
		}
		for id := uint32(1); int(id) <= n; id++ {
			nb := r.Neighbours(id)
			if len(nb) != r.K() || !slices.IsSorted(nb) || slices.Contains(nb, id) {
				t.Fatalf("n=%d: neighbours of %d: %v", n, id, nb)
			}
			for i, j := range nb {
				if (i > 0 && nb[i-1] == j) || !r.IsNeighbour(j, id) {
					t.Fatalf("n=%d: %d–%d not symmetric or repeated", n, id, j)
				}
			}
		}
	}
	a, _ := secagg.NewRound(secagg.Config{GraphSeed: 1}, testTask, 1, 500)
	b, _ := secagg.NewRound(secagg.Config{GraphSeed: 2}, testTask, 1, 500)
	if slices.Equal(a.Neighbours(1), b.Neighbours(1)) {
		t.Error("graph does not depend on the seed")
	}
}

// TestRecommendedFailureBounds checks the documented guarantee of the
// default k: with t = k/2+1, at most 10% dropout and at most 10% of the
// cohort colluding, the union bounds over the cohort of a neighbourhood
// losing k/2 members to dropout and of k/2+1 corrupt neighbours are below
// 2^-20 from 20 participants, 2^-25 from 100 and 2^-35 from 1000.
func TestRecommendedFailureBounds(t *testing.T) {
	for _, n := range []int{20, 50, 100, 300, 1000, 3000, 10000, 100000} {
		k := secagg.RecommendedK(n)
		if k >= n-1 {
			continue // complete graph: k/2 dropouts among n−1 is the classic bound
		}
		th := k/2 + 1
		drop := float64(n) * binomTail(k, 0.1, k-th+1)
		corrupt := float64(n) * binomTail(k, 0.1, th)
		bound := 0x1p-20
		if n >= 1000 {
			bound = 0x1p-35
		} else if n >= 100 {
			bound = 0x1p-25
		}
		if drop > bound || corrupt > bound {
			t.Errorf("n=%d k=%d: failure bounds %.2g (dropout), %.2g (collusion)", n, k, drop, corrupt)
		}
	}
}

// binomTail is P[Binomial(k, p) ≥ m].
func binomTail(k int, p float64, m int) float64 {
	s := 0.0
	for i := m; i <= k; i++ {
		c := 1.0
		for j := 0; j < i; j++ {
			c = c * float64(k-j) / float64(j+1)
		}
		pw := 1.0
		for range i {
			pw *= p
		}
		for range k - i {
			pw *= 1 - p
		}
		s += c * pw
	}
	return s
}

func TestServerRefuses(t *testing.T) {
	c := newCohort(t, secagg.Config{K: 4, Threshold: 3, GraphSeed: 1}, 5, 2, 30)
	srv := c.srv
	ak, _ := c.clients[0].Advertise()
	check := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	mod := func(f func(*pb.AdvertiseKeys)) *pb.AdvertiseKeys {
		m := proto.Clone(ak).(*pb.AdvertiseKeys)
		f(m)
		return m
	}
	check("nil", srv.AddAdvertise(nil), secagg.ErrMalformed)
	check("task", srv.AddAdvertise(mod(func(m *pb.AdvertiseKeys) { m.TaskId = "other" })), secagg.ErrWrongRound)
	check("round", srv.AddAdvertise(mod(func(m *pb.AdvertiseKeys) { m.Round = 8 })), secagg.ErrWrongRound)
	check("id 0", srv.AddAdvertise(mod(func(m *pb.AdvertiseKeys) { m.ParticipantId = 0 })), secagg.ErrNotParticipant)
	check("id n+1", srv.AddAdvertise(mod(func(m *pb.AdvertiseKeys) { m.ParticipantId = 6 })), secagg.ErrNotParticipant)
	check("short key", srv.AddAdvertise(mod(func(m *pb.AdvertiseKeys) { m.MaskPublicKey = m.MaskPublicKey[:31] })), secagg.ErrMalformed)
	check("short signature", srv.AddAdvertise(mod(func(m *pb.AdvertiseKeys) { m.Signature = m.Signature[:10] })), secagg.ErrMalformed)
	check("out of stage", srv.AddShares(&pb.ShareKeys{TaskId: testTask, Round: 7, ParticipantId: 1}), secagg.ErrStage)
	_, err := srv.PeerKeys(1)
	check("reply before close", err, secagg.ErrStage)
	check("honest", srv.AddAdvertise(ak), nil)
	check("duplicate", srv.AddAdvertise(ak), secagg.ErrDuplicate)
	for _, cl := range c.clients[1:] {
		a, _ := cl.Advertise()
		check("honest", srv.AddAdvertise(a), nil)
	}
	check("close", srv.CloseStage(), nil)
	check("late", srv.AddAdvertise(ak), secagg.ErrStage)

	var shares []*pb.ShareKeys
	for _, cl := range c.clients {
		pk, _ := srv.PeerKeys(cl.ParticipantID())
		sk, err := cl.ShareKeys(pk)
		if err != nil {
			t.Fatal(err)
		}
		shares = append(shares, sk)
	}
	modS := func(f func(*pb.ShareKeys)) *pb.ShareKeys {
		m := proto.Clone(shares[0]).(*pb.ShareKeys)
		f(m)
		return m
	}
	check("missing share", srv.AddShares(modS(func(m *pb.ShareKeys) { m.Shares = m.Shares[1:] })), secagg.ErrMalformed)
	check("repeated receiver", srv.AddShares(modS(func(m *pb.ShareKeys) { m.Shares[1] = m.Shares[0] })), secagg.ErrDuplicate)
	check("foreign sender", srv.AddShares(modS(func(m *pb.ShareKeys) { m.Shares[0].SenderId = 2 })), secagg.ErrMalformed)
	check("self receiver", srv.AddShares(modS(func(m *pb.ShareKeys) { m.Shares[0].ReceiverId = 1 })), secagg.ErrNotParticipant)
	check("short ciphertext", srv.AddShares(modS(func(m *pb.ShareKeys) { m.Shares[0].Ciphertext = m.Shares[0].Ciphertext[:10] })), secagg.ErrMalformed)
	for _, sk := range shares {
		check("honest shares", srv.AddShares(sk), nil)
	}
	check("duplicate shares", srv.AddShares(shares[0]), secagg.ErrDuplicate)
	check("close", srv.CloseStage(), nil)

	fs, _ := srv.ForwardedShares(1)
	m, err := c.clients[0].MaskedInput(fs, []uint32{1, 2})
	check("masked", err, nil)
	modM := func(f func(*pb.MaskedUpdate)) *pb.MaskedUpdate {
		x := proto.Clone(m).(*pb.MaskedUpdate)
		f(x)
		return x
	}
	check("wrong dim", srv.AddMasked(modM(func(x *pb.MaskedUpdate) { x.Values = x.Values[:1] })), secagg.ErrMalformed)
	check("wrong bits", srv.AddMasked(modM(func(x *pb.MaskedUpdate) { x.Bits = 16 })), secagg.ErrMalformed)
	check("stranger", srv.AddMasked(modM(func(x *pb.MaskedUpdate) { x.ParticipantId = 9 })), secagg.ErrNotParticipant)
	check("masked", srv.AddMasked(m), nil)
	check("duplicate masked", srv.AddMasked(m), secagg.ErrDuplicate)
	_, err = srv.Result()
	check("early result", err, secagg.ErrStage)
}

func TestClientRefuses(t *testing.T) {
	c := newCohort(t, secagg.Config{K: 4, Threshold: 3, GraphSeed: 1}, 5, 2, 31)
	cl := c.clients[0]
	check := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	_, err := cl.ShareKeys(&pb.PeerKeys{})
	check("before advertise", err, secagg.ErrStage)
	c.stop = secagg.StageShareKeys
	c.run(t, nil, nil)
	pk, _ := c.srv.PeerKeys(1)
	mod := func(f func(*pb.PeerKeys)) *pb.PeerKeys {
		m := proto.Clone(pk).(*pb.PeerKeys)
		f(m)
		return m
	}
	_, err = cl.ShareKeys(mod(func(m *pb.PeerKeys) { m.ParticipantId = 2 }))
	check("other recipient", err, secagg.ErrWrongRound)
	_, err = cl.ShareKeys(mod(func(m *pb.PeerKeys) { m.Peers[1] = m.Peers[0] }))
	check("repeated peer", err, secagg.ErrDuplicate)
	_, err = cl.ShareKeys(mod(func(m *pb.PeerKeys) { m.Peers[0].Round = 1 }))
	check("peer of another round", err, secagg.ErrWrongRound)
	_, err = cl.ShareKeys(mod(func(m *pb.PeerKeys) { m.Peers[0].ParticipantId = 1 }))
	check("self as peer", err, secagg.ErrNotParticipant)
	_, err = cl.ShareKeys(mod(func(m *pb.PeerKeys) { m.Peers = m.Peers[:2] }))
	check("fewer than t peers", err, secagg.ErrTooFewSurvivors)
	_, err = cl.ShareKeys(pk)
	check("after abort", err, secagg.ErrAborted)

	cl2 := c.clients[1]
	pk2, _ := c.srv.PeerKeys(2)
	if _, err := cl2.ShareKeys(pk2); err != nil {
		t.Fatal(err)
	}
	_, err = cl2.MaskedInput(&pb.ForwardedShares{TaskId: testTask, Round: 7, ParticipantId: 2}, []uint32{1, 2})
	check("masked before shares close", err, secagg.ErrTooFewSurvivors)

	c3 := newCohort(t, secagg.Config{K: 4, Threshold: 3, Bits: 8, GraphSeed: 1}, 5, 2, 32)
	c3.stop = secagg.StageMaskedInput
	c3.run(t, nil, nil)
	fs, _ := c3.srv.ForwardedShares(1)
	_, err = c3.clients[0].MaskedInput(fs, []uint32{256, 0})
	check("input beyond 2^bits", err, secagg.ErrMalformed)
	_, err = c3.clients[0].MaskedInput(fs, nil)
	check("empty input", err, secagg.ErrMalformed)
	_, err = c3.clients[0].Consistency(&pb.SurvivorSet{TaskId: testTask, Round: 7})
	check("consistency before masking", err, secagg.ErrStage)
	if _, err = c3.clients[0].MaskedInput(fs, []uint32{255, 0}); err != nil {
		t.Fatal(err)
	}
	_, err = c3.clients[0].Consistency(&pb.SurvivorSet{TaskId: testTask, Round: 7, ParticipantIds: []uint32{2, 1, 3}})
	check("unsorted survivors", err, secagg.ErrMalformed)
	_, err = c3.clients[0].Consistency(&pb.SurvivorSet{TaskId: testTask, Round: 7, ParticipantIds: []uint32{2, 3, 4, 5}})
	check("survivors without self", err, secagg.ErrNotParticipant)
}

func TestConstructorsRefuse(t *testing.T) {
	r, _ := secagg.NewRound(secagg.Config{}, testTask, 1, 5)
	ok := secagg.ClientOptions{ParticipantID: 1, Rand: seededReader(1, 1), Identity: identity(1, 1),
		VerifyPeer: secagg.StaticVerifier(nil)}
	for name, o := range map[string]func(o *secagg.ClientOptions){
		"id 0":        func(o *secagg.ClientOptions) { o.ParticipantID = 0 },
		"id n+1":      func(o *secagg.ClientOptions) { o.ParticipantID = 6 },
		"no rand":     func(o *secagg.ClientOptions) { o.Rand = nil },
		"no identity": func(o *secagg.ClientOptions) { o.Identity = nil },
		"no verifier": func(o *secagg.ClientOptions) { o.VerifyPeer = nil },
	} {
		opts := ok
		o(&opts)
		if _, err := secagg.NewClient(r, opts); !errors.Is(err, secagg.ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := secagg.NewClient(nil, ok); !errors.Is(err, secagg.ErrConfig) {
		t.Errorf("nil round: %v", err)
	}
	for _, dim := range []int{0, secagg.MaxDim + 1} {
		if _, err := secagg.NewServer(r, dim, secagg.ServerOptions{}); !errors.Is(err, secagg.ErrConfig) {
			t.Errorf("dim %d: %v", dim, err)
		}
	}
}
