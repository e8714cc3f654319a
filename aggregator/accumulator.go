package aggregator

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// Accumulator is a streaming weighted mean of updates: FedAvg's aggregate.
// It holds one float64 sum per coordinate, so its memory is O(dim) however
// many reports arrive.
//
// The sums are plain float64, not compensated (Kahan). Each term is a float32
// times an example count, and float64 carries 29 more bits than float32:
// summing n terms costs at most about n·2⁻⁵³ relative to the sum of
// magnitudes, below float32 resolution (2⁻²⁴) for any n under 2²⁹ reports.
// Kahan summation would double the memory and triple the arithmetic for no
// visible gain.
//
// An Accumulator is not safe for concurrent use; the round loop owns it.
type Accumulator struct {
	dim     int
	maxNorm float64
	sum     []float64
	total   float64
	count   int
	// open is set while a Part is being added, torn once it has added
	// values it has not counted (see Begin).
	open, torn bool
}

// NewAccumulator returns an empty accumulator for updates of dim values
// whose L2 norm must not exceed maxNorm (0: no bound).
func NewAccumulator(dim int, maxNorm float64) (*Accumulator, error) {
	opts := ValidateOptions{Dim: dim, MaxNorm: maxNorm}
	if err := opts.check(); err != nil {
		return nil, err
	}
	return &Accumulator{dim: dim, maxNorm: maxNorm, sum: make([]float64, dim)}, nil
}

// Add validates update (as Validate does) and adds weight·update. Weight is
// normally the report's example count. On error nothing changes, so a bad
// report is simply not counted.
func (a *Accumulator) Add(update []float32, weight float64) error {
	if a.open {
		return fmt.Errorf("aggregator: add: another update is being added: %w", ErrIncomplete)
	}
	if err := validate("add", update, weight, a.dim, a.maxNorm); err != nil {
		return err
	}
	if err := a.checkTotal("add", weight); err != nil {
		return err
	}
	// The kernel rounds each product before its sum, on every path, so
	// every machine sums the same bits.
	if err := kernel.AddScaled(a.sum[:len(update)], update, weight); err != nil {
		return fmt.Errorf("aggregator: add: %w", err)
	}
	a.total += weight
	a.count++
	return nil
}

// AddSum adds a pre-summed batch: weightedSum[i] = Σ wₖ·updateₖ[i] over
// count updates whose weights total totalWeight, as secure aggregation
// reveals it. The result is the same as adding the updates one by one. Each
// sum must be finite and its implied mean within float32 range; with a norm
// bound, ‖weightedSum‖ ≤ totalWeight·maxNorm must hold (the triangle
// inequality for bounded updates). On error nothing changes.
func (a *Accumulator) AddSum(weightedSum []float64, totalWeight float64, count int) error {
	if a.open {
		return fmt.Errorf("aggregator: add sum: another update is being added: %w", ErrIncomplete)
	}
	if err := checkWeight("add sum", totalWeight); err != nil {
		return err
	}
	if count <= 0 {
		return fmt.Errorf("aggregator: add sum: count %d must be positive: %w", count, ErrWeight)
	}
	if len(weightedSum) != a.dim {
		return fmt.Errorf("aggregator: add sum: %d values, want %d: %w", len(weightedSum), a.dim, ErrShape)
	}
	if err := a.checkTotal("add sum", totalWeight); err != nil {
		return err
	}
	// Bounding |sum| by totalWeight·MaxFloat32 keeps the invariant Add keeps
	// by construction: the mean always fits a float32.
	limit := totalWeight * math.MaxFloat32
	var ss float64
	for i, s := range weightedSum {
		if !(math.Abs(s) <= limit) {
			return fmt.Errorf("aggregator: add sum: weightedSum[%d] = %v: %w", i, s, ErrNonFinite)
		}
		ss += s * s
	}
	if a.maxNorm > 0 {
		// ss may overflow for huge sums; Inf then fails the bound correctly.
		if norm, bound := math.Sqrt(ss), totalWeight*a.maxNorm*(1+NormTolerance); norm > bound {
			return fmt.Errorf("aggregator: add sum: norm %.6g exceeds %.6g (total weight × bound): %w", norm, bound, ErrNormBound)
		}
	}
	for i, s := range weightedSum {
		a.sum[i] += s
	}
	a.total += totalWeight
	a.count += count
	return nil
}

func (a *Accumulator) checkTotal(op string, w float64) error {
	if w > MaxWeight-a.total { // a.total+w could round down to MaxWeight
		return fmt.Errorf("aggregator: %s: total weight %v + %v exceeds 2^53: %w", op, a.total, w, ErrWeight)
	}
	return nil
}

// Mean returns the weighted mean Σ wₖ·updateₖ / Σ wₖ as a new slice, or
// ErrEmpty before the first report.
func (a *Accumulator) Mean() ([]float32, error) {
	if a.torn {
		return nil, fmt.Errorf("aggregator: mean: an update was added in part: %w", ErrIncomplete)
	}
	if a.count == 0 {
		return nil, fmt.Errorf("aggregator: mean: %w", ErrEmpty)
	}
	out := make([]float32, a.dim)
	for i, s := range a.sum {
		out[i] = float32(s / a.total)
	}
	return out, nil
}

// MeanInPlace returns the weighted mean as Mean does, but in the
// accumulator's own memory: the float32 means overwrite the front of the
// float64 sums, so a round's aggregate costs no second model-sized buffer.
// The accumulator is spent: anything but Reset then fails with
// ErrIncomplete, and the slice is valid until Reset.
func (a *Accumulator) MeanInPlace() ([]float32, error) {
	if a.torn {
		return nil, fmt.Errorf("aggregator: mean: an update was added in part: %w", ErrIncomplete)
	}
	if a.count == 0 {
		return nil, fmt.Errorf("aggregator: mean: %w", ErrEmpty)
	}
	// Mean i lands in bytes [4i, 4i+4), inside sum i/2, which is read
	// before: ascending order reads every sum before it is overwritten.
	out := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(a.sum))), 2*len(a.sum))[:a.dim]
	for i := range a.dim {
		out[i] = float32(a.sum[i] / a.total)
	}
	a.torn, a.open = true, true // spent until Reset
	return out, nil
}

// WeightedSum copies the running sum Σ wₖ·updateₖ, from coordinate from
// on, into dst and returns how many values it copied. A partial sum kept
// apart (a shard's) reaches the collector that combines it through AddSum.
func (a *Accumulator) WeightedSum(dst []float64, from int) int {
	if from < 0 || from >= a.dim || a.torn {
		return 0
	}
	return copy(dst, a.sum[from:])
}

// Count returns the number of reports added (AddSum counts its count).
func (a *Accumulator) Count() int { return a.count }

// TotalWeight returns the sum of the weights added.
func (a *Accumulator) TotalWeight() float64 { return a.total }

// Dim returns the update length the accumulator expects.
func (a *Accumulator) Dim() int { return a.dim }

// Reset empties the accumulator for the next round, keeping its memory.
func (a *Accumulator) Reset() {
	clear(a.sum)
	a.total, a.count = 0, 0
	a.open, a.torn = false, false
}
