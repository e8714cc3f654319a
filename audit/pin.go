package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

// PinFormat is the first line of a pin file.
const PinFormat = "fleetlearn-audit-pin/v1"

// maxPinFile bounds a pin file.
const maxPinFile = 64 << 10

// Pin is what an auditor pins for a log: its origin, its public keys and,
// optionally, the witnesses whose cosignature every export must carry. It
// is written as text (MarshalText) for `fleetlearn audit keys` and read back
// by `audit verify --pin`:
//
//	fleetlearn-audit-pin/v1
//	origin: fleetlearn/audit
//	entry-key-id: <RFC 7638 thumbprint of the entry key>
//	entry-jwks: {"keys":[{...}]}
//	checkpoint-vkey: fleetlearn/audit+1a2b3c4d+AbC...
//	witness-vkey: <cosignature/v1 verifier key>        (zero or more)
//
// Lines starting with # are comments: MarshalText writes the SHA-256
// fingerprints of the raw public keys there, for reading aloud.
type Pin struct {
	PublicKeys
	Witnesses []string
}

// MarshalText writes the pin file.
func (p Pin) MarshalText() ([]byte, error) {
	jwks, err := p.JWKS()
	if err != nil {
		return nil, fmt.Errorf("audit: pin: %w", err)
	}
	v, err := note.ParseVerifier(p.VerifierKey)
	if err != nil {
		return nil, fmt.Errorf("audit: pin: checkpoint key: %w: %w", ErrInvalidKeys, err)
	}
	var b bytes.Buffer
	fmt.Fprintln(&b, PinFormat)
	fmt.Fprintf(&b, "# Public keys of the Fleetlearn audit log %s. Check the fingerprints with the\n", p.Origin)
	fmt.Fprintln(&b, "# operator over a second channel, then: fleetlearn audit verify EXPORT --pin FILE")
	fmt.Fprintf(&b, "# entry key (Ed25519) SHA-256:      %s\n", fingerprint(p.Entry))
	fmt.Fprintf(&b, "# checkpoint key (Ed25519) SHA-256: %s (note key id %08x)\n", fingerprint(v.PublicKey()), v.KeyID())
	fmt.Fprintf(&b, "origin: %s\n", p.Origin)
	fmt.Fprintf(&b, "entry-key-id: %s\n", p.EntryKeyID)
	fmt.Fprintf(&b, "entry-jwks: %s\n", jwks)
	fmt.Fprintf(&b, "checkpoint-vkey: %s\n", p.VerifierKey)
	for _, w := range p.Witnesses {
		fmt.Fprintf(&b, "witness-vkey: %s\n", w)
	}
	return b.Bytes(), nil
}

func fingerprint(pub []byte) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:])
}

// ParsePin reads a pin file and checks that its parts agree: the key id is
// the entry key's thumbprint and the checkpoint key is named for the origin.
func ParsePin(b []byte) (Pin, error) {
	if len(b) > maxPinFile {
		return Pin{}, fmt.Errorf("audit: pin: %w", ErrTooLarge)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 0 || strings.TrimRight(lines[0], "\r") != PinFormat {
		return Pin{}, fmt.Errorf("audit: pin: not a %s file (make one with fleetlearn audit keys): %w", PinFormat, ErrInvalidKeys)
	}
	var p Pin
	var jwks string
	seen := map[string]bool{}
	for n, line := range lines[1:] {
		line = strings.TrimRight(line, "\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(line, ": ")
		if !ok || val == "" {
			return Pin{}, fmt.Errorf("audit: pin: line %d: want \"name: value\": %w", n+2, ErrInvalidKeys)
		}
		if key != "witness-vkey" && seen[key] {
			return Pin{}, fmt.Errorf("audit: pin: line %d: %s given twice: %w", n+2, key, ErrInvalidKeys)
		}
		seen[key] = true
		switch key {
		case "origin":
			p.Origin = val
		case "entry-key-id":
			p.EntryKeyID = val
		case "entry-jwks":
			jwks = val
		case "checkpoint-vkey":
			p.VerifierKey = val
		case "witness-vkey":
			if err := CheckWitnessKey(val); err != nil {
				return Pin{}, fmt.Errorf("audit: pin: line %d: %w", n+2, err)
			}
			if !slices.Contains(p.Witnesses, val) {
				p.Witnesses = append(p.Witnesses, val)
			}
		default:
			return Pin{}, fmt.Errorf("audit: pin: line %d: unknown field %q: %w", n+2, key, ErrInvalidKeys)
		}
	}
	for _, f := range []string{"origin", "entry-key-id", "entry-jwks", "checkpoint-vkey"} {
		if !seen[f] {
			return Pin{}, fmt.Errorf("audit: pin: %s missing: %w", f, ErrInvalidKeys)
		}
	}
	pub, err := ParseJWKS([]byte(jwks))
	if err != nil {
		return Pin{}, fmt.Errorf("audit: pin: %w", err)
	}
	kid, err := keyID(pub)
	if err != nil {
		return Pin{}, fmt.Errorf("audit: pin: %w", err)
	}
	if kid != p.EntryKeyID {
		return Pin{}, fmt.Errorf("audit: pin: entry-key-id %s is not the thumbprint %s of entry-jwks: %w", p.EntryKeyID, kid, ErrKeyMismatch)
	}
	p.Entry = pub
	v, err := note.ParseVerifier(p.VerifierKey)
	if err != nil {
		return Pin{}, fmt.Errorf("audit: pin: checkpoint-vkey: %w: %w", ErrInvalidKeys, err)
	}
	if v.Name() != p.Origin {
		return Pin{}, fmt.Errorf("audit: pin: checkpoint-vkey is for %q, origin is %q: %w", v.Name(), p.Origin, ErrKeyMismatch)
	}
	return p, nil
}

// CheckWitnessKey reports whether vkey is a witness verifier key
// (c2sp.org/tlog-cosignature: "<name>+<hex key id>+base64(0x04 ‖ key)").
func CheckWitnessKey(vkey string) error {
	if _, err := note.ParseCosigVerifier(vkey); err != nil {
		return fmt.Errorf("audit: witness key %q: %w: %w", vkey, ErrInvalidKeys, err)
	}
	return nil
}
