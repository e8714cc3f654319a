package identity

import (
	"errors"

	"github.com/fleetlearn/fleetlearn/identity/internal/keyfile"
)

// The sentinel errors' texts name the condition alone, without the
// package: the operation that wraps one names the package once ("identity:
// redeem: enrollment token already used: ..."), so that no message says
// either twice.

// Token errors. Verification failures wrap exactly one of these, so callers
// map them to protocol status codes with errors.Is.
var (
	// ErrMalformedToken reports bytes that are not a compact JWS of the expected kind.
	ErrMalformedToken = errors.New("malformed token")
	// ErrUnknownKey reports a token or signature naming a key id nobody trusts.
	ErrUnknownKey = errors.New("unknown signing key")
	// ErrBadSignature reports a signature that does not verify, or a token
	// signed with another algorithm than EdDSA.
	ErrBadSignature = errors.New("bad signature")
	// ErrTokenExpired reports a token past its expiry (beyond the leeway).
	ErrTokenExpired = errors.New("token expired")
	// ErrInvalidToken reports a verified token whose claims are unacceptable:
	// wrong audience, issued in the future, missing claims, unknown roles.
	ErrInvalidToken = errors.New("invalid token claims")
	// ErrWrongFleet reports an enrollment token scoped to another fleet.
	ErrWrongFleet = errors.New("token is for another fleet")
	// ErrTokenReused reports an enrollment token that was already redeemed.
	ErrTokenReused = errors.New("enrollment token already used")
)

// Authorization errors.
var (
	// ErrPermissionDenied reports a principal whose roles do not allow a method.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnknownMethod reports a method the policy does not list; unknown
	// methods are denied to everyone.
	ErrUnknownMethod = errors.New("method not in policy")
	// ErrUnknownRole reports a role name that is not one of the defined roles.
	ErrUnknownRole = errors.New("unknown role")
)

// Signature errors for modules and reports.
var (
	// ErrUntrustedPublisher reports a module signed by a key outside the trusted set.
	ErrUntrustedPublisher = errors.New("untrusted module publisher")
	// ErrHashMismatch reports a valid module signature over other bytes.
	ErrHashMismatch = errors.New("module hash does not match signature")
	// ErrBadJWKS reports a trusted publisher set that cannot be used.
	ErrBadJWKS = errors.New("bad publisher key set")
)

// Key and configuration errors.
var (
	// ErrBadKey reports a key that cannot be used: wrong type, wrong length,
	// wrong nkey prefix, or unreadable encoding.
	ErrBadKey = errors.New("bad key")
	// ErrKeyFileMode reports a secret key file readable by group or others.
	ErrKeyFileMode = keyfile.ErrMode
	// ErrBadInput reports an argument out of range: an empty or unsafe
	// identifier, a non-positive lifetime, an empty role set.
	ErrBadInput = errors.New("bad input")
)
