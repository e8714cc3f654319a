// Package slots shares a bounded number of slots (streams, uploads) among
// principals: no principal holds more than its own share, and no more are
// held in all than the caller's limit, so one principal cannot take them all.
package slots

import "sync"

// Refusal says which bound kept a slot from being taken.
type Refusal int

const (
	// Granted: the slot was taken.
	Granted Refusal = iota
	// PerKey: the principal already holds its share.
	PerKey
	// Full: every slot is held.
	Full
	// Reserved: the slots left are above the caller's limit, kept for others.
	Reserved
)

// Pool counts the slots held, per principal and in all.
type Pool struct {
	max, perKey int

	mu    sync.Mutex
	total int
	held  map[string]int // by principal; no zero entries
}

// New returns a pool of max slots, at most perKey of them per principal.
func New(max, perKey int) *Pool {
	return &Pool{max: max, perKey: perKey, held: map[string]int{}}
}

// Acquire takes a slot for key unless key holds its share, every slot is
// held, or limit (at most the pool's size; a caller kept out of a reserve
// passes less) are. release gives the slot back; calling it again does
// nothing.
func (p *Pool) Acquire(key string, limit int) (release func(), refused Refusal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.held[key] >= p.perKey:
		return nil, PerKey
	case p.total >= p.max:
		return nil, Full
	case p.total >= limit:
		return nil, Reserved
	}
	p.total++
	p.held[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.total--
			if p.held[key]--; p.held[key] == 0 {
				delete(p.held, key)
			}
		})
	}, Granted
}

// Open is how many slots are held in all, and by how many principals.
func (p *Pool) Open() (slots, principals int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total, len(p.held)
}
