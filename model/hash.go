package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"math"
)

// canonicalMagic starts the canonical bytes; bump its version if the
// encoding ever changes so old and new hashes cannot collide.
const canonicalMagic = "fleetlearn-model-v1\n"

// chunkBytes sizes the scratch buffers used to stream tensor data; a multiple
// of every dtype size.
const chunkBytes = 64 << 10

// Hash returns the SHA-256 of m's canonical bytes (see the package
// documentation). It depends on names, shapes and values only, not on
// Lineage. A nil model hashes like an empty one; a model that fails Validate
// still hashes deterministically, but its bytes are no longer self-delimiting.
func (m *Model) Hash() [32]byte {
	h := sha256.New()
	m.writeCanonical(h)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// HashHex returns Hash as lowercase hex.
func (m *Model) HashHex() string {
	sum := m.Hash()
	return hex.EncodeToString(sum[:])
}

// writeCanonical streams the canonical bytes to w. It is meant for hashes,
// whose Write never fails, so write errors are not reported.
func (m *Model) writeCanonical(w io.Writer) {
	var tensors []Tensor
	if m != nil {
		tensors = m.Tensors
	}
	buf := make([]byte, 0, chunkBytes)
	buf = append(buf, canonicalMagic...)
	buf = binary.AppendUvarint(buf, uint64(len(tensors)))
	for _, t := range tensors {
		buf = binary.AppendUvarint(buf, uint64(len(t.Name)))
		buf = append(buf, t.Name...)
		buf = binary.AppendUvarint(buf, uint64(len(t.Shape)))
		for _, d := range t.Shape {
			buf = binary.AppendUvarint(buf, uint64(d))
		}
		for data := t.Data; len(data) > 0; {
			if cap(buf)-len(buf) < 4 {
				w.Write(buf)
				buf = buf[:0]
			}
			n := min(len(data), (cap(buf)-len(buf))/4)
			buf = appendF32s(buf, data[:n])
			data = data[n:]
		}
	}
	w.Write(buf)
}

// appendF32s appends v as little-endian float32 bits; dst must have room.
func appendF32s(dst []byte, v []float32) []byte {
	start := len(dst)
	dst = dst[:start+4*len(v)]
	out := dst[start:]
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return dst
}
