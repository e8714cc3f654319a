package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
)

func testPin(t *testing.T, seed byte, origin string, witnesses ...string) Pin {
	t.Helper()
	pub, err := testKeys(t, seed).Public(origin)
	if err != nil {
		t.Fatal(err)
	}
	return Pin{PublicKeys: pub, Witnesses: witnesses}
}

func pinText(t *testing.T, p Pin) string {
	t.Helper()
	b, err := p.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func samePin(a, b Pin) bool {
	return a.Origin == b.Origin && a.Entry.Equal(b.Entry) && a.EntryKeyID == b.EntryKeyID &&
		a.VerifierKey == b.VerifierKey && slices.Equal(a.Witnesses, b.Witnesses)
}

func TestPinRoundTrip(t *testing.T) {
	w1 := testWitness(t, "witness.example/w1", 3).VerifierKey()
	w2 := testWitness(t, "witness.example/w2", 4).VerifierKey()
	for _, p := range []Pin{
		testPin(t, 21, "test.fleetlearn/audit"),
		testPin(t, 21, "test.fleetlearn/audit", w1),
		testPin(t, 22, "other.fleetlearn/audit", w2, w1),
	} {
		text := pinText(t, p)
		if !strings.HasPrefix(text, PinFormat+"\n") {
			t.Fatalf("pin file:\n%s", text)
		}
		// The comments carry the raw keys' fingerprints, for reading aloud.
		h := sha256.Sum256(p.Entry)
		if !strings.Contains(text, "# entry key (Ed25519) SHA-256:      "+hex.EncodeToString(h[:])+"\n") {
			t.Errorf("no entry key fingerprint in\n%s", text)
		}
		if n := strings.Count(text, "\nwitness-vkey: "); n != len(p.Witnesses) {
			t.Errorf("%d witness lines for %d witnesses", n, len(p.Witnesses))
		}
		back, err := ParsePin([]byte(text))
		if err != nil {
			t.Fatalf("parse:\n%s\n%v", text, err)
		}
		if !samePin(back, p) {
			t.Errorf("round trip: %+v, want %+v", back, p)
		}
		// Written on Windows, or with a comment and blank lines added.
		crlf := strings.ReplaceAll(text, "\n", "\r\n")
		annotated := strings.Replace(text, "\norigin: ", "\n\n# checked by phone with the operator\norigin: ", 1)
		for _, v := range []string{crlf, annotated} {
			if back, err := ParsePin([]byte(v)); err != nil || !samePin(back, p) {
				t.Errorf("parse %q: %+v, %v", v, back, err)
			}
		}
	}
	// A witness named twice is pinned once.
	p := testPin(t, 21, "test.fleetlearn/audit", w1, w2, w1)
	back, err := ParsePin([]byte(pinText(t, p)))
	if err != nil || !slices.Equal(back.Witnesses, []string{w1, w2}) {
		t.Fatalf("witnesses %q, %v", back.Witnesses, err)
	}
}

func TestParsePinRefuses(t *testing.T) {
	p := testPin(t, 21, "test.fleetlearn/audit", testWitness(t, "witness.example/w1", 3).VerifierKey())
	text := pinText(t, p)
	other := testPin(t, 22, "test.fleetlearn/audit")
	otherOrigin := testPin(t, 21, "other.fleetlearn/audit")
	// field replaces the value of one field.
	field := func(name, val string) string {
		var out []string
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, name+": ") {
				l = name + ": " + val
			}
			out = append(out, l)
		}
		return strings.Join(out, "\n")
	}
	without := func(name string) string {
		return strings.Join(slices.DeleteFunc(strings.Split(text, "\n"), func(l string) bool {
			return strings.HasPrefix(l, name+": ")
		}), "\n")
	}
	otherJWKS, err := other.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		text string
		want error
	}{
		{"empty", "", ErrInvalidKeys},
		{"wrong first line", strings.Replace(text, PinFormat, "fleetlearn-audit-pin/v2", 1), ErrInvalidKeys},
		{"keys file", strings.Replace(text, PinFormat, "fleetlearn-audit-keys/v1", 1), ErrInvalidKeys},
		{"comment first", "# pin\n" + text, ErrInvalidKeys},
		{"unknown field", text + "expires: 2027-01-01\n", ErrInvalidKeys},
		{"no separator", text + "origin\n", ErrInvalidKeys},
		{"empty value", field("origin", ""), ErrInvalidKeys},
		{"duplicate origin", text + "origin: test.fleetlearn/audit\n", ErrInvalidKeys},
		{"duplicate key id", text + "entry-key-id: " + p.EntryKeyID + "\n", ErrInvalidKeys},
		{"duplicate jwks", text + "entry-jwks: " + string(otherJWKS) + "\n", ErrInvalidKeys},
		{"duplicate vkey", text + "checkpoint-vkey: " + p.VerifierKey + "\n", ErrInvalidKeys},
		{"no origin", without("origin"), ErrInvalidKeys},
		{"no key id", without("entry-key-id"), ErrInvalidKeys},
		{"no jwks", without("entry-jwks"), ErrInvalidKeys},
		{"no vkey", without("checkpoint-vkey"), ErrInvalidKeys},
		{"key id of another key", field("entry-key-id", other.EntryKeyID), ErrKeyMismatch},
		{"jwks of another key", field("entry-jwks", string(otherJWKS)), ErrKeyMismatch},
		{"malformed jwks", field("entry-jwks", `{"keys":[]}`), ErrInvalidKeys},
		{"vkey of another origin", field("checkpoint-vkey", otherOrigin.VerifierKey), ErrKeyMismatch},
		{"origin of another vkey", field("origin", "other.fleetlearn/audit"), ErrKeyMismatch},
		{"malformed vkey", field("checkpoint-vkey", "test.fleetlearn/audit+00000000+AAAA"), ErrInvalidKeys},
		{"witness key truncated", field("witness-vkey", p.Witnesses[0][:len(p.Witnesses[0])-8]), ErrInvalidKeys},
		{"witness key not a key", field("witness-vkey", "witness.example/w1"), ErrInvalidKeys},
		// A note verifier key (type 0x01) is not a cosignature key (0x04).
		{"log key as witness key", field("witness-vkey", p.VerifierKey), ErrInvalidKeys},
		{"oversize", text + "#" + strings.Repeat("x", maxPinFile-len(text)) + "\n", ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParsePin([]byte(tc.text)); !errors.Is(err, tc.want) {
				t.Fatalf("ParsePin: %v, want %v", err, tc.want)
			}
		})
	}
	// Exactly at the limit is still a pin file.
	if pad := maxPinFile - len(text) - 2; pad > 0 {
		if _, err := ParsePin([]byte(text + "#" + strings.Repeat("x", pad) + "\n")); err != nil {
			t.Errorf("pin file of %d bytes: %v", maxPinFile, err)
		}
	}
	if err := CheckWitnessKey(p.Witnesses[0]); err != nil {
		t.Errorf("CheckWitnessKey(%s): %v", p.Witnesses[0], err)
	}
	if _, err := (Pin{}).MarshalText(); !errors.Is(err, ErrInvalidKeys) {
		t.Errorf("MarshalText of an empty pin: %v", err)
	}
	bad := p
	bad.VerifierKey = "not a key"
	if _, err := bad.MarshalText(); !errors.Is(err, ErrInvalidKeys) {
		t.Errorf("MarshalText with a malformed checkpoint key: %v", err)
	}
}

// pinOf is the pin an auditor reads back from what `fleetlearn audit keys`
// prints for the log.
func pinOf(t *testing.T, lg *Log, witnesses ...string) Pin {
	t.Helper()
	p, err := ParsePin([]byte(pinText(t, Pin{PublicKeys: lg.PublicKeys(), Witnesses: witnesses})))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVerifyWithPin(t *testing.T) {
	ctx := context.Background()
	keys := testKeys(t, 21)
	w := testWitness(t, "witness.example/w1", 3)
	lg, _, _ := openTest(t, WithKeys(keys), WithWitnesses(w.VerifierKey()))
	appendN(t, lg, 12)
	exp := exportBytes(t, lg)
	pin := pinOf(t, lg)
	rep, err := VerifyExport(bytes.NewReader(exp), WithPin(pin))
	if err != nil {
		t.Fatal(err)
	}
	if !rep.KeysPinned || rep.Origin != pin.Origin || rep.EntryKeyID != pin.EntryKeyID || rep.VerifierKey != pin.VerifierKey || rep.Entries != 12 {
		t.Fatalf("report %+v", rep)
	}

	// Another log's export: other keys under the same origin, the same
	// keys under another origin.
	otherKeys, _, _ := openTest(t, WithKeys(testKeys(t, 22)))
	appendN(t, otherKeys, 12)
	otherOrigin, _, _ := openTest(t, WithKeys(keys), WithOrigin("other.fleetlearn/audit"))
	appendN(t, otherOrigin, 12)
	if otherOrigin.Origin() != "other.fleetlearn/audit" {
		t.Fatalf("origin %q", otherOrigin.Origin())
	}
	// The same entry key with another checkpoint key: only the checkpoint
	// key tells this log apart.
	mixed := testKeys(t, 22)
	mixed.Entry, mixed.Pseudonym = keys.Entry, keys.Pseudonym
	otherCheckpointKey, _, _ := openTest(t, WithKeys(mixed))
	appendN(t, otherCheckpointKey, 12)
	for name, other := range map[string]*Log{"other keys": otherKeys, "other origin": otherOrigin, "other checkpoint key": otherCheckpointKey} {
		_, err := VerifyExport(bytes.NewReader(exportBytes(t, other)), WithPin(pin))
		ve := wantVerifyError(t, err, -1, ErrTampered, ErrKeyMismatch)
		if ve.Line != 1 {
			t.Errorf("%s: line %d, want the header", name, ve.Line)
		}
	}
	// The other log verifies with its own pin, so it was the pin that
	// refused it.
	if _, err := VerifyExport(bytes.NewReader(exportBytes(t, otherOrigin)), WithPin(pinOf(t, otherOrigin))); err != nil {
		t.Fatalf("other origin with its own pin: %v", err)
	}

	// A pin naming a witness needs its cosignature on the latest
	// checkpoint, as an export assembled from the server's cosigned
	// checkpoint carries it.
	wpin := pinOf(t, lg, w.VerifierKey())
	cp, err := lg.Latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cosigned, err := w.Cosign(cp, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lg.AddCosignature(ctx, cosigned); err != nil {
		t.Fatal(err)
	}
	withCosig, err := lg.CosignedNote(ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	assemble := func(note []byte) []byte {
		var buf bytes.Buffer
		x, err := NewExportWriter(&buf, lg.PublicKeys(), [][]byte{note}, cp.Size)
		if err != nil {
			t.Fatal(err)
		}
		for e, err := range lg.Entries(ctx, 0, cp.Size) {
			if err != nil {
				t.Fatal(err)
			}
			if err := x.WriteEntry(e, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	// The witness's own newest checkpoint is the note it cosigned.
	rep, err = VerifyExport(bytes.NewReader(assemble(withCosig)), WithPin(wpin), WithWitnessCheckpoint(cosigned))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Witnessed) != 1 || rep.Witnessed[0].Witness != w.VerifierKey() || rep.Witnessed[0].Size != cp.Size || rep.Witnessed[0].OwnSize != cp.Size {
		t.Fatalf("witnessed %+v", rep.Witnessed)
	}
	_, err = VerifyExport(bytes.NewReader(assemble(cp.Note)), WithPin(wpin), WithWitnessCheckpoint(cosigned))
	wantVerifyError(t, err, int64(cp.Size), ErrTampered, ErrNotCosigned)
	// Without it, only offline gives a verdict.
	if _, err := VerifyExport(bytes.NewReader(assemble(withCosig)), WithPin(wpin)); !errors.Is(err, ErrNoWitnessCheckpoint) {
		t.Fatalf("pinned witness, no checkpoint of its own: %v", err)
	}
	if rep, err := VerifyExport(bytes.NewReader(assemble(withCosig)), WithPin(wpin), WithWitnessOffline()); err != nil || rep.Witnessed[0].OwnSize != 0 {
		t.Fatalf("offline: %+v, %v", rep.Witnessed, err)
	}
}

// A JWKS key of the wrong length is refused where it is read: verifying
// with it would panic in crypto/ed25519.
func TestParseJWKSKeyLength(t *testing.T) {
	for _, x := range []string{
		"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",     // 31 bytes
		"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", // 34 bytes
	} {
		jwks := []byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"` + x + `"}]}`)
		if _, err := ParseJWKS(jwks); !errors.Is(err, ErrInvalidKeys) {
			t.Errorf("x of %d characters: %v", len(x), err)
		}
	}
}
