// Package wasmbin writes and inspects tiny WebAssembly binaries for Fleetlearn's
// sandbox tests. It knows only what those tests need: function types, function
// and memory imports, functions, one memory, exports, active data segments and
// code, so a test can hand-build a module with exactly the flaw it is about, and
// it can find the sections and function bodies of a real module to corrupt them.
//
// The encoding follows the WebAssembly core specification, binary format
// (https://webassembly.github.io/spec/core/binary/).
package wasmbin

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ValType is a value type's encoding.
type ValType byte

// Value types.
const (
	I32 ValType = 0x7f
	I64 ValType = 0x7e
	F32 ValType = 0x7d
	F64 ValType = 0x7c
)

// Section ids.
const (
	SectionType     byte = 1
	SectionImport   byte = 2
	SectionFunction byte = 3
	SectionMemory   byte = 5
	SectionExport   byte = 7
	SectionCode     byte = 10
	SectionData     byte = 11
)

// ExportKind says what an export names.
type ExportKind byte

// Export kinds.
const (
	ExportFunc   ExportKind = 0
	ExportMemory ExportKind = 2
)

// FuncType is a function signature.
type FuncType struct{ Params, Results []ValType }

// Import is a function import of type Type, or a one-page memory import when
// Memory is set. Imported functions take the first function indices.
type Import struct {
	Module, Name string
	Type         uint32
	Memory       bool
}

// Func is a defined function: Body is its instructions, without the final end.
type Func struct {
	Type   uint32
	Locals []ValType
	Body   []byte
}

// Export names a function or the memory.
type Export struct {
	Name  string
	Kind  ExportKind
	Index uint32
}

// Data is an active data segment copied into memory 0 at Offset on instantiation.
type Data struct {
	Offset int32
	Bytes  []byte
}

// Module is a module to encode. Memory, when set, defines memory 0 with that
// many initial pages and no maximum.
type Module struct {
	Types   []FuncType
	Imports []Import
	Funcs   []Func
	Memory  *uint32
	Exports []Export
	Data    []Data
}

// Pages is a convenience for Module.Memory.
func Pages(n uint32) *uint32 { return &n }

// Magic and Version open every module.
var (
	Magic   = []byte{0x00, 'a', 's', 'm'}
	Version = []byte{0x01, 0x00, 0x00, 0x00}
)

// Encode returns the module's binary form. Empty sections are left out.
func (m Module) Encode() []byte {
	out := append(append([]byte{}, Magic...), Version...)
	section := func(id byte, n int, item func(b []byte, i int) []byte) {
		if n == 0 {
			return
		}
		payload := AppendU32(nil, uint32(n))
		for i := range n {
			payload = item(payload, i)
		}
		out = append(out, id)
		out = AppendU32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	section(SectionType, len(m.Types), func(b []byte, i int) []byte {
		t := m.Types[i]
		b = append(b, 0x60)
		b = appendVals(b, t.Params)
		return appendVals(b, t.Results)
	})
	section(SectionImport, len(m.Imports), func(b []byte, i int) []byte {
		im := m.Imports[i]
		b = appendName(appendName(b, im.Module), im.Name)
		if im.Memory {
			return append(b, 0x02, 0x00, 0x01) // memory, limits without max, min 1
		}
		return AppendU32(append(b, 0x00), im.Type)
	})
	section(SectionFunction, len(m.Funcs), func(b []byte, i int) []byte {
		return AppendU32(b, m.Funcs[i].Type)
	})
	if m.Memory != nil {
		section(SectionMemory, 1, func(b []byte, _ int) []byte {
			return AppendU32(append(b, 0x00), *m.Memory)
		})
	}
	section(SectionExport, len(m.Exports), func(b []byte, i int) []byte {
		e := m.Exports[i]
		return AppendU32(append(appendName(b, e.Name), byte(e.Kind)), e.Index)
	})
	section(SectionCode, len(m.Funcs), func(b []byte, i int) []byte {
		f := m.Funcs[i]
		// Each local gets its own (count 1, type) entry: simple, and valid.
		body := AppendU32(nil, uint32(len(f.Locals)))
		for _, l := range f.Locals {
			body = append(body, 0x01, byte(l))
		}
		body = append(append(body, f.Body...), OpEnd)
		return append(AppendU32(b, uint32(len(body))), body...)
	})
	section(SectionData, len(m.Data), func(b []byte, i int) []byte {
		d := m.Data[i]
		b = append(b, 0x00) // active, memory 0
		b = append(append(b, I32Const(d.Offset)...), OpEnd)
		return append(AppendU32(b, uint32(len(d.Bytes))), d.Bytes...)
	})
	return out
}

// Opcodes used by Fleetlearn's tests.
const (
	OpUnreachable byte = 0x00
	OpLoop        byte = 0x03
	OpEnd         byte = 0x0b
	OpBr          byte = 0x0c
	OpBrIf        byte = 0x0d
	OpDrop        byte = 0x1a
	OpI32Ne       byte = 0x47
	BlockEmpty    byte = 0x40 // block type of a block that takes and returns nothing
)

// I32Const is i32.const v.
func I32Const(v int32) []byte { return appendS32([]byte{0x41}, v) }

// Call is call f.
func Call(f uint32) []byte { return AppendU32([]byte{0x10}, f) }

// MemoryGrow is memory.grow on memory 0.
func MemoryGrow() []byte { return []byte{0x40, 0x00} }

// Code concatenates instruction sequences.
func Code(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func appendVals(b []byte, vs []ValType) []byte {
	b = AppendU32(b, uint32(len(vs)))
	for _, v := range vs {
		b = append(b, byte(v))
	}
	return b
}

func appendName(b []byte, s string) []byte { return append(AppendU32(b, uint32(len(s))), s...) }

// AppendU32 appends v as unsigned LEB128.
func AppendU32(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// appendS32 appends v as signed LEB128.
func appendS32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// ErrMalformed reports bytes this package cannot walk.
var ErrMalformed = errors.New("wasmbin: malformed module")

// readU32 decodes unsigned LEB128 at b[off:], returning the value and the next offset.
func readU32(b []byte, off int) (uint32, int, error) {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		if off >= len(b) {
			return 0, 0, fmt.Errorf("%w: LEB128 runs past the end", ErrMalformed)
		}
		c := b[off]
		off++
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, off, nil
		}
	}
	return 0, 0, fmt.Errorf("%w: LEB128 longer than 5 bytes", ErrMalformed)
}

// Section locates one section: b[Start:End] is its payload.
type Section struct {
	ID         byte
	Start, End int
}

// Sections lists a module's sections in order, without validating their contents.
func Sections(b []byte) ([]Section, error) {
	if len(b) < 8 || !bytes.Equal(b[:4], Magic) || !bytes.Equal(b[4:8], Version) {
		return nil, fmt.Errorf("%w: bad header", ErrMalformed)
	}
	var out []Section
	for off := 8; off < len(b); {
		id := b[off]
		n, start, err := readU32(b, off+1)
		if err != nil {
			return nil, err
		}
		end := start + int(n)
		if end > len(b) {
			return nil, fmt.Errorf("%w: section %d runs past the end", ErrMalformed, id)
		}
		out = append(out, Section{ID: id, Start: start, End: end})
		off = end
	}
	return out, nil
}

// Body locates one function body: b[Start:End] is the body after its size,
// and its instructions begin at Code, after the local declarations.
type Body struct{ Start, Code, End int }

// FuncBodies lists the function bodies of a module's code section.
func FuncBodies(b []byte) ([]Body, error) {
	secs, err := Sections(b)
	if err != nil {
		return nil, err
	}
	for _, s := range secs {
		if s.ID != SectionCode {
			continue
		}
		n, off, err := readU32(b[:s.End], s.Start)
		if err != nil {
			return nil, err
		}
		bodies := make([]Body, 0, n)
		for range n {
			size, start, err := readU32(b[:s.End], off)
			if err != nil {
				return nil, err
			}
			end := start + int(size)
			if end > s.End {
				return nil, fmt.Errorf("%w: function body runs past the code section", ErrMalformed)
			}
			decls, p, err := readU32(b[:end], start)
			if err != nil {
				return nil, err
			}
			for range decls {
				if _, p, err = readU32(b[:end], p); err != nil {
					return nil, err
				}
				p++ // the declaration's value type
			}
			if p > end {
				return nil, fmt.Errorf("%w: local declarations run past the body", ErrMalformed)
			}
			bodies = append(bodies, Body{Start: start, Code: p, End: end})
			off = end
		}
		return bodies, nil
	}
	return nil, fmt.Errorf("%w: no code section", ErrMalformed)
}

// Imports lists a module's imports in order. A memory import has Memory set;
// a table or global import, which Fleetlearn's tests never write, is refused.
func Imports(b []byte) ([]Import, error) {
	secs, err := Sections(b)
	if err != nil {
		return nil, err
	}
	name := func(end, off int) (string, int, error) {
		n, p, err := readU32(b[:end], off)
		if err != nil {
			return "", 0, err
		}
		if p+int(n) > end {
			return "", 0, fmt.Errorf("%w: name runs past the import section", ErrMalformed)
		}
		return string(b[p : p+int(n)]), p + int(n), nil
	}
	for _, s := range secs {
		if s.ID != SectionImport {
			continue
		}
		n, off, err := readU32(b[:s.End], s.Start)
		if err != nil {
			return nil, err
		}
		out := make([]Import, 0, min(n, 1<<16))
		for range n {
			var im Import
			if im.Module, off, err = name(s.End, off); err != nil {
				return nil, err
			}
			if im.Name, off, err = name(s.End, off); err != nil {
				return nil, err
			}
			if off >= s.End {
				return nil, fmt.Errorf("%w: import %s.%s has no kind", ErrMalformed, im.Module, im.Name)
			}
			kind := b[off]
			switch kind {
			case 0x00:
				if im.Type, off, err = readU32(b[:s.End], off+1); err != nil {
					return nil, err
				}
			case 0x02:
				im.Memory = true
				if off+1 >= s.End {
					return nil, fmt.Errorf("%w: memory import %s.%s has no limits", ErrMalformed, im.Module, im.Name)
				}
				flags := b[off+1]
				if _, off, err = readU32(b[:s.End], off+2); err != nil {
					return nil, err
				}
				if flags&1 != 0 {
					if _, off, err = readU32(b[:s.End], off); err != nil {
						return nil, err
					}
				}
			default:
				return nil, fmt.Errorf("%w: import %s.%s of kind %d", ErrMalformed, im.Module, im.Name, kind)
			}
			out = append(out, im)
		}
		return out, nil
	}
	return nil, nil
}

// F32Const is f32.const v.
func F32Const(v float32) []byte {
	u := math.Float32bits(v)
	return []byte{0x43, byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)}
}

// F64Const is f64.const v.
func F64Const(v float64) []byte {
	b := []byte{0x44, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint64(b[1:], math.Float64bits(v))
	return b
}
