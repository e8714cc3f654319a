package edge

import "errors"

// Errors that stop an agent or an enrollment for good: another try without
// the operator's help would fail the same way. Callers tell them apart with
// errors.Is to say what to do next.
var (
	// ErrNotEnrolled reports an agent without NATS credentials where the
	// aggregator requires them: the device must enroll first.
	ErrNotEnrolled = errors.New("edge: not enrolled")
	// ErrRevoked reports an agent whose credentials NATS no longer accepts:
	// the operator revoked the device (or it enrolled with another server).
	// The revocation reason stays on the server.
	ErrRevoked = errors.New("edge: revoked by the operator")
	// ErrTokenRefused reports an enrollment token the aggregator does not
	// accept (used, expired, malformed, for another fleet or another
	// server): the operator must issue a new one.
	ErrTokenRefused = errors.New("edge: enroll: enrollment token refused")
	// ErrKeyRefused reports a device key the aggregator will not enroll: it
	// was revoked, or it is already enrolled.
	ErrKeyRefused = errors.New("edge: enroll: device key refused")
	// ErrUnreachable reports an aggregator API that could not be reached or
	// whose TLS certificate does not verify.
	ErrUnreachable = errors.New("edge: enroll: aggregator unreachable")
)
