// Package hadamard is the randomized Hadamard rotation of distributed DP:
// x ↦ H·D·x/√n with D a diagonal of random signs and H the Walsh–Hadamard
// matrix, n a power of two. The rotation is orthonormal, so it keeps L2
// norms, and it spreads any vector's mass evenly over the coordinates,
// which is what lets a few bits per coordinate hold the sum (Kairouz, Liu,
// Steinke 2021, Section 4.2).
package hadamard

import (
	"crypto/aes"
	"crypto/cipher"
	"math"
)

// PaddedDim returns the smallest power of two ≥ d.
func PaddedDim(d int) int {
	n := 1
	for n < d {
		n <<= 1
	}
	return n
}

// Signs derives n signs (±1) from a 32-byte seed with AES-256-CTR, so that
// every party holding the seed gets the same rotation.
func Signs(seed [32]byte, n int) []float64 {
	block, err := aes.NewCipher(seed[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	var iv [aes.BlockSize]byte
	stream := cipher.NewCTR(block, iv[:])
	buf := make([]byte, (n+7)/8)
	stream.XORKeyStream(buf, buf)
	s := make([]float64, n)
	for i := range s {
		if buf[i/8]>>(i%8)&1 == 1 {
			s[i] = -1
		} else {
			s[i] = 1
		}
	}
	return s
}

// fwht applies the unnormalised Walsh–Hadamard transform in place;
// len(x) is a power of two.
func fwht(x []float64) {
	n := len(x)
	for h := 1; h < n; h <<= 1 {
		for i := 0; i < n; i += h << 1 {
			a, b := x[i:i+h], x[i+h:i+2*h]
			for j := range a {
				u, v := a[j], b[j]
				a[j], b[j] = u+v, u-v
			}
		}
	}
}

// Rotate sets x to H·D·x/√n in place; len(x) == len(signs), a power of two.
func Rotate(x, signs []float64) {
	for i := range x {
		x[i] *= signs[i]
	}
	fwht(x)
	f := 1 / math.Sqrt(float64(len(x)))
	for i := range x {
		x[i] *= f
	}
}

// Unrotate inverts Rotate in place: x ↦ D·H·x/√n, since H is symmetric and
// H·H = n·I.
func Unrotate(x, signs []float64) {
	fwht(x)
	f := 1 / math.Sqrt(float64(len(x)))
	for i := range x {
		x[i] *= f * signs[i]
	}
}
