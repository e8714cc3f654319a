// Package half widens 16-bit floating-point formats to float32. Both
// conversions are exact: every binary16 and bfloat16 value, subnormals
// included, is representable as a float32.
package half

import "math"

// F16ToFloat32 converts IEEE 754 binary16 bits to float32. Infinities and
// NaNs stay infinities and NaNs.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		// Rebias the exponent from 15 to 127.
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// A subnormal binary16 (mant * 2^-24) is normal in float32: shift the
	// leading one into the implicit bit, lowering the exponent per shift.
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}

// BF16ToFloat32 converts bfloat16 bits to float32: bfloat16 is the upper half
// of a float32.
func BF16ToFloat32(b uint16) float32 {
	return math.Float32frombits(uint32(b) << 16)
}
