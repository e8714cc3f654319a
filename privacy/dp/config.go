package dp

import "fmt"

// DistributedConfig is a task's distributed DP: the parameters fixed before
// a model's size and the secure sum's modulus are known. It is a value:
// DistributedFor keeps nothing of it but copies, so changing one afterwards
// changes no mechanism built from it.
type DistributedConfig struct {
	// Mechanism is the integer noise each device adds.
	Mechanism Mechanism
	// Contributors is the least number of devices whose noise a sum must
	// hold: each adds a 1/Contributors share of the noise variance, and a
	// round with fewer must be abandoned.
	Contributors int
	// ClipNorm is C, the L2 bound on each device's update.
	ClipNorm float64
	// NoiseMultiplier is z: the noise of Contributors devices adds up to a
	// standard deviation of z·C.
	NoiseMultiplier float64
	// CountStddev, when positive, appends adaptive clipping's bit to each
	// vector (WithCount): the noise of the devices' bits sums to about this
	// standard deviation, in devices.
	CountStddev float64
}

// Validate reports whether c describes a distributed mechanism: a known
// mechanism, at least one contributor, and a finite, positive clip norm and
// noise multiplier. The error wraps ErrInvalid.
func (c DistributedConfig) Validate() error {
	if c.Mechanism != DiscreteGaussian && c.Mechanism != Skellam {
		return fmt.Errorf("%w: mechanism %v", ErrInvalid, c.Mechanism)
	}
	if c.Contributors < 1 {
		return fmt.Errorf("%w: %d noise contributors, want at least 1", ErrInvalid, c.Contributors)
	}
	if err := checkPositive("clip norm", c.ClipNorm); err != nil {
		return err
	}
	if c.CountStddev != 0 {
		if err := checkPositive("count noise stddev", c.CountStddev); err != nil {
			return err
		}
	}
	return checkPositive("noise multiplier", c.NoiseMultiplier)
}

// DistributedFor returns the mechanism c describes for dim-element updates
// summed in Z_{2^bits}. The server and every device of a round derive the
// same parameters from the same configuration.
func DistributedFor(c DistributedConfig, dim, bits int) (*Distributed, error) {
	var count DistributedOption
	if c.CountStddev > 0 {
		count = WithCount(c.CountStddev)
	}
	return NewDistributed(c.Mechanism, dim, bits, c.Contributors, c.ClipNorm, c.NoiseMultiplier, count)
}
