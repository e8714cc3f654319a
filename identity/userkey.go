package identity

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"

	"github.com/nats-io/nkeys"

	"github.com/fleetlearn/fleetlearn/identity/internal/keyfile"
)

// UserKey is an nkey user key pair: a device's identity key, or the
// aggregator's service key. The same Ed25519 key authenticates the NATS
// connection (signing the server's nonce), signs update reports and SecAgg
// advertisements; its id is the nkey public key ("U...").
type UserKey struct {
	seed []byte
	id   string
	priv ed25519.PrivateKey
}

// GenerateUserKey makes a user key from 32 bytes of the WithRand source.
func GenerateUserKey(opts ...Option) (*UserKey, error) {
	c, err := newConfig("identity: generate user key", DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.CreatePairWithRand(nkeys.PrefixByteUser, c.rand)
	if err != nil {
		return nil, fmt.Errorf("identity: generate user key: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("identity: generate user key: %w", err)
	}
	return ParseUserKey(seed)
}

// ParseUserKey decodes an nkey user seed ("SU..."), surrounding whitespace
// allowed.
func ParseUserKey(seed []byte) (*UserKey, error) {
	seed = bytes.TrimSpace(seed)
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("%w: user seed: %w", ErrBadKey, err)
	}
	if prefix != nkeys.PrefixByteUser {
		return nil, fmt.Errorf("%w: seed is for a %s key, want a user key", ErrBadKey, prefix)
	}
	if len(raw) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: seed has %d bytes", ErrBadKey, len(raw))
	}
	priv := ed25519.NewKeyFromSeed(raw)
	id, err := nkeys.Encode(nkeys.PrefixByteUser, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	return &UserKey{seed: bytes.Clone(seed), id: string(id), priv: priv}, nil
}

// LoadOrCreateUserKey returns the user key whose seed is in the file at
// path, creating one (mode 0600, directory 0700) when there is none. A seed
// file readable by group or others is refused with ErrKeyFileMode.
func LoadOrCreateUserKey(path string, opts ...Option) (*UserKey, error) {
	const op = "identity: user key"
	b, err := keyfile.Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		k, gerr := GenerateUserKey(opts...)
		if gerr != nil {
			return nil, gerr
		}
		werr := keyfile.Create(path, append(bytes.Clone(k.seed), '\n'), 0o600)
		if werr == nil {
			return k, nil
		}
		if !errors.Is(werr, fs.ErrExist) {
			return nil, fmt.Errorf("%s: %w", op, werr)
		}
		b, err = keyfile.Read(path)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err) // keyfile's errors name the file
	}
	k, err := ParseUserKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", op, path, err)
	}
	return k, nil
}

// ID is the nkey public key, "U" and 55 more characters: the device's key id.
func (k *UserKey) ID() string { return k.id }

// PrivateKey is the Ed25519 signing key.
func (k *UserKey) PrivateKey() ed25519.PrivateKey { return k.priv }

// PublicKey is the Ed25519 public key.
func (k *UserKey) PublicKey() ed25519.PublicKey { return k.priv.Public().(ed25519.PublicKey) }

// Seed is the encoded seed, for creds files (FormatCreds). Keep it secret.
func (k *UserKey) Seed() []byte { return bytes.Clone(k.seed) }

// Sign signs a NATS server nonce (nats.UserJWT's callback); nkeys signs
// with plain Ed25519, so this equals ed25519.Sign(PrivateKey(), nonce).
func (k *UserKey) Sign(nonce []byte) ([]byte, error) { return ed25519.Sign(k.priv, nonce), nil }

// ParseUserKeyID decodes a user key id ("U...") to the Ed25519 public key
// that verifies the device's signatures.
func ParseUserKeyID(id string) (ed25519.PublicKey, error) {
	if !nkeys.IsValidPublicUserKey(id) {
		return nil, fmt.Errorf("%w: %q is not an nkey user public key", ErrBadKey, id)
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteUser, []byte(id))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	return ed25519.PublicKey(raw), nil
}
