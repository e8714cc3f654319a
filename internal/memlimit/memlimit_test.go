package memlimit_test

import (
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/memlimit"
)

// recorder stands in for debug.SetMemoryLimit.
type recorder struct{ limit int64 }

func (r *recorder) set(n int64) int64 {
	prev := r.limit
	if n >= 0 {
		r.limit = n
	}
	return prev
}

func TestHoldsSetTheLimit(t *testing.T) {
	r := &recorder{limit: math.MaxInt64}
	l := memlimit.New(100, memlimit.WithSetter(r.set), memlimit.WithLive(func() int64 { return 0 }))
	small := l.Hold(99)
	if r.limit != math.MaxInt64 {
		t.Fatalf("holds under the headroom set the limit to %d", r.limit)
	}
	small()
	a := l.Hold(1000)
	if r.limit != 1100 {
		t.Fatalf("one hold of 1000: limit %d, want 1100", r.limit)
	}
	b := l.Hold(500)
	if r.limit != 1600 || l.Held() != 1500 {
		t.Fatalf("two holds: limit %d held %d, want 1600 and 1500", r.limit, l.Held())
	}
	a()
	a() // a second release changes nothing
	if r.limit != 600 {
		t.Fatalf("after releasing 1000: limit %d, want 600", r.limit)
	}
	b()
	if r.limit != math.MaxInt64 {
		t.Fatalf("nothing held: limit %d, want the runtime's own (no limit)", r.limit)
	}
}

// TestOutsideLimitNeverRaised: a limit set from outside (GOMEMLIMIT) bounds
// what the holds may set.
func TestOutsideLimitNeverRaised(t *testing.T) {
	r := &recorder{limit: 800}
	l := memlimit.New(100, memlimit.WithSetter(r.set), memlimit.WithLive(func() int64 { return 0 }))
	release := l.Hold(500)
	if r.limit != 600 {
		t.Fatalf("hold under the outside limit: %d, want 600", r.limit)
	}
	big := l.Hold(5000)
	if r.limit != 800 {
		t.Fatalf("holds over the outside limit: %d, want it kept at 800", r.limit)
	}
	big()
	release()
	if r.limit != 800 {
		t.Fatalf("released: %d, want 800 back", r.limit)
	}
}

// TestOtherLiveCounted: what is live besides the holds raises the limit, so
// that the collector never chases memory that is in use.
func TestOtherLiveCounted(t *testing.T) {
	r := &recorder{limit: math.MaxInt64}
	live := int64(0)
	l := memlimit.New(100, memlimit.WithSetter(r.set), memlimit.WithLive(func() int64 { return live }))
	live = 3000 // 1000 of the hold below, 2000 of everything else
	release := l.Hold(1000)
	if r.limit != 3100 {
		t.Fatalf("limit %d, want 1000 held + 2000 other + 100", r.limit)
	}
	live = 5000 // caches grew
	l.Refresh()
	if r.limit != 5100 {
		t.Fatalf("after the live heap grew: limit %d, want 5100", r.limit)
	}
	release()
	l.Refresh() // nothing held: the runtime's own limit stays
	if r.limit != math.MaxInt64 {
		t.Fatalf("refresh with nothing held set %d", r.limit)
	}
}

func TestNilHoldsNothing(t *testing.T) {
	var l *memlimit.Limit
	l.Hold(1 << 30)()
	if l.Held() != 0 {
		t.Fatal("nil limit holds bytes")
	}
	if memlimit.New(0) != nil {
		t.Fatal("headroom 0 should leave the runtime alone")
	}
}
