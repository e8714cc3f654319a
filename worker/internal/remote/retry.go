package remote

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
)

// Message bounds. The server's gRPC limit is MaxMessageBytes both ways;
// blobs are at most MaxBlobBytes, which leaves room for the envelope.
const (
	MaxMessageBytes = 8 << 20
	MaxBlobBytes    = 4 << 20
	// MaxListed bounds the checkpoint ids a List answer may hold.
	MaxListed = 1 << 16
)

// CallOptions lets responses up to MaxMessageBytes through, beyond gRPC's
// 4 MiB default, which a 4 MiB blob and its envelope exceed.
func CallOptions() []grpc.CallOption {
	return []grpc.CallOption{grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)}
}

// Retry is how calls are retried while the server is unavailable.
type Retry struct {
	// Initial and Max bound the back-off between attempts.
	Initial, Max time.Duration
	// Attempts is the most calls made, the first included; 0 retries
	// until the context ends.
	Attempts int
	Clock    clock.Clock
}

// DefaultRetry rides out a server restart of a minute or so.
func DefaultRetry() Retry {
	return Retry{Initial: 200 * time.Millisecond, Max: 10 * time.Second, Attempts: 12}
}

// Do calls f until it succeeds, fails with a code other than UNAVAILABLE,
// runs out of attempts or ctx ends.
func (r Retry) Do(ctx context.Context, f func(context.Context) error) error {
	clk := clock.Or(r.Clock)
	b := backoff.New(max(r.Initial, time.Millisecond), max(r.Max, r.Initial, time.Millisecond), backoff.Jitter(rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))))
	for n := 1; ; n++ {
		err := f(ctx)
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		if r.Attempts > 0 && n >= r.Attempts {
			return fmt.Errorf("%w (gave up after %d attempts)", err, n)
		}
		if !clock.Sleep(clk, b.Next(), ctx.Done()) {
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		}
	}
}
