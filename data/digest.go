package data

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
)

// digestDomain separates dataset digests from Fleetlearn's other SHA-256s
// and versions the encoding.
const digestDomain = "fleetlearn/data/v1"

// Digest is the hex SHA-256 of the dataset's content: the domain, the
// example count, dimension and class count as big-endian uint64s, the
// features as little-endian float32 and the labels. Two datasets digest
// alike exactly when they hold the same examples in the same order, so a
// pool job's lineage can name the data a model was trained on.
func (d *Dataset) Digest() string {
	h := sha256.New()
	var b [8]byte
	h.Write([]byte(digestDomain))
	for _, v := range []uint64{uint64(d.Len()), uint64(d.Dim), uint64(d.NumClasses)} {
		binary.BigEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	buf := make([]byte, 0, 4096)
	for _, f := range d.Features {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
		if len(buf) == cap(buf) {
			h.Write(buf)
			buf = buf[:0]
		}
	}
	h.Write(buf)
	h.Write(d.Labels)
	return hex.EncodeToString(h.Sum(nil))
}
