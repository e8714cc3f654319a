package api

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Default bounds on uploads (ImportModel and RegisterModule streams) in
// flight. Each holds a stream, a staging file or a module in memory (up to
// DefaultMaxModuleBytes) until it ends, and a client may open streams and
// send slowly: without a bound one caller could hold every one.
const (
	DefaultUploadsPerCaller = 2
	DefaultUploads          = 8
)

// uploadSlots counts the uploads in flight, per caller and in all.
type uploadSlots struct {
	perCaller, total int

	mu sync.Mutex
	n  int
	by map[string]int
}

// acquire takes a slot for caller or refuses with ResourceExhausted, saying
// which bound was reached; release gives the slot back.
func (u *uploadSlots) acquire(op, caller string) (release func(), err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.by[caller] >= u.perCaller:
		return nil, status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"%s: %s already has %d uploads in flight (model imports and module registrations), the most one caller may have at once; "+
				"wait for one to finish, or cancel it, and retry", op, caller, u.by[caller]))
	case u.n >= u.total:
		return nil, status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"%s: the server is receiving %d uploads, the most it takes at once; retry when one has finished", op, u.n))
	}
	if u.by == nil {
		u.by = make(map[string]int)
	}
	u.by[caller]++
	u.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			defer u.mu.Unlock()
			u.n--
			if u.by[caller]--; u.by[caller] == 0 {
				delete(u.by, caller)
			}
		})
	}, nil
}

// startUpload takes an upload slot for the caller ctx belongs to.
func (s *service) startUpload(ctx context.Context, op string) (release func(), err error) {
	caller := ""
	if s.cfg.caller != nil {
		caller = s.cfg.caller(ctx)
	}
	if caller == "" {
		caller = PeerIdentity(ctx)
	}
	return s.uploads.acquire(op, caller)
}
