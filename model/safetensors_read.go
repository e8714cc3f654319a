package model

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model/internal/half"
)

// Lineage keys in "__metadata__".
const (
	metaVersion = "fleetlearn.version"
	metaParent  = "fleetlearn.parent"
	metaTask    = "fleetlearn.task"
	metaRound   = "fleetlearn.round"
	metaJob     = "fleetlearn.job"
	metaSource  = "fleetlearn.source"
	metaArch    = "fleetlearn.arch"
)

// dtypeSize gives the element size of each dtype the reader converts.
var dtypeSize = map[string]int{"F32": 4, "F64": 8, "F16": 2, "BF16": 2}

// integerDTypes are refused with a hint: they hold indices, counters or masks,
// not trainable parameters.
var integerDTypes = map[string]bool{
	"BOOL": true, "U8": true, "I8": true, "U16": true, "I16": true,
	"U32": true, "I32": true, "U64": true, "I64": true,
}

// tensorInfo is one validated header entry.
type tensorInfo struct {
	name       string
	dtype      string
	shape      []int
	count      int
	begin, end uint64
}

type header struct {
	tensors []tensorInfo // in data_offsets order
	lineage Lineage
	arch    string
	total   uint64 // buffer bytes
}

// DecodeSafetensors is ReadSafetensors over an in-memory file.
func DecodeSafetensors(b []byte, opts ...ReadOption) (*Model, error) {
	return readSafetensors(bytes.NewReader(b), int64(len(b)), opts)
}

// ReadSafetensors decodes one safetensors file from r, which must end where
// the file ends: bytes after the last tensor are refused, since the format
// requires the buffer to be fully indexed (frame streams with io.LimitReader).
// Tensors come back in data_offsets order, lineage from the fleetlearn.*
// metadata keys. See the package documentation for the accepted dtypes and
// the checks made on untrusted input.
func ReadSafetensors(r io.Reader, opts ...ReadOption) (*Model, error) {
	return readSafetensors(r, -1, opts)
}

// readSafetensors reads from r, whose length is size bytes or unknown (-1).
func readSafetensors(r io.Reader, size int64, opts []ReadOption) (*Model, error) {
	cfg := newReadConfig(opts)
	if size >= 0 {
		cfg.size = size
	}
	d, err := newSafetensorsReader(r, cfg)
	if err != nil {
		return nil, err
	}
	m := &Model{Tensors: make([]Tensor, len(d.hdr.tensors)), Lineage: d.hdr.lineage, Arch: d.hdr.arch}
	for i := range d.hdr.tensors {
		ti := &d.hdr.tensors[i]
		if _, err := d.Next(); err != nil {
			return nil, err
		}
		// Where the length is known the header was checked against it, so
		// the tensor is allocated at full size; otherwise it grows as bytes
		// arrive.
		prealloc := ti.count
		if !d.known {
			prealloc = min(prealloc, maxBlindElems)
		}
		data := make([]float32, 0, prealloc)
		for {
			data, err = d.appendValues(data)
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
		}
		m.Tensors[i] = Tensor{Name: ti.name, Shape: ti.shape, Data: data}
	}
	if _, err := d.Next(); err != io.EOF {
		return nil, err
	}
	return m, nil
}

// TensorInfo describes one tensor of a safetensors file as its header
// declares it.
type TensorInfo struct {
	Name  string
	Shape []int
	DType string // F32, F64, F16 or BF16: the values are read as float32
}

// Size is the number of values the tensor holds.
func (t TensorInfo) Size() int {
	n, _ := shapeSize(t.Shape) // checked when the header was read
	return n
}

// SafetensorsReader reads a safetensors file one chunk of values at a time,
// so that a file of any size can be checked, converted or hashed in memory
// that does not grow with it (the header aside, which WithMaxHeaderBytes
// bounds). It makes every check ReadSafetensors makes, which is built on it:
// NewSafetensorsReader reads and checks the header, Next moves to each
// tensor in data_offsets order, Values returns the current tensor's values
// converted to float32 and checked finite, and the Next after the last
// tensor returns io.EOF only once the input has ended where the header said.
type SafetensorsReader struct {
	r       io.Reader
	hdr     *header
	known   bool // the input's length was given and matches the header
	scratch []byte
	vals    []float32
	cur     int    // index of the current tensor; -1 before the first Next
	left    uint64 // bytes of the current tensor not yet read
	done    int    // values of the current tensor read so far
	err     error  // sticky: once reading failed, every call fails
}

// NewSafetensorsReader reads and checks the header of the safetensors file
// r holds. With WithInputSize, a header that disagrees with the input's
// length is refused before any value is read.
func NewSafetensorsReader(r io.Reader, opts ...ReadOption) (*SafetensorsReader, error) {
	return newSafetensorsReader(r, newReadConfig(opts))
}

func newSafetensorsReader(r io.Reader, cfg readConfig) (*SafetensorsReader, error) {
	size := cfg.size
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("safetensors: header length: %w", readErr(err))
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > uint64(cfg.maxHeaderBytes) {
		return nil, fmt.Errorf("safetensors: header of %d bytes exceeds limit of %d: %w", n, cfg.maxHeaderBytes, ErrTooLarge)
	}
	if n < 2 {
		return nil, fmt.Errorf("safetensors: header of %d bytes cannot hold an object: %w", n, ErrInvalidHeader)
	}
	// ReadAll grows with what arrives, so a lying length costs no memory
	// beyond the bytes actually sent.
	h, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	if uint64(len(h)) < n {
		return nil, fmt.Errorf("safetensors: header: got %d of %d bytes: %w", len(h), n, ErrTruncated)
	}
	hdr, err := parseHeader(h, cfg)
	if err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}

	// Where the length is known, check it up front so that tensors can be
	// allocated at full size.
	known := size >= 0
	if known {
		switch rest := uint64(size) - 8 - n; {
		case uint64(size) < 8+n:
			return nil, fmt.Errorf("safetensors: input of %d bytes is shorter than its %d-byte header: %w", size, n, ErrTruncated)
		case rest < hdr.total:
			return nil, fmt.Errorf("safetensors: buffer has %d bytes, header indexes %d: %w", rest, hdr.total, ErrTruncated)
		case rest > hdr.total:
			return nil, fmt.Errorf("safetensors: buffer has %d bytes, header indexes only %d: %w", rest, hdr.total, ErrInvalidOffsets)
		}
	}
	return &SafetensorsReader{r: r, hdr: hdr, known: known, scratch: make([]byte, min(hdr.total, chunkBytes)), cur: -1}, nil
}

// Tensors lists the file's tensors in data_offsets order, the order Next
// visits them and ReadSafetensors returns them.
func (d *SafetensorsReader) Tensors() []TensorInfo {
	out := make([]TensorInfo, len(d.hdr.tensors))
	for i, ti := range d.hdr.tensors {
		out[i] = TensorInfo{Name: ti.name, Shape: slices.Clone(ti.shape), DType: ti.dtype}
	}
	return out
}

// Lineage is the lineage the header's fleetlearn.* metadata keys record.
func (d *SafetensorsReader) Lineage() Lineage { return d.hdr.lineage }

// Arch is the architecture the header's fleetlearn.arch key records (Model.Arch).
func (d *SafetensorsReader) Arch() string { return d.hdr.arch }

// Next moves to the next tensor, reading (and checking) whatever values of
// the current one were left unread. After the last tensor it checks that
// the input ends there and returns io.EOF.
func (d *SafetensorsReader) Next() (TensorInfo, error) {
	for d.err == nil && d.cur >= 0 && d.cur < len(d.hdr.tensors) {
		if _, err := d.Values(); err == io.EOF {
			break
		}
	}
	if d.err != nil {
		return TensorInfo{}, d.err
	}
	if d.cur == len(d.hdr.tensors) {
		return TensorInfo{}, io.EOF
	}
	d.cur++
	if d.cur == len(d.hdr.tensors) {
		var one [1]byte
		switch k, err := io.ReadFull(d.r, one[:]); {
		case k > 0:
			d.err = fmt.Errorf("safetensors: bytes after the last tensor (header indexes %d): %w", d.hdr.total, ErrInvalidOffsets)
		case err != io.EOF:
			d.err = fmt.Errorf("safetensors: %w", err)
		}
		if d.err != nil {
			return TensorInfo{}, d.err
		}
		return TensorInfo{}, io.EOF
	}
	ti := &d.hdr.tensors[d.cur]
	d.left, d.done = ti.end-ti.begin, 0
	return TensorInfo{Name: ti.name, Shape: slices.Clone(ti.shape), DType: ti.dtype}, nil
}

// Values returns the next chunk of the current tensor's values as float32,
// io.EOF once there are no more. The slice is valid until the next call.
func (d *SafetensorsReader) Values() ([]float32, error) {
	v, err := d.appendValues(d.vals[:0])
	if err != nil {
		return nil, err
	}
	d.vals = v
	return v, nil
}

// appendValues reads the next chunk of the current tensor, appending its
// values to dst; io.EOF when the tensor has no more.
func (d *SafetensorsReader) appendValues(dst []float32) ([]float32, error) {
	if d.err != nil {
		return dst, d.err
	}
	if d.cur < 0 || d.cur >= len(d.hdr.tensors) {
		return dst, errors.New("safetensors: Values called outside a tensor: call Next first")
	}
	if d.left == 0 {
		return dst, io.EOF
	}
	ti := &d.hdr.tensors[d.cur]
	chunk := d.scratch[:min(d.left, uint64(len(d.scratch)))]
	if _, err := io.ReadFull(d.r, chunk); err != nil {
		d.err = fmt.Errorf("safetensors: tensor %q: %w", ti.name, readErr(err))
		return dst, d.err
	}
	d.left -= uint64(len(chunk))
	start := len(dst)
	dst = decodeChunk(dst, chunk, ti.dtype)
	if j := floats.FirstNonFinite(dst[start:]); j >= 0 {
		d.err = fmt.Errorf("safetensors: tensor %q: element %d: %s value is %v as float32: %w", ti.name, d.done+j, ti.dtype, dst[start+j], ErrNonFinite)
		return dst, d.err
	}
	d.done += len(dst) - start
	return dst, nil
}

// readErr marks an early end of input as ErrTruncated and passes other I/O
// errors through.
func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return ErrTruncated
	}
	return err
}

// maxBlindElems bounds the up-front allocation for a tensor when the input's
// length is unknown; beyond it the slice grows only as bytes arrive.
const maxBlindElems = 1 << 20

// decodeChunk appends the values in src, whose length is a multiple of the
// dtype's size, converted to float32.
func decodeChunk(dst []float32, src []byte, dtype string) []float32 {
	size := dtypeSize[dtype]
	start := len(dst)
	dst = slices.Grow(dst, len(src)/size)[:start+len(src)/size]
	out := dst[start:]
	le := binary.LittleEndian
	switch dtype {
	case "F32":
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(src[4*i:]))
		}
	case "F64":
		for i := range out {
			out[i] = float32(math.Float64frombits(le.Uint64(src[8*i:])))
		}
	case "F16":
		for i := range out {
			out[i] = half.F16ToFloat32(le.Uint16(src[2*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = half.BF16ToFloat32(le.Uint16(src[2*i:]))
		}
	}
	return dst
}

// parseHeader walks the JSON header token by token: encoding/json's maps
// would silently keep the last of duplicate keys.
func parseHeader(h []byte, cfg readConfig) (*header, error) {
	if h[0] != '{' {
		return nil, fmt.Errorf("must start with '{', not %q: %w", h[0], ErrInvalidHeader)
	}
	if !utf8.Valid(h) {
		return nil, fmt.Errorf("not valid UTF-8: %w", ErrInvalidHeader)
	}
	p := headerParser{dec: json.NewDecoder(bytes.NewReader(h))}
	p.dec.UseNumber()
	if err := p.delim('{'); err != nil {
		return nil, err
	}
	hdr := &header{}
	seen := make(map[string]bool)
	for p.dec.More() {
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		if key == metadataKey {
			if seen[key] {
				return nil, fmt.Errorf("duplicate %q: %w", key, ErrInvalidHeader)
			}
			seen[key] = true
			if hdr.lineage, hdr.arch, err = p.metadata(); err != nil {
				return nil, fmt.Errorf("%s: %w", metadataKey, err)
			}
			continue
		}
		if seen[key] {
			return nil, fmt.Errorf("tensor %q: %w", key, ErrDuplicateName)
		}
		seen[key] = true
		if err := validateName(key); err != nil {
			return nil, err
		}
		ti, err := p.tensor(key, cfg)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", key, err)
		}
		hdr.tensors = append(hdr.tensors, ti)
	}
	if err := p.delim('}'); err != nil {
		return nil, err
	}
	// Only whitespace (the writer's space padding) may follow the object.
	if tok, err := p.dec.Token(); err != io.EOF {
		if err != nil {
			return nil, fmt.Errorf("after the object: %v: %w", err, ErrInvalidHeader)
		}
		return nil, fmt.Errorf("unexpected %v after the object: %w", describe(tok), ErrInvalidHeader)
	}

	// Sort by offsets, ties (empty tensors) by name for a stable order, then
	// require each tensor to start where the previous one ended.
	slices.SortFunc(hdr.tensors, func(a, b tensorInfo) int {
		return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end), cmp.Compare(a.name, b.name))
	})
	for _, ti := range hdr.tensors {
		switch {
		case ti.begin < hdr.total:
			return nil, fmt.Errorf("tensor %q at [%d,%d] overlaps bytes before %d: %w", ti.name, ti.begin, ti.end, hdr.total, ErrInvalidOffsets)
		case ti.begin > hdr.total:
			return nil, fmt.Errorf("tensor %q at [%d,%d] leaves bytes [%d,%d] unindexed: %w", ti.name, ti.begin, ti.end, hdr.total, ti.begin, ErrInvalidOffsets)
		}
		hdr.total = ti.end
	}
	return hdr, nil
}

type headerParser struct {
	dec *json.Decoder
}

func (p *headerParser) token() (json.Token, error) {
	tok, err := p.dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%v: %w", err, ErrInvalidHeader)
	}
	return tok, nil
}

func (p *headerParser) delim(want json.Delim) error {
	tok, err := p.token()
	if err != nil {
		return err
	}
	if tok != want {
		return fmt.Errorf("got %v, want %v: %w", describe(tok), describe(want), ErrInvalidHeader)
	}
	return nil
}

func (p *headerParser) str() (string, error) {
	tok, err := p.token()
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("got %v, want a string: %w", describe(tok), ErrInvalidHeader)
	}
	return s, nil
}

// describe renders a token for error messages.
func describe(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(t)
	case json.Delim:
		return "'" + t.String() + "'"
	default:
		return fmt.Sprint(t)
	}
}

// uints reads an array of non-negative integers; bad elements wrap fieldErr,
// values beyond uint64 wrap ErrTooLarge.
func (p *headerParser) uints(fieldErr error) ([]uint64, error) {
	tok, err := p.token()
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('[') {
		return nil, fmt.Errorf("got %v, want an array: %w", describe(tok), fieldErr)
	}
	var out []uint64
	for p.dec.More() {
		tok, err := p.token()
		if err != nil {
			return nil, err
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, fmt.Errorf("got %v, want an integer: %w", describe(tok), fieldErr)
		}
		v, err := strconv.ParseUint(string(num), 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("%s overflows uint64: %w", num, ErrTooLarge)
		}
		if err != nil {
			return nil, fmt.Errorf("%s is not a non-negative integer: %w", num, fieldErr)
		}
		out = append(out, v)
	}
	return out, p.delim(']')
}

// tensor parses and checks one tensor entry; offsets are checked against each
// other later, once all entries are known.
func (p *headerParser) tensor(name string, cfg readConfig) (tensorInfo, error) {
	ti := tensorInfo{name: name}
	if err := p.delim('{'); err != nil {
		return ti, err
	}
	var dims, offsets []uint64
	seen := make(map[string]bool, 3)
	for p.dec.More() {
		key, err := p.str()
		if err != nil {
			return ti, err
		}
		if seen[key] {
			return ti, fmt.Errorf("duplicate field %q: %w", key, ErrInvalidHeader)
		}
		seen[key] = true
		switch key {
		case "dtype":
			ti.dtype, err = p.str()
		case "shape":
			dims, err = p.uints(ErrInvalidShape)
		case "data_offsets":
			offsets, err = p.uints(ErrInvalidOffsets)
		default:
			// The format defines no other fields; refusing them keeps a
			// misspelt one from passing as valid.
			return ti, fmt.Errorf("unknown field %q: %w", key, ErrInvalidHeader)
		}
		if err != nil {
			return ti, fmt.Errorf("%s: %w", key, err)
		}
	}
	if err := p.delim('}'); err != nil {
		return ti, err
	}
	for _, f := range [...]string{"dtype", "shape", "data_offsets"} {
		if !seen[f] {
			return ti, fmt.Errorf("missing %s: %w", f, ErrInvalidHeader)
		}
	}

	size, ok := dtypeSize[ti.dtype]
	if !ok {
		if integerDTypes[ti.dtype] {
			return ti, fmt.Errorf("dtype %s: integer and bool tensors are not model parameters: %w", ti.dtype, ErrUnsupportedDType)
		}
		return ti, fmt.Errorf("dtype %q: only F32, F16, BF16 and F64 are read: %w", ti.dtype, ErrUnsupportedDType)
	}

	ti.shape = make([]int, len(dims))
	for i, d := range dims {
		if d > math.MaxInt {
			return ti, fmt.Errorf("shape dimension %d: %d: %w", i, d, ErrTooLarge)
		}
		ti.shape[i] = int(d)
	}
	count, err := shapeSize(ti.shape)
	if err != nil {
		return ti, err
	}
	ti.count = count

	if len(offsets) != 2 {
		return ti, fmt.Errorf("data_offsets has %d values, want 2: %w", len(offsets), ErrInvalidOffsets)
	}
	ti.begin, ti.end = offsets[0], offsets[1]
	if ti.begin > ti.end {
		return ti, fmt.Errorf("data_offsets [%d,%d] reversed: %w", ti.begin, ti.end, ErrInvalidOffsets)
	}
	if ti.end > uint64(cfg.maxTensorBytes) {
		return ti, fmt.Errorf("data_offsets end %d exceeds limit of %d bytes: %w", ti.end, cfg.maxTensorBytes, ErrTooLarge)
	}
	if uint64(count) > math.MaxUint64/uint64(size) {
		return ti, fmt.Errorf("shape %v: byte size overflows: %w", ti.shape, ErrTooLarge)
	}
	if want := uint64(count) * uint64(size); ti.end-ti.begin != want {
		return ti, fmt.Errorf("shape %v of %s needs %d bytes, data_offsets [%d,%d] hold %d: %w",
			ti.shape, ti.dtype, want, ti.begin, ti.end, ti.end-ti.begin, ErrShapeMismatch)
	}
	return ti, nil
}

// metadata parses "__metadata__": null or an object of string values, taking
// lineage and the architecture from the fleetlearn.* keys and ignoring the
// rest.
func (p *headerParser) metadata() (l Lineage, arch string, err error) {
	tok, err := p.token()
	if err != nil || tok == nil {
		return l, "", err
	}
	if tok != json.Delim('{') {
		return l, "", fmt.Errorf("got %v, want an object: %w", describe(tok), ErrInvalidHeader)
	}
	seen := make(map[string]bool)
	for p.dec.More() {
		key, err := p.str()
		if err != nil {
			return l, "", err
		}
		if seen[key] {
			return l, "", fmt.Errorf("duplicate key %q: %w", key, ErrInvalidHeader)
		}
		seen[key] = true
		v, err := p.str()
		if err != nil {
			return l, "", fmt.Errorf("%q: %w", key, err)
		}
		switch key {
		case metaVersion:
			l.Version = v
		case metaParent:
			l.Parent = v
		case metaTask:
			l.Task = v
		case metaJob:
			l.Job = v
		case metaSource:
			l.Source = v
		case metaArch:
			if err := validateArch(v); err != nil {
				return l, "", fmt.Errorf("%s: %w", key, err)
			}
			arch = v
		case metaRound:
			if l.Round, err = strconv.ParseInt(v, 10, 64); err != nil {
				return l, "", fmt.Errorf("%s %q is not an integer: %w", key, v, ErrInvalidLineage)
			}
		}
	}
	return l, arch, p.delim('}')
}
