package wasm

import "github.com/tetratelabs/wazero/experimental"

// cappedMemory backs one instance's linear memory and refuses to grow past
// maxBytes. Refusal makes memory.grow return -1 inside the module; the flag
// lets the host report ErrMemoryLimit exactly, rather than guessing from how
// the module died.
type cappedMemory struct {
	buf      []byte
	maxBytes uint64
	refused  bool
}

func (m *cappedMemory) Reallocate(size uint64) []byte {
	if size > m.maxBytes {
		m.refused = true
		return nil
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size] // memory never shrinks, so bytes past len are still zero
		return m.buf
	}
	// Grow geometrically to keep reallocation amortised, never past the cap.
	c := min(max(size, 2*uint64(cap(m.buf))), m.maxBytes)
	nb := make([]byte, size, c)
	copy(nb, m.buf)
	m.buf = nb
	return nb
}

func (m *cappedMemory) Free() { m.buf = nil }

// capAllocator hands out one cappedMemory per instantiation and remembers it.
// hint is the size the module's memory reached in its previous call: the
// Go runtime grows memory several times while it starts, and reserving what
// the last call needed up front zeroes it once instead of allocating,
// zeroing and copying at each growth (a quarter of a call's host time on
// the example modules).
type capAllocator struct {
	maxBytes uint64
	hint     uint64
	mem      *cappedMemory
}

func (a *capAllocator) Allocate(capacity, limit uint64) experimental.LinearMemory {
	c := min(max(capacity, min(a.hint, limit)), a.maxBytes)
	a.mem = &cappedMemory{buf: make([]byte, 0, c), maxBytes: min(limit, a.maxBytes)}
	return a.mem
}

// size is the bytes of memory the instance ended with.
func (a *capAllocator) size() uint64 {
	if a.mem == nil {
		return 0
	}
	return uint64(len(a.mem.buf))
}

func (a *capAllocator) refused() bool { return a.mem != nil && a.mem.refused }
