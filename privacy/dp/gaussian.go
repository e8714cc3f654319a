package dp

import (
	"fmt"
	"math"
)

// AddCentralNoise adds N(0, (z·C)²) to every element of sum, the sum of
// updates each clipped to L2 norm C: the Gaussian mechanism of DP-FedAvg
// (McMahan, Ramage, Talwar, Zhang, ICLR 2018). One device changes the sum
// by at most C, so the release has noise multiplier z; account for it with
// Epsilon or a Budget, with q the device sampling rate.
//
// The noise is floating-point Gaussian. Floating-point samplers leak
// through the gaps in their output (Mironov 2012 for Laplace; the Gaussian
// is similar); the distributed mechanisms, which add integer noise, do not.
func AddCentralNoise(sum []float64, clipNorm, z float64, src *Source) error {
	if err := checkNoise(clipNorm, z, src); err != nil {
		return fmt.Errorf("dp: central noise: %w", err)
	}
	for i, v := range sum {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("dp: central noise: %w: element %d is %v", ErrInvalid, i, v)
		}
	}
	std := z * clipNorm
	for i := range sum {
		sum[i] += std * src.Normal()
	}
	return nil
}

// AddLocalNoise clips update in place to L2 norm C and adds N(0, (z·C)²)
// to each element, so the device releases an update that is private on its
// own, against the server and everyone else. For the same z each device
// gets the guarantee central DP gives it (without amplification by
// sampling, which the device cannot verify), but the aggregate of n such
// updates carries n times the central noise variance: local DP with useful
// ε costs far more accuracy than central or distributed DP.
func AddLocalNoise(update []float32, clipNorm, z float64, src *Source) error {
	if err := checkNoise(clipNorm, z, src); err != nil {
		return fmt.Errorf("dp: local noise: %w", err)
	}
	if _, err := ClipL2(update, clipNorm); err != nil {
		return fmt.Errorf("dp: local noise: %w", err)
	}
	std := z * clipNorm
	for i := range update {
		update[i] = float32(float64(update[i]) + std*src.Normal())
	}
	return nil
}

func checkNoise(clipNorm, z float64, src *Source) error {
	if err := checkPositive("clip norm", clipNorm); err != nil {
		return err
	}
	if err := checkPositive("noise multiplier", z); err != nil {
		return err
	}
	if src == nil {
		return fmt.Errorf("%w: nil source", ErrInvalid)
	}
	return nil
}
