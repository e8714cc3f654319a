package identity

import "errors"

// Token errors. Verification failures wrap exactly one of these, so callers
// map them to protocol status codes with errors.Is.
var (
	// ErrMalformedToken reports bytes that are not a compact JWS of the expected kind.
	ErrMalformedToken = errors.New("identity: malformed token")
	// ErrUnknownKey reports a token or signature naming a key id nobody trusts.
	ErrUnknownKey = errors.New("identity: unknown signing key")
	// ErrBadSignature reports a signature that does not verify, or a token
	// signed with another algorithm than EdDSA.
	ErrBadSignature = errors.New("identity: bad signature")
	// ErrTokenExpired reports a token past its expiry (beyond the leeway).
	ErrTokenExpired = errors.New("identity: token expired")
	// ErrInvalidToken reports a verified token whose claims are unacceptable:
	// wrong audience, issued in the future, missing claims, unknown roles.
	ErrInvalidToken = errors.New("identity: invalid token claims")
	// ErrWrongFleet reports an enrollment token scoped to another fleet.
	ErrWrongFleet = errors.New("identity: token is for another fleet")
	// ErrTokenReused reports an enrollment token that was already redeemed.
	ErrTokenReused = errors.New("identity: enrollment token already used")
)

// Authorization errors.
var (
	// ErrPermissionDenied reports a principal whose roles do not allow a method.
	ErrPermissionDenied = errors.New("identity: permission denied")
	// ErrUnknownMethod reports a method the policy does not list; unknown
	// methods are denied to everyone.
	ErrUnknownMethod = errors.New("identity: method not in policy")
	// ErrUnknownRole reports a role name that is not one of the defined roles.
	ErrUnknownRole = errors.New("identity: unknown role")
)

// Signature errors for modules and reports.
var (
	// ErrUntrustedPublisher reports a module signed by a key outside the trusted set.
	ErrUntrustedPublisher = errors.New("identity: untrusted module publisher")
	// ErrHashMismatch reports a valid module signature over other bytes.
	ErrHashMismatch = errors.New("identity: module hash does not match signature")
	// ErrBadJWKS reports a trusted publisher set that cannot be used.
	ErrBadJWKS = errors.New("identity: bad publisher key set")
)

// Key and configuration errors.
var (
	// ErrBadKey reports a key that cannot be used: wrong type, wrong length,
	// wrong nkey prefix, or unreadable encoding.
	ErrBadKey = errors.New("identity: bad key")
	// ErrKeyFileMode reports a secret key file readable by group or others.
	ErrKeyFileMode = errors.New("identity: key file permissions too open")
	// ErrBadInput reports an argument out of range: an empty or unsafe
	// identifier, a non-positive lifetime, an empty role set.
	ErrBadInput = errors.New("identity: bad input")
)
