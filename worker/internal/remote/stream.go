package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Average and OuterSync are streams both ways: the contribution goes up as
// a start message and chunks, the answer comes back in chunks, so neither
// side holds a message of the whole model.
const (
	// MaxSyncParams is the server's ceiling on the values of a streamed
	// vector: 2^30, 4 GiB of float32.
	MaxSyncParams = 1 << 30
	// syncChunkBytes is the size of the chunks sent; the server takes up
	// to 4 MiB.
	syncChunkBytes = 1 << 20
	// maxAnswerChunkBytes bounds a chunk of the server's answer.
	maxAnswerChunkBytes = 4 << 20
)

// sendFloats sends v as little-endian float32 in chunks, encoding one
// chunk at a time.
func sendFloats(v []float32, send func(*pb.SyncChunk) error) error {
	per := syncChunkBytes / 4
	for i := 0; i < len(v); i += per {
		part := v[i:min(i+per, len(v))]
		b := make([]byte, 4*len(part))
		for j, x := range part {
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
		}
		if err := send(&pb.SyncChunk{Offset: 4 * int64(i), Data: b}); err != nil {
			return err
		}
	}
	return nil
}

// sendBytes sends b in chunks.
func sendBytes(b []byte, send func(*pb.SyncChunk) error) error {
	for off := 0; off < len(b); off += syncChunkBytes {
		if err := send(&pb.SyncChunk{Offset: int64(off), Data: b[off:min(off+syncChunkBytes, len(b))]}); err != nil {
			return err
		}
	}
	return nil
}

// sent settles the sending side of a stream: an error from Send other
// than io.EOF is the call's; io.EOF means the server ended the call early
// (a refusal, or an answer that needs no more), whose status the receiving
// side reads.
func sent(err error, closeSend func() error) error {
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_ = closeSend() // the status, if any, comes from Recv
	return nil
}

// floatReceiver takes an answer's chunks into out: exactly len(out)
// finite float32 values, each chunk where the last one ended.
type floatReceiver struct {
	out []float32
	got int64
	n   int
	dec *wire.DenseDecoder
}

func newFloatReceiver(out []float32) *floatReceiver {
	r := &floatReceiver{out: out}
	r.dec = wire.NewDenseDecoder(len(out), func(v []float32) error {
		r.n += copy(r.out[r.n:], v)
		return nil
	})
	return r
}

func (r *floatReceiver) write(c *pb.SyncChunk) error {
	d := c.GetData()
	switch {
	case c == nil:
		return fmt.Errorf("server sent a message without parameters: %w", ErrBadResponse)
	case c.GetOffset() != r.got:
		return fmt.Errorf("server sent parameters at byte %d after %d bytes: %w", c.GetOffset(), r.got, ErrBadResponse)
	case len(d) == 0 || len(d) > maxAnswerChunkBytes:
		return fmt.Errorf("server sent a chunk of %d bytes: %w", len(d), ErrBadResponse)
	case int64(len(d)) > 4*int64(len(r.out))-r.got:
		return fmt.Errorf("server sent more than %d bytes for %d parameters: %w", 4*len(r.out), len(r.out), ErrBadResponse)
	}
	r.got += int64(len(d))
	if err := r.dec.Write(d); err != nil {
		return fmt.Errorf("server sent bad parameters: %w: %w", ErrBadResponse, err)
	}
	return nil
}

// close checks that every value came.
func (r *floatReceiver) close() error {
	if err := r.dec.Close(); err != nil {
		return fmt.Errorf("server sent %d bytes for %d parameters: %w: %w", r.got, len(r.out), ErrBadResponse, err)
	}
	return nil
}
