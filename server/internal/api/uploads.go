package api

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/internal/slots"
)

// Default bounds on uploads (ImportModel and RegisterModule streams) in
// flight. Each holds a stream, a staging file or a module in memory (up to
// DefaultMaxModuleBytes) until it ends, and a client may open streams and
// send slowly: without a bound one caller could hold every one.
const (
	DefaultUploadsPerCaller = 2
	DefaultUploads          = 8
)

// startUpload takes an upload slot (s.uploads counts them per caller and
// in all) for the caller ctx belongs to.
func (s *service) startUpload(ctx context.Context, op string) (release func(), err error) {
	caller := ""
	if s.cfg.caller != nil {
		caller = s.cfg.caller(ctx)
	}
	if caller == "" {
		caller = PeerIdentity(ctx)
	}
	release, refused := s.uploads.Acquire(caller, s.cfg.uploads)
	switch refused {
	case slots.PerKey:
		return nil, status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"%s: %s already has %d uploads in flight (model imports and module registrations), the most one caller may have at once; "+
				"wait for one to finish, or cancel it, and retry", op, caller, s.cfg.uploadsPer))
	case slots.Full, slots.Reserved:
		return nil, status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"%s: the server is receiving %d uploads, the most it takes at once; retry when one has finished", op, s.cfg.uploads))
	}
	return release, nil
}
