package wire

import pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"

// The pool's streamed vectors (Average and OuterSync, both ways): a start
// message, then the vector's bytes in SyncChunks, each at its byte offset.
const (
	// MaxSyncParams is the ceiling on the values of one streamed vector,
	// 2^30: 4 GiB of float32.
	MaxSyncParams = 1 << 30
	// MaxSyncChunkBytes bounds one chunk's data, whoever sends it.
	MaxSyncChunkBytes = 4 << 20
	// SyncChunkBytes is the size of the chunks both sides send.
	SyncChunkBytes = 1 << 20
)

// SendSyncFloats streams v as little-endian float32 in chunks of
// SyncChunkBytes, encoding one chunk at a time.
func SendSyncFloats(v []float32, send func(*pb.SyncChunk) error) error {
	per := SyncChunkBytes / 4
	for i := 0; i < len(v); i += per {
		if err := send(&pb.SyncChunk{Offset: 4 * int64(i), Data: EncodeDense(v[i:min(i+per, len(v))])}); err != nil {
			return err
		}
	}
	return nil
}

// SendSyncBytes streams b in chunks of SyncChunkBytes.
func SendSyncBytes(b []byte, send func(*pb.SyncChunk) error) error {
	for off := 0; off < len(b); off += SyncChunkBytes {
		if err := send(&pb.SyncChunk{Offset: int64(off), Data: b[off:min(off+SyncChunkBytes, len(b))]}); err != nil {
			return err
		}
	}
	return nil
}
