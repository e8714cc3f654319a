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
// documentation). It depends on names, shapes, values and Arch, not on
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
	c := newCanonical(w, len(tensors))
	for _, t := range tensors {
		c.tensor(t.Name, t.Shape)
		c.values(t.Data)
	}
	if m != nil {
		c.arch(m.Arch)
	}
	c.flush()
}

// canonical encodes the canonical bytes a piece at a time, for models held
// in memory and models streamed from a file alike.
type canonical struct {
	w   io.Writer
	buf []byte
}

func newCanonical(w io.Writer, tensors int) *canonical {
	c := &canonical{w: w, buf: make([]byte, 0, chunkBytes)}
	c.buf = append(c.buf, canonicalMagic...)
	c.buf = binary.AppendUvarint(c.buf, uint64(tensors))
	return c
}

// tensor starts a tensor; its values follow.
func (c *canonical) tensor(name string, shape []int) {
	c.buf = binary.AppendUvarint(c.buf, uint64(len(name)))
	c.buf = append(c.buf, name...)
	c.buf = binary.AppendUvarint(c.buf, uint64(len(shape)))
	for _, d := range shape {
		c.buf = binary.AppendUvarint(c.buf, uint64(d))
	}
}

func (c *canonical) values(data []float32) {
	for len(data) > 0 {
		if cap(c.buf)-len(c.buf) < 4 {
			c.w.Write(c.buf)
			c.buf = c.buf[:0]
		}
		n := min(len(data), (cap(c.buf)-len(c.buf))/4)
		c.buf = appendF32s(c.buf, data[:n])
		data = data[n:]
	}
}

// arch ends the bytes of a model with an architecture. The tensor count
// comes first, so bytes after the last tensor can only be this; a model
// without one hashes as it did before architectures existed.
func (c *canonical) arch(a string) {
	if a == "" {
		return
	}
	c.buf = binary.AppendUvarint(c.buf, uint64(len(a)))
	c.buf = append(c.buf, a...)
}

func (c *canonical) flush() {
	c.w.Write(c.buf)
	c.buf = c.buf[:0]
}

// HashSafetensors returns the Hash of the model the safetensors file r holds
// without holding the model: it reads the file through a SafetensorsReader,
// making every check ReadSafetensors makes, one chunk at a time.
func HashSafetensors(r io.Reader, opts ...ReadOption) ([32]byte, error) {
	var sum [32]byte
	d, err := NewSafetensorsReader(r, opts...)
	if err != nil {
		return sum, err
	}
	h := sha256.New()
	c := newCanonical(h, len(d.hdr.tensors))
	for {
		ti, err := d.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return sum, err
		}
		c.tensor(ti.Name, ti.Shape)
		for {
			v, err := d.Values()
			if err == io.EOF {
				break
			}
			if err != nil {
				return sum, err
			}
			c.values(v)
		}
	}
	c.arch(d.hdr.arch)
	c.flush()
	h.Sum(sum[:0])
	return sum, nil
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
