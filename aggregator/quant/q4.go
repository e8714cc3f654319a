package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// maxCode4 is the largest |code| of the 4-bit encoding; −8 is left out so
// that the range is symmetric and rounding stays unbiased at both ends.
const maxCode4 = 7

// maxScale4 is the scale Quantize4 picks for a block whose largest value
// is MaxAbs; Decode4 refuses larger ones.
var maxScale4 = scaleForCode(MaxAbs, maxCode4)

// Quantized4 is a vector in 4-bit codes, two to a byte, with a float32
// scale per block. The zero value holds no values; Quantize4 and Decode4
// return valid ones.
type Quantized4 struct {
	n      int
	block  int
	scales []float32
	// packed holds code 2j in the low nibble of byte j and code 2j+1 in
	// the high one, as the wire does, so that a decoded update costs half
	// a byte per value in memory too.
	packed []byte
}

// Quantize4 encodes x like Quantize but with codes in [−7, 7] and the
// scale max|x|/7 per block: half the bytes of int8 for an error 127/7 ≈ 18
// times larger, which error feedback (see Feedback) carries into the next
// round instead of losing. It draws one Uint64 from rng per value and
// takes the same x, block and rng as Quantize.
func Quantize4(x []float32, block int, rng rand.Source) (Quantized4, error) {
	if err := checkInput("quantize4", x, block, rng); err != nil {
		return Quantized4{}, err
	}
	q := Quantized4{
		n:      len(x),
		block:  block,
		scales: make([]float32, blocks(len(x), block)),
		packed: make([]byte, (len(x)+1)/2),
	}
	for b := range q.scales {
		lo, hi := b*block, min((b+1)*block, len(x))
		var m float64
		for _, v := range x[lo:hi] {
			m = max(m, math.Abs(float64(v)))
		}
		s := scaleForCode(m, maxCode4)
		q.scales[b] = s
		for i := lo; i < hi; i++ {
			// Drawn for every value, as in Quantize, so that the source
			// advances by the length alone.
			u := float64(rng.Uint64()>>11) * 0x1p-53
			if s == 0 {
				continue
			}
			// |x| ≤ 7·s exactly and division rounds monotonically, so
			// |r| ≤ 7 and the code fits in a nibble.
			r := float64(x[i]) / float64(s)
			c := math.Floor(r)
			if u < r-c {
				c++
			}
			q.packed[i/2] |= (byte(int8(c)) & 0x0f) << (4 * (i % 2))
		}
	}
	return q, nil
}

// scaleForCode returns the smallest float32 s (from m/k upwards) with
// k·s ≥ m, so that no value of the block maps beyond ±k; 0 for m = 0.
// k·s is exact in float64 for k < 2^29, so the comparison is too.
func scaleForCode(m float64, k int) float32 {
	if m == 0 {
		return 0
	}
	s := float32(m / float64(k))
	for float64(s)*float64(k) < m {
		s = math.Nextafter32(s, float32(math.Inf(1)))
	}
	return s
}

// Len returns the number of values.
func (q Quantized4) Len() int { return q.n }

// Block returns the block size.
func (q Quantized4) Block() int { return q.block }

// Scale returns the scale of the block holding value i, the bound on its
// quantization error.
func (q Quantized4) Scale(i int) float32 { return q.scales[i/q.block] }

// Code returns value i's code, in [−7, 7].
func (q Quantized4) Code(i int) int8 { return nibble(q.packed[i/2], i) }

// nibble sign-extends value i's 4 bits out of its byte.
func nibble(b byte, i int) int8 { return int8(b<<(4*(1-i%2))) >> 4 }

// Dequantize returns the values code·scale as a new slice.
func (q Quantized4) Dequantize() []float32 {
	out := make([]float32, q.n)
	for i := range out {
		out[i] = float32(float64(q.Code(i)) * float64(q.scales[i/q.block]))
	}
	return out
}

const (
	magic4   = "FLQ4"
	version4 = 1
)

// EncodedLen returns the length of q's encoding.
func (q Quantized4) EncodedLen() int { return headerSize + 4*len(q.scales) + len(q.packed) }

// MarshalBinary encodes q (see the package documentation for the layout).
func (q Quantized4) MarshalBinary() ([]byte, error) {
	return q.AppendBinary(make([]byte, 0, q.EncodedLen()))
}

// AppendBinary appends q's encoding to b.
func (q Quantized4) AppendBinary(b []byte) ([]byte, error) {
	if q.n == 0 {
		return nil, fmt.Errorf("quant: encode4: empty vector: %w", ErrShape)
	}
	return append(appendHeader(b, magic4, version4, q.n, q.block, q.scales), q.packed...), nil
}

// Decode4 decodes a 4-bit encoding of exactly n values (the model's
// dimension, known to the receiver), refusing any other length with
// ErrShape and anything malformed with ErrFormat.
func Decode4(b []byte, n int) (Quantized4, error) {
	var q Quantized4
	if err := q.UnmarshalBinary(b); err != nil {
		return Quantized4{}, err
	}
	if q.n != n {
		return Quantized4{}, fmt.Errorf("quant: decode4: %d values, want %d: %w", q.n, n, ErrShape)
	}
	return q, nil
}

// UnmarshalBinary decodes an encoding written by MarshalBinary, of whatever
// length it declares; prefer Decode4, which checks the length against the
// receiver's own. It refuses malformed input with ErrFormat and leaves q
// unchanged then. What it allocates is bounded by len(b).
func (q *Quantized4) UnmarshalBinary(b []byte) error {
	n, block, scales, raw, err := decodeHeader(b, header{op: "decode4", magic: magic4, version: version4,
		what: "a 4-bit update", maxScale: maxScale4, payload: func(n uint64) uint64 { return (n + 1) / 2 }})
	if err != nil {
		return err
	}
	if n%2 == 1 && raw[len(raw)-1]>>4 != 0 {
		// Otherwise two encodings would decode to the same values.
		return fmt.Errorf("quant: decode4: padding nibble after the last of %d values is %d, want 0: %w", n, raw[len(raw)-1]>>4, ErrFormat)
	}
	for i := range n {
		code := nibble(raw[i/2], int(i%2))
		if code < -maxCode4 {
			return fmt.Errorf("quant: decode4: code %d = %d, below -%d: %w", i, code, maxCode4, ErrFormat)
		}
		if code != 0 && scales[i/block] == 0 {
			return fmt.Errorf("quant: decode4: code %d = %d in a block of scale 0: %w", i, code, ErrFormat)
		}
	}
	*q = Quantized4{n: int(n), block: int(block), scales: scales, packed: append([]byte(nil), raw...)}
	return nil
}
