package note

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the seed corpus files under testdata/fuzz")

// cosigFixture is the log key and the witness keys the cosignature fuzz
// target checks notes with. Every key is a fixed seed, so the seeds in
// testdata stay valid.
type cosigFixture struct {
	log       Signer
	witnesses []Cosigner
	privs     map[uint32]ed25519.PrivateKey // by key id, to re-cosign
}

func newCosigFixture(tb testing.TB) cosigFixture {
	tb.Helper()
	log, err := NewSigner("example.com/log", ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize)))
	if err != nil {
		tb.Fatal(err)
	}
	fx := cosigFixture{log: log, privs: map[uint32]ed25519.PrivateKey{}}
	// The third witness has the log's name and key: only the type byte in
	// the key id tells its lines from the log's.
	for _, w := range []struct {
		name string
		seed byte
	}{{"witness.example/w1", 1}, {"witness.example/w2", 2}, {"example.com/log", 7}} {
		priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{w.seed}, ed25519.SeedSize))
		c, err := NewCosigner(w.name, priv)
		if err != nil {
			tb.Fatal(err)
		}
		fx.witnesses = append(fx.witnesses, c)
		fx.privs[c.KeyID()] = priv
	}
	return fx
}

type cosigSeed struct {
	file string
	msg  []byte
	name string // of the signature line the target adds
	raw  []byte
}

// seeds are real notes: signed by the log, cosigned by the witnesses, and
// then damaged one way at a time.
func (fx cosigFixture) seeds(tb testing.TB) []cosigSeed {
	tb.Helper()
	must := func(b []byte, err error) []byte {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	w1, w2, same := fx.witnesses[0], fx.witnesses[1], fx.witnesses[2]
	signed := must(fx.log.Sign([]byte(testText)))
	one := must(w1.Cosign(signed, 1679315147))
	three := must(same.Cosign(must(w2.Cosign(one, 1679315000)), 1))
	rawOf := func(msg []byte, c Cosigner) []byte {
		tb.Helper()
		_, cs, err := VerifyCosignature(msg, c.CosigVerifier)
		if err != nil {
			tb.Fatal(err)
		}
		return cs.Raw
	}
	// A line signed with w1's key but timestamped beyond 2^63-1, which the
	// format forbids.
	late := binary.BigEndian.AppendUint32(nil, w1.KeyID())
	late = binary.BigEndian.AppendUint64(late, 1<<63)
	late = append(late, ed25519.Sign(fx.privs[w1.KeyID()], CosignatureMessage([]byte(testText), 1<<63))...)
	tampered := bytes.Clone(rawOf(one, w1))
	tampered[11]++
	// Two valid lines of w1 with different timestamps (AddSignature would
	// keep only one): the later one counts.
	twice := append(bytes.Clone(one), lineOf(w1.Name(), rawOf(must(w1.Cosign(signed, 1679315999)), w1))...)
	// The most signature lines a note may have, w1's among them.
	full := bytes.Clone(one)
	for i := 2; i < maxSigs; i++ {
		full = append(full, lineOf(fmt.Sprintf("filler.example/%d", i), []byte{0, 0, 0, byte(i), 1})...)
	}
	unrelated := binary.BigEndian.AppendUint32(nil, 0x01020304)
	unrelated = append(unrelated, bytes.Repeat([]byte{0xaa}, cosigSize)...)
	return []cosigSeed{
		{"cosigned-add-other-witness", one, w2.Name(), rawOf(three, w2)},
		{"three-witnesses-recosign", three, w1.Name(), rawOf(must(w1.Cosign(signed, 1679316000)), w1)},
		{"log-only-carry-cosignature", signed, w1.Name(), rawOf(one, w1)},
		{"tampered-timestamp", replaceLine(one, w1.Name(), tampered), "x", []byte{1, 2, 3, 4, 5}},
		{"timestamp-beyond-2-63", append(bytes.Clone(signed), lineOf(w1.Name(), late)...), same.Name(), unrelated},
		{"two-lines-same-key", twice, "unrelated.example/w", unrelated},
		{"max-signature-lines", full, "unrelated.example/w", unrelated},
		{"spec-example", []byte("example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n" +
			"— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n" +
			"— witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"),
			"witness.example.com/w1", []byte{0x8d, 0x66, 0xcf, 0x3f, 0}},
		{"malformed", append(bytes.Clone(one), "junk\n"...), w1.Name(), rawOf(one, w1)},
	}
}

func lineOf(name string, raw []byte) []byte {
	return []byte("— " + name + " " + base64.StdEncoding.EncodeToString(raw) + "\n")
}

// replaceLine swaps the signature of name's line in msg.
func replaceLine(msg []byte, name string, raw []byte) []byte {
	lines := strings.SplitAfter(string(msg), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "— "+name+" ") {
			lines[i] = string(lineOf(name, raw))
		}
	}
	return []byte(strings.Join(lines, ""))
}

// FuzzVerifyCosignature reads arbitrary notes as a witness's cosigned note
// arrives at the log's public RPC, with an arbitrary signature line to add.
// A cosignature that verifies was made with the witness's key over exactly
// the note's text, adding a line of another key changes nothing a
// verifier sees, and every error names one of the package's failures.
func FuzzVerifyCosignature(f *testing.F) {
	fx := newCosigFixture(f)
	for _, s := range fx.seeds(f) {
		f.Add(s.msg, s.name, s.raw)
	}
	unrelated := binary.BigEndian.AppendUint32(nil, 0x01020304)
	unrelated = append(unrelated, bytes.Repeat([]byte{0xaa}, cosigSize)...)
	f.Fuzz(func(t *testing.T, msg []byte, name string, raw []byte) {
		names := SignatureNames(msg)
		type result struct {
			text []byte
			cs   Cosignature
			err  error
		}
		results := make([]result, len(fx.witnesses))
		for i, w := range fx.witnesses {
			text, cs, err := VerifyCosignature(msg, w.CosigVerifier)
			results[i] = result{text, cs, err}
			if err != nil {
				if n := countIs(err, ErrMalformed, ErrUnverified, ErrInvalidSignature); n != 1 {
					t.Fatalf("%s: error wraps %d of the package's errors: %v", w.Name(), n, err)
				}
				if errors.Is(err, ErrMalformed) != (names == nil) {
					t.Fatalf("%s: %v, but SignatureNames gives %q", w.Name(), err, names)
				}
				continue
			}
			checkCosigned(t, fx, w, msg, text, cs, names)
			// A line of some other key leaves w's verdict as it was.
			out, err := AddSignature(msg, "unrelated.example/w", unrelated)
			if err != nil {
				if len(names) < maxSigs || !errors.Is(err, ErrMalformed) {
					t.Fatalf("adding a line to a note of %d lines: %v", len(names), err)
				}
				continue
			}
			text2, cs2, err := VerifyCosignature(out, w.CosigVerifier)
			if err != nil || !bytes.Equal(text2, text) || cs2.Time != cs.Time || !bytes.Equal(cs2.Raw, cs.Raw) {
				t.Fatalf("%s: after adding an unrelated line: %q %d %v\n%q", w.Name(), text2, cs2.Time, err, out)
			}
		}

		out, err := AddSignature(msg, name, raw)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("AddSignature: %v", err)
			}
			if names != nil && validName(name) && len(raw) >= 5 && len(names) < maxSigs {
				t.Fatalf("AddSignature refused a line %q %x to a note of %d lines: %v", name, raw, len(names), err)
			}
			return
		}
		// The text is kept byte for byte, the new line is last, and adding
		// it again changes nothing.
		at := bytes.LastIndex(msg, []byte("\n\n"))
		if at < 0 || !bytes.HasPrefix(out, msg[:at+2]) {
			t.Fatalf("AddSignature changed the text:\n%q\n%q", msg, out)
		}
		got := SignatureNames(out)
		if len(got) == 0 || got[len(got)-1] != name || len(got) > len(names)+1 {
			t.Fatalf("signature lines %q after adding %q to %q", got, name, names)
		}
		if again, err := AddSignature(out, name, raw); err != nil || !bytes.Equal(again, out) {
			t.Fatalf("adding the same line twice: %v\n%q\n%q", err, out, again)
		}
		for i, w := range fx.witnesses {
			if name == w.Name() && len(raw) >= 4 && binary.BigEndian.Uint32(raw) == w.KeyID() {
				continue // the line replaces w's
			}
			text, cs, err := VerifyCosignature(out, w.CosigVerifier)
			r := results[i]
			if (err == nil) != (r.err == nil) || err != nil && errors.Is(err, ErrUnverified) != errors.Is(r.err, ErrUnverified) ||
				!bytes.Equal(text, r.text) || cs.Time != r.cs.Time || !bytes.Equal(cs.Raw, r.cs.Raw) {
				t.Fatalf("%s: a line of %q changed the verdict from %v to %v:\n%q\n%q", w.Name(), name, r.err, err, msg, out)
			}
		}
	})
}

// checkCosigned re-derives what VerifyCosignature accepted: the text is
// msg up to its blank line, w has a line there, and the cosignature is the
// one w's key makes of that text at that time.
func checkCosigned(t *testing.T, fx cosigFixture, w Cosigner, msg, text []byte, cs Cosignature, names []string) {
	t.Helper()
	at := bytes.LastIndex(msg, []byte("\n\n"))
	if at < 0 || !bytes.Equal(text, msg[:at+1]) {
		t.Fatalf("%s: text %q is not the note's %q", w.Name(), text, msg)
	}
	if !strings.Contains("\x00"+strings.Join(names, "\x00")+"\x00", "\x00"+w.Name()+"\x00") {
		t.Fatalf("%s verified, but the note's lines are by %q", w.Name(), names)
	}
	if cs.Time > math.MaxInt64 || len(cs.Raw) != 4+8+ed25519.SignatureSize ||
		binary.BigEndian.Uint32(cs.Raw) != w.KeyID() || binary.BigEndian.Uint64(cs.Raw[4:]) != cs.Time {
		t.Fatalf("%s: cosignature %x at %d", w.Name(), cs.Raw, cs.Time)
	}
	signedMsg := append([]byte("cosignature/v1\ntime "+strconv.FormatUint(cs.Time, 10)+"\n"), text...)
	if want := ed25519.Sign(fx.privs[w.KeyID()], signedMsg); !bytes.Equal(cs.Raw[12:], want) {
		t.Fatalf("%s: accepted a signature its key did not make of the text: %x", w.Name(), cs.Raw[12:])
	}
	again, err := w.Cosign(msg, cs.Time)
	if err != nil {
		t.Fatalf("%s: re-cosign: %v", w.Name(), err)
	}
	if _, cs2, err := VerifyCosignature(again, w.CosigVerifier); err != nil || !bytes.Equal(cs2.Raw, cs.Raw) {
		t.Fatalf("%s: re-cosigned at %d: %x, %v; accepted %x", w.Name(), cs.Time, cs2.Raw, err, cs.Raw)
	}
}

func countIs(err error, targets ...error) int {
	n := 0
	for _, t := range targets {
		if errors.Is(err, t) {
			n++
		}
	}
	return n
}

// TestWriteCosigFuzzSeeds rewrites testdata/fuzz/FuzzVerifyCosignature
// when run with -update-seeds.
func TestWriteCosigFuzzSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite testdata/fuzz")
	}
	fx := newCosigFixture(t)
	dir := filepath.Join("testdata", "fuzz", "FuzzVerifyCosignature")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bs := func(b []byte) string { return "[]byte(" + strconv.Quote(string(b)) + ")" }
	for _, s := range fx.seeds(t) {
		body := "go test fuzz v1\n" + bs(s.msg) + "\nstring(" + strconv.Quote(s.name) + ")\n" + bs(s.raw) + "\n"
		if err := os.WriteFile(filepath.Join(dir, s.file), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
