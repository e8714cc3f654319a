package identity_test

import (
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// The fuzz targets feed untrusted bytes to every decoder. Seeds live in
// testdata/fuzz; the keys below are deterministic, so the valid seed
// tokens there verify.

var fuzzModule = []byte("fuzz module")

func fuzzVerifiers(t testing.TB) (*identity.APIVerifier, *identity.EnrollmentVerifier, *identity.TrustedPublishers, *fakeClock) {
	clk := newClock()
	pub := signingKey(t, "fuzz").Public().(ed25519.PublicKey)
	api, err := identity.NewAPIVerifier([]ed25519.PublicKey{pub}, identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	used, _ := identity.NewMemoryUsedTokens(identity.WithClock(clk.Now))
	enr, err := identity.NewEnrollmentVerifier("fleet-a", used, []ed25519.PublicKey{pub}, identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := identity.PublicJWKS(pub)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := identity.ParseTrustedPublishers(jwks)
	if err != nil {
		t.Fatal(err)
	}
	return api, enr, tp, clk
}

// fuzzIssued mints one valid token of each kind with the fuzz key.
func fuzzIssued(t testing.TB, clk *fakeClock) (api, enroll, module string) {
	key := signingKey(t, "fuzz")
	ai, _ := identity.NewAPIIssuer(key, identity.WithClock(clk.Now), identity.WithRand(newDetRand("a")))
	ei, _ := identity.NewEnrollmentIssuer(key, identity.WithClock(clk.Now), identity.WithRand(newDetRand("e")))
	p, _ := identity.NewPublisher(key, identity.WithClock(clk.Now))
	var err error
	if api, _, err = ai.Mint("alice", []identity.Role{identity.RoleOperator}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if enroll, _, err = ei.Mint("fleet-a", "lab", time.Hour); err != nil {
		t.Fatal(err)
	}
	if module, err = p.SignModule("m", fuzzModule); err != nil {
		t.Fatal(err)
	}
	return api, enroll, module
}

func FuzzVerifyAPIToken(f *testing.F) {
	v, _, _, clk := fuzzVerifiers(f)
	tok, _, _ := fuzzIssued(f, clk)
	f.Add(tok)
	f.Fuzz(func(t *testing.T, s string) {
		p, err := v.Verify(s)
		if err == nil && (p.Subject == "" || len(p.Roles) == 0) {
			t.Fatalf("accepted %q as %+v", s, p)
		}
		if err != nil && !isTokenError(err) {
			t.Fatalf("unclassified error %v", err)
		}
	})
}

func FuzzRedeemEnrollment(f *testing.F) {
	_, v, _, clk := fuzzVerifiers(f)
	_, tok, _ := fuzzIssued(f, clk)
	f.Add(tok)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := v.Redeem(t.Context(), s)
		if err == nil && (c.Fleet != "fleet-a" || c.ID == "") {
			t.Fatalf("accepted %q as %+v", s, c)
		}
		if err != nil && !isTokenError(err) && !errors.Is(err, identity.ErrWrongFleet) && !errors.Is(err, identity.ErrTokenReused) {
			t.Fatalf("unclassified error %v", err)
		}
	})
}

func FuzzVerifyModule(f *testing.F) {
	_, _, tp, clk := fuzzVerifiers(f)
	_, _, sig := fuzzIssued(f, clk)
	f.Add(sig)
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := tp.VerifyModule(fuzzModule, s)
		if err == nil && ms.SHA256 != wire.SHA256(fuzzModule) {
			t.Fatalf("accepted %q for another hash", s)
		}
		if err != nil && !isTokenError(err) && !errors.Is(err, identity.ErrUntrustedPublisher) && !errors.Is(err, identity.ErrHashMismatch) {
			t.Fatalf("unclassified error %v", err)
		}
	})
}

func FuzzParseTrustedPublishers(f *testing.F) {
	jwks, err := identity.PublicJWKS(signingKey(f, "fuzz").Public().(ed25519.PublicKey))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(jwks)
	f.Fuzz(func(t *testing.T, b []byte) {
		tp, err := identity.ParseTrustedPublishers(b)
		if err == nil && len(tp.KeyIDs()) == 0 {
			t.Fatal("empty trusted set accepted")
		}
		if err != nil && !errors.Is(err, identity.ErrBadJWKS) {
			t.Fatalf("unclassified error %v", err)
		}
	})
}

func FuzzParseUserKey(f *testing.F) {
	k, _ := identity.GenerateUserKey(identity.WithRand(newDetRand("fuzz")))
	f.Add(k.Seed())
	f.Add([]byte(k.ID()))
	f.Fuzz(func(t *testing.T, b []byte) {
		uk, err := identity.ParseUserKey(b)
		if err != nil {
			if !errors.Is(err, identity.ErrBadKey) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		pub, err := identity.ParseUserKeyID(uk.ID())
		if err != nil || !pub.Equal(uk.PublicKey()) {
			t.Fatalf("key id of a parsed seed does not round-trip: %v", err)
		}
	})
}

func FuzzParseSigningKey(f *testing.F) {
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := identity.ParseSigningKey(b)
		if err == nil && len(k) != ed25519.PrivateKeySize {
			t.Fatalf("key of %d bytes", len(k))
		}
		if err != nil && !errors.Is(err, identity.ErrBadKey) {
			t.Fatalf("unclassified error %v", err)
		}
	})
}

func isTokenError(err error) bool {
	for _, e := range []error{identity.ErrMalformedToken, identity.ErrUnknownKey, identity.ErrBadSignature,
		identity.ErrTokenExpired, identity.ErrInvalidToken} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
