package remote

import "errors"

// Sentinel errors; errors from this package wrap one of them, a
// pool/checkpoint sentinel, the server's gRPC status or a context error.
var (
	// ErrBadResponse reports an answer from the server that breaks the
	// protocol: a blob or manifest over its bound, a digest that does not
	// match, an average of the wrong length.
	ErrBadResponse = errors.New("remote: bad response from server")
	// ErrTooLarge reports a request this side refuses to send because it
	// would exceed the server's limits: a blob over MaxBlobBytes, a vector
	// over MaxSyncParams values.
	ErrTooLarge = errors.New("remote: request too large")
	// ErrInvalid reports a bad argument: a missing client or rank.
	ErrInvalid = errors.New("remote: invalid argument")
)
