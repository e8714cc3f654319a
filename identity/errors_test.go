package identity_test

import (
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
)

// TestErrorTexts: an error says "identity" once, names its condition (the
// sentinel it wraps) once and the file it is about once, whichever layer of
// the package it came through.
func TestErrorTexts(t *testing.T) {
	clk, iss, v, _ := enrollSetup(t)
	ctx := t.Context()
	tok, _, err := iss.Mint("fleet-a", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Redeem(ctx, tok); err != nil {
		t.Fatal(err)
	}
	_, reused := v.Redeem(ctx, tok)
	other, _, _ := iss.Mint("fleet-b", "", time.Hour)
	_, foreign := v.Redeem(ctx, other)
	late, _, _ := iss.Mint("fleet-a", "", time.Minute)
	clk.Add(time.Hour)
	_, expired := v.Redeem(ctx, late)

	api, err := identity.NewAPIVerifier([]ed25519.PublicKey{signingKey(t, "api").Public().(ed25519.PublicKey)})
	if err != nil {
		t.Fatal(err)
	}
	_, garbage := api.Verify("not.a.token")

	dir := t.TempDir()
	open := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("secret\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	userPath, signingPath := open("device.nk"), open("publisher.pem")
	_, userMode := identity.LoadOrCreateUserKey(userPath)
	_, signingMode := identity.LoadOrCreateSigningKey(signingPath)
	if err := os.Chmod(userPath, 0o600); err != nil {
		t.Fatal(err)
	}
	_, badSeed := identity.LoadOrCreateUserKey(userPath)
	tlsDir := t.TempDir()
	if _, err := identity.LoadOrCreateTLS(tlsDir, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	caKey := filepath.Join(tlsDir, identity.CAKeyFile)
	if err := os.Chmod(caKey, 0o640); err != nil {
		t.Fatal(err)
	}
	_, tlsMode := identity.LoadOrCreateTLS(tlsDir, []string{"127.0.0.1"})

	jwks, err := identity.PublicJWKS(signingKey(t, "trusted").Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := identity.ParseTrustedPublishers(jwks)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := identity.NewPublisher(signingKey(t, "stranger"))
	if err != nil {
		t.Fatal(err)
	}
	module := []byte("\x00asm\x01\x00\x00\x00")
	sig, err := stranger.SignModule("m", module)
	if err != nil {
		t.Fatal(err)
	}
	_, untrusted := trusted.VerifyModule(module, sig)

	for _, c := range []struct {
		name     string
		err      error
		sentinel error
		want     string // the whole message, or its start when it ends in "..."
		file     string
	}{
		{"reused enrollment token", reused, identity.ErrTokenReused,
			"identity: redeem: enrollment token already used: ...", ""},
		{"foreign enrollment token", foreign, identity.ErrWrongFleet,
			`identity: redeem: token is for another fleet: "fleet-b", want "fleet-a"`, ""},
		{"expired enrollment token", expired, identity.ErrTokenExpired, "identity: redeem: token expired: ...", ""},
		{"malformed api token", garbage, identity.ErrMalformedToken, "identity: verify api token: malformed token: ...", ""},
		{"open user key file", userMode, identity.ErrKeyFileMode,
			"identity: user key: " + userPath + ": key file permissions too open: mode 0644, want 0600", userPath},
		{"open signing key file", signingMode, identity.ErrKeyFileMode,
			"identity: signing key: " + signingPath + ": key file permissions too open: mode 0644, want 0600", signingPath},
		{"open CA key file", tlsMode, identity.ErrKeyFileMode,
			"identity: tls: " + caKey + ": key file permissions too open: mode 0640, want 0600", caKey},
		{"bad seed", badSeed, identity.ErrBadKey, "identity: user key " + userPath + ": bad key: user seed: ...", userPath},
		{"untrusted publisher", untrusted, identity.ErrUntrustedPublisher,
			`identity: verify module: untrusted module publisher: kid "` + stranger.KeyID() + `"`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !errors.Is(c.err, c.sentinel) {
				t.Fatalf("err = %v, want it to wrap %v", c.err, c.sentinel)
			}
			msg := c.err.Error()
			if start, ok := strings.CutSuffix(c.want, "..."); ok && !strings.HasPrefix(msg, start) || !ok && msg != c.want {
				t.Errorf("message %q, want %q", msg, c.want)
			}
			if n := strings.Count(msg, "identity"); n != 1 {
				t.Errorf("message %q says identity %d times", msg, n)
			}
			if n := strings.Count(msg, c.sentinel.Error()); n != 1 {
				t.Errorf("message %q says %q %d times", msg, c.sentinel, n)
			}
			if c.file != "" && strings.Count(msg, c.file) != 1 {
				t.Errorf("message %q does not name %s exactly once", msg, c.file)
			}
		})
	}
}
