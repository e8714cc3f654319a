package kernel

// Dropout with a mask that is a pure function of (seed, index): the
// gradient regenerates it instead of storing it, and the native trainer
// and the WASM sandbox draw the same mask from the same seed.

import (
	"errors"
	"fmt"
)

// splitmixGamma is SplitMix64's increment, the golden ratio in 64 bits.
const splitmixGamma = 0x9e3779b97f4a7c15

// dropoutU is value i's uniform draw in [0, 1): the top 24 bits of
// SplitMix64 output i (counting from 0) for state seed, i.e. Steele, Lea
// and Flood's mix of seed + (i+1)·0x9e3779b97f4a7c15, times 2^-24. 24 bits
// make u exact in float32.
func dropoutU(seed, i uint64) float32 {
	z := seed + (i+1)*splitmixGamma
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float32(z>>40) * 0x1p-24
}

// dropout applies the mask of (p, seed) to in, scaled by 1/(1−p), into out.
func dropout(op, inName, outName string, in, out Mat, p float32, seed uint64) error {
	if err := errors.Join(in.check(inName), out.check(outName)); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := sameShape(op, in, out); err != nil {
		return err
	}
	if !(p >= 0 && p < 1) {
		return fmt.Errorf("%w: %s: p %v not in [0, 1)", ErrArgument, op, p)
	}
	if !sameVals(in, out) && overlap(in, out) {
		return fmt.Errorf("%w: %s: %s overlaps %s", ErrShape, op, outName, inName)
	}
	iv, ov := in.Vals(), out.Vals()
	if p == 0 {
		copy(ov, iv)
		return nil
	}
	s := float32(1 / (1 - float64(p)))
	ov = ov[:len(iv)]
	for i, v := range iv {
		if dropoutU(seed, uint64(i)) >= p {
			ov[i] = v * s
		} else {
			ov[i] = 0
		}
	}
	return nil
}

// Dropout writes x with each value dropped at probability p into y: value
// i (row-major over x) is kept when u_i ≥ p, u_i ∈ [0, 1) drawn from (seed,
// i) by a stateless SplitMix64 hash (the top 24 bits of SplitMix64's output
// i for state seed, over 2^24), and a kept value is multiplied by
// s = 1/(1−p) (computed in float64, rounded to float32 once); a dropped one
// is +0 whatever x held. p must be in [0, 1); p = 0 copies x. y may be x
// itself but must not otherwise share memory with it. The WASM host charges
// 4 per value.
func Dropout(x, y Mat, p float32, seed uint64) error {
	return dropout("dropout", "x", "y", x, y, p, seed)
}

// DropoutGrad writes the gradient of Dropout with the same p and seed into
// dx: dy·s where Dropout kept the value, +0 where it dropped it. dx may be
// dy itself but must not otherwise share memory with it.
func DropoutGrad(dy, dx Mat, p float32, seed uint64) error {
	return dropout("dropout_grad", "dy", "dx", dy, dx, p, seed)
}
