package lru_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/lru"
)

func TestDropOldest(t *testing.T) {
	m := map[string]uint64{"a": 7, "b": 3, "c": 9}
	used := func(u uint64) uint64 { return u }
	lru.DropOldest(m, used)
	if got := slices.Sorted(maps.Keys(m)); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("left %v, want a and c", got)
	}
	lru.DropOldest(m, used)
	lru.DropOldest(m, used)
	lru.DropOldest(m, used) // empty: nothing to drop
	if len(m) != 0 {
		t.Fatalf("left %v", m)
	}
}

func ExampleDropOldest() {
	type entry struct{ used uint64 }
	cache := map[string]*entry{"round-1": {used: 4}, "round-2": {used: 9}}
	lru.DropOldest(cache, func(e *entry) uint64 { return e.used })
	fmt.Println(slices.Sorted(maps.Keys(cache)))
	// Output: [round-2]
}
