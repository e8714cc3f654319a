package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzAssembler feeds arbitrary uploads, split at arbitrary points, through
// the upload reader the model import streams from and the assembler module
// registration holds whole, and checks that exactly the uploads that match
// the limit and header are accepted, unchanged, by both, and that the
// reader never ends with io.EOF on an upload it should refuse.
func FuzzAssembler(f *testing.F) {
	f.Add([]byte("safetensors"), []byte{3, 0, 5}, uint64(11), true, false, uint16(64))
	f.Add([]byte("safetensors"), []byte{4}, uint64(11), true, true, uint16(64))
	f.Add([]byte("safetensors"), []byte{1}, uint64(10), false, false, uint16(64))
	f.Add([]byte("x"), []byte{}, uint64(0), false, false, uint16(0))
	f.Add([]byte{}, []byte{}, uint64(0), true, false, uint16(8))
	f.Add(make([]byte, 100), []byte{7, 9}, uint64(0), false, false, uint16(63))
	f.Fuzz(func(t *testing.T, data, cuts []byte, size uint64, declareSHA, wrongSHA bool, limit16 uint16) {
		limit := int64(limit16) + 1
		sum := sha256.Sum256(data)
		want := hex.EncodeToString(sum[:])
		declared := ""
		if declareSHA {
			declared = want
			if wrongSHA {
				declared = hex.EncodeToString(make([]byte, 32))
			}
		}
		// The messages: the header, then data cut at cuts.
		msgs := [][]byte{nil}
		for i, rest := 0, data; len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i]))
			}
			msgs = append(msgs, rest[:n])
			rest = rest[n:]
		}
		recv := func() func() ([]byte, error) {
			i := 0
			return func() ([]byte, error) {
				if i == len(msgs) {
					return nil, io.EOF
				}
				i++
				return msgs[i-1], nil
			}
		}
		part := func(m []byte) (hdr, bool, []byte) { return hdr{size, declared}, m == nil, m }
		check := func(hdr) error { return nil }

		_, r, err := streamUpload("op", limit, recv(), part, check)
		_, held, heldSum, heldErr := receiveUpload("op", limit, recv(), part, check)
		if size > uint64(limit) {
			if status.Code(err) != codes.ResourceExhausted || status.Code(heldErr) != codes.ResourceExhausted {
				t.Fatalf("declared %d over limit %d: %v, %v", size, limit, err, heldErr)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		ok := len(data) > 0 && int64(len(data)) <= limit && (size == 0 || size == uint64(len(data))) &&
			(declared == "" || declared == want)
		if ok != (err == nil) || ok != (heldErr == nil) || ok != r.verified() || (err == nil) != (r.failed() == nil) {
			t.Fatalf("len %d, limit %d, declared %d: reader err = %v, held err = %v, want ok = %v", len(data), limit, size, err, heldErr, ok)
		}
		if err != nil {
			for _, e := range []error{err, heldErr} {
				if c := status.Code(e); c != codes.InvalidArgument && c != codes.ResourceExhausted {
					t.Fatalf("code %v: %v", c, e)
				}
			}
			return
		}
		if !bytes.Equal(got, data) || r.sum != want || !bytes.Equal(held, data) || heldSum != want {
			t.Fatalf("streamed %d bytes with sum %s, held %d with %s, want %d bytes with %s", len(got), r.sum, len(held), heldSum, len(data), want)
		}
	})
}

// hdr is an upload header for FuzzAssembler.
type hdr struct {
	size uint64
	sha  string
}

func (h hdr) GetSizeBytes() uint64 { return h.size }
func (h hdr) GetSha256() string    { return h.sha }
