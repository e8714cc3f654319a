//go:build race

package kernel

// raceEnabled: the race detector's sync.Pool drops items at random, so
// allocation counts mean nothing under it.
const raceEnabled = true
