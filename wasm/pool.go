package wasm

import (
	"math/bits"
	"sync"
)

// tensorPool recycles host tensor storage between calls. Every device runs
// the same module on the same shapes each round; without reuse each call
// allocates, zeroes and page-faults in its parameters and temporaries afresh
// and the garbage collector and scavenger hand them back. Storage comes in
// size classes four to an octave (at most 25% over the request), and a
// sync.Pool lets the collector drop what a quiet device no longer uses.
type tensorPool struct {
	classes [4 * 33]sync.Pool
}

// minPooled is the smallest tensor worth recycling: below it, allocation is
// cheaper than the pool.
const minPooled = 1 << 10

// classOf returns the class index and capacity that n values are stored in.
func classOf(n int) (int, int) {
	k := bits.Len(uint(n)) - 1 // 2^k <= n < 2^(k+1)
	step := 1 << (k - 2)
	q := (n + step - 1) / step // 4..8 quarters of 2^k
	if q == 8 {
		return 4 * (k + 1), 1 << (k + 1)
	}
	return 4*k + q - 4, q * step
}

// get returns storage for n values, zeroed when zero is set.
func (p *tensorPool) get(n int, zero bool) []float32 {
	if n < minPooled {
		return make([]float32, n)
	}
	c, size := classOf(n)
	if v, ok := p.classes[c].Get().(*[]float32); ok {
		b := (*v)[:n]
		if zero {
			clear(b)
		}
		return b
	}
	return make([]float32, n, size)
}

// put gives b's storage back; b must not be used afterwards.
func (p *tensorPool) put(b []float32) {
	n := cap(b)
	if n < minPooled {
		return
	}
	if c, size := classOf(n); size == n {
		b = b[:n]
		p.classes[c].Put(&b)
	}
}
