package identity

import (
	"crypto/ed25519"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lestrrat-go/jwx/v2/jwt"
)

// Role is what an API caller may do; Policy maps methods to roles.
type Role string

// The roles. A principal may hold several.
const (
	// RoleAdmin may call every method in the policy.
	RoleAdmin Role = "admin"
	// RoleOperator manages tasks, models and modules and reads audit
	// verification material (checkpoints, proofs, public keys).
	RoleOperator Role = "operator"
	// RoleAuditor reads the audit log and the task, round, model and module
	// views, and changes nothing.
	RoleAuditor Role = "auditor"
	// RolePoolWorker imports models and reads them: a training pool that
	// produces base models for federated tasks.
	RolePoolWorker Role = "pool-worker"
)

// Roles lists the defined roles.
func Roles() []Role { return []Role{RoleAdmin, RoleOperator, RoleAuditor, RolePoolWorker} }

// ParseRole accepts the name of a defined role.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !slices.Contains(Roles(), r) {
		return "", fmt.Errorf("%w: %q", ErrUnknownRole, s)
	}
	return r, nil
}

const claimRoles = "roles"

// MaxSubjectBytes bounds a principal's subject, which the audit log records.
const MaxSubjectBytes = 128

// Principal is a verified API caller.
type Principal struct {
	Subject string // the operator or service the token was issued to
	Roles   []Role // sorted, without duplicates
	TokenID string
	KeyID   string
	Expires time.Time
}

// Has reports whether p holds role r.
func (p Principal) Has(r Role) bool { return slices.Contains(p.Roles, r) }

// APIIssuer mints bearer tokens for the gRPC API.
type APIIssuer struct {
	key ed25519.PrivateKey
	kid string
	cfg config
}

// NewAPIIssuer signs with key. Options: WithClock, WithRand (token ids),
// WithMaxTTL (DefaultAPIMaxTTL).
func NewAPIIssuer(key ed25519.PrivateKey, opts ...Option) (*APIIssuer, error) {
	const op = "identity: api issuer"
	cfg, err := newConfig(op, DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	pub, err := publicKeyOf(op, key)
	if err != nil {
		return nil, err
	}
	return &APIIssuer{key: key, kid: KeyID(pub), cfg: cfg}, nil
}

// PublicKey is the key verifiers must trust.
func (i *APIIssuer) PublicKey() ed25519.PublicKey { return i.key.Public().(ed25519.PublicKey) }

// Mint returns a bearer token for subject holding roles, valid for ttl.
func (i *APIIssuer) Mint(subject string, roles []Role, ttl time.Duration) (string, Principal, error) {
	const op = "identity: mint api token"
	if err := checkSubject(subject); err != nil {
		return "", Principal{}, fmt.Errorf("%s: %w", op, err)
	}
	rs, err := normalizeRoles(roles)
	if err != nil {
		return "", Principal{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := checkTTL(op, ttl, i.cfg.maxTTL); err != nil {
		return "", Principal{}, err
	}
	jti, err := newTokenID(i.cfg.rand)
	if err != nil {
		return "", Principal{}, fmt.Errorf("%s: %w", op, err)
	}
	now := i.cfg.now().Truncate(time.Second)
	names := make([]string, len(rs))
	for k, r := range rs {
		names[k] = string(r)
	}
	tok, err := jwt.NewBuilder().JwtID(jti).Subject(subject).Audience([]string{audAPI}).
		IssuedAt(now).Expiration(now.Add(ttl)).Claim(claimRoles, names).Build()
	if err != nil {
		return "", Principal{}, fmt.Errorf("%s: %w", op, err)
	}
	s, err := signToken(i.key, i.kid, typAPI, tok)
	if err != nil {
		return "", Principal{}, fmt.Errorf("%s: %w", op, err)
	}
	return s, Principal{Subject: subject, Roles: rs, TokenID: jti, KeyID: i.kid, Expires: now.Add(ttl)}, nil
}

// APIVerifier checks API bearer tokens.
type APIVerifier struct {
	keys keyRing
	cfg  config
}

// NewAPIVerifier accepts tokens signed by any of keys. Options: WithClock,
// WithLeeway.
func NewAPIVerifier(keys []ed25519.PublicKey, opts ...Option) (*APIVerifier, error) {
	const op = "identity: api verifier"
	cfg, err := newConfig(op, DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	ring, err := newKeyRing(op, keys)
	if err != nil {
		return nil, err
	}
	return &APIVerifier{keys: ring, cfg: cfg}, nil
}

// Verify checks token (EdDSA only, a trusted key, expiry with leeway, API
// audience) and returns its principal. A token naming an unknown role is
// refused whole rather than trimmed: it was minted for another policy.
func (v *APIVerifier) Verify(token string) (Principal, error) {
	const op = "identity: verify api token"
	tok, kid, err := v.cfg.verifyToken(token, typAPI, audAPI, v.keys)
	if err != nil {
		return Principal{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := checkSubject(tok.Subject()); err != nil {
		return Principal{}, fmt.Errorf("%s: %w: %w", op, ErrInvalidToken, err)
	}
	raw, ok := tok.Get(claimRoles)
	if !ok {
		return Principal{}, fmt.Errorf("%s: %w: no roles", op, ErrInvalidToken)
	}
	list, ok := raw.([]any)
	if !ok {
		return Principal{}, fmt.Errorf("%s: %w: roles is %T, want an array", op, ErrInvalidToken, raw)
	}
	roles := make([]Role, 0, len(list))
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			return Principal{}, fmt.Errorf("%s: %w: role %v is not a string", op, ErrInvalidToken, x)
		}
		roles = append(roles, Role(s))
	}
	rs, err := normalizeRoles(roles)
	if err != nil {
		return Principal{}, fmt.Errorf("%s: %w: %w", op, ErrInvalidToken, err)
	}
	return Principal{Subject: tok.Subject(), Roles: rs, TokenID: tok.JwtID(), KeyID: kid, Expires: tok.Expiration()}, nil
}

// checkSubject accepts 1–MaxSubjectBytes of printable UTF-8: the subject
// names the operator in audit records.
func checkSubject(s string) error {
	if s == "" || len(s) > MaxSubjectBytes {
		return fmt.Errorf("%w: subject must be 1-%d bytes", ErrBadInput, MaxSubjectBytes)
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("%w: subject %q must be printable UTF-8", ErrBadInput, s)
	}
	return nil
}

func normalizeRoles(roles []Role) ([]Role, error) {
	if len(roles) == 0 {
		return nil, fmt.Errorf("%w: no roles", ErrBadInput)
	}
	out := make([]Role, 0, len(roles))
	for _, r := range roles {
		if _, err := ParseRole(string(r)); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
