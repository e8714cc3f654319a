package secagg_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// decodeMasked runs a MaskedDecoder over b cut at random points.
func decodeMasked(rng *rand.Rand, b []byte, bits, dim int, packed bool) ([]uint32, error) {
	var out []uint32
	d, err := secagg.NewMaskedDecoder(bits, dim, packed, uint64(len(b)), func(v []uint32) error {
		out = append(out, v...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for len(b) > 0 {
		k := rng.IntN(min(len(b), 11) + 1)
		if err := d.Write(b[:k]); err != nil {
			return nil, err
		}
		b = b[k:]
	}
	return out, d.Close()
}

// TestMaskedDecoderMatchesUnpack: both forms decode, cut anywhere, to what
// Unpack reads, and what Unpack refuses is refused.
func TestMaskedDecoderMatchesUnpack(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bits := range []int{1, 7, 8, 9, 16, 20, 31, 32} {
		for _, dim := range []int{1, 5, 5000} {
			vals := make([]uint32, dim)
			for i := range vals {
				vals[i] = uint32(rng.Uint64() & (1<<bits - 1))
			}
			m := &pb.MaskedUpdate{Bits: uint32(bits), Values: slices.Clone(vals)}
			if err := secagg.Pack(m); err != nil {
				t.Fatal(err)
			}
			got, err := decodeMasked(rng, m.Packed, bits, dim, true)
			if err != nil || !slices.Equal(got, vals) {
				t.Fatalf("bits %d dim %d packed: %v", bits, dim, err)
			}
			raw := make([]byte, 0, 4*dim)
			for _, v := range vals {
				raw = binary.LittleEndian.AppendUint32(raw, v)
			}
			if got, err = decodeMasked(rng, raw, bits, dim, false); err != nil || !slices.Equal(got, vals) {
				t.Fatalf("bits %d dim %d fixed32: %v", bits, dim, err)
			}
			if bits < 32 {
				// A value at 2^bits: refused by both.
				bad := slices.Clone(raw)
				binary.LittleEndian.PutUint32(bad[4*(dim-1):], 1<<bits)
				if _, err := decodeMasked(rng, bad, bits, dim, false); !errors.Is(err, secagg.ErrMalformed) {
					t.Fatalf("bits %d: value 2^bits: %v, want ErrMalformed", bits, err)
				}
			}
			if _, err := decodeMasked(rng, raw[:len(raw)-1], bits, dim, false); !errors.Is(err, secagg.ErrMalformed) {
				t.Fatalf("bits %d: a byte short: %v, want ErrMalformed", bits, err)
			}
		}
	}
}
