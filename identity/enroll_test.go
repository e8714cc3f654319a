package identity_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/fleetlearn/fleetlearn/identity"
)

func enrollSetup(t *testing.T) (*fakeClock, *identity.EnrollmentIssuer, *identity.EnrollmentVerifier, *identity.MemoryUsedTokens) {
	t.Helper()
	clk := newClock()
	iss, err := identity.NewEnrollmentIssuer(signingKey(t, "enroll"), identity.WithClock(clk.Now), identity.WithRand(newDetRand("jti")))
	if err != nil {
		t.Fatal(err)
	}
	used, err := identity.NewMemoryUsedTokens(identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	v, err := identity.NewEnrollmentVerifier("fleet-a", used, []ed25519.PublicKey{iss.PublicKey()}, identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	return clk, iss, v, used
}

func TestEnrollmentRoundTrip(t *testing.T) {
	_, iss, v, _ := enrollSetup(t)
	tok, minted, err := iss.Mint("fleet-a", "lab", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.Redeem(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if got != minted || got.Group != "lab" || got.Expires.Sub(got.IssuedAt) != time.Hour || got.KeyID != identity.KeyID(iss.PublicKey()) {
		t.Fatalf("redeemed %+v, minted %+v", got, minted)
	}
	if _, err := v.Redeem(t.Context(), tok); !errors.Is(err, identity.ErrTokenReused) {
		t.Fatalf("second redemption: %v", err)
	}
}

func TestEnrollmentRefusals(t *testing.T) {
	clk, iss, v, _ := enrollSetup(t)
	other, err := identity.NewEnrollmentIssuer(signingKey(t, "other"), identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	mint := func(iss *identity.EnrollmentIssuer, fleet string, ttl time.Duration) string {
		t.Helper()
		tok, _, err := iss.Mint(fleet, "", ttl)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	expiring := mint(iss, "fleet-a", time.Minute)
	otherFleet := mint(iss, "fleet-b", time.Hour)
	unknown := mint(other, "fleet-a", time.Hour)
	good := mint(iss, "fleet-a", time.Hour)
	// An API token from the same key must not enroll a device.
	api, err := identity.NewAPIIssuer(signingKey(t, "enroll"), identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	apiTok, _, err := api.Mint("alice", []identity.Role{identity.RoleAdmin}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	tampered := parts[0] + "." + parts[1] + "." + flip(parts[2])
	clk.Add(time.Minute + identity.DefaultLeeway + time.Second)
	for _, c := range []struct {
		name, tok string
		want      error
	}{
		{"expired", expiring, identity.ErrTokenExpired},
		{"other fleet", otherFleet, identity.ErrWrongFleet},
		{"unknown key", unknown, identity.ErrUnknownKey},
		{"tampered", tampered, identity.ErrBadSignature},
		{"api token", apiTok, identity.ErrMalformedToken},
		{"empty", "", identity.ErrMalformedToken},
		{"garbage", "a.b.c", identity.ErrMalformedToken},
		{"huge", strings.Repeat("a", identity.MaxTokenBytes+1), identity.ErrMalformedToken},
	} {
		if _, err := v.Verify(c.tok); !errors.Is(err, c.want) {
			t.Errorf("verify %s: %v, want %v", c.name, err, c.want)
		}
		if _, err := v.Redeem(t.Context(), c.tok); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Verify claims nothing, and refused tokens were not claimed: the good
	// one still works once.
	if c, err := v.Verify(good); err != nil || c.Fleet != "fleet-a" {
		t.Fatalf("verify the good token: %+v %v", c, err)
	}
	if _, err := v.Redeem(t.Context(), good); err != nil {
		t.Fatal(err)
	}
}

func flip(s string) string {
	b := []byte(s)
	if b[0] == 'A' {
		b[0] = 'B'
	} else {
		b[0] = 'A'
	}
	return string(b)
}

func TestEnrollmentLeeway(t *testing.T) {
	clk, iss, v, _ := enrollSetup(t)
	tok, _, err := iss.Mint("fleet-a", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute + identity.DefaultLeeway - time.Second)
	if _, err := v.Redeem(t.Context(), tok); err != nil {
		t.Fatalf("within leeway: %v", err)
	}
	// Issued in the future beyond the leeway: a skewed or forged clock.
	clk.Add(-time.Hour)
	tok2, _, err := iss.Mint("fleet-a", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(-identity.DefaultLeeway - time.Minute)
	if _, err := v.Redeem(t.Context(), tok2); !errors.Is(err, identity.ErrInvalidToken) {
		t.Fatalf("issued in the future: %v", err)
	}
}

// A token signed with another algorithm, even by the trusted key's owner
// in another form, is refused: the verifier pins EdDSA.
func TestEnrollmentAlgorithmPinned(t *testing.T) {
	clk, iss, v, _ := enrollSetup(t)
	tok := jwt.New()
	for k, val := range map[string]any{jwt.JwtIDKey: "x", jwt.AudienceKey: "fleetlearn/enroll", "fleet": "fleet-a",
		jwt.IssuedAtKey: clk.Now(), jwt.ExpirationKey: clk.Now().Add(time.Hour)} {
		if err := tok.Set(k, val); err != nil {
			t.Fatal(err)
		}
	}
	hdr := jws.NewHeaders()
	_ = hdr.Set(jws.KeyIDKey, identity.KeyID(iss.PublicKey()))
	_ = hdr.Set(jws.TypeKey, "fl-enroll+jwt")
	// HMAC keyed with the public key: the classic confusion attack.
	b, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256, []byte(iss.PublicKey()), jws.WithProtectedHeaders(hdr)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Redeem(t.Context(), string(b)); !errors.Is(err, identity.ErrBadSignature) {
		t.Fatalf("HS256 token: %v", err)
	}
	// alg "none".
	nb, err := jwt.Sign(tok, jwt.WithInsecureNoSignature())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Redeem(t.Context(), string(nb)); err == nil {
		t.Fatal("unsigned token accepted")
	}
}

func TestEnrollmentKeyRotation(t *testing.T) {
	clk := newClock()
	oldIss, _ := identity.NewEnrollmentIssuer(signingKey(t, "old"), identity.WithClock(clk.Now))
	newIss, _ := identity.NewEnrollmentIssuer(signingKey(t, "new"), identity.WithClock(clk.Now))
	used, _ := identity.NewMemoryUsedTokens(identity.WithClock(clk.Now))
	v, err := identity.NewEnrollmentVerifier("fleet-a", used, []ed25519.PublicKey{oldIss.PublicKey(), newIss.PublicKey()}, identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	for _, iss := range []*identity.EnrollmentIssuer{oldIss, newIss} {
		tok, _, err := iss.Mint("fleet-a", "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Redeem(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEnrollmentBadInput(t *testing.T) {
	clk, iss, _, used := enrollSetup(t)
	for _, c := range []struct {
		fleet, group string
		ttl          time.Duration
	}{
		{"", "", time.Hour},
		{"fleet.a", "", time.Hour},
		{"fleet-a", "g>", time.Hour},
		{"fleet-a", "", 0},
		{"fleet-a", "", -time.Second},
		{"fleet-a", "", identity.DefaultEnrollmentMaxTTL + time.Second},
		{strings.Repeat("f", 65), "", time.Hour},
	} {
		if _, _, err := iss.Mint(c.fleet, c.group, c.ttl); !errors.Is(err, identity.ErrBadInput) {
			t.Errorf("Mint(%q, %q, %v): %v", c.fleet, c.group, c.ttl, err)
		}
	}
	if _, err := identity.NewEnrollmentIssuer(ed25519.PrivateKey{1, 2}); !errors.Is(err, identity.ErrBadKey) {
		t.Errorf("short key: %v", err)
	}
	if _, err := identity.NewEnrollmentIssuer(signingKey(t, "x"), identity.WithClock(nil)); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("nil clock: %v", err)
	}
	if _, err := identity.NewEnrollmentIssuer(signingKey(t, "x"), identity.WithLeeway(-time.Second)); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("negative leeway: %v", err)
	}
	if _, err := identity.NewEnrollmentIssuer(signingKey(t, "x"), identity.WithRand(nil)); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("nil rand: %v", err)
	}
	pub := []ed25519.PublicKey{iss.PublicKey()}
	for name, f := range map[string]func() error{
		"no keys": func() error { _, err := identity.NewEnrollmentVerifier("fleet-a", used, nil); return err },
		"short key": func() error {
			_, err := identity.NewEnrollmentVerifier("fleet-a", used, []ed25519.PublicKey{{1}})
			return err
		},
		"nil used":  func() error { _, err := identity.NewEnrollmentVerifier("fleet-a", nil, pub); return err },
		"bad fleet": func() error { _, err := identity.NewEnrollmentVerifier("a b", used, pub); return err },
		"leeway": func() error {
			_, err := identity.NewEnrollmentVerifier("fleet-a", used, pub, identity.WithLeeway(time.Hour))
			return err
		},
	} {
		if err := f(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	_ = clk
}

// Concurrent redemptions of one token: exactly one wins.
func TestEnrollmentSingleUseConcurrent(t *testing.T) {
	_, iss, v, _ := enrollSetup(t)
	tok, _, err := iss.Mint("fleet-a", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var ok, reused atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			_, err := v.Redeem(context.Background(), tok)
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, identity.ErrTokenReused):
				reused.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 || reused.Load() != 15 {
		t.Fatalf("%d redemptions succeeded, %d reused", ok.Load(), reused.Load())
	}
}

func TestMemoryUsedTokensForgetsExpired(t *testing.T) {
	clk := newClock()
	used, err := identity.NewMemoryUsedTokens(identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := used.Claim(ctx, "a", clk.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := used.Claim(ctx, "b", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute + identity.DefaultLeeway + time.Second)
	if err := used.Claim(ctx, "c", clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if used.Len() != 2 {
		t.Fatalf("%d records, want 2 (a expired)", used.Len())
	}
	if err := used.Claim(ctx, "b", clk.Now().Add(time.Hour)); !errors.Is(err, identity.ErrTokenReused) {
		t.Fatalf("b again: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := used.Claim(cctx, "d", clk.Now()); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
