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
	"io"

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
	r, err := b.Open(ctx, name, limit)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, r.Size())
	for {
		chunk, err := r.next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, chunk...)
	}
}

// Reader reads one object a chunk at a time, so that a caller can decode and
// hash it without holding all of its bytes.
type Reader struct {
	ctx    context.Context
	b      *Bucket
	name   string
	subj   string
	seq    uint64
	chunks uint32 // chunks not yet fetched
	size   uint64
	read   uint64 // bytes fetched so far
	cur    []byte // the unread rest of the current chunk
}

// Open looks the object up and returns a reader of its bytes; objects over
// limit bytes are refused before any chunk is read.
func (b *Bucket) Open(ctx context.Context, name string, limit uint64) (*Reader, error) {
	info, err := b.obs.GetInfo(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("objfetch: %s: %w", name, err)
	}
	if info.Size > limit {
		return nil, fmt.Errorf("%w: %s has %d bytes, limit %d", ErrTooLarge, name, info.Size, limit)
	}
	return &Reader{ctx: ctx, b: b, name: name, subj: "$O." + b.name + ".C." + info.NUID, seq: 1,
		chunks: info.Chunks, size: info.Size}, nil
}

// Size is the object's length in bytes, as its metadata states it; a
// reader whose chunks do not add up to it fails.
func (r *Reader) Size() uint64 { return r.size }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		chunk, err := r.next()
		if err != nil {
			return 0, err
		}
		r.cur = chunk
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// next fetches the next chunk; io.EOF after the last, once the sizes agree.
func (r *Reader) next() ([]byte, error) {
	if r.chunks == 0 {
		if r.read != r.size {
			return nil, fmt.Errorf("objfetch: %s: got %d of %d bytes", r.name, r.read, r.size)
		}
		return nil, io.EOF
	}
	m, err := r.b.stream.GetMsg(r.ctx, r.seq, jetstream.WithGetMsgSubject(r.subj))
	if err != nil {
		return nil, fmt.Errorf("objfetch: %s: chunk at byte %d: %w", r.name, r.read, err)
	}
	if r.read+uint64(len(m.Data)) > r.size {
		return nil, fmt.Errorf("objfetch: %s: chunks exceed the object's %d bytes", r.name, r.size)
	}
	r.read += uint64(len(m.Data))
	r.seq = m.Sequence + 1
	r.chunks--
	return m.Data, nil
}
