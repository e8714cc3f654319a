package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
)

const (
	// DefaultBlock is the block size DiLoCo pseudo-gradients use: one
	// float32 scale per 256 values costs 1.6% over the int8 codes, and a
	// block that small keeps one large value from flattening its
	// neighbours' resolution.
	DefaultBlock = 256
	// MaxBlock bounds the block size.
	MaxBlock = 1 << 16
	// MaxLen bounds the number of values, as the aggregator bounds a
	// model's dimension.
	MaxLen = 1<<31 - 1
	// MaxAbs bounds |x|. Far beyond any sane pseudo-gradient, it keeps
	// 127·scale, and so every dequantized value, within float32.
	MaxAbs = 0x1p120
	// maxCode is the largest |code|; the range is symmetric.
	maxCode = 127
)

// maxScale is the scale Quantize picks for a block whose largest value is
// MaxAbs; Decode refuses larger ones.
var maxScale = scaleFor(MaxAbs)

// Quantized is a vector in int8 codes with a float32 scale per block. The
// zero value holds no values; Quantize and Decode return valid ones.
type Quantized struct {
	n      int
	block  int
	scales []float32
	codes  []int8
}

// Quantize encodes x with stochastic rounding in blocks of block values
// (DefaultBlock normally), drawing one Uint64 from rng per value. x must
// have 1 to MaxLen values, each finite and at most MaxAbs in magnitude;
// block must be in [1, MaxBlock] and rng non-nil.
func Quantize(x []float32, block int, rng rand.Source) (Quantized, error) {
	if err := checkInput("quantize", x, block, rng); err != nil {
		return Quantized{}, err
	}
	q := Quantized{
		n:      len(x),
		block:  block,
		scales: make([]float32, blocks(len(x), block)),
		codes:  make([]int8, len(x)),
	}
	for b := range q.scales {
		lo, hi := b*block, min((b+1)*block, len(x))
		var m float64
		for _, v := range x[lo:hi] {
			m = max(m, math.Abs(float64(v)))
		}
		s := scaleFor(m)
		q.scales[b] = s
		for i := lo; i < hi; i++ {
			// u in [0, 1) from the top 53 bits, drawn for every value so
			// that the source advances by the length alone.
			u := float64(rng.Uint64()>>11) * 0x1p-53
			if s == 0 {
				continue
			}
			// |x| ≤ 127·s exactly, and division rounds monotonically, so
			// |r| ≤ 127 and the code fits.
			r := float64(x[i]) / float64(s)
			c := math.Floor(r)
			if u < r-c {
				c++
			}
			q.codes[i] = int8(c)
		}
	}
	return q, nil
}

// scaleFor returns the smallest float32 s (from m/127 upwards) with
// 127·s ≥ m, so that no value of the block maps beyond ±127; 0 for m = 0.
// 127·s is exact in float64 (24 + 7 bits), so the comparison is too.
func scaleFor(m float64) float32 { return scaleForCode(m, maxCode) }

// appendHeader appends what both encodings start with: magic, version, n,
// block and the scales.
func appendHeader(b []byte, magic string, version byte, n, block int, scales []float32) []byte {
	b = append(b, magic...)
	b = append(b, version)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = binary.LittleEndian.AppendUint32(b, uint32(block))
	for _, s := range scales {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(s))
	}
	return b
}

// header says how decodeHeader checks one encoding: payload is the length
// of the codes of n values.
type header struct {
	op, magic, what string
	version         byte
	maxScale        float32
	payload         func(n uint64) uint64
}

// decodeHeader checks the shared header and the total length, and returns
// n, the block size, the scales and the codes' bytes.
func decodeHeader(b []byte, h header) (n, block uint64, scales []float32, payload []byte, err error) {
	if len(b) < headerSize {
		return 0, 0, nil, nil, fmt.Errorf("quant: %s: %d bytes, shorter than the %d-byte header: %w", h.op, len(b), headerSize, ErrFormat)
	}
	if string(b[:4]) != h.magic {
		return 0, 0, nil, nil, fmt.Errorf("quant: %s: magic %q, want %q (not %s): %w", h.op, b[:4], h.magic, h.what, ErrFormat)
	}
	if b[4] != h.version {
		return 0, 0, nil, nil, fmt.Errorf("quant: %s: version %d, want %d: %w", h.op, b[4], h.version, ErrFormat)
	}
	n = uint64(binary.LittleEndian.Uint32(b[5:]))
	block = uint64(binary.LittleEndian.Uint32(b[9:]))
	if n == 0 || n > MaxLen {
		return 0, 0, nil, nil, fmt.Errorf("quant: %s: %d values, want 1 to %d: %w", h.op, n, MaxLen, ErrFormat)
	}
	if block == 0 || block > MaxBlock {
		return 0, 0, nil, nil, fmt.Errorf("quant: %s: block size %d not in [1, %d]: %w", h.op, block, MaxBlock, ErrFormat)
	}
	nb := (n + block - 1) / block
	if want := headerSize + 4*nb + h.payload(n); uint64(len(b)) != want {
		return 0, 0, nil, nil, fmt.Errorf("quant: %s: %d bytes, want %d for %d values in blocks of %d: %w", h.op, len(b), want, n, block, ErrFormat)
	}
	scales = make([]float32, nb)
	p := b[headerSize:]
	for i := range scales {
		bits := binary.LittleEndian.Uint32(p[4*i:])
		s := math.Float32frombits(bits)
		// The sign bit catches −0 too, which the quantizers never write.
		if bits>>31 != 0 || !(s <= h.maxScale) {
			return 0, 0, nil, nil, fmt.Errorf("quant: %s: scale %d = %v not in [0, %v]: %w", h.op, i, s, h.maxScale, ErrFormat)
		}
		scales[i] = s
	}
	return n, block, scales, p[4*nb:], nil
}

func blocks(n, block int) int { return (n + block - 1) / block }

// Len returns the number of values.
func (q Quantized) Len() int { return q.n }

// Block returns the block size.
func (q Quantized) Block() int { return q.block }

// Scale returns the scale of the block holding value i, the bound on its
// quantization error.
func (q Quantized) Scale(i int) float32 { return q.scales[i/q.block] }

// Code returns value i's int8 code, in [−127, 127].
func (q Quantized) Code(i int) int8 { return q.codes[i] }

// Dequantize returns the values code·scale as a new slice.
func (q Quantized) Dequantize() []float32 {
	out := make([]float32, q.n)
	for i, c := range q.codes {
		out[i] = float32(float64(c) * float64(q.scales[i/q.block]))
	}
	return out
}

const (
	magic      = "FLQ8"
	version    = 1
	headerSize = 13
)

// EncodedLen returns the length of q's encoding.
func (q Quantized) EncodedLen() int { return headerSize + 4*len(q.scales) + q.n }

// MarshalBinary encodes q (see the package documentation for the layout).
func (q Quantized) MarshalBinary() ([]byte, error) {
	return q.AppendBinary(make([]byte, 0, q.EncodedLen()))
}

// AppendBinary appends q's encoding to b.
func (q Quantized) AppendBinary(b []byte) ([]byte, error) {
	if q.n == 0 {
		return nil, fmt.Errorf("quant: encode: empty vector: %w", ErrShape)
	}
	b = appendHeader(b, magic, version, q.n, q.block, q.scales)
	for _, c := range q.codes {
		b = append(b, byte(c))
	}
	return b, nil
}

// Decode decodes an encoding of exactly n values (the model's dimension,
// known to the receiver), refusing any other length with ErrShape and
// anything malformed with ErrFormat.
func Decode(b []byte, n int) (Quantized, error) {
	var q Quantized
	if err := q.UnmarshalBinary(b); err != nil {
		return Quantized{}, err
	}
	if q.n != n {
		return Quantized{}, fmt.Errorf("quant: decode: %d values, want %d: %w", q.n, n, ErrShape)
	}
	return q, nil
}

// UnmarshalBinary decodes an encoding written by MarshalBinary, of whatever
// length it declares; prefer Decode, which checks the length against the
// receiver's own. It refuses malformed input with ErrFormat and leaves q
// unchanged then. What it allocates is bounded by len(b).
func (q *Quantized) UnmarshalBinary(b []byte) error {
	n, block, scales, raw, err := decodeHeader(b, header{op: "decode", magic: magic, version: version,
		what: "an int8 pseudo-gradient", maxScale: maxScale, payload: func(n uint64) uint64 { return n }})
	if err != nil {
		return err
	}
	codes := make([]int8, n)
	for i, c := range raw {
		code := int8(c)
		if code < -maxCode {
			return fmt.Errorf("quant: decode: code %d = %d, below -%d: %w", i, code, maxCode, ErrFormat)
		}
		if code != 0 && scales[uint64(i)/block] == 0 {
			return fmt.Errorf("quant: decode: code %d = %d in a block of scale 0: %w", i, code, ErrFormat)
		}
		codes[i] = code
	}
	*q = Quantized{n: int(n), block: int(block), scales: scales, codes: codes}
	return nil
}

// checkInput is what both encoders accept: 1 to MaxLen values, each finite
// and at most MaxAbs in magnitude, a block in [1, MaxBlock] and a random
// source.
func checkInput(op string, x []float32, block int, rng rand.Source) error {
	switch {
	case block < 1 || block > MaxBlock:
		return fmt.Errorf("quant: %s: block size %d not in [1, %d]: %w", op, block, MaxBlock, ErrConfig)
	case rng == nil:
		return fmt.Errorf("quant: %s: no random source: %w", op, ErrConfig)
	case len(x) == 0 || len(x) > MaxLen:
		return fmt.Errorf("quant: %s: %d values, want 1 to %d: %w", op, len(x), MaxLen, ErrShape)
	}
	for i, v := range x {
		if !(math.Abs(float64(v)) <= MaxAbs) { // also false for NaN
			return fmt.Errorf("quant: %s: x[%d] = %v: not finite or beyond %g: %w", op, i, v, float64(MaxAbs), ErrRange)
		}
	}
	return nil
}
