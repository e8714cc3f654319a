package api

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// preallocCap bounds the buffer reserved from a declared size, so that a
// header alone cannot make the server allocate the whole upload limit.
const preallocCap = 64 << 20

// assembler collects the chunks of an upload and checks them against the
// size cap and the header's declared size and digest.
type assembler struct {
	op      string
	limit   int64
	size    uint64 // declared; 0 when the header leaves it out
	wantSHA string // declared; empty when the header leaves it out
	h       hash.Hash
	buf     []byte
}

func newAssembler(op string, limit int64, size uint64, wantSHA string) (*assembler, error) {
	if size > uint64(limit) {
		return nil, status.Error(codes.ResourceExhausted,
			fmt.Sprintf("%s: declared size %d bytes exceeds the %d byte limit", op, size, limit))
	}
	return &assembler{
		op: op, limit: limit, size: size, wantSHA: wantSHA,
		h:   sha256.New(),
		buf: make([]byte, 0, min(size, preallocCap)),
	}, nil
}

func (a *assembler) add(chunk []byte) error {
	if len(chunk) > ChunkBytes {
		return invalid(a.op, fmt.Sprintf("chunk of %d bytes exceeds %d bytes", len(chunk), ChunkBytes))
	}
	n := int64(len(a.buf)) + int64(len(chunk))
	if n > a.limit {
		return status.Error(codes.ResourceExhausted,
			fmt.Sprintf("%s: upload exceeds the %d byte limit", a.op, a.limit))
	}
	if a.size > 0 && uint64(n) > a.size {
		return invalid(a.op, fmt.Sprintf("received more than the declared %d bytes", a.size))
	}
	a.buf = append(a.buf, chunk...)
	a.h.Write(chunk)
	return nil
}

// finish checks the complete upload and returns it with its hex SHA-256.
func (a *assembler) finish() ([]byte, string, error) {
	if len(a.buf) == 0 {
		return nil, "", invalid(a.op, "no data after the header")
	}
	if a.size > 0 && uint64(len(a.buf)) != a.size {
		return nil, "", invalid(a.op, fmt.Sprintf("received %d bytes, header declared %d", len(a.buf), a.size))
	}
	sum := hex.EncodeToString(a.h.Sum(nil))
	if a.wantSHA != "" && sum != a.wantSHA {
		return nil, "", invalid(a.op, fmt.Sprintf("sha256 mismatch: received %s, header declared %s", sum, a.wantSHA))
	}
	return a.buf, sum, nil
}

// receiveChunks feeds the messages after the header into a until the client
// half-closes. part extracts a message's chunk and reports whether the message
// was another header, which is a protocol error.
func receiveChunks[T any](a *assembler, recv func() (T, error), part func(T) (chunk []byte, header bool)) ([]byte, string, error) {
	for {
		m, err := recv()
		if err == io.EOF {
			return a.finish()
		}
		if err != nil {
			return nil, "", err // already a status error from the transport
		}
		chunk, header := part(m)
		if header {
			return nil, "", invalid(a.op, "header sent twice; it must be only the first message")
		}
		if err := a.add(chunk); err != nil {
			return nil, "", err
		}
	}
}

// uploadHeader is what the model and module upload headers share.
type uploadHeader interface {
	GetSizeBytes() uint64
	GetSha256() string
}

// receiveUpload reads a header-then-chunks upload: the first message must be
// the header, which check validates; the rest are chunks, assembled within
// limit and checked against the header's declared size and digest. part
// returns a message's header (nil if it has none) and its chunk.
func receiveUpload[T any, H uploadHeader](op string, limit int64, recv func() (T, error),
	part func(T) (header H, isHeader bool, chunk []byte), check func(H) error) (H, []byte, string, error) {
	var zero H
	first, err := recv()
	if err == io.EOF {
		return zero, nil, "", invalid(op, "missing header: the stream was empty")
	}
	if err != nil {
		return zero, nil, "", err
	}
	h, ok, _ := part(first)
	if !ok {
		return zero, nil, "", invalid(op, "missing header: the first message must be the header")
	}
	if err := check(h); err != nil {
		return zero, nil, "", err
	}
	a, err := newAssembler(op, limit, h.GetSizeBytes(), h.GetSha256())
	if err != nil {
		return zero, nil, "", err
	}
	data, sum, err := receiveChunks(a, recv, func(m T) ([]byte, bool) {
		_, isHeader, chunk := part(m)
		return chunk, isHeader
	})
	return h, data, sum, err
}
