package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

type textSeed struct {
	file string
	text []byte
}

// pinSeeds are pin files as `fleetlearn audit keys` writes them, edited
// the ways a person or an attacker might.
func pinSeeds(tb testing.TB) []textSeed {
	tb.Helper()
	w1 := testWitness(tb, "witness.example/w1", 3).VerifierKey()
	w2 := testWitness(tb, "witness.example/w2", 4).VerifierKey()
	pin := func(seed byte, origin string, witnesses ...string) string {
		tb.Helper()
		pub, err := testKeys(tb, seed).Public(origin)
		if err != nil {
			tb.Fatal(err)
		}
		b, err := Pin{PublicKeys: pub, Witnesses: witnesses}.MarshalText()
		if err != nil {
			tb.Fatal(err)
		}
		return string(b)
	}
	field := func(text, key string) string {
		for _, l := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(l, key+": "); ok {
				return v
			}
		}
		tb.Fatalf("no %s in\n%s", key, text)
		return ""
	}
	one := pin(21, "test.fleetlearn/audit", w1)
	other := pin(22, "test.fleetlearn/audit")
	var bare []string
	for _, l := range strings.Split(one, "\n") {
		if !strings.HasPrefix(l, "#") {
			bare = append(bare, l, "")
		}
	}
	return []textSeed{
		{"no-witnesses", []byte(pin(21, "test.fleetlearn/audit"))},
		{"one-witness", []byte(one)},
		{"two-witnesses", []byte(pin(22, "other.fleetlearn/audit", w2, w1))},
		{"crlf", []byte(strings.ReplaceAll(one, "\n", "\r\n"))},
		{"no-comments-blank-lines", []byte(strings.Join(bare, "\n"))},
		{"witness-twice", []byte(one + "witness-vkey: " + w1 + "\n")},
		{"entry-key-id-of-other-key", []byte(strings.Replace(one, field(one, "entry-key-id"), field(other, "entry-key-id"), 1))},
		{"jwks-of-other-key", []byte(strings.Replace(one, field(one, "entry-jwks"), field(other, "entry-jwks"), 1))},
		{"origin-not-the-key-name", []byte(strings.Replace(one, "origin: test.fleetlearn/audit", "origin: evil.fleetlearn/audit", 1))},
		{"log-key-as-witness", []byte(one + "witness-vkey: " + field(one, "checkpoint-vkey") + "\n")},
		{"checkpoint-vkey-missing", []byte(strings.Replace(one, "checkpoint-vkey: ", "# checkpoint-vkey: ", 1))},
		{"origin-twice", []byte(one + "origin: test.fleetlearn/audit\n")},
		{"unknown-field", []byte(one + "monitor: https://example.com\n")},
	}
}

// FuzzParsePin reads arbitrary pin files: a pin that parses writes out a
// file that parses back to the same pin, and writes that file again byte
// for byte; a refusal names one of the documented errors.
func FuzzParsePin(f *testing.F) {
	for _, s := range pinSeeds(f) {
		f.Add(s.text)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePin(b)
		if err != nil {
			if n := countIs(err, ErrInvalidKeys, ErrKeyMismatch, ErrTooLarge); n != 1 {
				t.Fatalf("error wraps %d of the documented errors: %v", n, err)
			}
			return
		}
		text, err := p.MarshalText()
		if err != nil {
			t.Fatalf("a parsed pin does not marshal: %v\n%q", err, b)
		}
		back, err := ParsePin(text)
		if err != nil || !samePin(back, p) {
			t.Fatalf("round trip: %+v, %v\n%s", back, err, text)
		}
		if again, err := back.MarshalText(); err != nil || !bytes.Equal(again, text) {
			t.Fatalf("marshalled again: %v\n%s\n%s", err, text, again)
		}
	})
}

// witnessKeySeeds are witness key files as MarshalText writes them, and
// edits of them.
func witnessKeySeeds(tb testing.TB) []textSeed {
	tb.Helper()
	b, err := testWitness(tb, "witness.example/w1", 3).MarshalText()
	if err != nil {
		tb.Fatal(err)
	}
	text := string(b)
	seed := text[strings.LastIndex(text, " ")+1 : len(text)-1]
	return []textSeed{
		{"valid", b},
		{"no-final-newline", b[:len(b)-1]},
		{"crlf", []byte(strings.ReplaceAll(text, "\n", "\r\n"))},
		{"name-with-plus", []byte(strings.Replace(text, "name: witness.example/w1", "name: witness.example+w1", 1))},
		{"seed-short", []byte(strings.Replace(text, seed, seed[:40], 1))},
		{"seed-unpadded", []byte(strings.Replace(text, seed, strings.TrimRight(seed, "="), 1))},
		{"other-header", []byte(strings.Replace(text, witnessKeyHeader, "fleetlearn-audit-keys/v1", 1))},
		{"extra-line", []byte(text + "extra: 1\n")},
	}
}

// FuzzParseWitnessKey reads arbitrary witness key files: a key that parses
// writes out a file that parses back to the same key, and it cosigns
// checkpoints that verify under its own verifier key.
func FuzzParseWitnessKey(f *testing.F) {
	for _, s := range witnessKeySeeds(f) {
		f.Add(s.text)
	}
	keys := testKeys(f, 33)
	signer, err := note.NewSigner("test.fleetlearn/audit", keys.Checkpoint)
	if err != nil {
		f.Fatal(err)
	}
	msg, err := signer.Sign(checkpointText("test.fleetlearn/audit", 0, merkle.EmptyRoot))
	if err != nil {
		f.Fatal(err)
	}
	cp := Checkpoint{Origin: "test.fleetlearn/audit", Root: merkle.EmptyRoot, Note: msg}
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseWitnessKey(b)
		if err != nil {
			if n := countIs(err, ErrInvalidKeys, ErrTooLarge); n != 1 {
				t.Fatalf("error wraps %d of the documented errors: %v", n, err)
			}
			return
		}
		text, err := k.MarshalText()
		if err != nil {
			t.Fatalf("a parsed key does not marshal: %v\n%q", err, b)
		}
		back, err := ParseWitnessKey(text)
		if err != nil || back.Name() != k.Name() || back.VerifierKey() != k.VerifierKey() {
			t.Fatalf("round trip: %v %v, %v\n%s", back.Name(), back.VerifierKey(), err, text)
		}
		if again, err := back.MarshalText(); err != nil || !bytes.Equal(again, text) {
			t.Fatalf("marshalled again: %v\n%s\n%s", err, text, again)
		}
		if err := CheckWitnessKey(k.VerifierKey()); err != nil {
			t.Fatalf("its verifier key: %v", err)
		}
		cosigned, err := k.Cosign(cp, t0)
		if err != nil {
			t.Fatalf("cosign: %v", err)
		}
		if _, at, err := VerifyCosignature(cosigned, signer.String(), k.VerifierKey()); err != nil || !at.Equal(t0) {
			t.Fatalf("its cosignature: %s, %v", at, err)
		}
	})
}

// TestWritePinFuzzSeeds rewrites testdata/fuzz/FuzzParsePin and
// FuzzParseWitnessKey when run with -update-seeds.
func TestWritePinFuzzSeeds(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update-seeds to rewrite testdata/fuzz")
	}
	for target, seeds := range map[string][]textSeed{"FuzzParsePin": pinSeeds(t), "FuzzParseWitnessKey": witnessKeySeeds(t)} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s.text)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, s.file), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
