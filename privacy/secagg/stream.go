package secagg

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Masked inputs in pieces. A server that never holds a whole report checks
// a masked input as its bytes arrive (MaskedDecoder), then, once the report
// passed every check, reads it again into the sum (BeginMasked). AddMasked
// is the same for a whole MaskedUpdate.

// MaskedDecoder decodes a masked input's values as they arrive, from the
// packed fixed32 values field (4 bytes each) or the packed field
// (PackedWidth(bits) bytes each), little-endian, and refuses a value not
// below 2^bits or a length other than dim values: Unpack's checks, a piece
// at a time. It hands the values on in order, a batch at a time.
type MaskedDecoder struct {
	bits, width, dim int
	mask             uint32
	carry            [4]byte
	nc, n            int
	out              []uint32
	emit             func([]uint32) error
}

const maskedBatch = 4096

// NewMaskedDecoder returns a decoder of size bytes of dim values of bits
// bits, in the packed form (packed) or as fixed32s, for emit (whose slice is
// reused after it returns).
func NewMaskedDecoder(bits, dim int, packed bool, size uint64, emit func([]uint32) error) (*MaskedDecoder, error) {
	const op = "unpack"
	if bits < 1 || bits > 32 || dim < 1 || dim > MaxDim {
		return nil, fmt.Errorf("secagg: %s: %w: %d values of %d bits", op, ErrMalformed, dim, bits)
	}
	w := 4
	if packed {
		w = PackedWidth(bits)
	}
	if size != uint64(w)*uint64(dim) {
		return nil, fmt.Errorf("secagg: %s: %w: %d bytes, want %d values of %d bytes (%d)", op, ErrMalformed, size, dim, w, w*dim)
	}
	return &MaskedDecoder{bits: bits, width: w, dim: dim, mask: uint32(uint64(1)<<bits - 1), emit: emit,
		out: make([]uint32, 0, maskedBatch)}, nil
}

// Write decodes the next bytes.
func (d *MaskedDecoder) Write(p []byte) error {
	for len(p) > 0 {
		k := copy(d.carry[d.nc:d.width], p)
		d.nc += k
		p = p[k:]
		if d.nc < d.width {
			return nil
		}
		var b [4]byte
		copy(b[:], d.carry[:d.width])
		d.nc = 0
		v := binary.LittleEndian.Uint32(b[:])
		if v > d.mask {
			return fmt.Errorf("secagg: unpack: %w: value[%d] = %d is not below 2^%d", ErrMalformed, d.n, v, d.bits)
		}
		if d.n == d.dim {
			return fmt.Errorf("secagg: unpack: %w: more than %d values", ErrMalformed, d.dim)
		}
		d.out = append(d.out, v)
		d.n++
		if len(d.out) == maskedBatch {
			if err := d.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *MaskedDecoder) flush() error {
	if len(d.out) == 0 {
		return nil
	}
	err := d.emit(d.out)
	d.out = d.out[:0]
	return err
}

// Close checks that every value came and hands on the last ones.
func (d *MaskedDecoder) Close() error {
	if d.nc != 0 || d.n != d.dim {
		return fmt.Errorf("secagg: unpack: %w: %d values and %d bytes, want %d values", ErrMalformed, d.n, d.nc, d.dim)
	}
	return d.flush()
}

// MaskedPart adds one participant's masked input to the sum in pieces, in
// order: Write each piece, then Close. The values must have passed a
// MaskedDecoder. Until Close the input does not count; from its first
// Write until its Close the server refuses everything else, and a part left
// unclosed leaves it aborted: the sum holds part of an input.
type MaskedPart struct {
	s    *Server
	id   uint32
	n    int
	done bool
}

// errPartial aborts a server while a masked input is half added.
var errPartial = errors.New("a masked input was added in part")

// BeginMasked starts adding participant id's masked input of bits bits,
// with AddMasked's checks of the sender.
func (s *Server) BeginMasked(id uint32, bits uint32) (*MaskedPart, error) {
	const op = "add masked"
	if err := s.enter(StageMaskedInput, op); err != nil {
		return nil, err
	}
	if err := s.sender(op, s.u2, id); err != nil {
		return nil, err
	}
	if s.inS[id] {
		return nil, fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrDuplicate)
	}
	if int(bits) != s.r.bits {
		return nil, fmt.Errorf("secagg: %s: participant %d: %w: %d bits, the round has %d", op, id, ErrMalformed, bits, s.r.bits)
	}
	return &MaskedPart{s: s, id: id}, nil
}

// Write adds the next values.
func (p *MaskedPart) Write(v []uint32) error {
	s := p.s
	if p.done {
		return fmt.Errorf("secagg: add masked: participant %d: %w: write after close", p.id, ErrMalformed)
	}
	if len(v) > s.dim-p.n {
		return fmt.Errorf("secagg: add masked: participant %d: %w: more than %d values", p.id, ErrMalformed, s.dim)
	}
	mask := s.r.mask()
	for i, x := range v {
		if x > mask {
			return fmt.Errorf("secagg: add masked: participant %d: %w: value[%d] = %d is not below 2^%d", p.id, ErrMalformed, p.n+i, x, s.r.bits)
		}
	}
	if len(v) == 0 {
		return nil
	}
	if s.err == nil {
		s.err = fmt.Errorf("participant %d: %w", p.id, errPartial)
	}
	sum := s.sum[p.n : p.n+len(v)]
	for i, x := range v {
		sum[i] += x
	}
	p.n += len(v)
	return nil
}

// Close counts the input once all its values are in.
func (p *MaskedPart) Close() error {
	s := p.s
	if p.done {
		return nil
	}
	if p.n != s.dim {
		return fmt.Errorf("secagg: add masked: participant %d: %w: %d values of %d added", p.id, ErrMalformed, p.n, s.dim)
	}
	p.done = true
	if errors.Is(s.err, errPartial) {
		s.err = nil
	}
	s.inS[p.id] = true
	return nil
}
