package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// DecodeInto checks an FLQ8 (bits 8) or FLQ4 (bits 4) encoding of exactly n
// values as strictly as Decode and Decode4 and dequantizes it straight into
// dst's storage when it is large enough: the one conversion a receiver of
// untrusted updates makes, with no intermediate copy of the codes. Besides
// dst it allocates only the scales, bounded by len(b). Another length is
// refused with ErrShape, anything malformed with ErrFormat; dst's contents
// are unspecified after an error.
func DecodeInto(dst []float32, b []byte, bits, n int) ([]float32, error) {
	var h header
	switch bits {
	case 8:
		h = header{op: "decode", magic: magic, version: version, what: "an int8 update", maxScale: maxScale,
			payload: func(n uint64) uint64 { return n }}
	case 4:
		h = header{op: "decode4", magic: magic4, version: version4, what: "a 4-bit update", maxScale: maxScale4,
			payload: func(n uint64) uint64 { return (n + 1) / 2 }}
	default:
		return nil, fmt.Errorf("quant: decode into: %d bits, want 8 or 4: %w", bits, ErrConfig)
	}
	if n < 1 || n > MaxLen {
		return nil, fmt.Errorf("quant: %s: want %d values, not in [1, %d]: %w", h.op, n, MaxLen, ErrShape)
	}
	// The declared length is checked before decodeHeader allocates the
	// scales, so that an encoding for another model costs nothing.
	if len(b) >= headerSize {
		if got := uint64(b[5]) | uint64(b[6])<<8 | uint64(b[7])<<16 | uint64(b[8])<<24; got != uint64(n) && string(b[:4]) == h.magic {
			return nil, fmt.Errorf("quant: %s: %d values, want %d: %w", h.op, got, n, ErrShape)
		}
	}
	got, block, scales, raw, err := decodeHeader(b, h)
	if err != nil {
		return nil, err
	}
	if got != uint64(n) {
		return nil, fmt.Errorf("quant: %s: %d values, want %d: %w", h.op, got, n, ErrShape)
	}
	out := dst[:0]
	if cap(out) < n {
		out = make([]float32, n)
	}
	out = out[:n]
	k := int64(maxCode)
	if bits == 4 {
		k = maxCode4
		if n%2 == 1 && raw[len(raw)-1]>>4 != 0 {
			return nil, fmt.Errorf("quant: decode4: padding nibble after the last of %d values is %d, want 0: %w", n, raw[len(raw)-1]>>4, ErrFormat)
		}
	}
	for i := range out {
		var c int8
		if bits == 8 {
			c = int8(raw[i])
		} else {
			c = nibble(raw[i/2], i)
		}
		if int64(c) < -k {
			return nil, fmt.Errorf("quant: %s: code %d = %d, below -%d: %w", h.op, i, c, k, ErrFormat)
		}
		s := scales[uint64(i)/block]
		if c != 0 && s == 0 {
			return nil, fmt.Errorf("quant: %s: code %d = %d in a block of scale 0: %w", h.op, i, c, ErrFormat)
		}
		out[i] = float32(float64(c) * float64(s))
	}
	return out, nil
}

// Encode quantizes y with bits 8 (Quantize) or 4 (Quantize4) and returns
// its encoding and the values a receiver dequantizes from it, bit for bit.
// It is the step of Compress between AddTo and Keep, for a caller that
// transforms x + e (clips it, adds noise) before quantizing.
func Encode(y []float32, bits, block int, rng rand.Source) (encoded []byte, sent []float32, err error) {
	switch bits {
	case 8:
		q, err := Quantize(y, block, rng)
		if err != nil {
			return nil, nil, err
		}
		if encoded, err = q.MarshalBinary(); err != nil {
			return nil, nil, err
		}
		return encoded, q.Dequantize(), nil
	case 4:
		q, err := Quantize4(y, block, rng)
		if err != nil {
			return nil, nil, err
		}
		if encoded, err = q.MarshalBinary(); err != nil {
			return nil, nil, err
		}
		return encoded, q.Dequantize(), nil
	}
	return nil, nil, fmt.Errorf("quant: encode: %d bits, want 8 or 4: %w", bits, ErrConfig)
}

// AddTo adds the residual to x in place (nothing before the first Keep or
// Compress). x must have the residual's length once there is one
// (ErrShape); a sum that is not finite or beyond MaxAbs is refused with
// ErrRange, and x is unchanged after any error.
func (f *Feedback) AddTo(x []float32) error {
	if f.e == nil {
		return nil
	}
	if len(x) != len(f.e) {
		return fmt.Errorf("quant: add residual: %d values, but the residual has %d (another model? Reset it): %w", len(x), len(f.e), ErrShape)
	}
	for i, v := range x {
		if s := v + f.e[i]; !(math.Abs(float64(s)) <= MaxAbs) {
			return fmt.Errorf("quant: add residual: x[%d] + residual = %v, beyond %g: %w", i, s, float64(MaxAbs), ErrRange)
		}
	}
	for i := range x {
		x[i] += f.e[i]
	}
	return nil
}

// Keep sets the residual to y − sent: y what was meant to be sent (x + e
// after AddTo and any transformation), sent what the receiver decodes. The
// residual's storage is reused, so a device holds one model-sized buffer
// per Feedback. y and sent must have the same length, 1 to MaxLen
// (ErrShape), and every difference must be finite and at most MaxAbs
// (ErrRange); the residual is unchanged after an error.
func (f *Feedback) Keep(y, sent []float32) error {
	if len(y) != len(sent) || len(y) == 0 || len(y) > MaxLen {
		return fmt.Errorf("quant: keep residual: %d values sent for %d: %w", len(sent), len(y), ErrShape)
	}
	for i := range y {
		if d := y[i] - sent[i]; !(math.Abs(float64(d)) <= MaxAbs) {
			return fmt.Errorf("quant: keep residual: value %d: %v − %v is not finite or beyond %g: %w", i, y[i], sent[i], float64(MaxAbs), ErrRange)
		}
	}
	e := f.e
	if len(e) != len(y) {
		e = make([]float32, len(y))
	}
	for i := range y {
		e[i] = y[i] - sent[i]
	}
	f.e = e
	return nil
}
