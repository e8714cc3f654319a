// Package note signs and verifies Ed25519 signed notes (c2sp.org/signed-note)
// and reads and writes their verifier and signer key strings in the format
// of golang.org/x/mod/sumdb/note.
package note

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// algEd25519 is the signature type byte of plain Ed25519 keys.
const algEd25519 = 1

// MaxNoteSize bounds the notes Open reads.
const MaxNoteSize = 1 << 20

// Errors. Every failure wraps exactly one of them.
var (
	// ErrMalformed reports a note that does not follow the format.
	ErrMalformed = errors.New("malformed note")
	// ErrUnverified reports a well-formed note with no signature from any
	// of the given keys.
	ErrUnverified = errors.New("note has no verifiable signature")
	// ErrInvalidSignature reports a signature line naming a known key whose
	// signature does not verify.
	ErrInvalidSignature = errors.New("invalid note signature")
	// ErrKey reports a malformed key string or name.
	ErrKey = errors.New("invalid key")
)

// Verifier checks signatures of one named Ed25519 key.
type Verifier struct {
	name string
	id   uint32
	pub  ed25519.PublicKey
}

// Name is the key name.
func (v Verifier) Name() string { return v.name }

// KeyID is the 4-byte key id.
func (v Verifier) KeyID() uint32 { return v.id }

// PublicKey is the Ed25519 public key.
func (v Verifier) PublicKey() ed25519.PublicKey { return v.pub }

// String is the vkey: "<name>+<hex id>+base64(0x01 || pub)".
func (v Verifier) String() string {
	return fmt.Sprintf("%s+%08x+%s", v.name, v.id, base64.StdEncoding.EncodeToString(append([]byte{algEd25519}, v.pub...)))
}

// Signer signs notes with one named Ed25519 key.
type Signer struct {
	Verifier
	priv ed25519.PrivateKey
}

// Sign returns the note: text, a blank line, and the signature line. The
// text must be a valid note text ending in a newline.
func (s Signer) Sign(text []byte) ([]byte, error) {
	if err := checkText(text); err != nil {
		return nil, fmt.Errorf("note: sign: %w", err)
	}
	sig := ed25519.Sign(s.priv, text)
	var buf bytes.Buffer
	buf.Grow(len(text) + 1 + len(s.name) + 100)
	buf.Write(text)
	buf.WriteString("\n— ")
	buf.WriteString(s.name)
	buf.WriteByte(' ')
	var id [4]byte
	binary.BigEndian.PutUint32(id[:], s.id)
	buf.WriteString(base64.StdEncoding.EncodeToString(append(id[:], sig...)))
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

// SKey is the signer key string "PRIVATE+KEY+<name>+<hex id>+base64(0x01 || seed)".
func (s Signer) SKey() string {
	return fmt.Sprintf("PRIVATE+KEY+%s+%08x+%s", s.name, s.id,
		base64.StdEncoding.EncodeToString(append([]byte{algEd25519}, s.priv.Seed()...)))
}

// KeyID computes SHA-256(name || 0x0A || 0x01 || pub)[:4] as a big-endian
// uint32.
func KeyID(name string, pub ed25519.PublicKey) uint32 {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{'\n', algEd25519})
	h.Write(pub)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// NewSigner names an Ed25519 private key.
func NewSigner(name string, priv ed25519.PrivateKey) (Signer, error) {
	if !validName(name) {
		return Signer{}, fmt.Errorf("note: key name %q: %w", name, ErrKey)
	}
	if len(priv) != ed25519.PrivateKeySize {
		return Signer{}, fmt.Errorf("note: private key of %d bytes: %w", len(priv), ErrKey)
	}
	pub := priv.Public().(ed25519.PublicKey)
	return Signer{Verifier: Verifier{name: name, id: KeyID(name, pub), pub: pub}, priv: priv}, nil
}

// NewVerifier names an Ed25519 public key.
func NewVerifier(name string, pub ed25519.PublicKey) (Verifier, error) {
	if !validName(name) {
		return Verifier{}, fmt.Errorf("note: key name %q: %w", name, ErrKey)
	}
	if len(pub) != ed25519.PublicKeySize {
		return Verifier{}, fmt.Errorf("note: public key of %d bytes: %w", len(pub), ErrKey)
	}
	return Verifier{name: name, id: KeyID(name, pub), pub: bytes.Clone(pub)}, nil
}

// ParseVerifier parses a vkey and checks that its key id matches its name
// and key.
func ParseVerifier(vkey string) (Verifier, error) {
	name, id, key, err := splitKey(vkey)
	if err != nil {
		return Verifier{}, fmt.Errorf("note: verifier key: %w", err)
	}
	if len(key) != 1+ed25519.PublicKeySize || key[0] != algEd25519 {
		return Verifier{}, fmt.Errorf("note: verifier key: not an Ed25519 key: %w", ErrKey)
	}
	v, err := NewVerifier(name, key[1:])
	if err != nil {
		return Verifier{}, err
	}
	if v.id != id {
		return Verifier{}, fmt.Errorf("note: verifier key: id %08x does not match the key (%08x): %w", id, v.id, ErrKey)
	}
	return v, nil
}

// ParseSigner parses a signer key string.
func ParseSigner(skey string) (Signer, error) {
	rest, ok := strings.CutPrefix(skey, "PRIVATE+KEY+")
	if !ok {
		return Signer{}, fmt.Errorf("note: signer key: missing PRIVATE+KEY prefix: %w", ErrKey)
	}
	name, id, key, err := splitKey(rest)
	if err != nil {
		return Signer{}, fmt.Errorf("note: signer key: %w", err)
	}
	if len(key) != 1+ed25519.SeedSize || key[0] != algEd25519 {
		return Signer{}, fmt.Errorf("note: signer key: not an Ed25519 key: %w", ErrKey)
	}
	s, err := NewSigner(name, ed25519.NewKeyFromSeed(key[1:]))
	if err != nil {
		return Signer{}, err
	}
	if s.id != id {
		return Signer{}, fmt.Errorf("note: signer key: id %08x does not match the key (%08x): %w", id, s.id, ErrKey)
	}
	return s, nil
}

func splitKey(s string) (name string, id uint32, key []byte, err error) {
	name, rest, ok1 := strings.Cut(s, "+")
	hexID, b64, ok2 := strings.Cut(rest, "+")
	if !ok1 || !ok2 || len(hexID) != 8 || !validName(name) {
		return "", 0, nil, ErrKey
	}
	idb, err := hex.DecodeString(hexID)
	if err != nil {
		return "", 0, nil, ErrKey
	}
	key, err = base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return "", 0, nil, ErrKey
	}
	return name, binary.BigEndian.Uint32(idb), key, nil
}

// validName: non-empty UTF-8 without spaces, control characters or '+'.
func validName(name string) bool {
	if name == "" || !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		if r == '+' || unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// checkText: valid UTF-8, ends in a newline, no control characters other
// than newline, no blank line (which would end the text early).
func checkText(text []byte) error {
	if len(text) == 0 || text[len(text)-1] != '\n' {
		return fmt.Errorf("text must end in a newline: %w", ErrMalformed)
	}
	if !utf8.Valid(text) {
		return fmt.Errorf("text is not UTF-8: %w", ErrMalformed)
	}
	if bytes.Contains(text, []byte("\n\n")) || text[0] == '\n' {
		return fmt.Errorf("text contains a blank line: %w", ErrMalformed)
	}
	for _, r := range string(text) {
		if r != '\n' && (unicode.IsControl(r) || r == utf8.RuneError) {
			return fmt.Errorf("text contains control character %U: %w", r, ErrMalformed)
		}
	}
	return nil
}

// Signature is one verified signature of a note.
type Signature struct {
	Name  string
	KeyID uint32
}

// Open splits a note into text and signatures and verifies the signatures
// of known keys; signatures from unknown keys are ignored. It fails with
// ErrMalformed for a note that breaks the format, ErrInvalidSignature if a
// known key's signature is wrong, and ErrUnverified if no known key signed.
func Open(msg []byte, known ...Verifier) (text []byte, sigs []Signature, err error) {
	text, lines, err := split(msg)
	if err != nil {
		return nil, nil, err
	}
	var bad []string
	for _, line := range lines {
		for _, v := range known {
			if v.name != line.name || v.id != line.id {
				continue
			}
			if len(line.sig) == ed25519.SignatureSize && ed25519.Verify(v.pub, text, line.sig) {
				if !contains(sigs, line.name, line.id) {
					sigs = append(sigs, Signature{Name: line.name, KeyID: line.id})
				}
			} else {
				bad = append(bad, line.name)
			}
		}
	}
	if len(bad) > 0 {
		return nil, nil, fmt.Errorf("note: signature of %s: %w", strings.Join(bad, ", "), ErrInvalidSignature)
	}
	if len(sigs) == 0 {
		return nil, nil, fmt.Errorf("note: %w", ErrUnverified)
	}
	return text, sigs, nil
}

// maxSigs bounds the signature lines of a note.
const maxSigs = 100

// short cuts a line quoted in an error to a readable length.
func short(line string) string {
	const n = 80
	if len(line) <= n {
		return line
	}
	for i := n; i > 0; i-- {
		if utf8.RuneStart(line[i]) {
			return line[:i] + "..."
		}
	}
	return "..."
}

// sigLine is one parsed signature line: "— <name> base64(<id> || <sig>)".
type sigLine struct {
	name string
	id   uint32
	sig  []byte // what follows the key id
}

// split checks a note's format and splits it into its text (up to and
// including the newline before the blank line) and its signature lines.
func split(msg []byte) (text []byte, lines []sigLine, err error) {
	if len(msg) > MaxNoteSize {
		return nil, nil, fmt.Errorf("note: %d bytes: %w", len(msg), ErrMalformed)
	}
	at := bytes.LastIndex(msg, []byte("\n\n"))
	if at < 0 {
		return nil, nil, fmt.Errorf("note: no signature block: %w", ErrMalformed)
	}
	text, block := msg[:at+1], msg[at+2:]
	if err := checkText(text); err != nil {
		return nil, nil, fmt.Errorf("note: %w", err)
	}
	if len(block) == 0 || block[len(block)-1] != '\n' {
		return nil, nil, fmt.Errorf("note: signature block must be non-empty and end in a newline: %w", ErrMalformed)
	}
	if !utf8.Valid(block) {
		return nil, nil, fmt.Errorf("note: signature block is not UTF-8: %w", ErrMalformed)
	}
	raw := strings.Split(string(block[:len(block)-1]), "\n")
	if len(raw) > maxSigs {
		return nil, nil, fmt.Errorf("note: %d signatures: %w", len(raw), ErrMalformed)
	}
	lines = make([]sigLine, 0, len(raw))
	for _, line := range raw {
		rest, ok := strings.CutPrefix(line, "— ")
		if !ok {
			return nil, nil, fmt.Errorf("note: signature line %q: %w", short(line), ErrMalformed)
		}
		name, b64, ok := strings.Cut(rest, " ")
		if !ok || !validName(name) {
			return nil, nil, fmt.Errorf("note: signature line %q: %w", short(line), ErrMalformed)
		}
		sig, err := base64.StdEncoding.Strict().DecodeString(b64)
		if err != nil || len(sig) < 5 {
			return nil, nil, fmt.Errorf("note: signature line %q: %w", short(line), ErrMalformed)
		}
		lines = append(lines, sigLine{name: name, id: binary.BigEndian.Uint32(sig), sig: sig[4:]})
	}
	return text, lines, nil
}

func contains(sigs []Signature, name string, id uint32) bool {
	for _, s := range sigs {
		if s.Name == name && s.KeyID == id {
			return true
		}
	}
	return false
}
