package dp_test

import (
	"crypto/aes"
	"crypto/cipher"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// zeroStream is a deterministic reader for tests: AES-CTR of zeros under a
// key derived from seed.
type zeroStream struct{ s cipher.Stream }

func (z zeroStream) Read(p []byte) (int, error) {
	clear(p)
	z.s.XORKeyStream(p, p)
	return len(p), nil
}

func testSource(t testing.TB, seed byte) *dp.Source {
	t.Helper()
	key := make([]byte, 32)
	key[31] = seed
	b, _ := aes.NewCipher(key)
	src, err := dp.NewSource(zeroStream{cipher.NewCTR(b, make([]byte, 16))})
	if err != nil {
		t.Fatal(err)
	}
	return src
}
