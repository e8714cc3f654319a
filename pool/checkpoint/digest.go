package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Digest is the SHA-256 of a blob or of a manifest's canonical bytes.
type Digest [32]byte

// Sum returns the digest of b.
func Sum(b []byte) Digest { return sha256.Sum256(b) }

// String returns the digest as 64 lowercase hex digits.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// IsZero reports whether d is the zero digest, which stands for "none" (a
// checkpoint without a parent).
func (d Digest) IsZero() bool { return d == Digest{} }

// ParseDigest parses 64 lowercase hex digits. Upper case is refused so that
// a digest has one spelling, in file names and in manifests alike.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	if len(s) != 2*len(d) {
		return d, fmt.Errorf("parse digest %q: want %d hex digits: %w", s, 2*len(d), ErrInvalidManifest)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return d, fmt.Errorf("parse digest %q: not lowercase hex: %w", s, ErrInvalidManifest)
		}
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, fmt.Errorf("parse digest %q: %w", s, ErrInvalidManifest)
	}
	return d, nil
}

// MarshalText writes the hex form.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses the hex form.
func (d *Digest) UnmarshalText(b []byte) error {
	v, err := ParseDigest(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}
