package secagg

import (
	"encoding/binary"
	"fmt"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// PackedWidth is the number of bytes a masked value of a 2^bits ring takes
// in MaskedUpdate.packed: ⌈bits/8⌉, so that an 8-bit ring costs a quarter
// of the fixed32 values.
func PackedWidth(bits int) int { return (bits + 7) / 8 }

// Pack moves m's values into its packed form, PackedWidth(m.Bits) bytes
// each, little-endian, and clears m.Values. The payload hash
// (wire.MaskedSHA256) is taken over the values, so compute it first; the
// receiver's Unpack restores them. It refuses a value not below 2^bits.
func Pack(m *pb.MaskedUpdate) error {
	const op = "pack"
	bits := int(m.GetBits())
	if bits < 1 || bits > 32 {
		return fmt.Errorf("secagg: %s: %w: %d bits", op, ErrMalformed, bits)
	}
	if len(m.Packed) > 0 {
		return fmt.Errorf("secagg: %s: %w: already packed", op, ErrMalformed)
	}
	w := PackedWidth(bits)
	mask := uint32(1<<bits - 1)
	b := make([]byte, 0, w*len(m.Values)+4)
	for i, v := range m.Values {
		if v > mask {
			return fmt.Errorf("secagg: %s: %w: value[%d] = %d is not below 2^%d", op, ErrMalformed, i, v, bits)
		}
		b = binary.LittleEndian.AppendUint32(b, v)[:len(b)+w]
	}
	m.Packed, m.Values = b, nil
	return nil
}

// Unpack turns a packed masked update of a ring of bits back into exactly
// dim values (m.Values), clearing m.Packed; an update that already carries
// values (older agents) is left as it is. It refuses, with ErrMalformed, an
// update carrying both forms, another bits, a packed length other than
// dim·PackedWidth(bits), and a value not below 2^bits. It allocates only
// once the length matched, so at most the model's dimension.
func Unpack(m *pb.MaskedUpdate, bits, dim int) error {
	const op = "unpack"
	switch {
	case m == nil:
		return fmt.Errorf("secagg: %s: %w: nil message", op, ErrMalformed)
	case int(m.Bits) != bits || bits < 1 || bits > 32:
		return fmt.Errorf("secagg: %s: %w: %d bits, the round has %d", op, ErrMalformed, m.Bits, bits)
	case len(m.Packed) > 0 && len(m.Values) > 0:
		return fmt.Errorf("secagg: %s: %w: both values and packed are set", op, ErrMalformed)
	case len(m.Packed) == 0:
		return nil
	}
	w := PackedWidth(bits)
	if dim < 1 || dim > MaxDim || len(m.Packed) != w*dim {
		return fmt.Errorf("secagg: %s: %w: %d packed bytes, want %d values of %d bytes (%d)", op, ErrMalformed, len(m.Packed), dim, w, w*dim)
	}
	mask := uint32(1<<bits - 1)
	out := make([]uint32, dim)
	var buf [4]byte
	for i := range out {
		copy(buf[:], m.Packed[w*i:w*i+w])
		v := binary.LittleEndian.Uint32(buf[:])
		if v > mask {
			return fmt.Errorf("secagg: %s: %w: value[%d] = %d is not below 2^%d", op, ErrMalformed, i, v, bits)
		}
		out[i] = v
	}
	m.Values, m.Packed = out, nil
	return nil
}
