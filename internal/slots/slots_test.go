package slots

import "testing"

func TestPool(t *testing.T) {
	p := New(4, 2)
	var releases []func()
	take := func(key string, limit int, want Refusal) {
		t.Helper()
		r, got := p.Acquire(key, limit)
		if got != want {
			t.Fatalf("%s (limit %d): refusal %d, want %d", key, limit, got, want)
		}
		if r != nil {
			releases = append(releases, r)
		}
	}
	take("a", 4, Granted)
	take("a", 4, Granted)
	take("a", 4, PerKey)
	take("b", 3, Granted)
	take("b", 3, Reserved) // three held: the fourth is kept for callers with limit 4
	take("c", 4, Granted)
	take("d", 4, Full)
	if s, k := p.Open(); s != 4 || k != 3 {
		t.Fatalf("open %d slots by %d principals, want 4 by 3", s, k)
	}
	for _, r := range releases {
		r()
		r() // a second release gives nothing back twice
	}
	if s, k := p.Open(); s != 0 || k != 0 {
		t.Fatalf("open %d slots by %d principals after every release, want none", s, k)
	}
	take("a", 4, Granted)
}
