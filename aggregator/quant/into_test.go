package quant_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
)

func testVector(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 0.01)
	}
	return x
}

// TestDecodeIntoMatchesDecode: the receiver's one-step decoder gives what
// Decode / Decode4 then Dequantize give, bit for bit, into a reused buffer.
func TestDecodeIntoMatchesDecode(t *testing.T) {
	buf := make([]float32, 0, 1000)
	for _, bits := range []int{8, 4} {
		for _, n := range []int{1, 255, 256, 257, 999} {
			enc, sent, err := quant.Encode(testVector(n, uint64(n)), bits, quant.DefaultBlock, rand.NewPCG(1, 2))
			if err != nil {
				t.Fatal(err)
			}
			got, err := quant.DecodeInto(buf, enc, bits, n)
			if err != nil {
				t.Fatalf("%d bits, n %d: %v", bits, n, err)
			}
			if !slices.Equal(got, sent) {
				t.Fatalf("%d bits, n %d: decoded values differ from the sent ones", bits, n)
			}
			if &got[0] != &buf[:1][0] {
				t.Fatalf("%d bits, n %d: did not decode into the buffer", bits, n)
			}
		}
	}
}

// TestDecodeIntoRefuses: hostile encodings are refused with a reason, and
// the right sentinel.
func TestDecodeIntoRefuses(t *testing.T) {
	const n = 300
	enc8, _, _ := quant.Encode(testVector(n, 3), 8, quant.DefaultBlock, rand.NewPCG(1, 2))
	enc4, _, _ := quant.Encode(testVector(n, 3), 4, quant.DefaultBlock, rand.NewPCG(1, 2))
	nan := slices.Clone(enc8)
	copy(nan[13:17], []byte{0x00, 0x00, 0xc0, 0x7f}) // the first scale: NaN
	neg := slices.Clone(enc8)
	neg[16] |= 0x80
	minCode := slices.Clone(enc8)
	minCode[len(minCode)-1] = 0x80 // −128
	for _, c := range []struct {
		name string
		b    []byte
		bits int
		n    int
		want error
	}{
		{"empty", nil, 8, n, quant.ErrFormat},
		{"truncated", enc8[:len(enc8)-1], 8, n, quant.ErrFormat},
		{"oversized", append(slices.Clone(enc8), 0), 8, n, quant.ErrFormat},
		{"another model's length", enc8, 8, n + 1, quant.ErrShape},
		{"int4 bytes for int8", enc4, 8, n, quant.ErrFormat},
		{"int8 bytes for int4", enc8, 4, n, quant.ErrFormat},
		{"NaN scale", nan, 8, n, quant.ErrFormat},
		{"negative scale", neg, 8, n, quant.ErrFormat},
		{"code -128", minCode, 8, n, quant.ErrFormat},
		{"bits 16", enc8, 16, n, quant.ErrConfig},
	} {
		if _, err := quant.DecodeInto(nil, c.b, c.bits, c.n); !errors.Is(err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}

// TestAddToKeep: AddTo then Encode then Keep is Compress, split so that a
// device can clip x + e before quantizing it.
func TestAddToKeep(t *testing.T) {
	var a, b quant.Feedback
	for round := range 5 {
		x := testVector(600, uint64(round))
		wantEnc, _, err := a.Compress(x, 4, 64, rand.NewPCG(uint64(round), 9))
		if err != nil {
			t.Fatal(err)
		}
		y := slices.Clone(x)
		if err := b.AddTo(y); err != nil {
			t.Fatal(err)
		}
		enc, sent, err := quant.Encode(y, 4, 64, rand.NewPCG(uint64(round), 9))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Keep(y, sent); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(enc, wantEnc) || !slices.Equal(a.Residual(), b.Residual()) {
			t.Fatalf("round %d: split feedback differs from Compress", round)
		}
	}
	if err := b.AddTo(make([]float32, 5)); !errors.Is(err, quant.ErrShape) {
		t.Fatalf("AddTo of another length: %v", err)
	}
	if err := b.Keep([]float32{1}, []float32{float32(math.NaN())}); !errors.Is(err, quant.ErrRange) {
		t.Fatalf("Keep of NaN: %v", err)
	}
}

// FuzzDecodeInto: whatever the bytes, DecodeInto refuses with a sentinel
// or returns n finite values that Decode / Decode4 agree with.
func FuzzDecodeInto(f *testing.F) {
	for _, bits := range []int{8, 4} {
		for _, n := range []int{1, 5, 300} {
			enc, _, _ := quant.Encode(testVector(n, 7), bits, 2, rand.NewPCG(1, 1))
			f.Add(enc, uint8(bits), uint16(n))
			f.Add(enc[:len(enc)-1], uint8(bits), uint16(n))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, bits uint8, n uint16) {
		v, err := quant.DecodeInto(nil, b, int(bits), int(n))
		if err != nil {
			if !errors.Is(err, quant.ErrFormat) && !errors.Is(err, quant.ErrShape) && !errors.Is(err, quant.ErrConfig) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if len(v) != int(n) {
			t.Fatalf("%d values, want %d", len(v), n)
		}
		var want []float32
		if bits == 8 {
			q, err := quant.Decode(b, int(n))
			if err != nil {
				t.Fatalf("DecodeInto accepted what Decode refuses: %v", err)
			}
			want = q.Dequantize()
		} else {
			q, err := quant.Decode4(b, int(n))
			if err != nil {
				t.Fatalf("DecodeInto accepted what Decode4 refuses: %v", err)
			}
			want = q.Dequantize()
		}
		for i, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) || x != want[i] {
				t.Fatalf("value %d = %v, want %v", i, x, want[i])
			}
		}
	})
}
