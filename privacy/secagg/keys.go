package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Sizes on the wire.
const (
	publicKeySize  = 32
	nonceSize      = 12
	sharePlainSize = 4 + 4 + 32 + 32 // sender, receiver, key share, seed share
	shareCipherLen = sharePlainSize + 16
	shareSize      = 32
)

// PeerVerifier checks a peer's Ed25519 signature sig over msg, made with the
// device key that the enrollment records for participant (keyID is the
// message's key_id). It returns nil only for a valid signature by that
// participant's enrolled device.
type PeerVerifier func(participant uint32, keyID string, msg, sig []byte) error

// StaticVerifier returns a PeerVerifier for a fixed participant → key map,
// ignoring key ids.
func StaticVerifier(keys map[uint32]ed25519.PublicKey) PeerVerifier {
	return func(id uint32, _ string, msg, sig []byte) error {
		pub, ok := keys[id]
		if !ok || len(pub) != ed25519.PublicKeySize || !ed25519.Verify(pub, msg, sig) {
			return fmt.Errorf("participant %d: bad signature", id)
		}
		return nil
	}
}

// AdvertiseMessage returns the bytes AdvertiseKeys.signature signs under
// round r: a domain label, the round digest (task, round, cohort size, k,
// t, bits, clip range, graph seed), participant_id and both public keys.
func AdvertiseMessage(r *Round, ak *pb.AdvertiseKeys) []byte {
	return r.advertiseMessage(ak.GetParticipantId(), ak.GetCipherPublicKey(), ak.GetMaskPublicKey())
}

// ConsistencyMessage returns the bytes ConsistencyCheck.signature signs
// under round r: a domain label, the round digest, the signer and the
// ascending survivor numbers.
func ConsistencyMessage(r *Round, signer uint32, survivors []uint32) []byte {
	return r.consistencyMessage(signer, survivors)
}

// advertiseMessage is what AdvertiseKeys.signature signs.
func (r *Round) advertiseMessage(id uint32, cipherPub, maskPub []byte) []byte {
	b := make([]byte, 0, 128)
	b = append(b, "fleetlearn/secagg/v1 advertise\x00"...)
	b = append(b, r.ctx[:]...)
	b = binary.BigEndian.AppendUint32(b, id)
	b = append(b, cipherPub...)
	return append(b, maskPub...)
}

// consistencyMessage is what ConsistencyCheck.signature signs.
func (r *Round) consistencyMessage(signer uint32, survivors []uint32) []byte {
	b := make([]byte, 0, 80+4*len(survivors))
	b = append(b, "fleetlearn/secagg/v1 consistency\x00"...)
	b = append(b, r.ctx[:]...)
	b = binary.BigEndian.AppendUint32(b, signer)
	b = binary.BigEndian.AppendUint32(b, uint32(len(survivors)))
	for _, s := range survivors {
		b = binary.BigEndian.AppendUint32(b, s)
	}
	return b
}

func (r *Round) derive(secret []byte, label string, a, b uint32) [32]byte {
	info := make([]byte, 0, 96)
	info = append(info, "fleetlearn/secagg/v1 "...)
	info = append(info, label...)
	info = append(info, 0)
	info = append(info, r.ctx[:]...)
	info = binary.BigEndian.AppendUint32(info, a)
	info = binary.BigEndian.AppendUint32(info, b)
	k, err := hkdf.Key(sha256.New, secret, nil, string(info), 32)
	if err != nil { // only for lengths over 255·32
		panic(err)
	}
	return [32]byte(k)
}

// shareKey is the AES-256-GCM key for shares from sender to receiver.
func (r *Round) shareKey(shared []byte, sender, receiver uint32) [32]byte {
	return r.derive(shared, "share key", sender, receiver)
}

// pairSeed is the pairwise mask seed of participants a and b.
func (r *Round) pairSeed(shared []byte, a, b uint32) [32]byte {
	return r.derive(shared, "pairwise mask", min(a, b), max(a, b))
}

// selfSeed is the self-mask PRG key of owner, from its shared seed.
func (r *Round) selfSeed(seed []byte, owner uint32) [32]byte {
	return r.derive(seed, "self mask", owner, 0)
}

// shareAD is the AES-GCM additional data of a share from sender to receiver.
func (r *Round) shareAD(sender, receiver uint32) []byte {
	b := make([]byte, 0, 128)
	b = append(b, "fleetlearn/secagg/v1 share\x00"...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.task)))
	b = append(b, r.task...)
	b = binary.BigEndian.AppendUint64(b, r.round)
	b = append(b, r.ctx[:]...)
	b = binary.BigEndian.AppendUint32(b, sender)
	return binary.BigEndian.AppendUint32(b, receiver)
}

func gcm(key [32]byte) cipher.AEAD {
	block, err := aes.NewCipher(key[:])
	if err != nil {
		panic(err) // 32-byte keys are always valid
	}
	a, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return a
}

// x25519Private turns a 32-byte secret below p (top bit clear) into an
// X25519 key. X25519 clears the top bit of every scalar anyway, so sharing
// the bytes as a field element loses nothing.
func x25519Private(b []byte) (*ecdh.PrivateKey, error) {
	return ecdh.X25519().NewPrivateKey(b)
}

// prgChunk is how many bytes of key stream are made at a time: small enough
// to stay in L1/L2 cache, large enough to amortize the call.
const prgChunk = 16 << 10

var zeroChunk [prgChunk]byte

// addPRG adds (sub=false) or subtracts the AES-256-CTR stream keyed by seed,
// read as little-endian uint32 words, to acc modulo 2^32. Each seed keys
// exactly one stream, so the all-zero counter block is safe. buf must hold
// prgChunk bytes.
func addPRG(acc []uint32, seed *[32]byte, sub bool, buf []byte) {
	block, err := aes.NewCipher(seed[:])
	if err != nil {
		panic(err)
	}
	var iv [aes.BlockSize]byte
	ctr := cipher.NewCTR(block, iv[:])
	for len(acc) > 0 {
		n := min(len(acc), prgChunk/4)
		ks := buf[:4*n]
		ctr.XORKeyStream(ks, zeroChunk[:4*n])
		if sub {
			subWords(acc[:n], ks)
		} else {
			addWords(acc[:n], ks)
		}
		acc = acc[n:]
	}
}

// addWords adds the little-endian words of ks to a. Unrolled by eight with
// explicit sub-slices so the compiler drops the per-element bounds checks:
// this loop, not AES, bounds the server's unmasking.
func addWords(a []uint32, ks []byte) {
	ks = ks[:4*len(a)]
	i := 0
	for ; i+8 <= len(a); i += 8 {
		b, x := ks[4*i:4*i+32], a[i:i+8]
		x[0] += binary.LittleEndian.Uint32(b[0:])
		x[1] += binary.LittleEndian.Uint32(b[4:])
		x[2] += binary.LittleEndian.Uint32(b[8:])
		x[3] += binary.LittleEndian.Uint32(b[12:])
		x[4] += binary.LittleEndian.Uint32(b[16:])
		x[5] += binary.LittleEndian.Uint32(b[20:])
		x[6] += binary.LittleEndian.Uint32(b[24:])
		x[7] += binary.LittleEndian.Uint32(b[28:])
	}
	for ; i < len(a); i++ {
		a[i] += binary.LittleEndian.Uint32(ks[4*i:])
	}
}

// subWords subtracts the little-endian words of ks from a, like addWords.
func subWords(a []uint32, ks []byte) {
	ks = ks[:4*len(a)]
	i := 0
	for ; i+8 <= len(a); i += 8 {
		b, x := ks[4*i:4*i+32], a[i:i+8]
		x[0] -= binary.LittleEndian.Uint32(b[0:])
		x[1] -= binary.LittleEndian.Uint32(b[4:])
		x[2] -= binary.LittleEndian.Uint32(b[8:])
		x[3] -= binary.LittleEndian.Uint32(b[12:])
		x[4] -= binary.LittleEndian.Uint32(b[16:])
		x[5] -= binary.LittleEndian.Uint32(b[20:])
		x[6] -= binary.LittleEndian.Uint32(b[24:])
		x[7] -= binary.LittleEndian.Uint32(b[28:])
	}
	for ; i < len(a); i++ {
		a[i] -= binary.LittleEndian.Uint32(ks[4*i:])
	}
}
