package wire

import (
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Reading an update report in pieces (docs/PROTOCOL.md, Chunked reports). A
// report of a large model is almost all payload: the update's values. The
// server folds them into the round's sum as they arrive rather than hold
// the report, so it splits the report's bytes, as they come, into the
// payload, handed on piece by piece, and the rest (ids, hashes, signature,
// metrics, layout), kept and decoded by the protobuf library as a report
// whose payload field is present but empty. A report that Marshal writes
// scans to the message Unmarshal reads; ScanUpdate is stricter only where
// streaming must be: one payload message, one values field in it, the
// masked values packed.

// PayloadField says which field of an update report held its payload.
type PayloadField int

// The payload fields.
const (
	// NoPayload: the report had no payload field with values.
	NoPayload PayloadField = iota
	// DenseValues is dense.values, little-endian float32s.
	DenseValues
	// QuantizedData is quantized.data, an int8 or int4 encoding.
	QuantizedData
	// MaskedValues is masked.values, packed fixed32s.
	MaskedValues
	// MaskedPacked is masked.packed, values of ⌈bits/8⌉ bytes.
	MaskedPacked
)

func (f PayloadField) String() string {
	switch f {
	case DenseValues:
		return "dense.values"
	case QuantizedData:
		return "quantized.data"
	case MaskedValues:
		return "masked.values"
	case MaskedPacked:
		return "masked.packed"
	}
	return "no payload"
}

// ErrScan reports update report bytes that ScanUpdate cannot split.
var ErrScan = errors.New("wire: malformed update report")

// The UpdateReport fields that hold a payload message, and the field of
// each that holds its values.
const (
	fieldDense     = 8
	fieldMasked    = 9
	fieldQuantized = 13
)

func payloadOf(msg, field protowire.Number) PayloadField {
	switch {
	case msg == fieldDense && field == 1:
		return DenseValues
	case msg == fieldQuantized && field == 2:
		return QuantizedData
	case msg == fieldMasked && field == 3:
		return MaskedValues
	case msg == fieldMasked && field == 4:
		return MaskedPacked
	}
	return NoPayload
}

// ScanUpdate reads a serialized UpdateReport from next, which returns its
// bytes piece by piece and io.EOF after the last. When it reaches the
// payload's values it calls open with their field and length, and hands
// them to the function open returns as they come, in order (pieces of any
// length, none empty); open may refuse them first. It returns the report
// with that field empty, which field it was, and the payload's length.
// Everything but the payload is held, at most limit bytes of it. An error
// from next, open or the payload function stops the scan and is returned
// as it is; malformed bytes give ErrScan.
func ScanUpdate(next func() ([]byte, error), limit int, open func(PayloadField, uint64) (func([]byte) error, error)) (*pb.UpdateReport, PayloadField, uint64, error) {
	s := scanner{r: pieceReader{next: next}, limit: limit, open: open}
	if err := s.top(); err != nil {
		return nil, s.field, 0, err
	}
	var rep pb.UpdateReport
	if err := proto.Unmarshal(s.skel, &rep); err != nil {
		return nil, s.field, 0, fmt.Errorf("%w: %v", ErrScan, err)
	}
	return &rep, s.field, s.size, nil
}

type scanner struct {
	r      pieceReader
	limit  int
	open   func(PayloadField, uint64) (func([]byte) error, error)
	skel   []byte
	field  PayloadField
	size   uint64
	sawMsg bool
	depth  int
	held   int
}

// maxGroupDepth is protobuf's own recursion limit.
const maxGroupDepth = 10000

// grow counts n more bytes held.
func (s *scanner) grow(n int) error {
	if s.held += n; s.held > s.limit {
		return fmt.Errorf("%w: more than %d bytes besides the payload", ErrScan, s.limit)
	}
	return nil
}

func (s *scanner) top() error {
	for {
		tag, err := s.r.varint()
		if err == io.EOF && s.r.atBoundary {
			return nil
		}
		if err != nil {
			return err
		}
		num, typ := protowire.DecodeTag(tag)
		if (num == fieldDense || num == fieldMasked || num == fieldQuantized) && typ == protowire.BytesType {
			if s.sawMsg {
				return fmt.Errorf("%w: more than one payload message", ErrScan)
			}
			s.sawMsg = true
			n, err := s.r.varint()
			if err != nil {
				return eofIsTruncation(err)
			}
			sub, err := s.message(num, n)
			if err != nil {
				return err
			}
			if err := s.grow(protowire.SizeTag(num) + protowire.SizeBytes(len(sub)) - len(sub)); err != nil {
				return err
			}
			s.skel = protowire.AppendTag(s.skel, num, typ)
			s.skel = protowire.AppendBytes(s.skel, sub)
			continue
		}
		if s.skel, err = s.copyField(s.skel, num, typ, nil); err != nil {
			return err
		}
	}
}

// message scans a payload message of n bytes and returns it without its
// values' bytes.
func (s *scanner) message(msg protowire.Number, n uint64) ([]byte, error) {
	end := s.r.off + n
	var sub []byte
	for s.r.off < end {
		tag, err := s.r.varint()
		if err != nil {
			return nil, eofIsTruncation(err)
		}
		num, typ := protowire.DecodeTag(tag)
		f := payloadOf(msg, num)
		if f == MaskedValues && typ == protowire.Fixed32Type {
			return nil, fmt.Errorf("%w: %v not packed", ErrScan, f)
		}
		// A values field number in another wire type is an unknown field
		// to protobuf, kept as one.
		if f == NoPayload || typ != protowire.BytesType {
			lim := &end
			if sub, err = s.copyField(sub, num, typ, lim); err != nil {
				return nil, err
			}
			continue
		}
		if s.field != NoPayload {
			return nil, fmt.Errorf("%w: payload values in %v and %v", ErrScan, s.field, f)
		}
		s.field = f
		size, err := s.r.varint()
		if err != nil {
			return nil, eofIsTruncation(err)
		}
		if size > end-s.r.off {
			return nil, fmt.Errorf("%w: %v of %d bytes overruns its message", ErrScan, f, size)
		}
		s.size = size
		payload, err := s.open(f, size)
		if err != nil {
			return nil, err
		}
		if err := s.r.stream(size, payload); err != nil {
			return nil, err
		}
		// The field stays, empty, so that the message says which it was.
		if err := s.grow(protowire.SizeTag(num) + 1); err != nil {
			return nil, err
		}
		sub = protowire.AppendTag(sub, num, typ)
		sub = protowire.AppendVarint(sub, 0)
	}
	if s.r.off != end {
		return nil, fmt.Errorf("%w: a field overruns its payload message", ErrScan)
	}
	return sub, nil
}

// copyField copies one field whose tag was just read into dst. end, when
// set, is where the enclosing message ends.
func (s *scanner) copyField(dst []byte, num protowire.Number, typ protowire.Type, end *uint64) ([]byte, error) {
	if num < protowire.MinValidNumber {
		return dst, fmt.Errorf("%w: field number %d", ErrScan, num)
	}
	var (
		v   uint64
		n   int
		err error
	)
	switch typ {
	case protowire.VarintType:
		v, err = s.r.varint()
		n = protowire.SizeVarint(v)
	case protowire.Fixed32Type:
		n = 4
	case protowire.Fixed64Type:
		n = 8
	case protowire.BytesType:
		v, err = s.r.varint()
		if err == nil && v > uint64(s.limit) {
			return dst, fmt.Errorf("%w: field %d of %d bytes (more than %d bytes besides the payload)", ErrScan, num, v, s.limit)
		}
		n = protowire.SizeBytes(int(v))
	case protowire.StartGroupType:
		// A group (proto2) is an unknown field here: copied, to its end.
		if s.depth++; s.depth > maxGroupDepth {
			return dst, fmt.Errorf("%w: groups nested deeper than %d", ErrScan, maxGroupDepth)
		}
		defer func() { s.depth-- }()
		if err := s.grow(protowire.SizeTag(num)); err != nil {
			return dst, err
		}
		dst = protowire.AppendTag(dst, num, typ)
		for {
			tag, err := s.r.varint()
			if err != nil {
				return dst, eofIsTruncation(err)
			}
			inner, ityp := protowire.DecodeTag(tag)
			if ityp == protowire.EndGroupType {
				if inner != num {
					return dst, fmt.Errorf("%w: group %d ends as %d", ErrScan, num, inner)
				}
				if err := s.grow(protowire.SizeTag(num)); err != nil {
					return dst, err
				}
				return protowire.AppendTag(dst, num, ityp), nil
			}
			if dst, err = s.copyField(dst, inner, ityp, end); err != nil {
				return dst, err
			}
		}
	default:
		return dst, fmt.Errorf("%w: field %d has wire type %d", ErrScan, num, typ)
	}
	if err != nil {
		return dst, eofIsTruncation(err)
	}
	if err := s.grow(protowire.SizeTag(num) + n); err != nil {
		return dst, err
	}
	dst = protowire.AppendTag(dst, num, typ)
	switch typ {
	case protowire.VarintType:
		dst = protowire.AppendVarint(dst, v)
	case protowire.Fixed32Type, protowire.Fixed64Type:
		dst, err = s.r.appendN(dst, uint64(n))
	case protowire.BytesType:
		dst = protowire.AppendVarint(dst, v)
		dst, err = s.r.appendN(dst, v)
	}
	if err != nil {
		return dst, eofIsTruncation(err)
	}
	if end != nil && s.r.off > *end {
		return dst, fmt.Errorf("%w: field %d overruns its payload message", ErrScan, num)
	}
	return dst, nil
}

func eofIsTruncation(err error) error {
	if err == io.EOF {
		return fmt.Errorf("%w: truncated", ErrScan)
	}
	return err
}

// pieceReader reads bytes across the pieces next returns.
type pieceReader struct {
	next       func() ([]byte, error)
	cur        []byte
	off        uint64 // bytes consumed
	atBoundary bool   // the last read ended exactly at io.EOF with nothing consumed
}

// fill makes cur non-empty, or returns next's error (io.EOF at the end).
func (r *pieceReader) fill() error {
	for len(r.cur) == 0 {
		b, err := r.next()
		if err != nil {
			return err
		}
		r.cur = b
	}
	return nil
}

func (r *pieceReader) varint() (uint64, error) {
	var v uint64
	for i := 0; i < binaryMaxVarint; i++ {
		if err := r.fill(); err != nil {
			r.atBoundary = i == 0 && err == io.EOF
			if err == io.EOF && i > 0 {
				return 0, fmt.Errorf("%w: truncated varint", ErrScan)
			}
			return 0, err
		}
		c := r.cur[0]
		r.cur = r.cur[1:]
		r.off++
		if i == binaryMaxVarint-1 && c > 1 {
			return 0, fmt.Errorf("%w: varint overflows 64 bits", ErrScan)
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: varint longer than %d bytes", ErrScan, binaryMaxVarint)
}

const binaryMaxVarint = 10

// appendN appends the next n bytes to dst.
func (r *pieceReader) appendN(dst []byte, n uint64) ([]byte, error) {
	for n > 0 {
		if err := r.fill(); err != nil {
			return dst, err
		}
		k := min(n, uint64(len(r.cur)))
		dst = append(dst, r.cur[:k]...)
		r.cur, r.off, n = r.cur[k:], r.off+k, n-k
	}
	return dst, nil
}

// stream hands the next n bytes to f, piece by piece.
func (r *pieceReader) stream(n uint64, f func([]byte) error) error {
	for n > 0 {
		if err := r.fill(); err != nil {
			return eofIsTruncation(err)
		}
		k := min(n, uint64(len(r.cur)))
		if err := f(r.cur[:k]); err != nil {
			return err
		}
		r.cur, r.off, n = r.cur[k:], r.off+k, n-k
	}
	return nil
}
