package audit

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"

	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

// Keys are the log's secrets. The entry and checkpoint keys are separate so
// that either can be rotated, escrowed or kept in different hardware.
type Keys struct {
	Entry      ed25519.PrivateKey // signs each entry (JWS, EdDSA)
	Checkpoint ed25519.PrivateKey // signs checkpoints (signed notes)
	Pseudonym  []byte             // HMAC-SHA256 key for device pseudonyms, PseudonymKeySize bytes
}

// GenerateKeys draws fresh keys from rand.
func GenerateKeys(rand io.Reader) (Keys, error) {
	var k Keys
	var err error
	if _, k.Entry, err = ed25519.GenerateKey(rand); err != nil {
		return Keys{}, fmt.Errorf("audit: generate keys: %w", err)
	}
	if _, k.Checkpoint, err = ed25519.GenerateKey(rand); err != nil {
		return Keys{}, fmt.Errorf("audit: generate keys: %w", err)
	}
	k.Pseudonym = make([]byte, PseudonymKeySize)
	if _, err := io.ReadFull(rand, k.Pseudonym); err != nil {
		return Keys{}, fmt.Errorf("audit: generate keys: %w", err)
	}
	return k, nil
}

func (k Keys) check() error {
	switch {
	case len(k.Entry) != ed25519.PrivateKeySize:
		return fmt.Errorf("entry key of %d bytes: %w", len(k.Entry), ErrInvalidKeys)
	case len(k.Checkpoint) != ed25519.PrivateKeySize:
		return fmt.Errorf("checkpoint key of %d bytes: %w", len(k.Checkpoint), ErrInvalidKeys)
	case len(k.Pseudonym) != PseudonymKeySize:
		return fmt.Errorf("pseudonym key of %d bytes: %w", len(k.Pseudonym), ErrInvalidKeys)
	case bytes.Equal(k.Entry.Seed(), k.Checkpoint.Seed()):
		return fmt.Errorf("entry and checkpoint keys must differ: %w", ErrInvalidKeys)
	}
	return nil
}

const keysHeader = "fleetlearn-audit-keys/v1"

// MarshalText writes the keys file format:
//
//	fleetlearn-audit-keys/v1
//	entry-ed25519-seed: <base64>
//	checkpoint-ed25519-seed: <base64>
//	pseudonym-hmac-key: <base64>
func (k Keys) MarshalText() ([]byte, error) {
	if err := k.check(); err != nil {
		return nil, fmt.Errorf("audit: keys: %w", err)
	}
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, "%s\nentry-ed25519-seed: %s\ncheckpoint-ed25519-seed: %s\npseudonym-hmac-key: %s\n",
		keysHeader, b64(k.Entry.Seed()), b64(k.Checkpoint.Seed()), b64(k.Pseudonym)), nil
}

// ParseKeys reads the format MarshalText writes.
func ParseKeys(b []byte) (Keys, error) {
	if len(b) > 4096 {
		return Keys{}, fmt.Errorf("audit: keys: %w", ErrTooLarge)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 4 || lines[0] != keysHeader {
		return Keys{}, fmt.Errorf("audit: keys: not a %s file: %w", keysHeader, ErrInvalidKeys)
	}
	field := func(line, name string, size int) ([]byte, error) {
		v, ok := strings.CutPrefix(line, name+": ")
		if !ok {
			return nil, fmt.Errorf("audit: keys: expected %s: %w", name, ErrInvalidKeys)
		}
		d, err := base64.StdEncoding.Strict().DecodeString(v)
		if err != nil || len(d) != size {
			return nil, fmt.Errorf("audit: keys: %s: %w", name, ErrInvalidKeys)
		}
		return d, nil
	}
	es, err := field(lines[1], "entry-ed25519-seed", ed25519.SeedSize)
	if err != nil {
		return Keys{}, err
	}
	cs, err := field(lines[2], "checkpoint-ed25519-seed", ed25519.SeedSize)
	if err != nil {
		return Keys{}, err
	}
	ps, err := field(lines[3], "pseudonym-hmac-key", PseudonymKeySize)
	if err != nil {
		return Keys{}, err
	}
	k := Keys{Entry: ed25519.NewKeyFromSeed(es), Checkpoint: ed25519.NewKeyFromSeed(cs), Pseudonym: ps}
	if err := k.check(); err != nil {
		return Keys{}, fmt.Errorf("audit: keys: %w", err)
	}
	return k, nil
}

// PublicKeys are what an auditor needs to verify a log: publish them where
// the operator cannot change them later.
type PublicKeys struct {
	Origin string            // the log's name, first line of its checkpoints
	Entry  ed25519.PublicKey // verifies entries, with algorithm EdDSA only
	// EntryKeyID is the entry key's RFC 7638 JWK thumbprint (SHA-256,
	// base64url), the "kid" of every entry.
	EntryKeyID string
	// VerifierKey is the checkpoint key as a note verifier key:
	// "<name>+<hex key id>+base64(0x01 || public key)".
	VerifierKey string
}

// Public returns the public keys of a log with this origin, as
// (*Log).PublicKeys would, for publishing them before or without opening it.
func (k Keys) Public(origin string) (PublicKeys, error) {
	if err := k.check(); err != nil {
		return PublicKeys{}, fmt.Errorf("audit: keys: %w", err)
	}
	pub := k.Entry.Public().(ed25519.PublicKey)
	v, err := note.NewVerifier(origin, k.Checkpoint.Public().(ed25519.PublicKey))
	if err != nil {
		return PublicKeys{}, fmt.Errorf("audit: keys: origin %q: %w", origin, ErrInvalidKeys)
	}
	kid, err := keyID(pub)
	if err != nil {
		return PublicKeys{}, err
	}
	return PublicKeys{Origin: origin, Entry: pub, EntryKeyID: kid, VerifierKey: v.String()}, nil
}

// JWKS returns the entry key as a JSON Web Key Set with one OKP key
// (crv Ed25519, alg EdDSA, use sig, kid EntryKeyID).
func (p PublicKeys) JWKS() ([]byte, error) {
	k, err := entryJWK(p.Entry)
	if err != nil {
		return nil, err
	}
	set := jwk.NewSet()
	if err := set.AddKey(k); err != nil {
		return nil, fmt.Errorf("audit: jwks: %w", err)
	}
	return json.Marshal(set)
}

func entryJWK(pub ed25519.PublicKey) (jwk.Key, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("audit: entry key of %d bytes: %w", len(pub), ErrInvalidKeys)
	}
	k, err := jwk.FromRaw(pub)
	if err != nil {
		return nil, fmt.Errorf("audit: jwk: %w", err)
	}
	kid, err := keyID(pub)
	if err != nil {
		return nil, err
	}
	for name, v := range map[string]any{jwk.KeyIDKey: kid, jwk.AlgorithmKey: jwa.EdDSA, jwk.KeyUsageKey: jwk.ForSignature} {
		if err := k.Set(name, v); err != nil {
			return nil, fmt.Errorf("audit: jwk: %w", err)
		}
	}
	return k, nil
}

// keyID is the RFC 7638 thumbprint of an Ed25519 public key.
func keyID(pub ed25519.PublicKey) (string, error) {
	k, err := jwk.FromRaw(pub)
	if err != nil {
		return "", fmt.Errorf("audit: jwk: %w", err)
	}
	tp, err := k.Thumbprint(crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("audit: jwk thumbprint: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(tp), nil
}

// ParseJWKS reads a key set holding exactly one Ed25519 public key, as JWKS
// writes, and returns that key.
func ParseJWKS(b []byte) (ed25519.PublicKey, error) {
	if len(b) > 64<<10 {
		return nil, fmt.Errorf("audit: jwks: %w", ErrTooLarge)
	}
	set, err := jwk.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("audit: jwks: %w: %w", ErrInvalidKeys, err)
	}
	if set.Len() != 1 {
		return nil, fmt.Errorf("audit: jwks: %d keys, want 1: %w", set.Len(), ErrInvalidKeys)
	}
	k, _ := set.Key(0)
	if k.KeyType() != "OKP" {
		return nil, fmt.Errorf("audit: jwks: key type %s: %w", k.KeyType(), ErrInvalidKeys)
	}
	if a := k.Algorithm(); a != nil && a.String() != "" && a.String() != jwa.EdDSA.String() {
		return nil, fmt.Errorf("audit: jwks: algorithm %s: %w", a, ErrInvalidKeys)
	}
	var raw any
	if err := k.Raw(&raw); err != nil {
		return nil, fmt.Errorf("audit: jwks: %w: %w", ErrInvalidKeys, err)
	}
	pub, ok := raw.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("audit: jwks: not an Ed25519 public key: %w", ErrInvalidKeys)
	}
	// jwx takes x at any length; crypto/ed25519 panics on the wrong one,
	// in a verifier goroutine no caller could recover.
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("audit: jwks: Ed25519 key of %d bytes, want %d: %w", len(pub), ed25519.PublicKeySize, ErrInvalidKeys)
	}
	return pub, nil
}
