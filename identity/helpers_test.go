package identity_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetlearn/fleetlearn/identity"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// detRand is a deterministic byte stream for reproducible keys and ids.
type detRand struct {
	ctr   uint64
	block []byte
}

func newDetRand(seed string) *detRand {
	return &detRand{block: []byte(seed)}
}

func (r *detRand) Read(p []byte) (int, error) {
	for i := range p {
		if i%32 == 0 {
			r.ctr++
			h := sha256.Sum256(append(r.block, byte(r.ctr), byte(r.ctr>>8), byte(r.ctr>>16)))
			r.block = h[:]
		}
		p[i] = r.block[i%32]
	}
	return len(p), nil
}

var _ io.Reader = (*detRand)(nil)

func signingKey(t testing.TB, seed string) ed25519.PrivateKey {
	t.Helper()
	k, err := identity.GenerateSigningKey(identity.WithRand(newDetRand(seed)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newSeed makes an operator ("O") or account ("A") nkey seed.
func newSeed(kind string) []byte {
	var kp nkeys.KeyPair
	var err error
	if kind == "O" {
		kp, err = nkeys.CreateOperator()
	} else {
		kp, err = nkeys.CreateAccount()
	}
	if err != nil {
		panic(err)
	}
	seed, _ := kp.Seed()
	return seed
}
