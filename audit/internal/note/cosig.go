package note

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
)

// Cosignatures (c2sp.org/tlog-cosignature, the Ed25519 type cosignature/v1)
// are note signatures by witnesses. Their key ids use signature type 0x04,
// so a verifier that knows only the log's key ignores them, and their
// signature is a timestamped_signature:
//
//	key id (4) || timestamp, uint64 big-endian (8) || Ed25519 signature (64)
//
// over "cosignature/v1\ntime <timestamp>\n" followed by the note's text.

// algCosignatureV1 is the signature type byte of cosignature/v1 keys.
const algCosignatureV1 = 4

// cosigSize is the decoded size of a cosignature after its key id.
const cosigSize = 8 + ed25519.SignatureSize

// MaxCosignatureTime is the largest timestamp a cosignature may carry: the
// format requires it to fit in 63 bits.
const MaxCosignatureTime = math.MaxInt64

// CosignatureKeyID computes SHA-256(name || 0x0A || 0x04 || pub)[:4] as a
// big-endian uint32.
func CosignatureKeyID(name string, pub ed25519.PublicKey) uint32 {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{'\n', algCosignatureV1})
	h.Write(pub)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// CosignatureMessage is what a cosignature with timestamp t signs over a
// note text.
func CosignatureMessage(text []byte, t uint64) []byte {
	msg := make([]byte, 0, len(text)+40)
	msg = append(msg, "cosignature/v1\ntime "...)
	msg = strconv.AppendUint(msg, t, 10)
	msg = append(msg, '\n')
	return append(msg, text...)
}

// CosigVerifier checks the cosignatures of one named witness key.
type CosigVerifier struct {
	name string
	id   uint32
	pub  ed25519.PublicKey
}

// Name is the witness's key name.
func (v CosigVerifier) Name() string { return v.name }

// KeyID is the 4-byte key id.
func (v CosigVerifier) KeyID() uint32 { return v.id }

// PublicKey is the Ed25519 public key.
func (v CosigVerifier) PublicKey() ed25519.PublicKey { return v.pub }

// String is the vkey: "<name>+<hex id>+base64(0x04 || pub)".
func (v CosigVerifier) String() string {
	return fmt.Sprintf("%s+%08x+%s", v.name, v.id, base64.StdEncoding.EncodeToString(append([]byte{algCosignatureV1}, v.pub...)))
}

// NewCosigVerifier names an Ed25519 public key as a witness key.
func NewCosigVerifier(name string, pub ed25519.PublicKey) (CosigVerifier, error) {
	if !validName(name) {
		return CosigVerifier{}, fmt.Errorf("note: key name %q: %w", name, ErrKey)
	}
	if len(pub) != ed25519.PublicKeySize {
		return CosigVerifier{}, fmt.Errorf("note: public key of %d bytes: %w", len(pub), ErrKey)
	}
	return CosigVerifier{name: name, id: CosignatureKeyID(name, pub), pub: bytes.Clone(pub)}, nil
}

// ParseCosigVerifier parses a witness vkey (signature type 0x04) and checks
// that its key id matches its name and key.
func ParseCosigVerifier(vkey string) (CosigVerifier, error) {
	name, id, key, err := splitKey(vkey)
	if err != nil {
		return CosigVerifier{}, fmt.Errorf("note: cosignature verifier key: %w", err)
	}
	if len(key) != 1+ed25519.PublicKeySize || key[0] != algCosignatureV1 {
		return CosigVerifier{}, fmt.Errorf("note: cosignature verifier key: not a cosignature/v1 Ed25519 key: %w", ErrKey)
	}
	v, err := NewCosigVerifier(name, key[1:])
	if err != nil {
		return CosigVerifier{}, err
	}
	if v.id != id {
		return CosigVerifier{}, fmt.Errorf("note: cosignature verifier key: id %08x does not match the key (%08x): %w", id, v.id, ErrKey)
	}
	return v, nil
}

// Cosigner makes cosignatures with one named Ed25519 key.
type Cosigner struct {
	CosigVerifier
	priv ed25519.PrivateKey
}

// NewCosigner names an Ed25519 private key as a witness key.
func NewCosigner(name string, priv ed25519.PrivateKey) (Cosigner, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return Cosigner{}, fmt.Errorf("note: private key of %d bytes: %w", len(priv), ErrKey)
	}
	v, err := NewCosigVerifier(name, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return Cosigner{}, err
	}
	return Cosigner{CosigVerifier: v, priv: priv}, nil
}

// Cosign returns msg, a well-formed note, with this key's cosignature of its
// text at timestamp t (seconds since the Unix epoch) appended to its
// signature block, in place of any line this key added before. The other
// lines are kept as they are; their signatures are not checked.
func (c Cosigner) Cosign(msg []byte, t uint64) ([]byte, error) {
	if t > MaxCosignatureTime {
		return nil, fmt.Errorf("note: cosign: timestamp %d beyond 2^63-1: %w", t, ErrMalformed)
	}
	text, _, err := split(msg)
	if err != nil {
		return nil, fmt.Errorf("note: cosign: %w", err)
	}
	raw := make([]byte, 4, 4+cosigSize)
	binary.BigEndian.PutUint32(raw, c.id)
	raw = binary.BigEndian.AppendUint64(raw, t)
	raw = append(raw, ed25519.Sign(c.priv, CosignatureMessage(text, t))...)
	return AddSignature(msg, c.name, raw)
}

// AddSignature appends the signature line "— <name> base64(raw)" to note
// msg, where raw is the key id and the signature, dropping the lines with
// the same name and key id that msg already has.
func AddSignature(msg []byte, name string, raw []byte) ([]byte, error) {
	if !validName(name) || len(raw) < 5 {
		return nil, fmt.Errorf("note: add signature of %q: %w", name, ErrMalformed)
	}
	text, lines, err := split(msg)
	if err != nil {
		return nil, fmt.Errorf("note: add signature: %w", err)
	}
	id := binary.BigEndian.Uint32(raw)
	var kept []sigLine
	for _, l := range lines {
		if l.name != name || l.id != id {
			kept = append(kept, l)
		}
	}
	if len(kept)+1 > maxSigs {
		return nil, fmt.Errorf("note: add signature: %d signatures: %w", len(kept)+1, ErrMalformed)
	}
	var buf bytes.Buffer
	buf.Grow(len(msg) + len(name) + 4 + base64.StdEncoding.EncodedLen(len(raw)))
	buf.Write(text)
	buf.WriteByte('\n')
	for _, l := range kept {
		var idb [4]byte
		binary.BigEndian.PutUint32(idb[:], l.id)
		writeLine(&buf, l.name, append(idb[:], l.sig...))
	}
	writeLine(&buf, name, raw)
	return buf.Bytes(), nil
}

func writeLine(buf *bytes.Buffer, name string, raw []byte) {
	buf.WriteString("— ")
	buf.WriteString(name)
	buf.WriteByte(' ')
	buf.WriteString(base64.StdEncoding.EncodeToString(raw))
	buf.WriteByte('\n')
}

// Cosignature is one verified cosignature of a note.
type Cosignature struct {
	// Time is the timestamp the witness signed, in seconds since the Unix
	// epoch.
	Time uint64
	// Raw is the decoded signature: key id, timestamp and Ed25519
	// signature, as AddSignature takes it.
	Raw []byte
}

// VerifyCosignature checks the cosignature lines of v in note msg. Lines of
// other keys are ignored. It fails with ErrMalformed for a note that breaks
// the format, ErrUnverified if v has no line, and ErrInvalidSignature if any
// of v's lines does not verify or carries a timestamp beyond 2^63-1. Of
// several valid lines it returns the one with the latest timestamp.
func VerifyCosignature(msg []byte, v CosigVerifier) (text []byte, cosig Cosignature, err error) {
	text, lines, err := split(msg)
	if err != nil {
		return nil, Cosignature{}, err
	}
	found := false
	for _, l := range lines {
		if l.name != v.name || l.id != v.id {
			continue
		}
		if len(l.sig) != cosigSize {
			return nil, Cosignature{}, fmt.Errorf("note: cosignature of %s: %d bytes: %w", v.name, len(l.sig), ErrInvalidSignature)
		}
		t := binary.BigEndian.Uint64(l.sig)
		if t > MaxCosignatureTime {
			return nil, Cosignature{}, fmt.Errorf("note: cosignature of %s: timestamp %d beyond 2^63-1: %w", v.name, t, ErrInvalidSignature)
		}
		if !ed25519.Verify(v.pub, CosignatureMessage(text, t), l.sig[8:]) {
			return nil, Cosignature{}, fmt.Errorf("note: cosignature of %s: %w", v.name, ErrInvalidSignature)
		}
		if !found || t > cosig.Time {
			raw := make([]byte, 4, 4+cosigSize)
			binary.BigEndian.PutUint32(raw, l.id)
			cosig = Cosignature{Time: t, Raw: append(raw, l.sig...)}
		}
		found = true
	}
	if !found {
		return nil, Cosignature{}, fmt.Errorf("note: no cosignature of %s: %w", v.name, ErrUnverified)
	}
	return text, cosig, nil
}

// SignatureNames lists the key names of a note's signature lines, in order,
// for error messages; nil for a malformed note.
func SignatureNames(msg []byte) []string {
	_, lines, err := split(msg)
	if err != nil {
		return nil
	}
	names := make([]string, len(lines))
	for i, l := range lines {
		names[i] = l.name
	}
	return names
}
