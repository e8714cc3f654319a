package identity

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"

	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// typModule is the JOSE type of module signatures.
const typModule = "fl-module+jws"

// MaxSignatureBytes bounds the module signatures a verifier looks at.
const MaxSignatureBytes = 4 << 10

// ModuleStatement is what a module signature asserts: the publisher
// released the module with this sha256 under this name.
type ModuleStatement struct {
	SHA256   string `json:"sha256"` // lowercase hex of the module bytes
	Name     string `json:"name"`
	IssuedAt int64  `json:"iat"` // Unix seconds
}

// ModuleSignature is a verified module signature.
type ModuleSignature struct {
	ModuleStatement
	KeyID string // the publisher key that signed
}

// Publisher signs WASM modules.
type Publisher struct {
	key ed25519.PrivateKey
	kid string
	cfg config
}

// NewPublisher signs with key. Options: WithClock.
func NewPublisher(key ed25519.PrivateKey, opts ...Option) (*Publisher, error) {
	const op = "identity: publisher"
	cfg, err := newConfig(op, DefaultAPIMaxTTL, opts)
	if err != nil {
		return nil, err
	}
	pub, err := publicKeyOf(op, key)
	if err != nil {
		return nil, err
	}
	return &Publisher{key: key, kid: KeyID(pub), cfg: cfg}, nil
}

// KeyID is the publisher's key id.
func (p *Publisher) KeyID() string { return p.kid }

// SignModule returns a compact JWS (EdDSA) whose payload is the
// ModuleStatement for module under name.
func (p *Publisher) SignModule(name string, module []byte) (string, error) {
	return p.SignModuleSHA256(name, wire.SHA256(module))
}

// SignModuleSHA256 signs a module known by its lowercase hex sha256.
func (p *Publisher) SignModuleSHA256(name, sha string) (string, error) {
	const op = "identity: sign module"
	if err := wire.CheckSHA256("module", sha); err != nil {
		return "", fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
	}
	if err := checkSubject(name); err != nil {
		return "", fmt.Errorf("%s: name: %w", op, err)
	}
	payload, err := json.Marshal(ModuleStatement{SHA256: sha, Name: name, IssuedAt: p.cfg.now().Unix()})
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	hdr := jws.NewHeaders()
	if err := hdr.Set(jws.KeyIDKey, p.kid); err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	if err := hdr.Set(jws.TypeKey, typModule); err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	b, err := jws.Sign(payload, jws.WithKey(jwa.EdDSA, p.key, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	return string(b), nil
}

// PublicJWKS is the JWK Set of Ed25519 public keys, each with its key id
// and "alg": "EdDSA": what ParseTrustedPublishers reads.
func PublicJWKS(keys ...ed25519.PublicKey) ([]byte, error) {
	const op = "identity: jwks"
	set := jwk.NewSet()
	for i, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%s: %w: key %d has %d bytes", op, ErrBadKey, i, len(k))
		}
		jk, err := jwk.FromRaw(k)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		for _, kv := range []struct {
			k string
			v any
		}{{jwk.KeyIDKey, KeyID(k)}, {jwk.AlgorithmKey, jwa.EdDSA}, {jwk.KeyUsageKey, "sig"}} {
			if err := jk.Set(kv.k, kv.v); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		if err := set.AddKey(jk); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	b, err := json.MarshalIndent(set, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return b, nil
}

// TrustedPublishers is the set of publisher keys whose modules devices run.
type TrustedPublishers struct {
	keys keyRing
}

// MaxJWKSBytes bounds a trusted publisher set.
const MaxJWKSBytes = 64 << 10

// ParseTrustedPublishers reads a JWK Set of Ed25519 public keys. Every key
// must be an OKP Ed25519 public key; its "kid", when present, must be its
// RFC 7638 thumbprint (KeyID), and its "alg", when present, EdDSA. A set
// holding a private key is refused: it was not meant to be distributed.
func ParseTrustedPublishers(jwks []byte) (*TrustedPublishers, error) {
	const op = "identity: trusted publishers"
	if len(jwks) > MaxJWKSBytes {
		return nil, fmt.Errorf("%s: %w: %d bytes", op, ErrBadJWKS, len(jwks))
	}
	set, err := jwk.Parse(jwks)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", op, ErrBadJWKS, err)
	}
	if set.Len() == 0 {
		return nil, fmt.Errorf("%s: %w: no keys", op, ErrBadJWKS)
	}
	ring := keyRing{}
	for i := 0; i < set.Len(); i++ {
		k, _ := set.Key(i)
		var raw any
		if err := k.Raw(&raw); err != nil {
			return nil, fmt.Errorf("%s: %w: key %d: %w", op, ErrBadJWKS, i, err)
		}
		pub, ok := raw.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("%s: %w: key %d is %T, want an Ed25519 public key", op, ErrBadJWKS, i, raw)
		}
		if len(pub) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%s: %w: key %d has %d bytes", op, ErrBadJWKS, i, len(pub))
		}
		kid := KeyID(pub)
		if k.KeyID() != "" && k.KeyID() != kid {
			return nil, fmt.Errorf("%s: %w: key %d has kid %q, its thumbprint is %q", op, ErrBadJWKS, i, k.KeyID(), kid)
		}
		if a := k.Algorithm().String(); a != "" && a != jwa.EdDSA.String() {
			return nil, fmt.Errorf("%s: %w: key %d is for %q, want EdDSA", op, ErrBadJWKS, i, a)
		}
		ring[kid] = pub
	}
	return &TrustedPublishers{keys: ring}, nil
}

// KeyIDs lists the trusted keys.
func (t *TrustedPublishers) KeyIDs() []string {
	out := make([]string, 0, len(t.keys))
	for k := range t.keys {
		out = append(out, k)
	}
	return sortedStrings(out)
}

// VerifyModule checks that signature is a trusted publisher's signature
// over module's sha256.
func (t *TrustedPublishers) VerifyModule(module []byte, signature string) (ModuleSignature, error) {
	return t.VerifyModuleSHA256(wire.SHA256(module), signature)
}

// VerifyModuleSHA256 checks signature against a module's lowercase hex
// sha256. It fails with ErrMalformedToken, ErrUntrustedPublisher,
// ErrBadSignature or ErrHashMismatch.
func (t *TrustedPublishers) VerifyModuleSHA256(sha, signature string) (ModuleSignature, error) {
	const op = "identity: verify module"
	if err := wire.CheckSHA256("module", sha); err != nil {
		return ModuleSignature{}, fmt.Errorf("%s: %w: %w", op, ErrBadInput, err)
	}
	if len(signature) == 0 || len(signature) > MaxSignatureBytes {
		return ModuleSignature{}, fmt.Errorf("%s: %w: signature of %d bytes", op, ErrMalformedToken, len(signature))
	}
	msg, err := jws.Parse([]byte(signature), jws.WithCompact())
	if err != nil {
		return ModuleSignature{}, fmt.Errorf("%s: %w: %w", op, ErrMalformedToken, err)
	}
	if len(msg.Signatures()) != 1 {
		return ModuleSignature{}, fmt.Errorf("%s: %w: %d signatures", op, ErrMalformedToken, len(msg.Signatures()))
	}
	h := msg.Signatures()[0].ProtectedHeaders()
	if h.Type() != typModule || len(h.Critical()) != 0 {
		return ModuleSignature{}, fmt.Errorf("%s: %w: type %q", op, ErrMalformedToken, h.Type())
	}
	if h.Algorithm() != jwa.EdDSA {
		return ModuleSignature{}, fmt.Errorf("%s: %w: algorithm %q, want EdDSA", op, ErrBadSignature, h.Algorithm())
	}
	pub, ok := t.keys[h.KeyID()]
	if !ok {
		return ModuleSignature{}, fmt.Errorf("%s: %w: kid %q", op, ErrUntrustedPublisher, h.KeyID())
	}
	payload, err := jws.Verify([]byte(signature), jws.WithKey(jwa.EdDSA, pub))
	if err != nil {
		return ModuleSignature{}, fmt.Errorf("%s: %w: %w", op, ErrBadSignature, err)
	}
	var st ModuleStatement
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return ModuleSignature{}, fmt.Errorf("%s: %w: payload: %w", op, ErrMalformedToken, err)
	}
	if err := wire.CheckSHA256("signed module", st.SHA256); err != nil {
		return ModuleSignature{}, fmt.Errorf("%s: %w: %w", op, ErrMalformedToken, err)
	}
	if st.SHA256 != sha {
		return ModuleSignature{}, fmt.Errorf("%s: %w: signed %s, module is %s", op, ErrHashMismatch, st.SHA256, sha)
	}
	return ModuleSignature{ModuleStatement: st, KeyID: h.KeyID()}, nil
}

// IssuedAtTime is the statement's issue time.
func (s ModuleStatement) IssuedAtTime() time.Time { return time.Unix(s.IssuedAt, 0) }
