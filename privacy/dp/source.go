package dp

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Source is the randomness behind all privacy noise: an AES-256-CTR
// keystream whose key and counter block are read once from a
// cryptographically secure reader. Reading 48 bytes per source instead of
// per sample keeps noise generation fast while every output bit stays as
// unpredictable as the seed. A Source is not safe for concurrent use; give
// each goroutine its own.
type Source struct {
	stream cipher.Stream
	buf    [4096]byte
	pos    int
	spare  float64
	has    bool
}

// NewSource seeds a Source from r, or from crypto/rand when r is nil.
// Inject a deterministic reader only in tests.
func NewSource(r io.Reader) (*Source, error) {
	if r == nil {
		r = rand.Reader
	}
	var seed [48]byte
	if _, err := io.ReadFull(r, seed[:]); err != nil {
		return nil, fmt.Errorf("dp: source: %w: reading seed: %w", ErrInvalid, err)
	}
	return newSourceFromSeed(seed[:])
}

// newSourceFromSeed keys a Source with seed's 32 bytes of AES-256 key and
// 16 of counter block.
func newSourceFromSeed(seed []byte) (*Source, error) {
	block, err := aes.NewCipher(seed[:32])
	if err != nil {
		return nil, fmt.Errorf("dp: source: %w", err)
	}
	s := &Source{stream: cipher.NewCTR(block, seed[32:])}
	s.pos = len(s.buf)
	return s, nil
}

// Uint64 returns 64 uniform bits.
func (s *Source) Uint64() uint64 {
	if s.pos+8 > len(s.buf) {
		clear(s.buf[:])
		s.stream.XORKeyStream(s.buf[:], s.buf[:])
		s.pos = 0
	}
	v := binary.LittleEndian.Uint64(s.buf[s.pos:])
	s.pos += 8
	return v
}

// Float64 returns a uniform value in [0, 1) with 53 random bits.
func (s *Source) Float64() float64 {
	return float64(s.Uint64()>>11) / (1 << 53)
}

// Normal returns a standard normal variate by the Box–Muller transform of
// two 53-bit uniforms, the first taken in (0, 1] so the logarithm is
// finite.
func (s *Source) Normal() float64 {
	if s.has {
		s.has = false
		return s.spare
	}
	u1 := float64(s.Uint64()>>11+1) / (1 << 53)
	u2 := s.Float64()
	r := math.Sqrt(-2 * math.Log(u1))
	sin, cos := math.Sincos(2 * math.Pi * u2)
	s.spare, s.has = r*sin, true
	return r * cos
}
