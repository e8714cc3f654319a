// Package lru bounds small caches kept in maps: when one is full, the entry
// used least recently goes.
package lru

// DropOldest deletes the entry of m whose used value is least (the least
// recently used, where used counts uses); an empty m is left alone. It
// scans m: for the few entries of a bounded cache.
func DropOldest[K comparable, V any](m map[K]V, used func(V) uint64) {
	var oldest K
	var least uint64
	found := false
	for k, v := range m {
		if u := used(v); !found || u < least {
			oldest, least, found = k, u, true
		}
	}
	if found {
		delete(m, oldest)
	}
}
