// Package objfetch downloads objects from a JetStream object store with
// direct gets. The object store's own reader creates a consumer per download,
// a JetStream API request the server handles for every device and round;
// direct gets are answered by any replica of the bucket's stream without one.
//
// It relies on the object store layout of NATS ADR-20: the bucket's stream is
// OBJ_<bucket>, and an object's chunks are the messages on
// $O.<bucket>.C.<nuid> in order. The caller checks the content (Fleetlearn
// names blobs by their sha256), so the object store's digest is not
// recomputed here.
package objfetch

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrTooLarge reports an object larger than the caller allows.
var ErrTooLarge = errors.New("objfetch: object too large")

// Bucket is an object store and its stream, resolved once and reused.
type Bucket struct {
	name   string
	obs    jetstream.ObjectStore
	stream jetstream.Stream
}

// Open resolves the object store bucket and its stream.
func Open(ctx context.Context, js jetstream.JetStream, bucket string) (*Bucket, error) {
	obs, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("objfetch: bucket %s: %w", bucket, err)
	}
	st, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("objfetch: bucket %s: stream: %w", bucket, err)
	}
	return &Bucket{name: bucket, obs: obs, stream: st}, nil
}

// Get returns the object's bytes; objects over limit bytes are refused before
// any chunk is read.
func (b *Bucket) Get(ctx context.Context, name string, limit uint64) ([]byte, error) {
	return b.Append(ctx, nil, name, limit)
}

// Append is Get into the end of dst, for callers that reuse one buffer.
func (b *Bucket) Append(ctx context.Context, dst []byte, name string, limit uint64) ([]byte, error) {
	info, err := b.obs.GetInfo(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("objfetch: %s: %w", name, err)
	}
	if info.Size > limit {
		return nil, fmt.Errorf("%w: %s has %d bytes, limit %d", ErrTooLarge, name, info.Size, limit)
	}
	subj := "$O." + b.name + ".C." + info.NUID
	base := len(dst)
	out := slices.Grow(dst, int(info.Size))
	seq := uint64(1)
	for range info.Chunks {
		m, err := b.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if err != nil {
			return nil, fmt.Errorf("objfetch: %s: chunk at byte %d: %w", name, len(out)-base, err)
		}
		if uint64(len(out)-base+len(m.Data)) > info.Size {
			return nil, fmt.Errorf("objfetch: %s: chunks exceed the object's %d bytes", name, info.Size)
		}
		out = append(out, m.Data...)
		seq = m.Sequence + 1
	}
	if uint64(len(out)-base) != info.Size {
		return nil, fmt.Errorf("objfetch: %s: got %d of %d bytes", name, len(out)-base, info.Size)
	}
	return out, nil
}
