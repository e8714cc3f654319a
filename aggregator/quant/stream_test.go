package quant_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
)

// decodePieces decodes b through a Decoder fed in random pieces.
func decodePieces(rng *rand.Rand, b []byte, bits, n int) ([]float32, error) {
	var out []float32
	d, err := quant.NewDecoder(bits, n, uint64(len(b)), func(v []float32) error {
		out = append(out, v...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for len(b) > 0 {
		k := rng.IntN(min(len(b), 5000) + 1)
		if err := d.Write(b[:k]); err != nil {
			return nil, err
		}
		b = b[k:]
	}
	return out, d.Close()
}

// TestDecoderMatchesDecodeInto: pieces decode to DecodeInto's values, and
// a corrupted encoding is refused by both.
func TestDecoderMatchesDecodeInto(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, bits := range []int{8, 4} {
		for _, n := range []int{1, 2, 3, 63, 64, 65, 256, 1001, 9000} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			if n > 200 {
				clear(x[64:128]) // a block of scale 0
			}
			enc, _, err := quant.Encode(x, bits, 64*(1+n%3), rand.NewPCG(1, uint64(n)))
			if err != nil {
				t.Fatal(err)
			}
			for trial := range 30 {
				b := slices.Clone(enc)
				if trial > 0 {
					b[rng.IntN(len(b))] ^= byte(1 << rng.IntN(8))
				}
				want, werr := quant.DecodeInto(nil, b, bits, n)
				got, gerr := decodePieces(rng, b, bits, n)
				if (werr == nil) != (gerr == nil) {
					t.Fatalf("bits %d n %d trial %d: DecodeInto %v, Decoder %v", bits, n, trial, werr, gerr)
				}
				if werr == nil && !slices.Equal(want, got) {
					t.Fatalf("bits %d n %d trial %d: values differ", bits, n, trial)
				}
			}
		}
	}
}

func TestDecoderRefuses(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 1000)
	for i := range x {
		x[i] = float32(i)
	}
	small, _, err := quant.Encode(x, 8, 16, rand.NewPCG(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodePieces(rng, small, 8, 1000); !errors.Is(err, quant.ErrFormat) {
		t.Fatalf("block 16 (scales a quarter of the update): %v, want ErrFormat", err)
	}
	enc, _, _ := quant.Encode(x, 8, 256, rand.NewPCG(1, 1))
	if _, err := decodePieces(rng, enc, 8, 999); !errors.Is(err, quant.ErrShape) {
		t.Fatalf("another length: %v, want ErrShape", err)
	}
	if _, err := decodePieces(rng, enc[:len(enc)-1], 8, 1000); !errors.Is(err, quant.ErrFormat) {
		t.Fatalf("truncated: %v, want ErrFormat", err)
	}
	if _, err := quant.NewDecoder(5, 10, 100, nil); !errors.Is(err, quant.ErrConfig) {
		t.Fatalf("5 bits: %v, want ErrConfig", err)
	}
	d, _ := quant.NewDecoder(8, 1000, uint64(len(enc)), func([]float32) error { return nil })
	if err := d.Write(append(slices.Clone(enc), 0)); !errors.Is(err, quant.ErrFormat) {
		t.Fatalf("a byte past the announced size: %v, want ErrFormat", err)
	}
}

func FuzzDecoder(f *testing.F) {
	x := []float32{1, -2, 3, 0.5, 0, 0, 7}
	for _, bits := range []int{8, 4} {
		enc, _, _ := quant.Encode(x, bits, 64, rand.NewPCG(1, 1))
		f.Add(enc, bits == 4, uint64(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, four bool, seed uint64) {
		bits := 8
		if four {
			bits = 4
		}
		want, werr := quant.DecodeInto(nil, b, bits, len(x))
		got, gerr := decodePieces(rand.New(rand.NewPCG(seed, 0)), b, bits, len(x))
		if gerr == nil && (werr != nil || !slices.Equal(want, got)) {
			t.Fatalf("Decoder accepted what DecodeInto decodes as %v, %v", want, werr)
		}
		// The Decoder refuses blocks below MinStreamBlock, which DecodeInto takes.
		if werr == nil && gerr != nil && len(b) >= 13 && uint32(b[9])|uint32(b[10])<<8|uint32(b[11])<<16|uint32(b[12])<<24 >= quant.MinStreamBlock {
			t.Fatalf("Decoder refused what DecodeInto takes: %v", gerr)
		}
	})
}
