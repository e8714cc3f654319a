package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Limits on what a manifest may describe. A manifest read back from a store
// is untrusted input: these bound what decoding it, and loading what it
// names, can cost.
const (
	// MaxManifestBytes bounds the encoded manifest.
	MaxManifestBytes = 16 << 20
	// MaxChunkBytes bounds one blob.
	MaxChunkBytes = 64 << 20
	// MaxTensors bounds the tensors in each of params and optimizer.
	MaxTensors = 1 << 16
	// MaxDims bounds a tensor's rank.
	MaxDims = 16
	// MaxRNGBytes bounds the saved RNG state.
	MaxRNGBytes = 1 << 20
	// MaxStringBytes bounds the job id, a tensor name and the shard name.
	MaxStringBytes = 4096
	// MaxFiles bounds the opaque files of a checkpoint.
	MaxFiles = 1024
	// MaxFileNameBytes bounds a file's name, as most file systems do.
	MaxFileNameBytes = 255
	// MaxFilesBytes bounds the total size of a checkpoint's files.
	MaxFilesBytes = 64 << 30
)

// manifestFormat is the only format this package writes and reads.
const manifestFormat = 1

// Manifest names one checkpoint: its blobs, in tensor order, its opaque
// files, in name order, and the state that is not a tensor. Its canonical encoding (Encode) is what is stored and
// hashed; DecodeManifest accepts only that encoding, so one checkpoint has
// one id.
type Manifest struct {
	Format    int           `json:"format"`
	Job       string        `json:"job"`
	Step      int64         `json:"step"`
	Parent    Digest        `json:"parent,omitzero"`
	Cursor    Cursor        `json:"cursor"`
	RNG       []byte        `json:"rng,omitempty"`
	Params    []TensorEntry `json:"params"`
	Optimizer []TensorEntry `json:"optimizer,omitempty"`
	// Files is omitted when empty, so that a manifest without files
	// encodes, and is named, as it was before files existed.
	Files []FileEntry `json:"files,omitempty"`
}

// FileEntry is one opaque file: its name (a plain file name), its size and
// the chunks that hold its bytes, in order. Entries are sorted by name, so
// that the same files give the same id whatever order they were given in.
type FileEntry struct {
	Name   string  `json:"name"`
	Size   int64   `json:"size"`
	Chunks []Chunk `json:"chunks"`
}

// TensorEntry is one tensor: its name, shape and the chunks that hold its
// float32 little-endian bytes, in order.
type TensorEntry struct {
	Name   string  `json:"name"`
	Shape  []int   `json:"shape"`
	Chunks []Chunk `json:"chunks"`
}

// Chunk is one blob of a tensor.
type Chunk struct {
	Digest Digest `json:"digest"`
	Size   int64  `json:"size"`
}

// Cursor is where the job is in its data: the epoch, the offset within the
// current shard, and the shard's name.
type Cursor struct {
	Epoch  int64  `json:"epoch"`
	Offset int64  `json:"offset"`
	Shard  string `json:"shard"`
}

// Blobs returns every chunk of the manifest: params, then optimizer, then
// files.
func (m *Manifest) Blobs() []Chunk {
	var out []Chunk
	for _, list := range [][]TensorEntry{m.Params, m.Optimizer} {
		for _, t := range list {
			out = append(out, t.Chunks...)
		}
	}
	for _, f := range m.Files {
		out = append(out, f.Chunks...)
	}
	return out
}

// Encode validates m and returns its canonical bytes and their digest, the
// checkpoint id.
func (m *Manifest) Encode() ([]byte, Digest, error) {
	if err := m.validate(); err != nil {
		return nil, Digest{}, fmt.Errorf("checkpoint: encode manifest: %w", err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, Digest{}, fmt.Errorf("checkpoint: encode manifest: %w", err)
	}
	if len(b) > MaxManifestBytes {
		return nil, Digest{}, fmt.Errorf("checkpoint: encode manifest: %d bytes, limit %d: %w",
			len(b), MaxManifestBytes, ErrInvalidManifest)
	}
	return b, Sum(b), nil
}

// DecodeManifest parses untrusted manifest bytes. It refuses anything over
// the limits, unknown fields, inconsistent sizes, and any encoding other than
// the canonical one, all with ErrInvalidManifest.
func DecodeManifest(b []byte) (*Manifest, error) {
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("checkpoint: decode manifest: %d bytes, limit %d: %w",
			len(b), MaxManifestBytes, ErrInvalidManifest)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("checkpoint: decode manifest: %v: %w", err, ErrInvalidManifest)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("checkpoint: decode manifest: %w", err)
	}
	// Re-encoding catches trailing data, other spellings of the same
	// values, and anything else that would give one checkpoint two ids.
	c, err := json.Marshal(&m)
	if err != nil || !bytes.Equal(c, b) {
		return nil, fmt.Errorf("checkpoint: decode manifest: not in canonical form: %w", ErrInvalidManifest)
	}
	return &m, nil
}

func (m *Manifest) validate() error {
	if m.Format != manifestFormat {
		return fmt.Errorf("format %d, want %d: %w", m.Format, manifestFormat, ErrInvalidManifest)
	}
	if err := checkString("job", m.Job); err != nil {
		return err
	}
	if err := checkString("shard", m.Cursor.Shard); err != nil {
		return err
	}
	if m.Step < 0 || m.Cursor.Epoch < 0 || m.Cursor.Offset < 0 {
		return fmt.Errorf("negative step, epoch or offset: %w", ErrInvalidManifest)
	}
	if len(m.RNG) > MaxRNGBytes {
		return fmt.Errorf("rng state of %d bytes, limit %d: %w", len(m.RNG), MaxRNGBytes, ErrInvalidManifest)
	}
	if m.Params == nil {
		return fmt.Errorf("no params list: %w", ErrInvalidManifest)
	}
	if err := validateEntries("params", m.Params); err != nil {
		return err
	}
	if err := validateEntries("optimizer", m.Optimizer); err != nil {
		return err
	}
	return validateFiles(m.Files)
}

func validateFiles(fs []FileEntry) error {
	if len(fs) > MaxFiles {
		return fmt.Errorf("%d files, limit %d: %w", len(fs), MaxFiles, ErrInvalidManifest)
	}
	var total int64
	for i, f := range fs {
		if err := checkFileName(f.Name); err != nil {
			return fmt.Errorf("file %d: %w", i, err)
		}
		// Strictly increasing names: sorted and unique in one test.
		if i > 0 && fs[i-1].Name >= f.Name {
			return fmt.Errorf("file %q after %q: files must be sorted by name, each once: %w", f.Name, fs[i-1].Name, ErrInvalidManifest)
		}
		if f.Chunks == nil {
			return fmt.Errorf("file %q: chunks must be a list: %w", f.Name, ErrInvalidManifest)
		}
		var sum int64
		for _, c := range f.Chunks {
			if c.Size <= 0 || c.Size > MaxChunkBytes {
				return fmt.Errorf("file %q: chunk size %d: %w", f.Name, c.Size, ErrInvalidManifest)
			}
			sum += c.Size // cannot overflow: at most MaxManifestBytes chunks of MaxChunkBytes
		}
		if f.Size != sum {
			return fmt.Errorf("file %q: size %d, chunks hold %d bytes: %w", f.Name, f.Size, sum, ErrInvalidManifest)
		}
		if total += sum; total > MaxFilesBytes {
			return fmt.Errorf("files hold more than %d bytes: %w", int64(MaxFilesBytes), ErrInvalidManifest)
		}
	}
	return nil
}

// checkFileName reports, with ErrInvalidManifest, a name that is not a plain
// file name: empty, "." or "..", holding '/' or NUL, longer than
// MaxFileNameBytes or not UTF-8. Such a name could not be written back as
// one file in one directory.
func checkFileName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("file name %q: %w", name, ErrInvalidManifest)
	case len(name) > MaxFileNameBytes:
		return fmt.Errorf("file name of %d bytes, limit %d: %w", len(name), MaxFileNameBytes, ErrInvalidManifest)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("file name %q: holds '/' or NUL: %w", name, ErrInvalidManifest)
	case !utf8.ValidString(name):
		return fmt.Errorf("file name %q: not UTF-8: %w", name, ErrInvalidManifest)
	}
	return nil
}

func checkString(what, s string) error {
	if len(s) > MaxStringBytes {
		return fmt.Errorf("%s of %d bytes, limit %d: %w", what, len(s), MaxStringBytes, ErrInvalidManifest)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q is not UTF-8: %w", what, s, ErrInvalidManifest)
	}
	return nil
}

func validateEntries(what string, ts []TensorEntry) error {
	if len(ts) > MaxTensors {
		return fmt.Errorf("%s: %d tensors, limit %d: %w", what, len(ts), MaxTensors, ErrInvalidManifest)
	}
	seen := make(map[string]struct{}, len(ts))
	for i, t := range ts {
		if t.Name == "" {
			return fmt.Errorf("%s tensor %d: empty name: %w", what, i, ErrInvalidManifest)
		}
		if err := checkString(what+" tensor name", t.Name); err != nil {
			return err
		}
		if _, dup := seen[t.Name]; dup {
			return fmt.Errorf("%s tensor %q: duplicate name: %w", what, t.Name, ErrInvalidManifest)
		}
		seen[t.Name] = struct{}{}
		if t.Shape == nil || t.Chunks == nil {
			return fmt.Errorf("%s tensor %q: shape and chunks must be lists: %w", what, t.Name, ErrInvalidManifest)
		}
		n, err := byteSize(t.Shape)
		if err != nil {
			return fmt.Errorf("%s tensor %q: %w", what, t.Name, err)
		}
		var sum int64
		for _, c := range t.Chunks {
			if c.Size <= 0 || c.Size > MaxChunkBytes || c.Size%4 != 0 {
				return fmt.Errorf("%s tensor %q: chunk size %d: %w", what, t.Name, c.Size, ErrInvalidManifest)
			}
			sum += c.Size // cannot overflow: at most MaxManifestBytes chunks of MaxChunkBytes
		}
		if sum != n {
			return fmt.Errorf("%s tensor %q: chunks hold %d bytes, shape %v needs %d: %w",
				what, t.Name, sum, t.Shape, n, ErrInvalidManifest)
		}
	}
	return nil
}

// byteSize is the float32 byte count of shape, refusing negative dimensions,
// too many of them, and overflow.
func byteSize(shape []int) (int64, error) {
	if len(shape) > MaxDims {
		return 0, fmt.Errorf("rank %d, limit %d: %w", len(shape), MaxDims, ErrInvalidManifest)
	}
	n := int64(4)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %v: negative dimension: %w", shape, ErrInvalidManifest)
		}
		if d != 0 && n > math.MaxInt64/int64(d) {
			return 0, fmt.Errorf("shape %v: size overflows: %w", shape, ErrInvalidManifest)
		}
		n *= int64(d)
	}
	return n, nil
}
