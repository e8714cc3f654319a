// Package field is arithmetic modulo p = 2^255 − 19 for Shamir secret
// sharing. Elements use five 51-bit limbs, so every operation runs in time
// independent of the values (the exponent of Invert is public).
package field

import (
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"math/bits"
)

// Size is the length of an encoded element.
const Size = 32

// ErrNonCanonical reports an encoding that is not a reduced element below p.
var ErrNonCanonical = errors.New("field: non-canonical encoding")

const mask51 = 1<<51 - 1

// Element is an element of GF(2^255 − 19). The zero value is 0.
type Element struct {
	l [5]uint64 // value = Σ l[i]·2^(51·i); limbs may exceed 51 bits between operations
}

// SetUint64 sets e to x and returns e.
func (e *Element) SetUint64(x uint64) *Element {
	e.l = [5]uint64{x & mask51, x >> 51, 0, 0, 0}
	return e
}

// SetBytes decodes a little-endian encoding below p. It refuses the top bit
// and values in [p, 2^255) so every element has exactly one encoding.
func (e *Element) SetBytes(b []byte) error {
	if len(b) != Size || b[31]&0x80 != 0 {
		return ErrNonCanonical
	}
	var v Element
	v.l[0] = binary.LittleEndian.Uint64(b[0:8]) & mask51
	v.l[1] = (binary.LittleEndian.Uint64(b[6:14]) >> 3) & mask51
	v.l[2] = (binary.LittleEndian.Uint64(b[12:20]) >> 6) & mask51
	v.l[3] = (binary.LittleEndian.Uint64(b[19:27]) >> 1) & mask51
	v.l[4] = (binary.LittleEndian.Uint64(b[24:32]) >> 12) & mask51
	enc := v.Bytes()
	if subtle.ConstantTimeCompare(enc[:], b) != 1 {
		return ErrNonCanonical
	}
	*e = v
	return nil
}

// Bytes returns the canonical little-endian encoding of e.
func (e *Element) Bytes() [Size]byte {
	t := *e
	t.reduce()
	var out [Size]byte
	var buf [8]byte
	for i, l := range t.l {
		off := i * 51
		binary.LittleEndian.PutUint64(buf[:], l<<uint(off%8))
		for j, bb := range buf {
			k := off/8 + j
			if k >= Size {
				break
			}
			out[k] |= bb
		}
	}
	return out
}

// Equal reports whether a and b are the same element, in constant time.
func (e *Element) Equal(b *Element) bool {
	x, y := e.Bytes(), b.Bytes()
	return subtle.ConstantTimeCompare(x[:], y[:]) == 1
}

// IsZero reports whether e is 0.
func (e *Element) IsZero() bool {
	var z Element
	return e.Equal(&z)
}

// carry brings every limb below 2^52 without changing the value mod p.
func (e *Element) carry() {
	c0, c1, c2, c3, c4 := e.l[0]>>51, e.l[1]>>51, e.l[2]>>51, e.l[3]>>51, e.l[4]>>51
	e.l[0] = e.l[0]&mask51 + c4*19
	e.l[1] = e.l[1]&mask51 + c0
	e.l[2] = e.l[2]&mask51 + c1
	e.l[3] = e.l[3]&mask51 + c2
	e.l[4] = e.l[4]&mask51 + c3
}

// reduce brings e to its canonical value in [0, p).
func (e *Element) reduce() {
	e.carry()
	// Now e < 2^255 + 2^13·19. c is 1 exactly when e ≥ p, i.e. e + 19
	// carries out of bit 255.
	c := (e.l[0] + 19) >> 51
	c = (e.l[1] + c) >> 51
	c = (e.l[2] + c) >> 51
	c = (e.l[3] + c) >> 51
	c = (e.l[4] + c) >> 51
	e.l[0] += 19 * c
	e.l[1] += e.l[0] >> 51
	e.l[0] &= mask51
	e.l[2] += e.l[1] >> 51
	e.l[1] &= mask51
	e.l[3] += e.l[2] >> 51
	e.l[2] &= mask51
	e.l[4] += e.l[3] >> 51
	e.l[3] &= mask51
	e.l[4] &= mask51
}

// Add sets e = a + b and returns e.
func (e *Element) Add(a, b *Element) *Element {
	for i := range e.l {
		e.l[i] = a.l[i] + b.l[i]
	}
	e.carry()
	return e
}

// Sub sets e = a − b and returns e.
func (e *Element) Sub(a, b *Element) *Element {
	// Adding 2p keeps every limb non-negative (inputs are carried, < 2^52).
	e.l[0] = a.l[0] + 0xFFFFFFFFFFFDA - b.l[0]
	e.l[1] = a.l[1] + 0xFFFFFFFFFFFFE - b.l[1]
	e.l[2] = a.l[2] + 0xFFFFFFFFFFFFE - b.l[2]
	e.l[3] = a.l[3] + 0xFFFFFFFFFFFFE - b.l[3]
	e.l[4] = a.l[4] + 0xFFFFFFFFFFFFE - b.l[4]
	e.carry()
	return e
}

type u128 struct{ lo, hi uint64 }

func mul(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{lo, hi}
}

func addMul(v u128, a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	lo, c := bits.Add64(lo, v.lo, 0)
	hi, _ = bits.Add64(hi, v.hi, c)
	return u128{lo, hi}
}

func shr51(v u128) uint64 { return v.hi<<13 | v.lo>>51 }

// Mul sets e = a · b and returns e.
func (e *Element) Mul(a, b *Element) *Element {
	a0, a1, a2, a3, a4 := a.l[0], a.l[1], a.l[2], a.l[3], a.l[4]
	b0, b1, b2, b3, b4 := b.l[0], b.l[1], b.l[2], b.l[3], b.l[4]
	// 2^255 ≡ 19, so limb products at or above 2^255 fold back times 19.
	a1x, a2x, a3x, a4x := a1*19, a2*19, a3*19, a4*19

	r0 := mul(a0, b0)
	r0 = addMul(r0, a1x, b4)
	r0 = addMul(r0, a2x, b3)
	r0 = addMul(r0, a3x, b2)
	r0 = addMul(r0, a4x, b1)

	r1 := mul(a0, b1)
	r1 = addMul(r1, a1, b0)
	r1 = addMul(r1, a2x, b4)
	r1 = addMul(r1, a3x, b3)
	r1 = addMul(r1, a4x, b2)

	r2 := mul(a0, b2)
	r2 = addMul(r2, a1, b1)
	r2 = addMul(r2, a2, b0)
	r2 = addMul(r2, a3x, b4)
	r2 = addMul(r2, a4x, b3)

	r3 := mul(a0, b3)
	r3 = addMul(r3, a1, b2)
	r3 = addMul(r3, a2, b1)
	r3 = addMul(r3, a3, b0)
	r3 = addMul(r3, a4x, b4)

	r4 := mul(a0, b4)
	r4 = addMul(r4, a1, b3)
	r4 = addMul(r4, a2, b2)
	r4 = addMul(r4, a3, b1)
	r4 = addMul(r4, a4, b0)

	c0, c1, c2, c3, c4 := shr51(r0), shr51(r1), shr51(r2), shr51(r3), shr51(r4)
	e.l[0] = r0.lo&mask51 + c4*19
	e.l[1] = r1.lo&mask51 + c0
	e.l[2] = r2.lo&mask51 + c1
	e.l[3] = r3.lo&mask51 + c2
	e.l[4] = r4.lo&mask51 + c3
	e.carry()
	return e
}

// Square sets e = a² and returns e.
func (e *Element) Square(a *Element) *Element { return e.Mul(a, a) }

// Invert sets e = 1/a (0 when a is 0) and returns e. It computes a^(p−2)
// with the fixed chain of 254 squarings and 11 multiplications used for
// Curve25519.
func (e *Element) Invert(a *Element) *Element {
	var z2, z9, z11, z2_5_0, z2_10_0, z2_20_0, z2_50_0, z2_100_0, t Element
	sq := func(n int) {
		for range n {
			t.Square(&t)
		}
	}
	z2.Square(a)
	t.Square(&z2)
	t.Square(&t)
	z9.Mul(&t, a)
	z11.Mul(&z9, &z2)
	t.Square(&z11)
	z2_5_0.Mul(&t, &z9) // 2^5 − 1

	t.Square(&z2_5_0)
	sq(4)
	z2_10_0.Mul(&t, &z2_5_0) // 2^10 − 1

	t.Square(&z2_10_0)
	sq(9)
	z2_20_0.Mul(&t, &z2_10_0) // 2^20 − 1

	t.Square(&z2_20_0)
	sq(19)
	t.Mul(&t, &z2_20_0) // 2^40 − 1

	t.Square(&t)
	sq(9)
	z2_50_0.Mul(&t, &z2_10_0) // 2^50 − 1

	t.Square(&z2_50_0)
	sq(49)
	z2_100_0.Mul(&t, &z2_50_0) // 2^100 − 1

	t.Square(&z2_100_0)
	sq(99)
	t.Mul(&t, &z2_100_0) // 2^200 − 1

	t.Square(&t)
	sq(49)
	t.Mul(&t, &z2_50_0) // 2^250 − 1

	sq(5)                  // 2^255 − 2^5
	return e.Mul(&t, &z11) // 2^255 − 21 = p − 2
}
