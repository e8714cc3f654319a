package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// MinStreamBlock is the smallest block size a Decoder takes. It holds the
// scales while the codes stream past, 4 bytes per block: at 64 values a
// block that is at most 1/16 of the float32 update, so an encoding with
// tiny blocks cannot make a receiver of pieces hold a second update.
// DefaultBlock is 256.
const MinStreamBlock = 64

// decodeBatch is how many values a Decoder hands on at a time.
const decodeBatch = 4096

// Decoder decodes an FLQ8 or FLQ4 encoding of n values that arrives in
// pieces, as strictly as DecodeInto decodes a whole one, and hands the
// values on in order, a batch at a time. It holds the header and scales,
// and one batch.
type Decoder struct {
	h      header
	bits   int
	n      uint64
	size   uint64 // the encoding's length, known before its bytes
	emit   func([]float32) error
	head   []byte // header and scales until complete
	block  uint64
	scales []float32
	off    uint64 // bytes consumed
	i      uint64 // values decoded
	out    []float32
}

// NewDecoder returns a decoder of an encoding of size bytes that must hold
// n values in bits 8 or 4, handing them to emit (whose slice is reused
// after it returns).
func NewDecoder(bits, n int, size uint64, emit func([]float32) error) (*Decoder, error) {
	d := &Decoder{bits: bits, n: uint64(n), size: size, emit: emit}
	switch bits {
	case 8:
		d.h = header{op: "decode", magic: magic, version: version, what: "an int8 update", maxScale: maxScale,
			payload: func(n uint64) uint64 { return n }}
	case 4:
		d.h = header{op: "decode4", magic: magic4, version: version4, what: "a 4-bit update", maxScale: maxScale4,
			payload: func(n uint64) uint64 { return (n + 1) / 2 }}
	default:
		return nil, fmt.Errorf("quant: decoder: %d bits, want 8 or 4: %w", bits, ErrConfig)
	}
	if n < 1 || n > MaxLen {
		return nil, fmt.Errorf("quant: %s: want %d values, not in [1, %d]: %w", d.h.op, n, MaxLen, ErrShape)
	}
	return d, nil
}

// Write decodes the next bytes of the encoding.
func (d *Decoder) Write(p []byte) error {
	if uint64(len(p)) > d.size-d.off {
		return fmt.Errorf("quant: %s: more than the %d bytes announced: %w", d.h.op, d.size, ErrFormat)
	}
	// Twice at most: the header says how long the scales are.
	for d.scales == nil && len(p) > 0 {
		k := min(len(p), d.headLen()-len(d.head))
		d.head = append(d.head, p[:k]...)
		d.off += uint64(k)
		p = p[k:]
		if err := d.parseHead(); err != nil {
			return err
		}
	}
	for len(p) > 0 {
		if d.out == nil {
			d.out = make([]float32, 0, decodeBatch)
		}
		if decodeBatch-len(d.out) < 2 {
			if err := d.flush(); err != nil {
				return err
			}
		}
		room := decodeBatch - len(d.out)
		if d.bits == 8 {
			// A run of codes of one block: one scale, no call per value.
			end := min((d.i/d.block+1)*d.block, d.n)
			k := min(len(p), room, int(end-d.i))
			if k == 0 { // unreachable: the length was checked against n
				return fmt.Errorf("quant: %s: more than %d codes: %w", d.h.op, d.n, ErrFormat)
			}
			sc := d.scales[d.i/d.block]
			sf := float64(sc)
			for j, c := range p[:k] {
				code := int8(c)
				if code < -maxCode {
					return fmt.Errorf("quant: %s: code %d = %d, below -%d: %w", d.h.op, d.i+uint64(j), code, maxCode, ErrFormat)
				}
				if code != 0 && sc == 0 {
					return fmt.Errorf("quant: %s: code %d = %d in a block of scale 0: %w", d.h.op, d.i+uint64(j), code, ErrFormat)
				}
				d.out = append(d.out, float32(float64(code)*sf))
			}
			d.i += uint64(k)
			d.off += uint64(k)
			p = p[k:]
			continue
		}
		take := min(len(p), room/2)
		for _, c := range p[:take] {
			if err := d.value(int8(c<<4) >> 4); err != nil {
				return err
			}
			if d.i == d.n { // odd n: the last high nibble is padding
				if c>>4 != 0 {
					return fmt.Errorf("quant: decode4: padding nibble after the last of %d values is %d, want 0: %w", d.n, c>>4, ErrFormat)
				}
				continue
			}
			if err := d.value(int8(c) >> 4); err != nil {
				return err
			}
		}
		d.off += uint64(take)
		p = p[take:]
	}
	return nil
}

// headLen is the header's length, and once it is known the scales' too.
func (d *Decoder) headLen() int {
	if d.block == 0 {
		return headerSize
	}
	return headerSize + 4*int((d.n+d.block-1)/d.block)
}

// parseHead checks the header once it is whole, then reads the scales once
// they are.
func (d *Decoder) parseHead() error {
	h := d.h
	if d.block == 0 {
		if len(d.head) < headerSize {
			return nil
		}
		b := d.head
		if string(b[:4]) != h.magic {
			return fmt.Errorf("quant: %s: magic %q, want %q (not %s): %w", h.op, b[:4], h.magic, h.what, ErrFormat)
		}
		if b[4] != h.version {
			return fmt.Errorf("quant: %s: version %d, want %d: %w", h.op, b[4], h.version, ErrFormat)
		}
		if n := uint64(binary.LittleEndian.Uint32(b[5:])); n != d.n {
			return fmt.Errorf("quant: %s: %d values, want %d: %w", h.op, n, d.n, ErrShape)
		}
		block := uint64(binary.LittleEndian.Uint32(b[9:]))
		if block < MinStreamBlock || block > MaxBlock {
			return fmt.Errorf("quant: %s: block size %d not in [%d, %d]: %w", h.op, block, MinStreamBlock, MaxBlock, ErrFormat)
		}
		nb := (d.n + block - 1) / block
		if want := headerSize + 4*nb + h.payload(d.n); d.size != want {
			return fmt.Errorf("quant: %s: %d bytes, want %d for %d values in blocks of %d: %w", h.op, d.size, want, d.n, block, ErrFormat)
		}
		d.block = block
	}
	if len(d.head) < d.headLen() {
		return nil
	}
	p := d.head[headerSize:]
	scales := make([]float32, len(p)/4)
	for i := range scales {
		bits := binary.LittleEndian.Uint32(p[4*i:])
		s := math.Float32frombits(bits)
		if bits>>31 != 0 || !(s <= h.maxScale) {
			return fmt.Errorf("quant: %s: scale %d = %v not in [0, %v]: %w", h.op, i, s, h.maxScale, ErrFormat)
		}
		scales[i] = s
	}
	d.scales, d.head = scales, nil
	return nil
}

func (d *Decoder) value(c int8) error {
	k := int64(maxCode)
	if d.bits == 4 {
		k = maxCode4
	}
	if int64(c) < -k {
		return fmt.Errorf("quant: %s: code %d = %d, below -%d: %w", d.h.op, d.i, c, k, ErrFormat)
	}
	s := d.scales[d.i/d.block]
	if c != 0 && s == 0 {
		return fmt.Errorf("quant: %s: code %d = %d in a block of scale 0: %w", d.h.op, d.i, c, ErrFormat)
	}
	d.out = append(d.out, float32(float64(c)*float64(s)))
	d.i++
	return nil
}

func (d *Decoder) flush() error {
	if len(d.out) == 0 {
		return nil
	}
	err := d.emit(d.out)
	d.out = d.out[:0]
	return err
}

// Close checks that the encoding was whole and hands on the last values.
func (d *Decoder) Close() error {
	if d.block == 0 {
		return fmt.Errorf("quant: %s: %d bytes, shorter than the %d-byte header: %w", d.h.op, d.off, headerSize, ErrFormat)
	}
	if d.off != d.size || d.i != d.n {
		return fmt.Errorf("quant: %s: %d of %d bytes, %d of %d values: %w", d.h.op, d.off, d.size, d.i, d.n, ErrFormat)
	}
	return d.flush()
}
