package aggregator

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// sampleCollector keeps every update of a round for the coordinate-wise
// robust rules (Yin et al. 2018). Memory grows as 4·dim bytes per report.
// The rules are unweighted: an example count says nothing about whether an
// update is honest, and letting it weigh in would let one device with a
// large claimed count drag the median. Weights are still validated and
// totalled for the round's bookkeeping.
type sampleCollector struct {
	kind    Kind
	dim     int
	maxNorm float64
	trim    float64
	rows    [][]float32
	total   float64
}

func (c *sampleCollector) Add(update []float32, weight float64) error {
	if err := validate("add", update, weight, c.dim, c.maxNorm); err != nil {
		return err
	}
	if weight > MaxWeight-c.total {
		return fmt.Errorf("aggregator: add: total weight %v + %v exceeds 2^53: %w", c.total, weight, ErrWeight)
	}
	c.rows = append(c.rows, slices.Clone(update))
	c.total += weight
	return nil
}

func (c *sampleCollector) AddSum([]float64, float64, int) error {
	return fmt.Errorf("aggregator: add sum: %v needs every update, not their sum: %w", c.kind, ErrUnsupported)
}

func (c *sampleCollector) Count() int           { return len(c.rows) }
func (c *sampleCollector) TotalWeight() float64 { return c.total }

func (c *sampleCollector) Aggregate() ([]float32, error) {
	n := len(c.rows)
	if n == 0 {
		return nil, fmt.Errorf("aggregator: %v: %w", c.kind, ErrEmpty)
	}
	// k values are dropped at each end. For the median, everything but the
	// middle one or two.
	k := 0
	if c.kind == TrimmedMean {
		k = int(math.Floor(c.trim * float64(n)))
		// Unreachable while trim < 0.5 is enforced; kept so a future
		// change cannot divide by zero.
		if 2*k >= n {
			return nil, fmt.Errorf("aggregator: %v: trimming %d of %d reports per side leaves none: %w", c.kind, k, n, ErrEmpty)
		}
	}
	out := make([]float32, c.dim)
	col := make([]float32, n)
	for i := range out {
		for j, r := range c.rows {
			col[j] = r[i]
		}
		if c.kind == Median {
			out[i] = median(col)
		} else {
			out[i] = trimmedMean(col, k)
		}
	}
	return out, nil
}

// median returns the middle value of a (the mean of the two middle ones for
// even lengths), reordering a.
func median(a []float32) float32 {
	h := len(a) / 2
	selectK(a, h)
	if len(a)%2 == 1 {
		return a[h]
	}
	lo := slices.Max(a[:h]) // selectK left the h smallest in front
	return float32((float64(lo) + float64(a[h])) / 2)
}

// trimmedMean returns the mean of a without its k smallest and k largest
// values, reordering a. It needs 2k < len(a).
func trimmedMean(a []float32, k int) float32 {
	keep := a
	if k > 0 {
		m := len(a) - 2*k
		selectK(a, k) // the k smallest move to a[:k]
		keep = a[k:]
		selectK(keep, m) // the k largest move past keep[m-1]
		keep = keep[:m]
	}
	var s float64
	for _, x := range keep {
		s += float64(x)
	}
	return float32(s / float64(len(keep)))
}

// selectK reorders a so that a[k] is the value of rank k, with no larger
// value before it and no smaller one after (k == len(a) is a no-op). It is
// quickselect with a three-way partition, so duplicates cost nothing, and a
// budget of partitions after which it sorts what is left: updates come from
// devices, and a median-of-three pivot alone has inputs that make it
// quadratic.
func selectK(a []float32, k int) {
	lo, hi := 0, len(a)-1
	budget := 2 * bits.Len(uint(len(a)))
	for lo < hi {
		if budget == 0 {
			slices.Sort(a[lo : hi+1])
			return
		}
		budget--
		p := medianOf3(a[lo], a[lo+(hi-lo)/2], a[hi])
		lt, i, gt := lo, lo, hi
		for i <= gt {
			switch x := a[i]; {
			case x < p:
				a[lt], a[i] = x, a[lt]
				lt++
				i++
			case x > p:
				a[i], a[gt] = a[gt], x
				gt--
			default:
				i++
			}
		}
		// Now a[lo:lt] < p, a[lt:gt+1] == p, a[gt+1:hi+1] > p.
		switch {
		case k < lt:
			hi = lt - 1
		case k > gt:
			lo = gt + 1
		default:
			return
		}
	}
}

func medianOf3(a, b, c float32) float32 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	return max(a, b)
}
