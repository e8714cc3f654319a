package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/fleetlearn/fleetlearn/internal/countio"
)

// WriteSafetensors writes m, after validating it, as a safetensors file with
// F32 little-endian data. The output is deterministic: "__metadata__" first
// (holding the lineage), then the tensors in model order, and the header
// padded with spaces to a multiple of 8 bytes.
func WriteSafetensors(w io.Writer, m *Model) error {
	if err := m.validate(); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	tensors := make([]TensorInfo, len(m.Tensors))
	for i, t := range m.Tensors {
		tensors[i] = TensorInfo{Name: t.Name, Shape: t.Shape, DType: "F32"}
	}
	if err := writeHeader(w, tensors, m.Lineage, m.Arch); err != nil {
		return err
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

// writeHeader writes the length and the header of a file that holds tensors
// as F32, in that order, lineage l and architecture arch.
func writeHeader(w io.Writer, tensors []TensorInfo, l Lineage, arch string) error {
	hdr := appendHeader(make([]byte, 8, 256), tensors, l, arch)
	binary.LittleEndian.PutUint64(hdr, uint64(len(hdr)-8))
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	return nil
}

// appendHeader appends the JSON header, written by hand because
// encoding/json sorts map keys and the order must follow the model. Every
// tensor is F32.
func appendHeader(b []byte, tensors []TensorInfo, l Lineage, arch string) []byte {
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
	meta(metaVersion, l.Version)
	meta(metaParent, l.Parent)
	meta(metaTask, l.Task)
	if l.Round != 0 {
		meta(metaRound, strconv.FormatInt(l.Round, 10))
	}
	meta(metaJob, l.Job)
	meta(metaSource, l.Source)
	meta(metaArch, arch)
	b = append(b, '}')

	var off uint64
	for _, t := range tensors {
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
		off += 4 * uint64(t.Size())
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

// WriteCanonical writes to w the file WriteSafetensors would write for the
// model d holds with its lineage replaced by l: every tensor as F32, in d's
// order, and d's architecture. It reads d to its end one chunk at a time, making every check
// ReadSafetensors makes, so a file of any size is converted in memory that
// does not grow with it. d must not have been read from yet. It returns the
// bytes written; an error from w is reported as a write error
// ("safetensors: write: ...").
func (d *SafetensorsReader) WriteCanonical(w io.Writer, l Lineage) (int64, error) {
	if d.cur != -1 {
		return 0, errors.New("safetensors: WriteCanonical on a reader already read from")
	}
	if err := l.validate(); err != nil {
		return 0, fmt.Errorf("safetensors: write: %w", err)
	}
	cw := &countio.Writer{W: w}
	if err := writeHeader(cw, d.Tensors(), l, d.hdr.arch); err != nil {
		return cw.N, err
	}
	buf := make([]byte, 0, chunkBytes)
	for {
		_, err := d.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return cw.N, err
		}
		for {
			v, err := d.Values()
			if err == io.EOF {
				break
			}
			if err != nil {
				return cw.N, err
			}
			for len(v) > 0 {
				n := min(len(v), (cap(buf)-len(buf))/4)
				buf = appendF32s(buf, v[:n])
				v = v[n:]
				if cap(buf)-len(buf) < 4 {
					if _, err := cw.Write(buf); err != nil {
						return cw.N, fmt.Errorf("safetensors: write: %w", err)
					}
					buf = buf[:0]
				}
			}
		}
	}
	if len(buf) > 0 {
		if _, err := cw.Write(buf); err != nil {
			return cw.N, fmt.Errorf("safetensors: write: %w", err)
		}
	}
	return cw.N, nil
}
