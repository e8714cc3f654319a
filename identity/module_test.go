package identity_test

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

func TestModuleSignatures(t *testing.T) {
	clk := newClock()
	pubA, err := identity.NewPublisher(signingKey(t, "pub-a"), identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	pubB, _ := identity.NewPublisher(signingKey(t, "pub-b"))
	jwks, err := identity.PublicJWKS(signingKey(t, "pub-a").Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := identity.ParseTrustedPublishers(jwks)
	if err != nil {
		t.Fatal(err)
	}
	if ids := trusted.KeyIDs(); len(ids) != 1 || ids[0] != pubA.KeyID() {
		t.Fatalf("key ids %v", ids)
	}
	module := []byte("\x00asm\x01\x00\x00\x00 a module")
	sig, err := pubA.SignModule("mnist-train", module)
	if err != nil {
		t.Fatal(err)
	}
	got, err := trusted.VerifyModule(module, sig)
	if err != nil {
		t.Fatal(err)
	}
	if got.KeyID != pubA.KeyID() || got.Name != "mnist-train" || got.SHA256 != wire.SHA256(module) || !got.IssuedAtTime().Equal(clk.Now()) {
		t.Fatalf("verified %+v", got)
	}
	if _, err := trusted.VerifyModuleSHA256(wire.SHA256(module), sig); err != nil {
		t.Fatal(err)
	}
	sigB, _ := pubB.SignModule("mnist-train", module)
	parts := strings.Split(sig, ".")
	for _, c := range []struct {
		name   string
		module []byte
		sig    string
		want   error
	}{
		{"other module", []byte("other"), sig, identity.ErrHashMismatch},
		{"untrusted publisher", module, sigB, identity.ErrUntrustedPublisher},
		{"tampered signature", module, parts[0] + "." + parts[1] + "." + flip(parts[2]), identity.ErrBadSignature},
		{"swapped payload", module, parts[0] + "." + strings.Split(sigB, ".")[1] + "." + parts[2], identity.ErrBadSignature},
		{"empty", module, "", identity.ErrMalformedToken},
		{"garbage", module, "x.y.z", identity.ErrMalformedToken},
		{"huge", module, strings.Repeat("x", identity.MaxSignatureBytes+1), identity.ErrMalformedToken},
	} {
		if _, err := trusted.VerifyModule(c.module, c.sig); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := trusted.VerifyModuleSHA256("ABC", sig); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("bad sha: %v", err)
	}
	for _, c := range []struct{ name, sha string }{{"", wire.SHA256(module)}, {"m", "abc"}, {"a\x00b", wire.SHA256(module)}} {
		if _, err := pubA.SignModuleSHA256(c.name, c.sha); !errors.Is(err, identity.ErrBadInput) {
			t.Errorf("SignModuleSHA256(%q, %q): %v", c.name, c.sha, err)
		}
	}
}

func TestParseTrustedPublishersRefuses(t *testing.T) {
	key := signingKey(t, "pub")
	for name, jwks := range map[string]string{
		"empty":       ``,
		"no keys":     `{"keys":[]}`,
		"not json":    `{`,
		"rsa":         `{"keys":[{"kty":"RSA","n":"sXch","e":"AQAB"}]}`,
		"wrong kid":   `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"mine"}]}`,
		"wrong alg":   `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","alg":"ES256"}]}`,
		"private key": `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","d":"nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"}]}`,
		"x25519":      `{"keys":[{"kty":"OKP","crv":"X25519","x":"hSDwCYkwp1R0i33ctD73Wg2_Og0mOBr066SpjqqbTmo"}]}`,
		"huge":        strings.Repeat(" ", identity.MaxJWKSBytes+1),
	} {
		if _, err := identity.ParseTrustedPublishers([]byte(jwks)); !errors.Is(err, identity.ErrBadJWKS) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A key without kid or alg is accepted under its thumbprint.
	tp, err := identity.ParseTrustedPublishers([]byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`))
	if err != nil || tp.KeyIDs()[0] != "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k" {
		t.Fatalf("bare key: %v", err)
	}
	if _, err := identity.PublicJWKS(ed25519.PublicKey(key[:5])); !errors.Is(err, identity.ErrBadKey) {
		t.Errorf("short key: %v", err)
	}
}
