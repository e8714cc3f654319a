package secagg_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

const benchDim = 100_000

// recorded is one honest round's messages, replayed by the benchmarks.
type recorded struct {
	c       *cohort
	input   []uint32
	advs    []*pb.AdvertiseKeys
	shares  []*pb.ShareKeys
	masked  []*pb.MaskedUpdate
	checks  []*pb.ConsistencyCheck
	unmasks []*pb.UnmaskResponse
	want    []uint32

	p                 uint32 // the participant whose client is timed
	pk                *pb.PeerKeys
	fs                *pb.ForwardedShares
	ss                *pb.SurvivorSet
	req               *pb.UnmaskRequest
	sentB, receivedB  int
	survivors, shared int
}

// parallel runs f for every client on all CPUs (setup only).
func parallel(clients []*secagg.Client, f func(cl *secagg.Client)) {
	var wg sync.WaitGroup
	ch := make(chan *secagg.Client)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for cl := range ch {
				f(cl)
			}
		})
	}
	for _, cl := range clients {
		ch <- cl
	}
	close(ch)
	wg.Wait()
}

// record plays a default-configuration round of n participants in which
// a fraction drop of them drops after sharing keys (the costliest point
// for the server: their pairwise masks must be recomputed). The dropout
// set is redrawn until every participant keeps threshold neighbours, as
// the default k guarantees with high probability only for 10% dropout.
func record(b *testing.B, n int, drop float64) *recorded {
	b.Helper()
	cfg := secagg.Config{GraphSeed: 12345}
	c := newCohort(b, cfg, n, benchDim, 1)
	rng := rand.New(rand.NewPCG(uint64(n), uint64(drop*100)))
	var dropped []bool
	for tries := 0; ; tries++ {
		if tries == 1000 {
			b.Fatalf("no feasible %v dropout set", drop)
		}
		dropped = make([]bool, n+1)
		for _, i := range rng.Perm(n)[:int(drop*float64(n))] {
			dropped[i+1] = true
		}
		ok := true
		for id := uint32(1); int(id) <= n && ok; id++ {
			alive := 0
			for _, j := range c.r.Neighbours(id) {
				if !dropped[j] {
					alive++
				}
			}
			ok = alive >= c.r.Threshold()
		}
		if ok {
			break
		}
	}
	rec := &recorded{c: c, input: make([]uint32, benchDim)}
	for i := range rec.input {
		rec.input[i] = uint32(i % 1000)
	}
	for _, cl := range c.clients {
		ak, err := cl.Advertise()
		if err != nil {
			b.Fatal(err)
		}
		rec.advs = append(rec.advs, ak)
		if err := c.srv.AddAdvertise(ak); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, c.srv)
	pks := make([]*pb.PeerKeys, n)
	for i := range pks {
		pks[i], _ = c.srv.PeerKeys(uint32(i + 1))
	}
	rec.shares = make([]*pb.ShareKeys, n)
	parallel(c.clients, func(cl *secagg.Client) {
		sk, err := cl.ShareKeys(pks[cl.ParticipantID()-1])
		if err != nil {
			panic(err)
		}
		rec.shares[cl.ParticipantID()-1] = sk
	})
	for _, sk := range rec.shares {
		if err := c.srv.AddShares(sk); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, c.srv)
	var live []*secagg.Client
	fss := make([]*pb.ForwardedShares, n)
	for _, cl := range c.clients {
		if !dropped[cl.ParticipantID()] {
			live = append(live, cl)
			fss[cl.ParticipantID()-1], _ = c.srv.ForwardedShares(cl.ParticipantID())
		}
	}
	maskedBy := make([]*pb.MaskedUpdate, n)
	parallel(live, func(cl *secagg.Client) {
		m, err := cl.MaskedInput(fss[cl.ParticipantID()-1], rec.input)
		if err != nil {
			panic(err)
		}
		maskedBy[cl.ParticipantID()-1] = m
	})
	for _, m := range maskedBy {
		if m != nil {
			rec.masked = append(rec.masked, m)
			if err := c.srv.AddMasked(m); err != nil {
				b.Fatal(err)
			}
		}
	}
	mustCloseB(b, c.srv)
	for _, cl := range live {
		ss, _ := c.srv.SurvivorSet(cl.ParticipantID())
		cc, err := cl.Consistency(ss)
		if err != nil {
			b.Fatal(err)
		}
		rec.checks = append(rec.checks, cc)
		if err := c.srv.AddConsistency(cc); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, c.srv)
	for _, cl := range live {
		req, _ := c.srv.UnmaskRequest(cl.ParticipantID())
		resp, err := cl.Unmask(req)
		if err != nil {
			b.Fatal(err)
		}
		rec.unmasks = append(rec.unmasks, resp)
		if err := c.srv.AddUnmask(resp); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, c.srv)
	sum, err := c.srv.Result()
	if err != nil {
		b.Fatal(err)
	}
	rec.want = make([]uint32, benchDim)
	for i, v := range rec.input {
		rec.want[i] = v * uint32(len(live))
	}
	if !slices.Equal(sum, rec.want) {
		b.Fatal("recorded round summed wrong")
	}
	rec.survivors, rec.shared = len(live), n

	// Time the first survivor with the most dropped neighbours.
	best := -1
	for _, cl := range live {
		d := 0
		for _, j := range c.r.Neighbours(cl.ParticipantID()) {
			if dropped[j] {
				d++
			}
		}
		if d > best {
			best, rec.p = d, cl.ParticipantID()
		}
	}
	p := rec.p
	rec.pk, rec.fs = pks[p-1], fss[p-1]
	rec.ss, _ = c.srv.SurvivorSet(p)
	rec.req, _ = c.srv.UnmaskRequest(p)
	var resp *pb.UnmaskResponse
	var m *pb.MaskedUpdate
	var cc *pb.ConsistencyCheck
	for _, u := range rec.unmasks {
		if u.ParticipantId == p {
			resp = u
		}
	}
	m, cc = maskedBy[p-1], nil
	for _, x := range rec.checks {
		if x.ParticipantId == p {
			cc = x
		}
	}
	rec.sentB = proto.Size(rec.advs[p-1]) + proto.Size(rec.shares[p-1]) + proto.Size(m) + proto.Size(cc) + proto.Size(resp)
	rec.receivedB = proto.Size(rec.pk) + proto.Size(rec.fs) + proto.Size(rec.ss) + proto.Size(rec.req)
	return rec
}

func mustCloseB(b *testing.B, s *secagg.Server) {
	b.Helper()
	if err := s.CloseStage(); err != nil {
		b.Fatal(err)
	}
}

// clientRound is one participant's whole round. Its randomness is the
// recorded client's, so the recorded server messages stay valid.
func (rec *recorded) clientRound(b *testing.B) {
	c := rec.c
	cl, err := secagg.NewClient(c.r, secagg.ClientOptions{ParticipantID: rec.p, Rand: seededReader(1, rec.p),
		Identity: c.idents[rec.p-1], KeyID: "dev-key", VerifyPeer: secagg.StaticVerifier(c.keys)})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cl.Advertise(); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.ShareKeys(rec.pk); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.MaskedInput(rec.fs, rec.input); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.Consistency(rec.ss); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.Unmask(rec.req); err != nil {
		b.Fatal(err)
	}
}

// serverRound is the server's whole round, replies included.
func (rec *recorded) serverRound(b *testing.B, workers int) {
	c := rec.c
	n := c.r.N()
	srv, err := secagg.NewServer(c.r, benchDim, secagg.ServerOptions{Workers: workers})
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range rec.advs {
		if err := srv.AddAdvertise(m); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, srv)
	for id := uint32(1); int(id) <= n; id++ {
		if _, err := srv.PeerKeys(id); err != nil {
			b.Fatal(err)
		}
	}
	for _, m := range rec.shares {
		if err := srv.AddShares(m); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, srv)
	for id := uint32(1); int(id) <= n; id++ {
		if _, err := srv.ForwardedShares(id); err != nil {
			b.Fatal(err)
		}
	}
	for _, m := range rec.masked {
		if err := srv.AddMasked(m); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, srv)
	for _, m := range rec.checks {
		if _, err := srv.SurvivorSet(m.ParticipantId); err != nil {
			b.Fatal(err)
		}
		if err := srv.AddConsistency(m); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, srv)
	for _, m := range rec.unmasks {
		if _, err := srv.UnmaskRequest(m.ParticipantId); err != nil {
			b.Fatal(err)
		}
		if err := srv.AddUnmask(m); err != nil {
			b.Fatal(err)
		}
	}
	mustCloseB(b, srv)
	sum, err := srv.Result()
	if err != nil || sum[benchDim-1] != rec.want[benchDim-1] {
		b.Fatalf("result: %v", err)
	}
}

// BenchmarkRound measures, per cohort size and dropout rate (participants
// that drop after sharing keys), one client's compute for a whole round,
// the server's compute for a whole round, and the client's traffic, at
// d = 100,000 with the default k and t. The server runs single-threaded
// and, in the "server-parallel" case, with one worker per CPU.
func BenchmarkRound(b *testing.B) {
	for _, n := range []int{100, 500, 1000} {
		for _, drop := range []float64{0, 0.1, 0.3} {
			b.Run(fmt.Sprintf("n=%d/drop=%d%%", n, int(drop*100+0.5)), func(b *testing.B) {
				rec := record(b, n, drop)
				b.Run("client", func(b *testing.B) {
					for b.Loop() {
						rec.clientRound(b)
					}
					b.ReportMetric(float64(rec.sentB), "sent-B/client")
					b.ReportMetric(float64(rec.receivedB), "recv-B/client")
					b.ReportMetric(float64(rec.c.r.K()), "k")
				})
				b.Run("server", func(b *testing.B) {
					for b.Loop() {
						rec.serverRound(b, 1)
					}
					b.ReportMetric(float64(rec.survivors), "survivors")
				})
				if runtime.GOMAXPROCS(0) > 1 {
					b.Run("server-parallel", func(b *testing.B) {
						for b.Loop() {
							rec.serverRound(b, runtime.GOMAXPROCS(0))
						}
					})
				}
			})
		}
	}
}
