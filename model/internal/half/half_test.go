package half

import (
	"math"
	"testing"
)

// f16Reference evaluates binary16 bits arithmetically, independently of the
// bit manipulation under test.
func f16Reference(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	case 0:
		return sign * math.Ldexp(mant, -24)
	}
	return sign * math.Ldexp(1+mant/1024, exp-15)
}

func TestF16ToFloat32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := F16ToFloat32(h)
		want := f16Reference(h)
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Errorf("F16ToFloat32(%#04x) = %v, want NaN", h, got)
			}
			continue
		}
		// Compare bits so that -0 and +0 are told apart.
		if math.Float32bits(got) != math.Float32bits(float32(want)) || float64(got) != want {
			t.Errorf("F16ToFloat32(%#04x) = %v (%#08x), want %v", h, got, math.Float32bits(got), want)
		}
	}
}

func TestF16ToFloat32Known(t *testing.T) {
	for _, tc := range []struct {
		h    uint16
		want uint32 // float32 bits
	}{
		{0x0000, 0x00000000},              // +0
		{0x8000, 0x80000000},              // -0
		{0x3c00, math.Float32bits(1)},     // 1
		{0xc000, math.Float32bits(-2)},    // -2
		{0x7bff, math.Float32bits(65504)}, // largest normal
		{0x0400, 0x38800000},              // smallest normal, 2^-14
		{0x0001, 0x33800000},              // smallest subnormal, 2^-24
		{0x03ff, 0x387fc000},              // largest subnormal, 1023 * 2^-24
		{0x8001, 0xb3800000},              // negative subnormal
		{0x7c00, 0x7f800000},              // +Inf
		{0xfc00, 0xff800000},              // -Inf
	} {
		if got := math.Float32bits(F16ToFloat32(tc.h)); got != tc.want {
			t.Errorf("F16ToFloat32(%#04x) bits = %#08x, want %#08x", tc.h, got, tc.want)
		}
	}
}

func TestBF16ToFloat32(t *testing.T) {
	for _, tc := range []struct {
		b    uint16
		want float64
	}{
		{0x3f80, 1},
		{0xc040, -3},
		{0x4049, 3.140625},
		{0x0001, math.Ldexp(1, -133)},  // smallest subnormal
		{0x0080, math.Ldexp(1, -126)},  // smallest normal
		{0x7f7f, math.Ldexp(255, 120)}, // largest finite
		{0x7f80, math.Inf(1)},
		{0xff80, math.Inf(-1)},
	} {
		if got := BF16ToFloat32(tc.b); float64(got) != tc.want {
			t.Errorf("BF16ToFloat32(%#04x) = %v, want %v", tc.b, got, tc.want)
		}
	}
	if got := BF16ToFloat32(0x8000); math.Float32bits(got) != 0x80000000 {
		t.Errorf("BF16ToFloat32(0x8000) = %v, want -0", got)
	}
	if got := BF16ToFloat32(0x7fc0); !math.IsNaN(float64(got)) {
		t.Errorf("BF16ToFloat32(0x7fc0) = %v, want NaN", got)
	}
}
