package wasm

import (
	"encoding/binary"
	"slices"
)

// Go's linker writes a module's initial memory as one active data segment
// per run of non-zero bytes: the example modules carry some 37,000, and
// wazero evaluates each segment's offset expression and copies it on every
// instantiation, that is on every call (4 ms of a call's 10 on the x86 VM
// of docs/ABI.md). mergeDataSegments rewrites the data section into a few
// segments that hold the same bytes, the gaps between them filled with the
// zeros memory starts with, before the module is compiled. The module's
// behaviour is unchanged: memory holds the same bytes after instantiation,
// and a segment out of bounds still fails instantiation, since the merged
// segment ends where the last of its parts did.

// dataMergeGap is the longest run of zeros merged into a segment: each
// segment costs wazero about as much as copying a few kilobytes.
const dataMergeGap = 4096

// maxMergedDataBytes bounds the bytes a rewritten data section may hold,
// gaps included: the sandbox's default memory cap. Sparser data is left as
// it is (a hostile module must not make the host allocate its whole address
// space).
const maxMergedDataBytes = 128 << 20

type dataSegment struct {
	offset uint32
	data   []byte
}

// mergeDataSegments returns code with its active data segments merged, or
// code itself when there is nothing to merge or when the module is anything
// but the simple case it knows to be safe: a well-formed section list, a
// data section of active segments for memory 0 at i32.const offsets that do
// not overlap, and no data count section (passive segments and the bulk
// memory instructions name segments by index). Malformed modules are left
// for the compiler to refuse.
func mergeDataSegments(code []byte) []byte {
	if len(code) < 8 || string(code[:4]) != "\x00asm" {
		return code
	}
	hdr, start, end := -1, -1, -1 // the data section's id byte and contents
	for p := 8; p < len(code); {
		id := code[p]
		size, n := binary.Uvarint(code[p+1:])
		if n <= 0 || n > 5 || size > uint64(len(code)-p-1-n) {
			return code
		}
		body := p + 1 + n
		switch id {
		case 11:
			if start >= 0 {
				return code
			}
			hdr, start, end = p, body, body+int(size)
		case 12:
			return code
		}
		p = body + int(size)
	}
	if start < 0 {
		return code
	}
	segs, ok := parseDataSegments(code[start:end])
	if !ok || len(segs) < 2 {
		return code
	}
	slices.SortStableFunc(segs, func(a, b dataSegment) int {
		switch {
		case a.offset < b.offset:
			return -1
		case a.offset > b.offset:
			return 1
		}
		return 0
	})
	// Sorting is safe only if no two segments overlap: the later one would
	// win in the original order.
	for i := 1; i < len(segs); i++ {
		if uint64(segs[i].offset) < uint64(segs[i-1].offset)+uint64(len(segs[i-1].data)) {
			return code
		}
	}
	var merged []dataSegment
	var total uint64
	for _, s := range segs {
		if k := len(merged) - 1; k >= 0 {
			last := &merged[k]
			lastEnd := uint64(last.offset) + uint64(len(last.data))
			if gap := uint64(s.offset) - lastEnd; gap <= dataMergeGap {
				total += gap + uint64(len(s.data))
				if total > maxMergedDataBytes {
					return code
				}
				last.data = append(last.data, make([]byte, gap)...)
				last.data = append(last.data, s.data...)
				continue
			}
		}
		total += uint64(len(s.data))
		if total > maxMergedDataBytes {
			return code
		}
		merged = append(merged, dataSegment{offset: s.offset, data: slices.Clone(s.data)})
	}
	if len(merged) == len(segs) {
		return code
	}
	var sec []byte
	sec = binary.AppendUvarint(sec, uint64(len(merged)))
	for _, s := range merged {
		sec = append(sec, 0, 0x41) // active, memory 0; i32.const
		sec = appendSleb32(sec, int32(s.offset))
		sec = append(sec, 0x0b) // end
		sec = binary.AppendUvarint(sec, uint64(len(s.data)))
		sec = append(sec, s.data...)
	}
	out := make([]byte, 0, len(code)-(end-start)+len(sec)+5)
	// The section's size is rewritten; Go pads it to five bytes.
	out = append(out, code[:hdr+1]...)
	out = binary.AppendUvarint(out, uint64(len(sec)))
	out = append(out, sec...)
	return append(out, code[end:]...)
}

// parseDataSegments reads a data section's contents, reporting false for
// anything but active segments for memory 0 at an i32.const offset.
func parseDataSegments(b []byte) ([]dataSegment, bool) {
	count, n := binary.Uvarint(b)
	if n <= 0 || n > 5 || count > uint64(len(b)) {
		return nil, false
	}
	b = b[n:]
	segs := make([]dataSegment, 0, count)
	for range count {
		// Flag 0 (active, memory 0), then i32.const.
		if len(b) < 2 || b[0] != 0 || b[1] != 0x41 {
			return nil, false
		}
		off, n := readSleb32(b[2:])
		if n <= 0 {
			return nil, false
		}
		b = b[2+n:]
		if len(b) < 1 || b[0] != 0x0b {
			return nil, false
		}
		size, n := binary.Uvarint(b[1:])
		if n <= 0 || n > 5 || size > uint64(len(b)-1-n) {
			return nil, false
		}
		b = b[1+n:]
		segs = append(segs, dataSegment{offset: uint32(off), data: b[:size:size]})
		b = b[size:]
	}
	return segs, len(b) == 0
}

// readSleb32 decodes a signed LEB128 i32 of at most five bytes, as wasm
// encodes i32.const; n is 0 when b holds none.
func readSleb32(b []byte) (v int32, n int) {
	var r int64
	var shift uint
	for i := 0; i < len(b) && i < 5; i++ {
		c := b[i]
		r |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				r |= -1 << shift
			}
			if r < -1<<31 || r > 1<<31-1 {
				return 0, 0
			}
			return int32(r), i + 1
		}
	}
	return 0, 0
}

func appendSleb32(b []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if x == 0 && c&0x40 == 0 || x == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
