// Package shamir is t-of-n Shamir secret sharing of 32-byte secrets over
// GF(2^255 − 19). Share x-coordinates are participant numbers, never 0.
package shamir

import (
	"errors"
	"fmt"
	"io"

	"github.com/fleetlearn/fleetlearn/privacy/secagg/internal/field"
)

// ErrInput reports unusable coordinates or thresholds.
var ErrInput = errors.New("shamir: invalid input")

// RandomElement draws a uniform element below p from r by rejection: 32
// bytes with the top bit cleared are at least p with probability 19/2^255.
func RandomElement(r io.Reader) (field.Element, []byte, error) {
	b := make([]byte, field.Size)
	for {
		if _, err := io.ReadFull(r, b); err != nil {
			return field.Element{}, nil, fmt.Errorf("shamir: random: %w", err)
		}
		b[31] &= 0x7f
		var e field.Element
		if e.SetBytes(b) == nil {
			return e, b, nil
		}
	}
}

// Split shares secret with threshold t, one share per x in xs (distinct and
// non-zero; at least t of them). ys[i] is the share at xs[i].
func Split(secret *field.Element, xs []uint32, t int, r io.Reader) ([]field.Element, error) {
	if t < 1 || len(xs) < t {
		return nil, fmt.Errorf("%w: threshold %d with %d shares", ErrInput, t, len(xs))
	}
	if err := checkXs(xs); err != nil {
		return nil, err
	}
	coef := make([]field.Element, t)
	coef[0] = *secret
	for i := 1; i < t; i++ {
		c, _, err := RandomElement(r)
		if err != nil {
			return nil, err
		}
		coef[i] = c
	}
	ys := make([]field.Element, len(xs))
	var x field.Element
	for i, xi := range xs {
		x.SetUint64(uint64(xi))
		y := coef[t-1]
		for j := t - 2; j >= 0; j-- {
			y.Mul(&y, &x)
			y.Add(&y, &coef[j])
		}
		ys[i] = y
	}
	for i := range coef {
		coef[i] = field.Element{}
	}
	return ys, nil
}

// Combine interpolates the polynomial through (xs[i], ys[i]) at 0. With
// exactly t shares of a t-threshold sharing it returns the secret.
func Combine(xs []uint32, ys []field.Element) (field.Element, error) {
	if len(xs) == 0 || len(xs) != len(ys) {
		return field.Element{}, fmt.Errorf("%w: %d coordinates, %d values", ErrInput, len(xs), len(ys))
	}
	if err := checkXs(xs); err != nil {
		return field.Element{}, err
	}
	n := len(xs)
	x := make([]field.Element, n)
	for i, xi := range xs {
		x[i].SetUint64(uint64(xi))
	}
	// λ_j = Π_{m≠j} x_m / (x_m − x_j); all denominators are inverted at once
	// (Montgomery's trick) so a reconstruction costs one inversion.
	num := make([]field.Element, n)
	den := make([]field.Element, n)
	var d field.Element
	for j := range n {
		num[j].SetUint64(1)
		den[j].SetUint64(1)
		for m := range n {
			if m == j {
				continue
			}
			num[j].Mul(&num[j], &x[m])
			d.Sub(&x[m], &x[j])
			den[j].Mul(&den[j], &d)
		}
	}
	prefix := make([]field.Element, n)
	var acc field.Element
	acc.SetUint64(1)
	for j := range n {
		prefix[j] = acc
		acc.Mul(&acc, &den[j])
	}
	var inv field.Element
	inv.Invert(&acc)
	var secret, term, invj field.Element
	for j := n - 1; j >= 0; j-- {
		invj.Mul(&inv, &prefix[j])
		inv.Mul(&inv, &den[j])
		term.Mul(&ys[j], &num[j])
		term.Mul(&term, &invj)
		secret.Add(&secret, &term)
	}
	return secret, nil
}

func checkXs(xs []uint32) error {
	seen := make(map[uint32]bool, len(xs))
	for _, x := range xs {
		if x == 0 || seen[x] {
			return fmt.Errorf("%w: coordinate %d zero or repeated", ErrInput, x)
		}
		seen[x] = true
	}
	return nil
}
