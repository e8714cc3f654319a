package server

import (
	crand "crypto/rand"
)

// seedFromOS seeds the default randomness; callers that need determinism inject WithRand.
func seedFromOS() [32]byte {
	var b [32]byte
	crand.Read(b[:])
	return b
}
