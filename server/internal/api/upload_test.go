package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzAssembler feeds arbitrary uploads, split at arbitrary points, and
// checks that exactly the uploads that match the limit and header are
// accepted, unchanged.
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
		a, err := newAssembler("op", limit, size, declared)
		if size > uint64(limit) {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("declared %d over limit %d: %v", size, limit, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		rest := data
		for i := 0; err == nil && len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i]))
			}
			err = a.add(rest[:n])
			rest = rest[n:]
		}
		var got []byte
		var gotSum string
		if err == nil {
			got, gotSum, err = a.finish()
		}
		ok := len(data) > 0 && int64(len(data)) <= limit && (size == 0 || size == uint64(len(data))) &&
			(declared == "" || declared == want)
		if ok != (err == nil) {
			t.Fatalf("len %d, limit %d, declared %d: err = %v, want ok = %v", len(data), limit, size, err, ok)
		}
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.ResourceExhausted {
				t.Fatalf("code %v: %v", c, err)
			}
			return
		}
		if !bytes.Equal(got, data) || gotSum != want {
			t.Fatalf("assembled %d bytes with sum %s, want %d bytes with %s", len(got), gotSum, len(data), want)
		}
	})
}
