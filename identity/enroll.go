package identity

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"sync"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Enrollment token claims beyond the registered ones.
const (
	claimFleet = "fleet"
	claimGroup = "group"
)

// EnrollmentClaims are what a verified enrollment token grants: one device
// may join Fleet (and Group, when set) before Expires.
type EnrollmentClaims struct {
	ID       string // jti: the token is redeemed under this id exactly once
	Fleet    string
	Group    string // "" for any group
	IssuedAt time.Time
	Expires  time.Time
	KeyID    string // the issuer key that signed it
}

// EnrollmentIssuer mints enrollment tokens: short-lived, single-use EdDSA
// JWTs an operator hands to one device installation.
type EnrollmentIssuer struct {
	key ed25519.PrivateKey
	kid string
	cfg config
}

// NewEnrollmentIssuer signs with key. Options: WithClock, WithRand (token
// ids), WithMaxTTL (DefaultEnrollmentMaxTTL).
func NewEnrollmentIssuer(key ed25519.PrivateKey, opts ...Option) (*EnrollmentIssuer, error) {
	const op = "identity: enrollment issuer"
	cfg, err := newConfig(op, DefaultEnrollmentMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	pub, err := publicKeyOf(op, key)
	if err != nil {
		return nil, err
	}
	return &EnrollmentIssuer{key: key, kid: KeyID(pub), cfg: cfg}, nil
}

// PublicKey is the key verifiers must trust.
func (i *EnrollmentIssuer) PublicKey() ed25519.PublicKey { return i.key.Public().(ed25519.PublicKey) }

// Mint returns a token that lets one device join fleet (and group, unless
// empty) within ttl. Fleet and group are identifiers as wire.CheckToken
// defines them.
func (i *EnrollmentIssuer) Mint(fleet, group string, ttl time.Duration) (string, EnrollmentClaims, error) {
	const op = "identity: mint enrollment token"
	if err := wire.CheckToken("fleet", fleet); err != nil {
		return "", EnrollmentClaims{}, fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
	}
	if group != "" {
		if err := wire.CheckToken("group", group); err != nil {
			return "", EnrollmentClaims{}, fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
		}
	}
	if err := checkTTL(op, ttl, i.cfg.maxTTL); err != nil {
		return "", EnrollmentClaims{}, err
	}
	jti, err := newTokenID(i.cfg.rand)
	if err != nil {
		return "", EnrollmentClaims{}, fmt.Errorf("%s: %w", op, err)
	}
	now := i.cfg.now().Truncate(time.Second)
	c := EnrollmentClaims{ID: jti, Fleet: fleet, Group: group, IssuedAt: now, Expires: now.Add(ttl), KeyID: i.kid}
	b := jwt.NewBuilder().JwtID(jti).Audience([]string{audEnroll}).IssuedAt(now).Expiration(c.Expires).
		Claim(claimFleet, fleet)
	if group != "" {
		b = b.Claim(claimGroup, group)
	}
	tok, err := b.Build()
	if err != nil {
		return "", EnrollmentClaims{}, fmt.Errorf("%s: %w", op, err)
	}
	s, err := signToken(i.key, i.kid, typEnroll, tok)
	if err != nil {
		return "", EnrollmentClaims{}, fmt.Errorf("%s: %w", op, err)
	}
	return s, c, nil
}

// UsedTokens remembers redeemed enrollment tokens. Claim records jti and
// returns nil the first time, ErrTokenReused (wrapped or not) every later
// time, atomically across concurrent callers. exp is when the token expires:
// the record may be dropped once exp plus the verifier's leeway has passed,
// since the token fails its expiry check from then on.
type UsedTokens interface {
	Claim(ctx context.Context, jti string, exp time.Time) error
}

// MemoryUsedTokens is a UsedTokens in memory, for tests and single-process
// tools. A server keeps its records in its database, so that a restart does
// not make redeemed tokens usable again.
type MemoryUsedTokens struct {
	mu     sync.Mutex
	now    func() time.Time
	leeway time.Duration
	used   map[string]time.Time
}

// NewMemoryUsedTokens forgets records after their expiry plus leeway, as
// read from the WithClock clock; WithLeeway must match the verifier's.
func NewMemoryUsedTokens(opts ...Option) (*MemoryUsedTokens, error) {
	cfg, err := newConfig("identity: used tokens", DefaultEnrollmentMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	return &MemoryUsedTokens{now: cfg.now, leeway: cfg.leeway, used: map[string]time.Time{}}, nil
}

// Claim implements UsedTokens.
func (m *MemoryUsedTokens) Claim(ctx context.Context, jti string, exp time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for id, e := range m.used {
		if now.After(e.Add(m.leeway)) {
			delete(m.used, id)
		}
	}
	if _, ok := m.used[jti]; ok {
		return fmt.Errorf("%w: %s", ErrTokenReused, jti)
	}
	m.used[jti] = exp
	return nil
}

// Len is the number of records held.
func (m *MemoryUsedTokens) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.used)
}

// EnrollmentVerifier redeems enrollment tokens for one fleet.
type EnrollmentVerifier struct {
	fleet string
	keys  keyRing
	used  UsedTokens
	cfg   config
}

// NewEnrollmentVerifier accepts tokens for fleet signed by any of keys
// (several during a key rotation), recording redemptions in used. Options:
// WithClock, WithLeeway.
func NewEnrollmentVerifier(fleet string, used UsedTokens, keys []ed25519.PublicKey, opts ...Option) (*EnrollmentVerifier, error) {
	const op = "identity: enrollment verifier"
	cfg, err := newConfig(op, DefaultEnrollmentMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	if err := wire.CheckToken("fleet", fleet); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
	}
	if used == nil {
		return nil, fmt.Errorf("%s: %w: nil UsedTokens", op, ErrBadInput)
	}
	ring, err := newKeyRing(op, keys)
	if err != nil {
		return nil, err
	}
	return &EnrollmentVerifier{fleet: fleet, keys: ring, used: used, cfg: cfg}, nil
}

// Redeem verifies token (signature, EdDSA only, expiry with leeway, fleet
// scope) and then claims its id, so that it is accepted at most once. A
// token that fails any check is not claimed and stays usable.
func (v *EnrollmentVerifier) Redeem(ctx context.Context, token string) (EnrollmentClaims, error) {
	c, err := v.Verify(token)
	if err != nil {
		return EnrollmentClaims{}, err
	}
	if err := v.used.Claim(ctx, c.ID, c.Expires); err != nil {
		return EnrollmentClaims{}, fmt.Errorf("identity: redeem: %w", err)
	}
	return c, nil
}

// Verify makes every check Redeem makes except the claim: a caller that
// must look at its own state before redeeming (is the key or device id
// taken?) verifies first, so that a caller without a genuine token learns
// nothing of that state.
func (v *EnrollmentVerifier) Verify(token string) (EnrollmentClaims, error) {
	const op = "identity: redeem" // the sentinels name the enrollment token
	tok, kid, err := v.cfg.verifyToken(token, typEnroll, audEnroll, v.keys)
	if err != nil {
		return EnrollmentClaims{}, fmt.Errorf("%s: %w", op, err)
	}
	fleet, err := stringClaim(tok, claimFleet)
	if err != nil {
		return EnrollmentClaims{}, fmt.Errorf("%s: %w", op, err)
	}
	group, err := stringClaim(tok, claimGroup)
	if err != nil {
		return EnrollmentClaims{}, fmt.Errorf("%s: %w", op, err)
	}
	if fleet != v.fleet {
		return EnrollmentClaims{}, fmt.Errorf("%s: %w: %q, want %q", op, ErrWrongFleet, fleet, v.fleet)
	}
	if group != "" {
		if err := wire.CheckToken("group", group); err != nil {
			return EnrollmentClaims{}, fmt.Errorf("%s: %w: %w", op, ErrInvalidToken, err)
		}
	}
	return EnrollmentClaims{ID: tok.JwtID(), Fleet: fleet, Group: group, IssuedAt: tok.IssuedAt(), Expires: tok.Expiration(), KeyID: kid}, nil
}
