package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
)

// Feedback carries one device's quantization error from round to round
// (error feedback): each round it sends x + e quantized and keeps what
// that lost as the new e, so nothing is lost for good, only delayed, and
// the running sum of what it sent stays within one quantization step of
// the sum of its updates.
//
// The zero value is ready to use and takes the length of the first
// update; MarshalBinary and UnmarshalBinary persist the residual between
// rounds. A Feedback is not safe for concurrent use.
type Feedback struct {
	e []float32
}

// Len returns the length of the residual: 0 before the first Compress.
func (f *Feedback) Len() int { return len(f.e) }

// Residual returns a copy of the residual e, the part of the updates sent
// so far that the receiver has not yet received.
func (f *Feedback) Residual() []float32 { return append([]float32(nil), f.e...) }

// Reset drops the residual, as for a device that starts over from a new
// model.
func (f *Feedback) Reset() { f.e = nil }

// Compress quantizes y = x + e with bits 8 (Quantize) or 4 (Quantize4) in
// blocks of block values, drawing one Uint64 from rng per value, and sets
// e = y − sent. It returns the encoding to send (FLQ8 or FLQ4) and sent,
// the values the receiver will dequantize from it, bit for bit.
//
// x must have the residual's length once there is one (ErrShape); on any
// error the residual is left as it was, so a failed round can be retried.
func (f *Feedback) Compress(x []float32, bits int, block int, rng rand.Source) (encoded []byte, sent []float32, err error) {
	if bits != 8 && bits != 4 {
		return nil, nil, fmt.Errorf("quant: compress: %d bits, want 8 or 4: %w", bits, ErrConfig)
	}
	if f.e != nil && len(x) != len(f.e) {
		return nil, nil, fmt.Errorf("quant: compress: %d values, but the residual has %d (another model? Reset it): %w", len(x), len(f.e), ErrShape)
	}
	y := make([]float32, len(x))
	for i, v := range x {
		// Checked here so that the error names x, not x + e.
		if !(math.Abs(float64(v)) <= MaxAbs) {
			return nil, nil, fmt.Errorf("quant: compress: x[%d] = %v: not finite or beyond %g: %w", i, v, float64(MaxAbs), ErrRange)
		}
		y[i] = v
		if f.e != nil {
			y[i] += f.e[i]
			if !(math.Abs(float64(y[i])) <= MaxAbs) {
				return nil, nil, fmt.Errorf("quant: compress: x[%d] + residual = %v, beyond %g (scale the update down): %w", i, y[i], float64(MaxAbs), ErrRange)
			}
		}
	}
	switch bits {
	case 8:
		q, err := Quantize(y, block, rng)
		if err != nil {
			return nil, nil, fmt.Errorf("quant: compress: %w", err)
		}
		if encoded, err = q.MarshalBinary(); err != nil {
			return nil, nil, fmt.Errorf("quant: compress: %w", err)
		}
		sent = q.Dequantize()
	case 4:
		q, err := Quantize4(y, block, rng)
		if err != nil {
			return nil, nil, fmt.Errorf("quant: compress: %w", err)
		}
		if encoded, err = q.MarshalBinary(); err != nil {
			return nil, nil, fmt.Errorf("quant: compress: %w", err)
		}
		sent = q.Dequantize()
	}
	// y is reused as the new residual: |y − sent| is under one step, and
	// so at most MaxAbs, which keeps the next round's y finite.
	for i := range y {
		y[i] -= sent[i]
	}
	f.e = y
	return encoded, sent, nil
}

const (
	magicFeedback   = "FLEF"
	versionFeedback = 1
	// headerFeedback is the magic, the version and the uint32 length.
	headerFeedback = 9
)

// MarshalBinary encodes the residual, little-endian:
//
//	[0:4]  magic "FLEF"
//	[4]    version (1)
//	[5:9]  n, the number of values, uint32 (0 before the first Compress)
//	[9:]   n float32 values
func (f *Feedback) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, headerFeedback+4*len(f.e))
	b = append(b, magicFeedback...)
	b = append(b, versionFeedback)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(f.e)))
	for _, v := range f.e {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b, nil
}

// UnmarshalBinary restores a residual written by MarshalBinary. It refuses
// with ErrFormat another magic or version, a length over MaxLen or not
// matching the bytes, and a value that is not finite or beyond MaxAbs
// (which Compress never leaves), and leaves f unchanged then. What it
// allocates is bounded by len(b). The next Compress checks the length
// against the update.
func (f *Feedback) UnmarshalBinary(b []byte) error {
	if len(b) < headerFeedback {
		return fmt.Errorf("quant: decode residual: %d bytes, shorter than the %d-byte header: %w", len(b), headerFeedback, ErrFormat)
	}
	if string(b[:4]) != magicFeedback {
		return fmt.Errorf("quant: decode residual: magic %q, want %q (not an error-feedback residual): %w", b[:4], magicFeedback, ErrFormat)
	}
	if b[4] != versionFeedback {
		return fmt.Errorf("quant: decode residual: version %d, want %d: %w", b[4], versionFeedback, ErrFormat)
	}
	n := uint64(binary.LittleEndian.Uint32(b[5:]))
	if n > MaxLen {
		return fmt.Errorf("quant: decode residual: %d values, over %d: %w", n, MaxLen, ErrFormat)
	}
	if want := headerFeedback + 4*n; uint64(len(b)) != want {
		return fmt.Errorf("quant: decode residual: %d bytes, want %d for %d values: %w", len(b), want, n, ErrFormat)
	}
	var e []float32
	if n > 0 {
		e = make([]float32, n)
	}
	for i := range e {
		v := math.Float32frombits(binary.LittleEndian.Uint32(b[headerFeedback+4*i:]))
		if !(math.Abs(float64(v)) <= MaxAbs) {
			return fmt.Errorf("quant: decode residual: value %d = %v: not finite or beyond %g: %w", i, v, float64(MaxAbs), ErrFormat)
		}
		e[i] = v
	}
	f.e = e
	return nil
}
