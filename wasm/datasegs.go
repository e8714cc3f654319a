package wasm

import (
	"cmp"
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
	// Go writes each of its data sections in address order.
	slices.SortFunc(segs, func(a, b dataSegment) int { return cmp.Compare(a.offset, b.offset) })
	// Sorting is safe only if no two segments overlap: the later one would
	// win in the original order.
	for i := 1; i < len(segs); i++ {
		if uint64(segs[i].offset) < uint64(segs[i-1].offset)+uint64(len(segs[i-1].data)) {
			return code
		}
	}
	// Runs of segments no more than dataMergeGap apart become one segment.
	type run struct {
		first, last int    // segs[first:last+1]
		size        uint64 // bytes, gaps included
	}
	var runs []run
	var total uint64
	for i, sg := range segs {
		if k := len(runs) - 1; k >= 0 {
			prev := segs[i-1]
			if gap := uint64(sg.offset) - uint64(prev.offset) - uint64(len(prev.data)); gap <= dataMergeGap {
				runs[k].last = i
				runs[k].size += gap + uint64(len(sg.data))
				total += gap + uint64(len(sg.data))
				if total > maxMergedDataBytes {
					return code
				}
				continue
			}
		}
		runs = append(runs, run{first: i, last: i, size: uint64(len(sg.data))})
		total += uint64(len(sg.data))
		if total > maxMergedDataBytes {
			return code
		}
	}
	if len(runs) == len(segs) {
		return code
	}
	// One allocation for the new module; make zeroes it, so the gaps are
	// written by extending the slice.
	secLen := uint64(uvarintLen(uint64(len(runs))))
	for _, r := range runs {
		secLen += 2 + uint64(len(appendSleb32(nil, int32(segs[r.first].offset)))) + 1 + uint64(uvarintLen(r.size)) + r.size
	}
	out := make([]byte, 0, uint64(hdr+1+5)+secLen+uint64(len(code)-end))
	// The section's size is rewritten; Go pads it to five bytes.
	out = append(out, code[:hdr+1]...)
	out = binary.AppendUvarint(out, secLen)
	out = binary.AppendUvarint(out, uint64(len(runs)))
	for _, r := range runs {
		out = append(out, 0, 0x41) // active, memory 0; i32.const
		out = appendSleb32(out, int32(segs[r.first].offset))
		out = append(out, 0x0b) // end
		out = binary.AppendUvarint(out, r.size)
		base := uint64(len(out)) - uint64(segs[r.first].offset)
		for _, sg := range segs[r.first : r.last+1] {
			out = out[:base+uint64(sg.offset)]
			out = append(out, sg.data...)
		}
	}
	return append(out, code[end:]...)
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
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
