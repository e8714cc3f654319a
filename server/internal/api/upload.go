package api

import (
	"bytes"
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

// upload checks the chunks of an upload as they arrive against the size cap
// and the header's declared size and digest, keeping none of them.
type upload struct {
	op      string
	limit   int64
	size    uint64 // declared; 0 when the header leaves it out
	wantSHA string // declared; empty when the header leaves it out
	h       hash.Hash
	n       int64
}

func newUpload(op string, limit int64, size uint64, wantSHA string) (*upload, error) {
	if size > uint64(limit) {
		return nil, status.Error(codes.ResourceExhausted,
			fmt.Sprintf("%s: declared size %d bytes exceeds the %d byte limit", op, size, limit))
	}
	return &upload{op: op, limit: limit, size: size, wantSHA: wantSHA, h: sha256.New()}, nil
}

func (u *upload) add(chunk []byte) error {
	if len(chunk) > ChunkBytes {
		return invalid(u.op, fmt.Sprintf("chunk of %d bytes exceeds %d bytes", len(chunk), ChunkBytes))
	}
	n := u.n + int64(len(chunk))
	if n > u.limit {
		return status.Error(codes.ResourceExhausted,
			fmt.Sprintf("%s: upload exceeds the %d byte limit", u.op, u.limit))
	}
	if u.size > 0 && uint64(n) > u.size {
		return invalid(u.op, fmt.Sprintf("received more than the declared %d bytes", u.size))
	}
	u.n = n
	u.h.Write(chunk)
	return nil
}

// finish checks the complete upload and returns its hex SHA-256.
func (u *upload) finish() (string, error) {
	if u.n == 0 {
		return "", invalid(u.op, "no data after the header")
	}
	if u.size > 0 && uint64(u.n) != u.size {
		return "", invalid(u.op, fmt.Sprintf("received %d bytes, header declared %d: the upload was cut short; send the whole file again", u.n, u.size))
	}
	sum := hex.EncodeToString(u.h.Sum(nil))
	if u.wantSHA != "" && sum != u.wantSHA {
		return "", invalid(u.op, fmt.Sprintf("sha256 mismatch: received %s, header declared %s", sum, u.wantSHA))
	}
	return sum, nil
}

// uploadReader is an upload's chunks as an io.Reader, holding one chunk at
// a time. It returns io.EOF only once the client has half-closed and the
// whole upload matched the limit and the header: an upload cut short,
// over its limit or not hashing to its declared digest ends with that
// status error instead, so a consumer that reads to io.EOF before keeping
// anything never keeps a bad upload.
type uploadReader struct {
	u *upload
	// next returns the next message's chunk and whether the message was
	// another header, which is a protocol error.
	next func() (chunk []byte, header bool, err error)
	cur  []byte
	err  error  // io.EOF after a verified end, else why the upload failed
	sum  string // hex SHA-256, once verified
}

func (r *uploadReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		chunk, header, err := r.next()
		switch {
		case err == io.EOF:
			if r.sum, err = r.u.finish(); err == nil {
				err = io.EOF
			}
			r.err = err
		case err != nil:
			r.err = err // already a status error from the transport
		case header:
			r.err = invalid(r.u.op, "header sent twice; it must be only the first message")
		default:
			if r.err = r.u.add(chunk); r.err == nil {
				r.cur = chunk
			}
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// failed is why the upload failed, nil if it has not (yet).
func (r *uploadReader) failed() error {
	if r.err == io.EOF {
		return nil
	}
	return r.err
}

// verified reports whether the whole upload was read and matched.
func (r *uploadReader) verified() bool { return r.err == io.EOF }

// uploadHeader is what the model and module upload headers share.
type uploadHeader interface {
	GetSizeBytes() uint64
	GetSha256() string
}

// streamUpload reads the header of a header-then-chunks upload: the first
// message must be the header, which check validates. The chunks that
// follow are returned as an uploadReader, checked within limit and
// against the header's declared size and digest as they are read. part
// returns a message's header (nil if it has none) and its chunk.
func streamUpload[T any, H uploadHeader](op string, limit int64, recv func() (T, error),
	part func(T) (header H, isHeader bool, chunk []byte), check func(H) error) (H, *uploadReader, error) {
	var zero H
	first, err := recv()
	if err == io.EOF {
		return zero, nil, invalid(op, "missing header: the stream was empty")
	}
	if err != nil {
		return zero, nil, err
	}
	h, ok, _ := part(first)
	if !ok {
		return zero, nil, invalid(op, "missing header: the first message must be the header")
	}
	if err := check(h); err != nil {
		return zero, nil, err
	}
	u, err := newUpload(op, limit, h.GetSizeBytes(), h.GetSha256())
	if err != nil {
		return zero, nil, err
	}
	return h, &uploadReader{u: u, next: func() ([]byte, bool, error) {
		m, err := recv()
		if err != nil {
			return nil, false, err
		}
		_, isHeader, chunk := part(m)
		return chunk, isHeader, nil
	}}, nil
}

// receiveUpload is streamUpload for an upload that must be held whole (a
// module, which the sandbox compiles from memory): it returns the header,
// the bytes and their hex SHA-256.
func receiveUpload[T any, H uploadHeader](op string, limit int64, recv func() (T, error),
	part func(T) (header H, isHeader bool, chunk []byte), check func(H) error) (H, []byte, string, error) {
	h, r, err := streamUpload(op, limit, recv, part, check)
	if err != nil {
		return h, nil, "", err
	}
	var buf bytes.Buffer
	buf.Grow(int(min(h.GetSizeBytes(), preallocCap)))
	if _, err := buf.ReadFrom(r); err != nil {
		return h, nil, "", err
	}
	return h, buf.Bytes(), r.sum, nil
}
