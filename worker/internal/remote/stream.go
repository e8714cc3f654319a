package remote

import (
	"errors"
	"fmt"
	"io"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Average and OuterSync are streams both ways (wire.SendSyncFloats): the
// contribution goes up as a start message and chunks, the answer comes back
// in chunks, so neither side holds a message of the whole model.

// MaxSyncParams is the server's ceiling on the values of a streamed vector.
const MaxSyncParams = wire.MaxSyncParams

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
	case len(d) == 0 || len(d) > wire.MaxSyncChunkBytes:
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

// receiveFloats reads an answer's chunks from next into out until the
// server ends the stream, then checks that every value came.
func receiveFloats(out []float32, next func() (*pb.SyncChunk, error)) error {
	rx := newFloatReceiver(out)
	for {
		c, err := next()
		if errors.Is(err, io.EOF) {
			return rx.close()
		}
		if err != nil {
			return err
		}
		if err := rx.write(c); err != nil {
			return err
		}
	}
}

// close checks that every value came.
func (r *floatReceiver) close() error {
	if err := r.dec.Close(); err != nil {
		return fmt.Errorf("server sent %d bytes for %d parameters: %w: %w", r.got, len(r.out), ErrBadResponse, err)
	}
	return nil
}
