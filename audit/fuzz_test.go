package audit

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the seed corpus files under testdata/fuzz")

// fuzzFixture is a small deterministic log shared by the fuzz targets.
type fuzzFixture struct {
	keys    Keys
	pub     PublicKeys
	entries []Entry
	export  []byte
	notes   [][]byte
	roots   []merkle.Hash
}

var (
	fixtureOnce sync.Once
	fixture     fuzzFixture
	fixtureErr  error
)

func getFixture(tb testing.TB) fuzzFixture {
	tb.Helper()
	fixtureOnce.Do(func() {
		ctx := context.Background()
		dir, err := os.MkdirTemp("", "audit-fuzz")
		if err != nil {
			fixtureErr = err
			return
		}
		defer os.RemoveAll(dir)
		k, _ := GenerateKeys(seeded(42))
		clk := newStepClock()
		lg, err := Open(ctx, dir, WithKeys(k), WithClock(clk.Now), WithOrigin("fuzz.fleetlearn/audit"))
		if err != nil {
			fixtureErr = err
			return
		}
		defer lg.Close()
		f := fuzzFixture{keys: k, pub: lg.PublicKeys()}
		for i := range 7 {
			e, err := lg.Append(ctx, sampleEvent(tb, i))
			if err != nil {
				fixtureErr = err
				return
			}
			f.entries = append(f.entries, e)
			if i%3 == 2 {
				cp, err := lg.Checkpoint(ctx)
				if err != nil {
					fixtureErr = err
					return
				}
				f.notes = append(f.notes, cp.Note)
			}
		}
		var buf bytes.Buffer
		if err := lg.Export(ctx, &buf, WithInclusionProofs(2), WithConsistencyProofs(3)); err != nil {
			fixtureErr = err
			return
		}
		latest, _ := lg.Latest(ctx)
		f.notes = append(f.notes, latest.Note)
		f.export = buf.Bytes()
		f.roots = refRoots(f.entries)
		fixture = f
	})
	if fixtureErr != nil {
		tb.Fatal(fixtureErr)
	}
	return fixture
}

// FuzzVerifyEntry decodes and verifies arbitrary entry bytes. Entries have
// one spelling: any entry that verifies is exactly what the log's signer
// writes for its index and event.
func FuzzVerifyEntry(f *testing.F) {
	fx := getFixture(f)
	for _, e := range fx.entries[:3] {
		f.Add(e.Data, e.Index)
	}
	f.Add([]byte("e30.e30.AA"), uint64(0))
	signer := entrySigner{priv: fx.keys.Entry, kid: fx.pub.EntryKeyID}
	f.Fuzz(func(t *testing.T, data []byte, index uint64) {
		ev, err := VerifyEntry(Entry{Index: index, Data: data}, fx.pub.Entry)
		if _, perr := (Entry{Data: data}).Event(); err == nil && perr != nil {
			t.Fatalf("verified but Event fails: %v", perr)
		}
		if err != nil {
			return
		}
		payload, err := ev.MarshalCanonical()
		if err != nil {
			t.Fatal(err)
		}
		again, err := signer.sign(index, payload)
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("verified entry is not the log's spelling:\n%s\n%s", data, again)
		}
	})
}

// FuzzParseEvent decodes arbitrary event JSON: whatever parses is canonical
// and survives a round trip.
func FuzzParseEvent(f *testing.F) {
	for _, p := range allPayloads() {
		ev, _ := NewEvent(Operator("alice"), p)
		ev.Time = t0
		b, _ := ev.MarshalCanonical()
		f.Add(b)
	}
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := ParseEvent(b)
		if err != nil {
			return
		}
		again, err := ev.MarshalCanonical()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("round trip: %s, %v", again, err)
		}
		if p, err := ev.DecodePayload(); err == nil {
			if _, err := NewEvent(ev.Actor, p); err != nil && !errors.Is(err, ErrInvalidEvent) && !errors.Is(err, ErrNotPseudonym) {
				t.Fatalf("NewEvent of a decoded payload: %v", err)
			}
		}
	})
}

// FuzzDecodeProof decodes a proof record as an export carries it and
// verifies it against the fixture's tree: only the true proof verifies.
func FuzzDecodeProof(f *testing.F) {
	fx := getFixture(f)
	for _, line := range strings.Split(string(fx.export), "\n") {
		if strings.Contains(line, `"kind":"inclusion"`) || strings.Contains(line, `"kind":"consistency"`) {
			f.Add([]byte(line))
		}
	}
	f.Add([]byte(`{"kind":"inclusion","index":0,"size":1,"proof":[]}`))
	f.Add([]byte(`{"kind":"consistency","size1":1,"size2":7,"proof":["00"]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		var rec exportProof
		if err := strictJSON(line, &rec); err != nil {
			return
		}
		proof, err := decodeProofRecord(rec)
		if err != nil {
			return
		}
		n := uint64(len(fx.entries))
		if rec.Kind == "inclusion" {
			i, size := *rec.Index, *rec.Size
			if size > n || i >= size {
				return
			}
			leaf := fx.entries[i].LeafHash()
			if VerifyInclusion(i, size, leaf[:], proof, fx.roots[size][:]) == nil {
				want := refInclusion(fx, i, size)
				if fmt.Sprint(want) != fmt.Sprint(proof) {
					t.Fatalf("a wrong inclusion proof verified: %x", proof)
				}
			}
			return
		}
		s1, s2 := *rec.Size1, *rec.Size2
		if s1 > n || s2 > n {
			return
		}
		if VerifyConsistency(s1, s2, proof, fx.roots[s1][:], fx.roots[s2][:]) == nil {
			want := refConsistency(fx, s1, s2)
			if fmt.Sprint(want) != fmt.Sprint(proof) {
				t.Fatalf("a wrong consistency proof verified: %x", proof)
			}
		}
	})
}

func strictJSON(line []byte, v any) error {
	return (&verifier{}).decodeLine(line, v)
}

func refInclusion(fx fuzzFixture, i, size uint64) [][]byte {
	return refProof(fx, merkle.InclusionRanges(i, size))
}

func refConsistency(fx fuzzFixture, s1, s2 uint64) [][]byte {
	return refProof(fx, merkle.ConsistencyRanges(s1, s2))
}

func refProof(fx fuzzFixture, rs []merkle.Range) [][]byte {
	out := [][]byte{}
	for _, r := range rs {
		sub := refRoots(fx.entries[r.Begin:r.End])
		h := sub[len(sub)-1]
		out = append(out, h[:])
	}
	return out
}

// FuzzParseFilter parses arbitrary filter text: a parsed filter prints to
// text that parses back to the same filter.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{
		"type=round.closed task=t-1 since=2026-01-01T00:00:00Z until=2026-02-01",
		`task="a \"b\"" round=3 actor=operator:alice`,
		"actor=device:pd-0123",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		flt, err := ParseFilter(s)
		if err != nil {
			return
		}
		back, err := ParseFilter(flt.String())
		if err != nil || !filtersEqual(back, flt) {
			t.Fatalf("%q → %q → %+v, %v", s, flt.String(), back, err)
		}
	})
}

// FuzzParseCheckpoint reads arbitrary notes as checkpoints of the fixture's
// log: only notes the log signed are accepted.
func FuzzParseCheckpoint(f *testing.F) {
	fx := getFixture(f)
	for _, n := range fx.notes {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cp, err := ParseCheckpoint(b, fx.pub.VerifierKey)
		if err != nil {
			return
		}
		text := checkpointText(cp.Origin, cp.Size, cp.Root)
		if !bytes.HasPrefix(b, text) {
			t.Fatalf("accepted a note whose text is not the checkpoint's: %q", b)
		}
	})
}

// FuzzVerifyExport reads arbitrary export files with the fixture's keys
// pinned: whatever verifies is the fixture's log or a prefix of it.
func FuzzVerifyExport(f *testing.F) {
	fx := getFixture(f)
	f.Add(fx.export)
	f.Add([]byte(`{"kind":"header"}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rep, err := VerifyExport(bytes.NewReader(b), WithEntryKey(fx.pub.Entry), WithVerifierKey(fx.pub.VerifierKey), WithWorkers(1))
		if err != nil {
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("not a *VerifyError: %v", err)
			}
			return
		}
		if rep.Entries > uint64(len(fx.entries)) || rep.Root != fx.roots[rep.Entries] {
			t.Fatalf("verified a log that is not the fixture's: %+v", rep)
		}
	})
}

// TestWriteFuzzSeeds rewrites testdata/fuzz from the seeds above when run
// with -update-seeds.
func TestWriteFuzzSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite testdata/fuzz")
	}
	fx := getFixture(t)
	write := func(target, name string, args ...string) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		body := "go test fuzz v1\n" + strings.Join(args, "\n") + "\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bs := func(b []byte) string { return "[]byte(" + strconv.Quote(string(b)) + ")" }
	str := func(s string) string { return "string(" + strconv.Quote(s) + ")" }
	u64 := func(v uint64) string { return "uint64(" + strconv.FormatUint(v, 10) + ")" }

	write("FuzzVerifyEntry", "valid", bs(fx.entries[1].Data), u64(1))
	write("FuzzVerifyEntry", "wrong-index", bs(fx.entries[1].Data), u64(2))
	bad := bytes.Clone(fx.entries[2].Data)
	bad[len(bad)-5] ^= 1
	write("FuzzVerifyEntry", "bad-signature", bs(bad), u64(2))
	write("FuzzVerifyEntry", "alg-none", bs(forge(`{"alg":"none"}`, "{}", nil)), u64(0))

	for i, p := range allPayloads()[:4] {
		ev, _ := NewEvent(Operator("alice"), p)
		ev.Time = t0
		b, _ := ev.MarshalCanonical()
		write("FuzzParseEvent", fmt.Sprintf("event-%d", i), bs(b))
	}
	write("FuzzParseEvent", "not-canonical", bs([]byte(`{"v": 1}`)))

	n := 0
	for _, line := range strings.Split(string(fx.export), "\n") {
		if strings.Contains(line, `"proof":`) {
			write("FuzzDecodeProof", fmt.Sprintf("proof-%d", n), bs([]byte(line)))
			n++
		}
	}
	write("FuzzDecodeProof", "short-hash", bs([]byte(`{"kind":"inclusion","index":0,"size":2,"proof":["00ff"]}`)))

	write("FuzzParseFilter", "full", str("type=round.closed task=t-1 round=2 actor=operator:alice since=2026-01-01T00:00:00Z until=2026-02-01"))
	write("FuzzParseFilter", "quoted", str(`task="a b \"c\""`))
	write("FuzzParseFilter", "bad", str(`task="open`))

	write("FuzzParseCheckpoint", "valid", bs(fx.notes[len(fx.notes)-1]))
	write("FuzzParseCheckpoint", "no-signature", bs(checkpointText("fuzz.fleetlearn/audit", 1, merkle.EmptyRoot)))

	write("FuzzVerifyExport", "valid", bs(fx.export))
	write("FuzzVerifyExport", "truncated", bs(fx.export[:len(fx.export)/2]))
}
