package api

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// sentinelCodes maps the backend's sentinel errors to status codes; the
// first match wins.
var sentinelCodes = []struct {
	err  error
	code codes.Code
}{
	{backend.ErrNotFound, codes.NotFound},
	{backend.ErrInvalid, codes.InvalidArgument},
	{backend.ErrExists, codes.AlreadyExists},
	{backend.ErrPrecondition, codes.FailedPrecondition},
	{backend.ErrTooLarge, codes.ResourceExhausted},
	{backend.ErrUnavailable, codes.Unavailable},
	{backend.ErrUnauthenticated, codes.Unauthenticated},
	{backend.ErrDenied, codes.PermissionDenied},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// toStatus turns an error from the backend into a status error whose message
// starts with op. Errors the backend did not classify are logged and reported
// as Internal with a generic message, so internals never reach clients.
func (s *service) toStatus(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	for _, m := range sentinelCodes {
		if errors.Is(err, m.err) {
			return status.Error(m.code, op+": "+err.Error())
		}
	}
	s.cfg.log.ErrorContext(ctx, "request failed", "op", op, "err", err)
	return status.Error(codes.Internal, op+": internal error")
}

// invalid reports a request rejected at the boundary.
func invalid(op, msg string) error {
	return status.Error(codes.InvalidArgument, op+": "+msg)
}
