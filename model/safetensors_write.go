package model

import (
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
)

// WriteSafetensors writes m, after validating it, as a safetensors file with
// F32 little-endian data. The output is deterministic: "__metadata__" first
// (holding the lineage), then the tensors in model order, and the header
// padded with spaces to a multiple of 8 bytes.
func WriteSafetensors(w io.Writer, m *Model) error {
	if err := m.validate(); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	hdr := appendHeader(make([]byte, 8, 256), m)
	binary.LittleEndian.PutUint64(hdr, uint64(len(hdr)-8))
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	buf := make([]byte, 0, chunkBytes)
	for _, t := range m.Tensors {
		for data := t.Data; len(data) > 0; {
			n := min(len(data), (cap(buf)-len(buf))/4)
			buf = appendF32s(buf, data[:n])
			data = data[n:]
			if cap(buf)-len(buf) < 4 {
				if _, err := w.Write(buf); err != nil {
					return fmt.Errorf("safetensors: write: %w", err)
				}
				buf = buf[:0]
			}
		}
	}
	if len(buf) > 0 {
		if _, err := w.Write(buf); err != nil {
			return fmt.Errorf("safetensors: write: %w", err)
		}
	}
	return nil
}

// appendHeader appends the JSON header, written by hand because
// encoding/json sorts map keys and the order must follow the model.
func appendHeader(b []byte, m *Model) []byte {
	start := len(b)
	b = append(b, `{"__metadata__":{`...)
	first := true
	meta := func(key, v string) {
		if v == "" {
			return
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, key)
		b = append(b, ':')
		b = appendJSONString(b, v)
	}
	l := m.Lineage
	meta(metaVersion, l.Version)
	meta(metaParent, l.Parent)
	meta(metaTask, l.Task)
	if l.Round != 0 {
		meta(metaRound, strconv.FormatInt(l.Round, 10))
	}
	meta(metaJob, l.Job)
	meta(metaSource, l.Source)
	b = append(b, '}')

	var off uint64
	for _, t := range m.Tensors {
		b = append(b, ',')
		b = appendJSONString(b, t.Name)
		b = append(b, `:{"dtype":"F32","shape":[`...)
		for i, d := range t.Shape {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(d), 10)
		}
		b = append(b, `],"data_offsets":[`...)
		b = strconv.AppendUint(b, off, 10)
		b = append(b, ',')
		off += 4 * uint64(len(t.Data))
		b = strconv.AppendUint(b, off, 10)
		b = append(b, "]}"...)
	}
	b = append(b, '}')
	for (len(b)-start)%8 != 0 {
		b = append(b, ' ')
	}
	return b
}

// appendJSONString appends s, which must be valid UTF-8, as a JSON string,
// escaping only what JSON requires; bytes of multi-byte runes pass through.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
