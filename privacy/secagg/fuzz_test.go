package secagg_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

var writeCorpus = flag.Bool("write-corpus", false, "rewrite the seed corpora under testdata/fuzz from honest messages")

// fuzzCohort is a deterministic 5-participant round at stage, so the
// honest seeds stay valid across fuzz iterations.
func fuzzCohort(tb testing.TB, stage secagg.Stage) *cohort {
	c := newCohort(tb, secagg.Config{K: 4, Threshold: 3, GraphSeed: 3}, 5, 3, 77)
	if stage != secagg.StageAdvertise {
		c.stop = stage
		if out := c.run(tb, nil, nil); out.err != nil {
			tb.Fatal(out.err)
		}
	}
	c.stop = secagg.StageDone
	return c
}

// honest returns the marshalled honest messages of a stage, as seeds.
func honest(tb testing.TB, stage secagg.Stage, client bool) [][]byte {
	c := fuzzCohort(tb, stage)
	var msgs []proto.Message
	for _, cl := range c.clients {
		id := cl.ParticipantID()
		var m proto.Message
		var err error
		switch {
		case client && stage == secagg.StageShareKeys:
			m, err = c.srv.PeerKeys(id)
		case client && stage == secagg.StageMaskedInput:
			m, err = c.srv.ForwardedShares(id)
		case client && stage == secagg.StageConsistency:
			m, err = c.srv.SurvivorSet(id)
		case client && stage == secagg.StageUnmask:
			m, err = c.srv.UnmaskRequest(id)
		case stage == secagg.StageAdvertise:
			m, err = cl.Advertise()
		case stage == secagg.StageShareKeys:
			pk, _ := c.srv.PeerKeys(id)
			m, err = cl.ShareKeys(pk)
		case stage == secagg.StageMaskedInput:
			fs, _ := c.srv.ForwardedShares(id)
			m, err = cl.MaskedInput(fs, []uint32{1, 2, 3})
		case stage == secagg.StageConsistency:
			ss, _ := c.srv.SurvivorSet(id)
			m, err = cl.Consistency(ss)
		case stage == secagg.StageUnmask:
			req, _ := c.srv.UnmaskRequest(id)
			m, err = cl.Unmask(req)
		}
		if err != nil {
			tb.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	var out [][]byte
	for _, m := range msgs[:2] {
		b, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b, b[:len(b)/2])
	}
	return append(out, []byte{}, []byte{0x08, 0x01})
}

func addSeeds(f *testing.F, stage secagg.Stage, client bool) {
	seeds := honest(f, stage, client)
	for _, s := range seeds {
		f.Add(s)
	}
	if *writeCorpus {
		dir := filepath.Join("testdata", "fuzz", f.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			f.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d", i)), []byte(body), 0o644); err != nil {
				f.Fatal(err)
			}
		}
	}
}

// fuzzServer feeds a decoded message to the server at stage. A refused
// message must leave the server as it was: the honest round then still
// sums exactly.
func fuzzServer[M proto.Message](f *testing.F, stage secagg.Stage, add func(*secagg.Server, M) error) {
	addSeeds(f, stage, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		var zero M
		m := zero.ProtoReflect().New().Interface().(M)
		if proto.Unmarshal(b, m) != nil {
			return
		}
		c := fuzzCohort(t, stage)
		if add(c.srv, m) == nil {
			return // accepted: an honest message, re-encoded
		}
		out := c.run(t, nil, nil)
		if out.err != nil {
			t.Fatalf("round failed after a refused message: %v", out.err)
		}
		want := plainSum([][]uint32{{1, 2, 3}, {1, 2, 3}, {1, 2, 3}, {1, 2, 3}, {1, 2, 3}}, []uint32{1, 2, 3, 4, 5}, 32)
		if !slices.Equal(out.sum, want) {
			t.Fatalf("sum %v, want %v", out.sum, want)
		}
	})
}

// fuzzClient feeds a decoded server message to participant 1 at stage; it
// may refuse but must not panic.
func fuzzClient[M proto.Message](f *testing.F, stage secagg.Stage, call func(*secagg.Client, M) error) {
	addSeeds(f, stage, true)
	f.Fuzz(func(t *testing.T, b []byte) {
		var zero M
		m := zero.ProtoReflect().New().Interface().(M)
		if proto.Unmarshal(b, m) != nil {
			return
		}
		c := fuzzCohort(t, stage)
		_ = call(c.clients[0], m)
	})
}

func FuzzServerAdvertise(f *testing.F) {
	fuzzServer(f, secagg.StageAdvertise, (*secagg.Server).AddAdvertise)
}

func FuzzServerShares(f *testing.F) {
	fuzzServer(f, secagg.StageShareKeys, (*secagg.Server).AddShares)
}

func FuzzServerMasked(f *testing.F) {
	fuzzServer(f, secagg.StageMaskedInput, (*secagg.Server).AddMasked)
}

func FuzzServerConsistency(f *testing.F) {
	fuzzServer(f, secagg.StageConsistency, (*secagg.Server).AddConsistency)
}

func FuzzServerUnmask(f *testing.F) {
	fuzzServer(f, secagg.StageUnmask, (*secagg.Server).AddUnmask)
}

func FuzzClientPeerKeys(f *testing.F) {
	fuzzClient(f, secagg.StageShareKeys, func(c *secagg.Client, m *pb.PeerKeys) error {
		_, err := c.ShareKeys(m)
		return err
	})
}

func FuzzClientForwardedShares(f *testing.F) {
	fuzzClient(f, secagg.StageMaskedInput, func(c *secagg.Client, m *pb.ForwardedShares) error {
		_, err := c.MaskedInput(m, []uint32{1, 2, 3})
		return err
	})
}

func FuzzClientSurvivorSet(f *testing.F) {
	fuzzClient(f, secagg.StageConsistency, func(c *secagg.Client, m *pb.SurvivorSet) error {
		_, err := c.Consistency(m)
		return err
	})
}

func FuzzClientUnmaskRequest(f *testing.F) {
	fuzzClient(f, secagg.StageUnmask, func(c *secagg.Client, m *pb.UnmaskRequest) error {
		_, err := c.Unmask(m)
		return err
	})
}
