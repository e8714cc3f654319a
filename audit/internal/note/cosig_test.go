package note

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func testCosigner(t *testing.T, name string, seed byte) Cosigner {
	t.Helper()
	c, err := NewCosigner(name, ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testSigner(t *testing.T) Signer {
	t.Helper()
	s, err := NewSigner("example.com/log", ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const testText = "example.com/log\n5\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"

func signed(t *testing.T) []byte {
	t.Helper()
	msg, err := testSigner(t).Sign([]byte(testText))
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// TestCosignLayout rebuilds a cosignature from the byte layout of
// c2sp.org/tlog-cosignature, written out here independently of cosig.go.
func TestCosignLayout(t *testing.T) {
	c := testCosigner(t, "witness.example/w1", 1)
	const ts = 1679315147
	msg, err := c.Cosign(signed(t), ts)
	if err != nil {
		t.Fatal(err)
	}
	// Key id: SHA-256(name || "\n" || 0x04 || pub)[:4].
	h := sha256.Sum256(append([]byte("witness.example/w1\n\x04"), c.PublicKey()...))
	if c.KeyID() != binary.BigEndian.Uint32(h[:4]) {
		t.Fatalf("key id %08x, want %x", c.KeyID(), h[:4])
	}
	wantVKey := "witness.example/w1+" + hexID(h[:4]) + "+" + base64.StdEncoding.EncodeToString(append([]byte{4}, c.PublicKey()...))
	if c.String() != wantVKey {
		t.Fatalf("vkey %s, want %s", c, wantVKey)
	}
	lines := strings.Split(strings.TrimSuffix(string(msg), "\n"), "\n")
	last := lines[len(lines)-1]
	b64, ok := strings.CutPrefix(last, "— witness.example/w1 ")
	if !ok {
		t.Fatalf("last line %q", last)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != 4+8+64 {
		t.Fatalf("signature of %d bytes: %v", len(raw), err)
	}
	if !bytes.Equal(raw[:4], h[:4]) || binary.BigEndian.Uint64(raw[4:12]) != ts {
		t.Fatalf("key id %x, timestamp %d", raw[:4], binary.BigEndian.Uint64(raw[4:12]))
	}
	signedMsg := "cosignature/v1\ntime 1679315147\n" + testText
	if !ed25519.Verify(c.PublicKey(), []byte(signedMsg), raw[12:]) {
		t.Fatal("signature does not verify over the spec's message")
	}
	// The log's signature is still there, first, and still verifies.
	if !strings.HasPrefix(string(msg), string(signed(t))) {
		t.Fatalf("cosigned note does not extend the signed one:\n%s", msg)
	}
	if _, _, err := Open(msg, testSigner(t).Verifier); err != nil {
		t.Fatalf("open with the log key: %v", err)
	}
}

func hexID(b []byte) string { return hex.EncodeToString(b) }

// TestSpecExampleLine decodes the cosignature line of the example in
// c2sp.org/tlog-cosignature: 4 bytes of key id, then the timestamp of its
// example message, then 64 bytes of signature.
func TestSpecExampleLine(t *testing.T) {
	example := "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n" +
		"— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n" +
		"— witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
	_, lines, err := split([]byte(example))
	if err != nil || len(lines) != 2 {
		t.Fatalf("%d lines: %v", len(lines), err)
	}
	w := lines[1]
	if w.name != "witness.example.com/w1" || len(w.sig) != cosigSize || binary.BigEndian.Uint64(w.sig) != 1679315147 {
		t.Fatalf("line %+v", w)
	}
}

func TestCosignRoundTrip(t *testing.T) {
	c := testCosigner(t, "witness.example/w1", 1)
	v, err := ParseCosigVerifier(c.String())
	if err != nil || v.String() != c.String() || v.Name() != c.Name() || v.KeyID() != c.KeyID() {
		t.Fatalf("parse %s: %v, %v", c, v, err)
	}
	msg, err := c.Cosign(signed(t), 100)
	if err != nil {
		t.Fatal(err)
	}
	text, cs, err := VerifyCosignature(msg, v)
	if err != nil || string(text) != testText || cs.Time != 100 || len(cs.Raw) != 4+cosigSize {
		t.Fatalf("verify: %q %d %v", text, cs.Time, err)
	}
	// A second cosignature by the same key replaces the first; another
	// witness's line is kept.
	other := testCosigner(t, "witness.example/w2", 2)
	msg, err = other.Cosign(msg, 50)
	if err != nil {
		t.Fatal(err)
	}
	msg, err = c.Cosign(msg, 200)
	if err != nil {
		t.Fatal(err)
	}
	if names := SignatureNames(msg); strings.Join(names, " ") != "example.com/log witness.example/w2 witness.example/w1" {
		t.Fatalf("signature lines %v", names)
	}
	if _, cs, err := VerifyCosignature(msg, v); err != nil || cs.Time != 200 {
		t.Fatalf("after re-cosigning: %d, %v", cs.Time, err)
	}
	if _, cs, err := VerifyCosignature(msg, other.CosigVerifier); err != nil || cs.Time != 50 {
		t.Fatalf("other witness: %d, %v", cs.Time, err)
	}
	// AddSignature of the raw bytes carries the cosignature to another copy
	// of the note.
	_, cs, _ = VerifyCosignature(msg, v)
	again, err := AddSignature(signed(t), c.Name(), cs.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, got, err := VerifyCosignature(again, v); err != nil || got.Time != 200 {
		t.Fatalf("rebuilt note: %v", err)
	}
}

func TestCosignatureTampering(t *testing.T) {
	c := testCosigner(t, "witness.example/w1", 1)
	msg, err := c.Cosign(signed(t), 1000)
	if err != nil {
		t.Fatal(err)
	}
	text, lines, err := split(msg)
	if err != nil {
		t.Fatal(err)
	}
	rebuild := func(f func(raw []byte) []byte) []byte {
		var b bytes.Buffer
		b.Write(text)
		b.WriteByte('\n')
		for _, l := range lines {
			raw := binary.BigEndian.AppendUint32(nil, l.id)
			raw = append(raw, l.sig...)
			if l.name == c.Name() {
				raw = f(raw)
			}
			writeLine(&b, l.name, raw)
		}
		return b.Bytes()
	}
	cases := []struct {
		name string
		msg  []byte
		want error
	}{
		{"body", bytes.Replace(msg, []byte("\n5\n"), []byte("\n6\n"), 1), ErrInvalidSignature},
		{"timestamp", rebuild(func(r []byte) []byte { r[11]++; return r }), ErrInvalidSignature},
		{"signature", rebuild(func(r []byte) []byte { r[20] ^= 1; return r }), ErrInvalidSignature},
		{"truncated", rebuild(func(r []byte) []byte { return r[:len(r)-1] }), ErrInvalidSignature},
		{"timestamp beyond 2^63-1", rebuild(func(r []byte) []byte { r[4] |= 0x80; return r }), ErrInvalidSignature},
		// Another key id is another key: this witness has no line.
		{"key id", rebuild(func(r []byte) []byte { r[0] ^= 1; return r }), ErrUnverified},
		{"malformed", append(bytes.Clone(msg), "junk\n"...), ErrMalformed},
	}
	for _, tc := range cases {
		if _, _, err := VerifyCosignature(tc.msg, c.CosigVerifier); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, _, err := VerifyCosignature(signed(t), c.CosigVerifier); !errors.Is(err, ErrUnverified) {
		t.Errorf("uncosigned note: %v", err)
	}
	// The log's key does not accept a cosignature, nor the other way round:
	// the type byte is part of the key id.
	log := testSigner(t)
	if _, err := ParseCosigVerifier(log.String()); !errors.Is(err, ErrKey) {
		t.Errorf("log vkey as a witness key: %v", err)
	}
	if _, err := ParseVerifier(c.String()); !errors.Is(err, ErrKey) {
		t.Errorf("witness vkey as a log key: %v", err)
	}
	if _, err := c.Cosign(signed(t), 1<<63); !errors.Is(err, ErrMalformed) {
		t.Errorf("cosign beyond 2^63-1: %v", err)
	}
	if _, err := c.Cosign([]byte(testText), 1); !errors.Is(err, ErrMalformed) {
		t.Errorf("cosign a text without signatures: %v", err)
	}
}

// TestOpenIgnoresCosignatures: a verifier that knows only the log's key
// ignores cosignature lines, even one under the log's own name.
func TestOpenIgnoresCosignatures(t *testing.T) {
	log := testSigner(t)
	same, err := NewCosigner(log.Name(), ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize)))
	if err != nil {
		t.Fatal(err)
	}
	if same.KeyID() == log.KeyID() {
		t.Fatal("cosignature key id equals the note key id of the same key")
	}
	msg, err := same.Cosign(signed(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	msg, err = testCosigner(t, "witness.example/w1", 1).Cosign(msg, 1)
	if err != nil {
		t.Fatal(err)
	}
	text, sigs, err := Open(msg, log.Verifier)
	if err != nil || string(text) != testText || len(sigs) != 1 || sigs[0].KeyID != log.KeyID() {
		t.Fatalf("open: %q %v %v", text, sigs, err)
	}
}
