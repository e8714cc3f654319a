package identity

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"
)

// Token kinds. Each kind has its own JOSE "typ" and audience, so a token of
// one kind is never accepted as another even if one key signed both.
const (
	typEnroll = "fl-enroll+jwt"
	typAPI    = "fl-api+jwt"
	audEnroll = "fleetlearn/enroll"
	audAPI    = "fleetlearn/api"
)

// MaxTokenBytes bounds the tokens verifiers look at.
const MaxTokenBytes = 8 << 10

// maxTokenID bounds the jti a verifier passes on to storage.
const maxTokenID = 128

func newTokenID(r io.Reader) (string, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("token id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// signToken signs tok with EdDSA, naming the key and the token kind in the
// protected header.
func signToken(key ed25519.PrivateKey, kid, typ string, tok jwt.Token) (string, error) {
	hdr := jws.NewHeaders()
	if err := hdr.Set(jws.KeyIDKey, kid); err != nil {
		return "", err
	}
	if err := hdr.Set(jws.TypeKey, typ); err != nil {
		return "", err
	}
	b, err := jwt.Sign(tok, jwt.WithKey(jwa.EdDSA, key, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// verifyToken checks a compact JWS token of the given kind: EdDSA only,
// signed by a key in keys, with audience aud, exp, iat and jti present,
// and exp/iat/nbf within leeway of c.now. The returned error wraps one of
// the package's token sentinels.
func (c *config) verifyToken(token, typ, aud string, keys keyRing) (jwt.Token, string, error) {
	if len(token) == 0 || len(token) > MaxTokenBytes {
		return nil, "", fmt.Errorf("%w: %d bytes", ErrMalformedToken, len(token))
	}
	msg, err := jws.Parse([]byte(token), jws.WithCompact())
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrMalformedToken, err)
	}
	sigs := msg.Signatures()
	if len(sigs) != 1 {
		return nil, "", fmt.Errorf("%w: %d signatures", ErrMalformedToken, len(sigs))
	}
	h := sigs[0].ProtectedHeaders()
	if h.Algorithm() != jwa.EdDSA {
		return nil, "", fmt.Errorf("%w: algorithm %q, want EdDSA", ErrBadSignature, h.Algorithm())
	}
	if h.Type() != typ {
		return nil, "", fmt.Errorf("%w: token type %q, want %q", ErrMalformedToken, h.Type(), typ)
	}
	// A "crit" header names extensions the verifier must understand; none are.
	if len(h.Critical()) != 0 {
		return nil, "", fmt.Errorf("%w: critical header extensions %q", ErrMalformedToken, h.Critical())
	}
	kid := h.KeyID()
	pub, ok := keys[kid]
	if !ok {
		return nil, "", fmt.Errorf("%w: kid %q", ErrUnknownKey, kid)
	}
	tok, err := jwt.Parse([]byte(token),
		jwt.WithKey(jwa.EdDSA, pub),
		jwt.WithValidate(true),
		jwt.WithClock(jwt.ClockFunc(c.now)),
		jwt.WithAcceptableSkew(c.leeway),
		jwt.WithAudience(aud),
		jwt.WithRequiredClaim(jwt.ExpirationKey),
		jwt.WithRequiredClaim(jwt.IssuedAtKey),
		jwt.WithRequiredClaim(jwt.JwtIDKey),
	)
	switch {
	case err == nil:
		if len(tok.JwtID()) > maxTokenID {
			return nil, "", fmt.Errorf("%w: jti of %d bytes", ErrInvalidToken, len(tok.JwtID()))
		}
		return tok, kid, nil
	case errors.Is(err, jwt.ErrTokenExpired()):
		return nil, "", fmt.Errorf("%w: %w", ErrTokenExpired, err)
	case jwt.IsValidationError(err):
		return nil, "", fmt.Errorf("%w: %w", ErrInvalidToken, err)
	case jws.IsVerificationError(err):
		return nil, "", fmt.Errorf("%w: %w", ErrBadSignature, err)
	default:
		return nil, "", fmt.Errorf("%w: %w", ErrMalformedToken, err)
	}
}

// checkTTL refuses lifetimes outside (0, max].
func checkTTL(op string, ttl, max time.Duration) error {
	if ttl <= 0 || ttl > max {
		return fmt.Errorf("%s: %w: lifetime %v outside (0, %v]", op, ErrBadInput, ttl, max)
	}
	return nil
}

// stringClaim reads a private string claim, "" when absent.
func stringClaim(tok jwt.Token, name string) (string, error) {
	v, ok := tok.Get(name)
	if !ok {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%w: claim %q is %T, want string", ErrInvalidToken, name, v)
	}
	return s, nil
}
