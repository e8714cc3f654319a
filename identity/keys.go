package identity

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/fleetlearn/fleetlearn/identity/internal/keyfile"
)

// KeyID names an Ed25519 public key by its RFC 7638 JWK thumbprint
// (SHA-256, base64url without padding). Tokens and module signatures carry
// it in their "kid" header so verifiers can hold several keys across a
// rotation.
func KeyID(pub ed25519.PublicKey) string {
	// RFC 7638: the required members in lexicographic order, no whitespace.
	j := `{"crv":"Ed25519","kty":"OKP","x":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}`
	sum := sha256.Sum256([]byte(j))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// GenerateSigningKey makes an Ed25519 key from 32 bytes of the WithRand source.
func GenerateSigningKey(opts ...Option) (ed25519.PrivateKey, error) {
	c, err := newConfig("identity: generate key", DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	return newEd25519(c.rand)
}

func newEd25519(r io.Reader) (ed25519.PrivateKey, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := io.ReadFull(r, seed); err != nil {
		return nil, fmt.Errorf("identity: generate key: %w", err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// LoadOrCreateSigningKey returns the Ed25519 key in the PKCS #8 PEM file at
// path, creating it (mode 0600, directory 0700) when there is none. A file
// readable by group or others is refused with ErrKeyFileMode. Issuers of
// enrollment and API tokens and module publishers keep their keys this way.
func LoadOrCreateSigningKey(path string, opts ...Option) (ed25519.PrivateKey, error) {
	const op = "identity: signing key"
	b, err := keyfile.Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, gerr := GenerateSigningKey(opts...)
		if gerr != nil {
			return nil, gerr
		}
		der, merr := x509.MarshalPKCS8PrivateKey(key)
		if merr != nil {
			return nil, fmt.Errorf("%s %s: %w", op, path, merr)
		}
		werr := keyfile.Create(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
		if werr == nil {
			return key, nil
		}
		if !errors.Is(werr, fs.ErrExist) {
			return nil, fmt.Errorf("%s: %w", op, werr)
		}
		b, err = keyfile.Read(path) // lost a creation race: use the winner's key
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err) // keyfile's errors name the file
	}
	key, err := ParseSigningKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, path, err)
	}
	return key, nil
}

// ParseSigningKey decodes an Ed25519 private key from a PKCS #8 PEM block.
func ParseSigningKey(pemBytes []byte) (ed25519.PrivateKey, error) {
	blk, rest := pem.Decode(pemBytes)
	if blk == nil || blk.Type != "PRIVATE KEY" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: want exactly one PEM PRIVATE KEY block", ErrBadKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: %T is not an Ed25519 key", ErrBadKey, k)
	}
	return ek, nil
}

// publicKeyOf returns the public half of an Ed25519 private key, checking its length.
func publicKeyOf(op string, key ed25519.PrivateKey) (ed25519.PublicKey, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%s: %w: Ed25519 private key has %d bytes, want %d", op, ErrBadKey, len(key), ed25519.PrivateKeySize)
	}
	return key.Public().(ed25519.PublicKey), nil
}

// keyRing maps key ids to trusted public keys.
type keyRing map[string]ed25519.PublicKey

func newKeyRing(op string, keys []ed25519.PublicKey) (keyRing, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: %w: no trusted keys", op, ErrBadInput)
	}
	r := keyRing{}
	for i, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%s: %w: key %d has %d bytes, want %d", op, ErrBadKey, i, len(k), ed25519.PublicKeySize)
		}
		r[KeyID(k)] = append(ed25519.PublicKey(nil), k...)
	}
	return r, nil
}
