package wire_test

import (
	"bytes"
	"testing"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// TestSendSync: chunks of SyncChunkBytes at their offsets, whose data
// together is the vector's encoding.
func TestSendSync(t *testing.T) {
	v := make([]float32, wire.SyncChunkBytes/4*2+3) // two whole chunks and a tail
	for i := range v {
		v[i] = float32(i) / 7
	}
	var got []byte
	var chunks int
	err := wire.SendSyncFloats(v, func(c *pb.SyncChunk) error {
		if c.Offset != int64(len(got)) || len(c.Data) > wire.SyncChunkBytes {
			t.Fatalf("chunk %d at offset %d of %d bytes after %d bytes", chunks, c.Offset, len(c.Data), len(got))
		}
		got = append(got, c.Data...)
		chunks++
		return nil
	})
	if err != nil || chunks != 3 || !bytes.Equal(got, wire.EncodeDense(v)) {
		t.Fatalf("%d chunks, %d bytes, %v", chunks, len(got), err)
	}
	got, chunks = nil, 0
	enc := wire.EncodeDense(v)
	err = wire.SendSyncBytes(enc, func(c *pb.SyncChunk) error {
		if c.Offset != int64(len(got)) {
			t.Fatalf("bytes chunk at %d after %d", c.Offset, len(got))
		}
		got = append(got, c.Data...)
		chunks++
		return nil
	})
	if err != nil || chunks != 3 || !bytes.Equal(got, enc) {
		t.Fatalf("bytes: %d chunks, %v", chunks, err)
	}
}
