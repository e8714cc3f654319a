package note

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/audit/internal/testvectors"
)

func TestVectors(t *testing.T) {
	var v testvectors.SignedNotes
	testvectors.Load(t, "signed_note_vectors.json", &v)
	if len(v.Keys) == 0 || len(v.Sign) == 0 || len(v.Open) == 0 {
		t.Fatal("vector file has empty tables")
	}
	for _, k := range v.Keys {
		ver, err := ParseVerifier(k.VKey)
		if err != nil {
			t.Errorf("%s: %v", k.Name, err)
			continue
		}
		if ver.Name() != k.Name || ver.String() != k.VKey {
			t.Errorf("%s: round trip gave %s", k.Name, ver)
		}
		if k.SKey != "" {
			s, err := ParseSigner(k.SKey)
			if err != nil {
				t.Errorf("%s: %v", k.Name, err)
				continue
			}
			if s.String() != k.VKey || s.SKey() != k.SKey {
				t.Errorf("%s: signer gives vkey %s, skey %s", k.Name, s, s.SKey())
			}
		}
	}
	for _, s := range v.Sign {
		signer, err := ParseSigner(s.SKey)
		if err != nil {
			t.Fatalf("%s: %v", s.Desc, err)
		}
		got, err := signer.Sign([]byte(s.Text))
		if err != nil || string(got) != s.WantNote {
			t.Errorf("%s: got %q, %v\nwant %q", s.Desc, got, err, s.WantNote)
		}
	}
	for _, o := range v.Open {
		var known []Verifier
		for _, k := range o.VerifierKeys {
			ver, err := ParseVerifier(k)
			if err != nil {
				t.Fatalf("%s: %v", o.Desc, err)
			}
			known = append(known, ver)
		}
		text, sigs, err := Open([]byte(o.Note), known...)
		var want error
		switch o.Want {
		case "ok":
		case "unverified":
			want = ErrUnverified
		case "invalid_signature":
			want = ErrInvalidSignature
		case "malformed":
			want = ErrMalformed
		default:
			t.Fatalf("%s: unknown want %q", o.Desc, o.Want)
		}
		if want != nil {
			if !errors.Is(err, want) {
				t.Errorf("%s: got %v, want %v", o.Desc, err, want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", o.Desc, err)
			continue
		}
		var names []string
		for _, s := range sigs {
			names = append(names, s.Name)
		}
		if strings.Join(names, ",") != strings.Join(o.WantVerified, ",") {
			t.Errorf("%s: verified %v, want %v", o.Desc, names, o.WantVerified)
		}
		if !strings.HasPrefix(o.Note, string(text)) || !bytes.HasSuffix(text, []byte("\n")) {
			t.Errorf("%s: text %q", o.Desc, text)
		}
		if o.Checkpoint != nil && !strings.HasPrefix(string(text), o.Checkpoint.Origin+"\n") {
			t.Errorf("%s: text does not start with the origin", o.Desc)
		}
	}
}

func TestSignOpenRoundTrip(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
	s, err := NewSigner("fleetlearn.example/audit", priv)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ParseVerifier(s.String())
	if err != nil || !v.PublicKey().Equal(pub) {
		t.Fatalf("ParseVerifier(%s): %v", s, err)
	}
	msg, err := s.Sign([]byte("origin\n1\nAAAA\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(msg, v); err != nil {
		t.Fatal(err)
	}
	other, _ := NewVerifier("other", pub)
	if _, _, err := Open(msg, other); !errors.Is(err, ErrUnverified) {
		t.Errorf("unknown key: %v", err)
	}
	for _, bad := range []string{"", "no newline", "two\n\nparagraphs\n", "\n", "ctl\x7f\n", "bad\xffutf8\n"} {
		if _, err := s.Sign([]byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("Sign(%q): %v", bad, err)
		}
	}
	for _, bad := range []string{"", "a+b", "a+0000000g+AA==", "a+00000000+!!", "PRIVATE+KEY+x", "has space+00000000+AQ=="} {
		if _, err := ParseVerifier(bad); !errors.Is(err, ErrKey) {
			t.Errorf("ParseVerifier(%q): %v", bad, err)
		}
		if _, err := ParseSigner("PRIVATE+KEY+" + bad); !errors.Is(err, ErrKey) {
			t.Errorf("ParseSigner(%q): %v", bad, err)
		}
	}
	// A vkey whose id does not match its key.
	parts := strings.Split(s.String(), "+")
	wrong := fmt.Sprintf("%s+%08x+%s", parts[0], s.KeyID()^1, parts[2])
	if _, err := ParseVerifier(wrong); !errors.Is(err, ErrKey) {
		t.Errorf("ParseVerifier(%q): %v", wrong, err)
	}
}

func FuzzOpen(f *testing.F) {
	_, priv, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
	s, _ := NewSigner("fuzz", priv)
	msg, _ := s.Sign([]byte("fuzz\n3\nAAAA\n"))
	f.Add(msg)
	f.Add([]byte("text\n\n— fuzz AAAAAAAA\n"))
	f.Add([]byte("\n\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		text, sigs, err := Open(b, s.Verifier)
		if err != nil {
			return
		}
		if len(sigs) != 1 || !ed25519.Verify(s.PublicKey(), text, sigsFor(t, b)) {
			t.Fatalf("Open accepted %q", b)
		}
	})
}

// sigsFor re-extracts the fuzz key's signature to double-check Open.
func sigsFor(t *testing.T, b []byte) []byte {
	_ = t
	i := bytes.LastIndex(b, []byte("\n\n"))
	for _, line := range strings.Split(string(b[i+2:]), "\n") {
		if rest, ok := strings.CutPrefix(line, "— fuzz "); ok {
			raw, err := base64Decode(rest)
			if err == nil && len(raw) == 68 {
				return raw[4:]
			}
		}
	}
	return nil
}

func base64Decode(s string) ([]byte, error) {
	return base64StdStrict.DecodeString(s)
}

var base64StdStrict = base64.StdEncoding.Strict()
