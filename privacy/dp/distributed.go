package dp

import (
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/privacy/dp/internal/hadamard"
	"github.com/fleetlearn/fleetlearn/privacy/dp/internal/rdp"
	"github.com/fleetlearn/fleetlearn/privacy/dp/internal/sample"
)

// Mechanism is the integer noise a device adds for distributed DP.
type Mechanism int

const (
	// DiscreteGaussian is the distributed discrete Gaussian (Kairouz, Liu,
	// Steinke, ICML 2021): each device adds N_Z(0, σ_local²).
	DiscreteGaussian Mechanism = iota + 1
	// Skellam is the Skellam mechanism (Agarwal, Kairouz, Liu, NeurIPS
	// 2021): each device adds Poisson(σ_local²/2) − Poisson(σ_local²/2).
	Skellam
)

func (m Mechanism) String() string {
	switch m {
	case DiscreteGaussian:
		return "discrete-gaussian"
	case Skellam:
		return "skellam"
	}
	return fmt.Sprintf("Mechanism(%d)", int(m))
}

// Defaults for distributed DP.
const (
	// DefaultBeta is the conditional rounding parameter β of the DDG paper
	// and TFF: rounding is retried until the rounded norm meets a bound that
	// holds with probability at least 1 − β.
	DefaultBeta = 0.60653065971263342 // e^{−1/2}
	// DefaultKStddevs is how many standard deviations of the aggregate the
	// scale heuristic fits inside the modulus.
	DefaultKStddevs = 4.0
	// maxRoundingTries bounds conditional rounding; with β ≤ e^{−1/2} the
	// expected number of tries is below 2.6.
	maxRoundingTries = 1000
	maxDim           = 1 << 26
)

type distConfig struct {
	beta, k, scale float64
	count          float64
}

// DistributedOption configures NewDistributed.
type DistributedOption func(*distConfig)

// WithBeta sets the conditional rounding parameter β ∈ [0, 1); 0 turns
// conditioning off and uses the looser norm bound C·s + √d.
func WithBeta(beta float64) DistributedOption { return func(c *distConfig) { c.beta = beta } }

// WithKStddevs sets the number of aggregate standard deviations the scale
// heuristic keeps inside the modulus.
func WithKStddevs(k float64) DistributedOption { return func(c *distConfig) { c.k = k } }

// WithScale sets the scale factor directly instead of by the heuristic.
func WithScale(s float64) DistributedOption { return func(c *distConfig) { c.scale = s } }

// WithCount appends one coordinate to every encoded vector for adaptive
// clipping's bit (Andrew et al. 2021), noised so that the decoded count of
// unclipped devices has noise of standard deviation countStddev (σ_b). A
// device encodes its bit b as h·(2b − 1), for the integer
// h = ⌈2√n/σ_b⌉ (n the contributors), and adds integer noise of variance
// (2hσ_b)²/n, at least 16, so that the sum of n devices' noise is as
// close to a continuous Gaussian as the update's (τ of Epsilon negligible).
// The coordinate is a second mechanism of the same kind, sensitivity h,
// and Epsilon composes the two.
func WithCount(countStddev float64) DistributedOption {
	return func(c *distConfig) { c.count = countStddev }
}

// Distributed holds the parameters of one distributed DP configuration:
// the pipeline of TFF's DistributedDpSumFactory. A device flattens its
// update, rotates it with a randomized Hadamard transform, clips it to L2
// norm C, scales it by s and rounds it to integers with conditional
// randomized rounding, adds integer noise of variance σ_local² (in scaled
// units; σ_local = s·z·C/√n), and reduces it mod 2^bits. Secure aggregation
// sums the devices' vectors mod 2^bits; the server maps the sum back to
// signed integers, unscales and unrotates it.
//
// The noise of n devices adds up to the central noise z·C, so the release
// is private as long as at least n devices (the minimum noise
// contributors) are in the sum; fewer, and the round must be abandoned.
type Distributed struct {
	mech        Mechanism
	dim, padded int
	bits        int
	n           int
	clip, z     float64
	beta, k     float64
	scale       float64
	localVar    float64 // σ_local², scaled units
	normBound   float64 // L2 bound after rounding, scaled units
	mask, half  uint64
	// countHalf is h of WithCount: a bit encodes as ±h; 0 without a
	// count. countVar is the count coordinate's σ_local², countStddev σ_b.
	countHalf             int64
	countVar, countStddev float64
}

// NewDistributed returns the parameters for dim-element updates summed by
// secure aggregation over Z_{2^bits} (bits ≤ 32, the width of SecAgg's
// words), with noise calibrated for at least clients devices, clip norm C
// and central noise multiplier z.
func NewDistributed(m Mechanism, dim, bits, clients int, clipNorm, z float64, opts ...DistributedOption) (*Distributed, error) {
	c := distConfig{beta: DefaultBeta, k: DefaultKStddevs}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	bad := func(f string, a ...any) (*Distributed, error) {
		return nil, fmt.Errorf("dp: distributed: %w: "+f, append([]any{ErrInvalid}, a...)...)
	}
	if err := (DistributedConfig{Mechanism: m, Contributors: clients, ClipNorm: clipNorm, NoiseMultiplier: z}).Validate(); err != nil {
		return nil, fmt.Errorf("dp: distributed: %w", err)
	}
	switch {
	case dim < 1 || dim > maxDim:
		return bad("dimension %d, want 1..%d", dim, maxDim)
	case bits < 2 || bits > 32:
		return bad("bits %d, want 2..32", bits)
	case !(c.beta >= 0 && c.beta < 1):
		return bad("beta %v, want [0, 1)", c.beta)
	case !(c.k > 0) || math.IsInf(c.k, 0):
		return bad("k stddevs %v", c.k)
	case c.scale != 0 && (!(c.scale > 0) || math.IsInf(c.scale, 0)):
		return bad("scale %v", c.scale)
	case c.count != 0 && (!(c.count > 0) || math.IsInf(c.count, 0)):
		return bad("count stddev %v", c.count)
	}
	d := &Distributed{mech: m, dim: dim, padded: hadamard.PaddedDim(dim), bits: bits, n: clients,
		clip: clipNorm, z: z, beta: c.beta, k: c.k, scale: c.scale,
		mask: 1<<bits - 1, half: 1 << (bits - 1)}
	n := float64(clients)
	if d.scale == 0 {
		// TFF's heuristic (DDG paper §4.4): fit k standard deviations of a
		// coordinate of the aggregate, (s·C·n)²/d signal (worst case, all
		// devices aligned) + n/4 rounding + (s·z·C)² noise, in 2^bits.
		room := math.Ldexp(1, 2*bits) - n*c.k*c.k
		if !(room > 0) {
			return bad("%d bits cannot hold %d clients at %v standard deviations", bits, clients, c.k)
		}
		d.scale = math.Sqrt(room) / (2 * c.k * math.Sqrt(clipNorm*clipNorm*n*n/float64(d.padded)+z*z*clipNorm*clipNorm))
	}
	local := d.scale * z * clipNorm / math.Sqrt(n)
	d.localVar = local * local
	if math.IsInf(d.localVar, 0) || d.localVar > 1<<62 {
		return bad("local noise variance %v too large for integer noise", d.localVar)
	}
	d.normBound = roundedNormBound(d.scale*clipNorm, c.beta, d.padded)
	if c.count > 0 {
		h := math.Ceil(2 * math.Sqrt(n) / c.count)
		d.countHalf, d.countStddev = int64(h), c.count
		d.countVar = 4 * h * h * c.count * c.count / n
		if !d.CountFits(clients) {
			return bad("%d bits cannot hold the clipping bits of %d clients with count noise %v", bits, clients, c.count)
		}
	}
	return d, nil
}

// CountFits reports whether the count coordinate of a sum of devices
// vectors stays within the modulus: their bits and k standard deviations
// of its noise. A round of more devices than fit must not be summed.
func (d *Distributed) CountFits(devices int) bool {
	if d.countHalf == 0 {
		return true
	}
	h := float64(d.countHalf)
	return float64(devices)*h+d.k*2*h*d.countStddev < float64(d.half)
}

// Counts reports whether encoded vectors carry adaptive clipping's bit.
func (d *Distributed) Counts() bool { return d.countHalf > 0 }

// CountStddev returns the standard deviation of the noise on the decoded
// count of unclipped devices (WithCount); 0 without a count.
func (d *Distributed) CountStddev() float64 {
	return d.countStddev
}

// EncodedDim returns the length of encoded vectors: PaddedDim, and one
// more with a count.
func (d *Distributed) EncodedDim() int {
	if d.countHalf > 0 {
		return d.padded + 1
	}
	return d.padded
}

// roundedNormBound is the L2 norm bound of a vector of norm c in d
// dimensions after randomized rounding to the integers, conditional on an
// event of probability ≥ 1 − β (DDG paper Theorem 1; TFF's
// rounded_l2_norm_bound).
func roundedNormBound(c, beta float64, d int) float64 {
	fd := float64(d)
	b1 := c + math.Sqrt(fd)
	if beta == 0 {
		return b1
	}
	b2 := c*c + fd/4 + math.Sqrt(2*math.Log(1/beta))*(c+math.Sqrt(fd)/2)
	return min(b1, math.Sqrt(b2))
}

// Scale returns the scale factor s applied before rounding.
func (d *Distributed) Scale() float64 { return d.scale }

// PaddedDim returns the length of the rotated update: dim rounded up to a
// power of two for the Hadamard transform. Encoded vectors have EncodedDim
// values.
func (d *Distributed) PaddedDim() int { return d.padded }

// LocalStddev returns σ_local, each device's noise standard deviation in
// scaled integer units.
func (d *Distributed) LocalStddev() float64 { return math.Sqrt(d.localVar) }

// NormBound returns the L2 sensitivity after scaling and conditional
// rounding, in scaled units; accounting uses it instead of s·C.
func (d *Distributed) NormBound() float64 { return d.normBound }

// WrapProbability returns the heuristic probability that one coordinate of
// the aggregate of n devices leaves [−2^(bits−1), 2^(bits−1)) and wraps
// around, and the union bound for any coordinate of the vector. It models
// a coordinate as Gaussian with the variance the scale heuristic uses:
// (s·C·n)²/d for the signal (exact in variance for n identical rotated
// vectors, an upper bound otherwise), n/4 for rounding and n·σ_local² for
// the noise.
func (d *Distributed) WrapProbability() (perCoordinate, perVector float64) {
	n := float64(d.n)
	sc := d.scale * d.clip
	v := sc*sc*n*n/float64(d.padded) + n/4 + n*d.localVar
	p := math.Erfc(float64(d.half) / math.Sqrt(2*v))
	return p, min(1, p*float64(d.padded))
}

// Epsilon returns the ε after rounds releases under add-or-remove
// adjacency, by the RDP bounds of the mechanism's paper with the inflated
// norm bound (DDG: Kairouz et al. Theorem 1 and Proposition 14; Skellam:
// Agarwal et al. Theorem 3.5), integer orders 2…128 and 256, and the
// conversion of EpsilonFromRDP. No amplification by sampling is claimed:
// a device cannot check how the server picked the cohort.
func (d *Distributed) Epsilon(rounds int, delta float64) (float64, error) {
	if rounds < 1 || rounds > maxSteps {
		return 0, fmt.Errorf("dp: distributed epsilon: %w: rounds %d", ErrInvalid, rounds)
	}
	if err := checkDelta(delta); err != nil {
		return 0, fmt.Errorf("dp: distributed epsilon: %w", err)
	}
	var orders []float64
	for a := 2; a <= 128; a++ {
		orders = append(orders, float64(a))
	}
	orders = append(orders, 256)
	curve := make([]float64, len(orders))
	l2 := d.normBound
	l1 := l2 * min(math.Sqrt(float64(d.padded)), l2)
	for i, a := range orders {
		e := d.rdp(a, l2, l1, float64(d.padded), d.localVar)
		if h := float64(d.countHalf); h > 0 {
			// Adding or removing a device moves the count by h.
			e += d.rdp(a, h, h, 1, d.countVar)
		}
		curve[i] = float64(rounds) * e
	}
	eps, _ := rdp.Epsilon(orders, curve, delta)
	return eps, nil
}

// rdp is the order-a RDP of one sum of n devices' noise of variance
// localVar each over dim coordinates, for sensitivities l2 and l1.
func (d *Distributed) rdp(a, l2, l1, dim, localVar float64) float64 {
	n := float64(d.n)
	switch d.mech {
	case DiscreteGaussian:
		// τ bounds how far a sum of n discrete Gaussians is from one.
		tau := 0.0
		for k := 1; k < d.n; k++ {
			fk := float64(k)
			tau += math.Exp(-2 * math.Pi * math.Pi * localVar * fk / (fk + 1))
		}
		tau *= 10
		sd := math.Sqrt(n * localVar)
		s2, s1 := l2/sd, l1/sd
		return min(a/2*s2*s2+tau*dim,
			a/2*(s2*s2+2*s1*tau+tau*tau*dim),
			a/2*(s2+math.Sqrt(dim)*tau)*(s2+math.Sqrt(dim)*tau))
	case Skellam:
		mu := n * localVar
		return a*l2*l2/(2*mu) + min(((2*a-1)*l2*l2+6*l1)/(4*mu*mu), 3*l1/(2*mu))
	}
	return math.Inf(1)
}

// Encoder turns one device's float update into its secure aggregation
// input. It is not safe for concurrent use.
type Encoder struct {
	d     *Distributed
	signs []float64
	src   *Source
	dg    *sample.DiscreteGaussian
	buf   []float64
	ints  []int64
	cdg   *sample.DiscreteGaussian // the count coordinate's
}

// NewEncoder returns a device's encoder. seed fixes the round's rotation
// and must be the same for every device and the server; src supplies the
// rounding and noise randomness and must be the device's own.
func (d *Distributed) NewEncoder(seed [32]byte, src *Source) (*Encoder, error) {
	if src == nil {
		return nil, fmt.Errorf("dp: encoder: %w: nil source", ErrInvalid)
	}
	e := &Encoder{d: d, signs: hadamard.Signs(seed, d.padded), src: src,
		buf: make([]float64, d.padded), ints: make([]int64, d.padded)}
	if d.mech == DiscreteGaussian {
		e.dg = sample.NewDiscreteGaussian(d.localVar)
		if d.countHalf > 0 {
			e.cdg = sample.NewDiscreteGaussian(d.countVar)
		}
	}
	return e, nil
}

// Encode rotates, clips, scales, rounds and noises update and returns it
// mod 2^bits, PaddedDim values. A mechanism with a count (WithCount)
// needs EncodeCounted.
func (e *Encoder) Encode(update []float32) ([]uint32, error) {
	if e.d.countHalf > 0 {
		return nil, fmt.Errorf("dp: encode: %w: the mechanism counts clipping bits; use EncodeCounted", ErrInvalid)
	}
	return e.encode(update)
}

// EncodeCounted is Encode for a mechanism with a count: it appends the bit
// of the clip it applied (whether the update's norm was at most the clip
// norm, so that it was left as it was), with its own noise; EncodedDim
// values.
func (e *Encoder) EncodeCounted(update []float32) ([]uint32, error) {
	if e.d.countHalf == 0 {
		return nil, fmt.Errorf("dp: encode: %w: the mechanism has no count", ErrInvalid)
	}
	return e.encode(update)
}

func (e *Encoder) encode(update []float32) ([]uint32, error) {
	v, unclipped, err := e.encodeInts(update)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(v), e.d.EncodedDim())
	for i, x := range v {
		out[i] = uint32(uint64(x) & e.d.mask)
	}
	if h := e.d.countHalf; h > 0 {
		c := -h
		if unclipped {
			c = h
		}
		if e.cdg != nil {
			c += e.cdg.Sample(e.src)
		} else {
			c += sample.Skellam(e.src, e.d.countVar)
		}
		out = append(out, uint32(uint64(c)&e.d.mask))
	}
	return out, nil
}

// noise draws one coordinate's integer noise.
func (e *Encoder) noise() int64 {
	if e.d.mech == DiscreteGaussian {
		return e.dg.Sample(e.src)
	}
	return sample.Skellam(e.src, e.d.localVar)
}

// encodeInts is Encode before the modular reduction; unclipped reports
// that the clip left the update as it was.
func (e *Encoder) encodeInts(update []float32) (_ []int64, unclipped bool, _ error) {
	d := e.d
	if len(update) != d.dim {
		return nil, false, fmt.Errorf("dp: encode: %w: %d elements, want %d", ErrInvalid, len(update), d.dim)
	}
	x := e.buf
	for i, u := range update {
		f := float64(u)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, false, fmt.Errorf("dp: encode: %w: element %d is %v", ErrInvalid, i, f)
		}
		x[i] = f
	}
	clear(x[len(update):])
	hadamard.Rotate(x, e.signs)
	var norm float64
	for _, f := range x {
		norm += f * f
	}
	norm = math.Sqrt(norm)
	f := d.scale
	unclipped = norm <= d.clip
	if !unclipped {
		f *= d.clip / norm
	}
	for i := range x {
		x[i] *= f
	}
	if err := e.round(x); err != nil {
		return nil, false, err
	}
	for i := range e.ints {
		e.ints[i] += e.noise()
	}
	return e.ints, unclipped, nil
}

// round applies conditional randomized rounding: each coordinate goes to
// the integer above with probability equal to its fractional part, and the
// draw is repeated until the rounded vector's norm is within the bound.
func (e *Encoder) round(x []float64) error {
	bound2 := e.d.normBound * e.d.normBound
	for range maxRoundingTries {
		var n2 float64
		for i, v := range x {
			fl := math.Floor(v)
			r := int64(fl)
			if e.src.Float64() < v-fl {
				r++
			}
			e.ints[i] = r
			n2 += float64(r) * float64(r)
		}
		if e.d.beta == 0 || n2 <= bound2 {
			return nil
		}
	}
	return fmt.Errorf("dp: encode: %w after %d tries", ErrRounding, maxRoundingTries)
}

// Decoder maps a secure sum back to the float sum of clipped updates plus
// noise. It is safe for concurrent use.
type Decoder struct {
	d     *Distributed
	signs []float64
}

// NewDecoder returns the server's decoder for the round whose rotation seed
// is seed.
func (d *Distributed) NewDecoder(seed [32]byte) *Decoder {
	return &Decoder{d: d, signs: hadamard.Signs(seed, d.padded)}
}

// Decode maps sum, the element-wise sum mod 2^bits of the devices' encoded
// vectors, to signed values, unscales and unrotates them and returns the
// first dim elements. A mechanism with a count needs DecodeCounted.
func (dec *Decoder) Decode(sum []uint32) ([]float64, error) {
	if dec.d.countHalf > 0 {
		return nil, fmt.Errorf("dp: decode: %w: the mechanism counts clipping bits; use DecodeCounted", ErrInvalid)
	}
	return dec.decode(sum)
}

// DecodeCounted is Decode for a mechanism with a count, from the sum of
// devices vectors (CountFits(devices)): it also returns the noised number
// of devices whose bit was set (its noise of standard deviation
// CountStddev; not clamped, so it may fall outside [0, devices]).
func (dec *Decoder) DecodeCounted(sum []uint32, devices int) ([]float64, float64, error) {
	d := dec.d
	if d.countHalf == 0 {
		return nil, 0, fmt.Errorf("dp: decode: %w: the mechanism has no count", ErrInvalid)
	}
	if devices < 1 || !d.CountFits(devices) {
		return nil, 0, fmt.Errorf("dp: decode: %w: the count of %d devices does not fit in %d bits", ErrInvalid, devices, d.bits)
	}
	x, err := dec.decode(sum)
	if err != nil {
		return nil, 0, err
	}
	// Σ h·(2bᵢ − 1) + noise = h·(2·count − devices) + noise.
	s := float64(d.signed(sum[d.padded]))
	return x, (s/float64(d.countHalf) + float64(devices)) / 2, nil
}

func (d *Distributed) signed(v uint32) int64 {
	s := int64(v)
	if uint64(v) >= d.half {
		s -= int64(d.mask) + 1
	}
	return s
}

func (dec *Decoder) decode(sum []uint32) ([]float64, error) {
	d := dec.d
	if len(sum) != d.EncodedDim() {
		return nil, fmt.Errorf("dp: decode: %w: %d values, want %d", ErrInvalid, len(sum), d.EncodedDim())
	}
	x := make([]float64, d.padded)
	for i, v := range sum {
		if uint64(v) > d.mask {
			return nil, fmt.Errorf("dp: decode: %w: value %d = %d is not below 2^%d", ErrInvalid, i, v, d.bits)
		}
		if i < d.padded {
			x[i] = float64(d.signed(v)) / d.scale
		}
	}
	hadamard.Unrotate(x, dec.signs)
	return x[:d.dim], nil
}
