package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
)

// MaxEntryBytes bounds an entry's compact JWS.
const MaxEntryBytes = 256 << 10

// entryType is the "typ" of every entry's protected header.
const entryType = "fleetlearn-audit-event"

// Entry is one leaf of the log: its index and its bytes, a JWS in compact
// serialization whose payload is the event's canonical JSON. The bytes are
// stored and hashed exactly as signed; the leaf hash is
// SHA-256(0x00 || Data).
//
// The protected header is {"alg":"EdDSA","idx":<index>,"kid":<key id>,
// "typ":"fleetlearn-audit-event"}: the signed index binds an entry to its
// position, so an entry moved elsewhere is caught on its own.
type Entry struct {
	Index uint64
	Data  []byte
}

// LeafHash returns the entry's RFC 6962 leaf hash.
func (e Entry) LeafHash() [32]byte { return merkle.LeafHash(e.Data) }

// Event decodes the entry's event without checking the signature; use
// VerifyEntry for that.
func (e Entry) Event() (Event, error) {
	_, payload, err := splitEntry(e.Data)
	if err != nil {
		return Event{}, err
	}
	return ParseEvent(payload)
}

// LeafHash returns SHA-256(0x00 || data), the RFC 6962 leaf hash.
func LeafHash(data []byte) [32]byte { return merkle.LeafHash(data) }

type entryHeader struct {
	Alg string  `json:"alg"`
	Idx *uint64 `json:"idx"`
	Kid string  `json:"kid"`
	Typ string  `json:"typ"`
}

// entryHeaderJSON is the protected header as jwx writes it: members sorted,
// no spaces. A kid is base64url, which needs no escaping.
func entryHeaderJSON(index uint64, kid string) []byte {
	return fmt.Appendf(nil, `{"alg":"EdDSA","idx":%d,"kid":%q,"typ":%q}`, index, kid, entryType)
}

// splitEntry checks the compact form and header shape and returns the
// header and the decoded payload.
func splitEntry(data []byte) (entryHeader, []byte, error) {
	var h entryHeader
	if len(data) > MaxEntryBytes {
		return h, nil, fmt.Errorf("audit: entry of %d bytes: %w", len(data), ErrTooLarge)
	}
	parts := bytes.Split(data, []byte("."))
	if len(parts) != 3 || len(parts[0]) == 0 || len(parts[1]) == 0 || len(parts[2]) == 0 {
		return h, nil, fmt.Errorf("audit: entry: not a compact JWS: %w", ErrMalformedEntry)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(string(parts[0]))
	if err != nil {
		return h, nil, fmt.Errorf("audit: entry: header: %w: %w", ErrMalformedEntry, err)
	}
	// Decode leniently for a precise error, then insist on the one spelling
	// the log writes, so no two byte strings carry the same header.
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, nil, fmt.Errorf("audit: entry: header: %w: %w", ErrMalformedEntry, err)
	}
	switch {
	case h.Alg != jwa.EdDSA.String():
		return h, nil, fmt.Errorf("audit: entry: header alg %q, only EdDSA is accepted: %w", h.Alg, ErrMalformedEntry)
	case h.Typ != entryType:
		return h, nil, fmt.Errorf("audit: entry: header typ %q: %w", h.Typ, ErrMalformedEntry)
	case h.Idx == nil || h.Kid == "":
		return h, nil, fmt.Errorf("audit: entry: header lacks idx or kid: %w", ErrMalformedEntry)
	}
	if !bytes.Equal(raw, entryHeaderJSON(*h.Idx, h.Kid)) {
		return h, nil, fmt.Errorf("audit: entry: header %q is not in the log's form: %w", raw, ErrMalformedEntry)
	}
	payload, err := base64.RawURLEncoding.Strict().DecodeString(string(parts[1]))
	if err != nil {
		return h, nil, fmt.Errorf("audit: entry: payload: %w: %w", ErrMalformedEntry, err)
	}
	if _, err := base64.RawURLEncoding.Strict().DecodeString(string(parts[2])); err != nil {
		return h, nil, fmt.Errorf("audit: entry: signature: %w: %w", ErrMalformedEntry, err)
	}
	return h, payload, nil
}

// VerifyEntry checks an entry against the log's entry key: compact JWS with
// the expected header, an Ed25519 signature verified with algorithm EdDSA
// pinned (the header's alg is never used to pick the algorithm), the signed
// index equal to e.Index, and a canonical event. It returns the event.
func VerifyEntry(e Entry, pub ed25519.PublicKey) (Event, error) {
	if len(pub) != ed25519.PublicKeySize {
		return Event{}, fmt.Errorf("audit: verify entry: key of %d bytes: %w", len(pub), ErrInvalidKeys)
	}
	kid, err := keyID(pub)
	if err != nil {
		return Event{}, err
	}
	return verifyEntry(e, pub, kid)
}

func verifyEntry(e Entry, pub ed25519.PublicKey, kid string) (Event, error) {
	h, payload, err := splitEntry(e.Data)
	if err != nil {
		return Event{}, err
	}
	if h.Kid != kid {
		return Event{}, fmt.Errorf("audit: entry: signed by key %q, not %q: %w", h.Kid, kid, ErrBadSignature)
	}
	signed, err := jws.Verify(e.Data, jws.WithKey(jwa.EdDSA, pub), jws.WithCompact())
	if err != nil {
		return Event{}, fmt.Errorf("audit: entry: %w: %w", ErrBadSignature, err)
	}
	if !bytes.Equal(signed, payload) {
		return Event{}, fmt.Errorf("audit: entry: payload mismatch: %w", ErrMalformedEntry)
	}
	if *h.Idx != e.Index {
		return Event{}, fmt.Errorf("audit: entry: signed for index %d, found at %d: %w", *h.Idx, e.Index, ErrBadSignature)
	}
	ev, err := ParseEvent(payload)
	if err != nil {
		return Event{}, err
	}
	return ev, nil
}

// entrySigner makes entries.
type entrySigner struct {
	priv ed25519.PrivateKey
	kid  string
}

// sign writes the compact JWS of an event at index. The header has one
// fixed spelling, so the signing input is assembled here and signed with
// jwx's EdDSA signer; jws.Verify reads the result like any compact JWS.
func (s entrySigner) sign(index uint64, event []byte) ([]byte, error) {
	signer, err := jws.NewSigner(jwa.EdDSA)
	if err != nil {
		return nil, fmt.Errorf("audit: sign: %w", err)
	}
	enc := base64.RawURLEncoding
	header := entryHeaderJSON(index, s.kid)
	buf := make([]byte, 0, enc.EncodedLen(len(header))+enc.EncodedLen(len(event))+2+enc.EncodedLen(ed25519.SignatureSize))
	buf = enc.AppendEncode(buf, header)
	buf = append(buf, '.')
	buf = enc.AppendEncode(buf, event)
	sig, err := signer.Sign(buf, s.priv)
	if err != nil {
		return nil, fmt.Errorf("audit: sign: %w", err)
	}
	buf = append(buf, '.')
	return enc.AppendEncode(buf, sig), nil
}
