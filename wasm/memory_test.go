package wasm

import (
	"context"
	"testing"
)

// TestMemoryHint: a call leaves the size its memory reached for the next
// call's allocator, which reserves it up front but never past the call's
// cap or the module's declared maximum, and still refuses growth past the
// cap.
func TestMemoryHint(t *testing.T) {
	s, err := New(WithEngine(EngineInterpreter))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	mod := loadExample(t, s, "mlp-go")
	if _, err := mod.Train(context.Background(), smallCall(t)); err != nil {
		t.Fatal(err)
	}
	hint := mod.e.memHint.Load()
	// The example modules declare 43 initial pages and the Go runtime grows
	// memory as it starts.
	if hint <= 43*memoryPage || hint%memoryPage != 0 {
		t.Fatalf("hint %d bytes after a call, want whole pages past the initial 43", hint)
	}

	a := &capAllocator{maxBytes: 1 << 30, hint: hint}
	m := a.Allocate(43*memoryPage, 1<<32).(*cappedMemory)
	if uint64(cap(m.buf)) != hint || len(m.Reallocate(hint)) != int(hint) || uint64(cap(m.buf)) != hint {
		t.Errorf("reserved %d bytes for a hint of %d; growing to it made %d", cap(m.buf), hint, cap(m.buf))
	}
	for _, c := range []struct{ capBytes, limit, want uint64 }{
		{hint / 2, 1 << 32, hint / 2}, // the call's cap
		{1 << 30, hint / 4, hint / 4}, // the module's maximum
	} {
		a := &capAllocator{maxBytes: c.capBytes, hint: hint}
		m := a.Allocate(memoryPage, c.limit).(*cappedMemory)
		if uint64(cap(m.buf)) != c.want {
			t.Errorf("cap %d, maximum %d: reserved %d bytes, want %d", c.capBytes, c.limit, cap(m.buf), c.want)
		}
		if m.Reallocate(c.want+memoryPage) != nil || !a.refused() {
			t.Errorf("cap %d, maximum %d: growth past %d allowed", c.capBytes, c.limit, c.want)
		}
	}
}
