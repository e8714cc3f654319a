// Package floats holds the float32 checks that models, datasets, updates and
// module results share.
package floats

import "math"

// FirstNonFinite returns the index of the first NaN or ±Inf in v, or -1.
//
// It tests blocks without a branch per value: adding one to an all-ones
// exponent (the only one NaN and ±Inf have) carries into the sign bit, and
// no other exponent does. Every model, update and module result passes
// through here, so the scan is on each device's and the server's hot path.
func FirstNonFinite(v []float32) int {
	const exp, one, sign = 0x7f800000, 0x00800000, 0x80000000
	const block = 64
	for start := 0; start < len(v); start += block {
		end := min(start+block, len(v))
		var acc uint32
		for _, x := range v[start:end] {
			acc |= math.Float32bits(x)&exp + one
		}
		if acc&sign == 0 {
			continue
		}
		for i, x := range v[start:end] {
			if math.Float32bits(x)&exp == exp {
				return start + i
			}
		}
	}
	return -1
}

// SameBits reports whether a and b hold the same float32 values bit for
// bit: NaNs compare by payload, and +0 differs from -0, as a bitwise
// reproducibility check needs.
func SameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
