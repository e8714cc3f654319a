package remote_test

import (
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// received is a contribution stream as a fake server gathers it: the
// start, the bytes, and every message deterministically encoded, in order.
type received[S any] struct {
	start S
	body  []byte
	raw   []byte
}

// gather reads a contribution stream to its end; start and chunk take a
// message's parts.
func gather[Req, Resp, S any](st grpc.BidiStreamingServer[Req, Resp], start func(*Req) (S, bool), chunk func(*Req) *pb.SyncChunk) (*received[S], error) {
	var r received[S]
	for i := 0; ; i++ {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			if i == 0 {
				return nil, errors.New("empty stream")
			}
			return &r, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(any(m).(proto.Message))
		if err != nil {
			return nil, err
		}
		r.raw = append(r.raw, b...)
		if i == 0 {
			s, ok := start(m)
			if !ok {
				return nil, errors.New("stream without start")
			}
			r.start = s
			continue
		}
		c := chunk(m)
		if c == nil || c.GetOffset() != int64(len(r.body)) {
			return nil, fmt.Errorf("chunk %d out of order", i)
		}
		r.body = append(r.body, c.GetData()...)
	}
}

// cut splits data into chunks of at most size bytes, in order.
func cut(data []byte, size int) []*pb.SyncChunk {
	var out []*pb.SyncChunk
	for off := 0; off < len(data); off += size {
		out = append(out, &pb.SyncChunk{Offset: int64(off), Data: data[off:min(off+size, len(data))]})
	}
	return out
}
