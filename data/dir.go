package data

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/internal/ident"
)

const (
	// FormatV1 is the manifest "format" value of the dataset directory
	// layout described in docs/DATASET.md.
	FormatV1 = "fleetlearn-dataset/v1"

	// ManifestFile is the name of the manifest inside a dataset directory.
	ManifestFile = "manifest.json"

	featuresFile = "features.f32"
	labelsFile   = "labels.u8"

	maxManifestBytes = 64 << 10
	maxFileNameBytes = 255

	defaultMaxExamples       = 1 << 24
	defaultMaxBytes    int64 = 1 << 30
)

// Manifest describes a dataset directory. It is stored as manifest.json.
type Manifest struct {
	Format      string            `json:"format"`
	Name        string            `json:"name"`
	NumExamples int               `json:"num_examples"`
	Dim         int               `json:"dim"`
	NumClasses  int               `json:"num_classes"`
	Features    string            `json:"features"`
	Labels      string            `json:"labels"`
	SHA256      map[string]string `json:"sha256"`
}

// featureBytes and labelBytes are the exact sizes the data files must have;
// DecodeManifest guarantees they do not overflow.
func (m Manifest) featureBytes() int64 { return int64(m.NumExamples) * int64(m.Dim) * 4 }
func (m Manifest) labelBytes() int64   { return int64(m.NumExamples) }

// DecodeManifest parses and checks a manifest: the format must be
// [FormatV1], unknown fields are rejected, counts must be in range, file
// names must be plain names inside the directory, and there must be exactly
// one lowercase hex SHA-256 digest per data file. Errors wrap [ErrManifest]
// or, for manifests describing more data than can be addressed,
// [ErrTooLarge].
func DecodeManifest(b []byte) (Manifest, error) {
	var m Manifest
	if len(b) > maxManifestBytes {
		return m, fmt.Errorf("data: manifest: %d bytes exceeds %d: %w", len(b), maxManifestBytes, ErrTooLarge)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("data: manifest: %w: %w", ErrManifest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Manifest{}, fmt.Errorf("data: manifest: trailing data after JSON object: %w", ErrManifest)
	}
	if err := m.check(); err != nil {
		return Manifest{}, fmt.Errorf("data: manifest: %w", err)
	}
	return m, nil
}

func (m Manifest) check() error {
	switch {
	case m.Format != FormatV1:
		return fmt.Errorf("format %q, want %q: %w", m.Format, FormatV1, ErrManifest)
	case m.NumExamples < 0:
		return fmt.Errorf("num_examples %d < 0: %w", m.NumExamples, ErrManifest)
	case m.Dim < 1:
		return fmt.Errorf("dim %d < 1: %w", m.Dim, ErrManifest)
	case m.NumClasses < 1 || m.NumClasses > MaxClasses:
		return fmt.Errorf("num_classes %d outside [1, %d]: %w", m.NumClasses, MaxClasses, ErrManifest)
	case int64(m.NumExamples) > math.MaxInt64/4/int64(m.Dim):
		return fmt.Errorf("num_examples %d x dim %d overflows: %w", m.NumExamples, m.Dim, ErrTooLarge)
	}
	if err := checkName(m.Name); err != nil {
		return fmt.Errorf("%w: %w", err, ErrManifest)
	}
	for _, f := range []struct{ field, name string }{{"features", m.Features}, {"labels", m.Labels}} {
		if err := checkFileName(f.name); err != nil {
			return fmt.Errorf("%s: %w", f.field, err)
		}
	}
	if m.Features == m.Labels {
		return fmt.Errorf("features and labels are both %q: %w", m.Features, ErrManifest)
	}
	if len(m.SHA256) != 2 {
		return fmt.Errorf("sha256 has %d entries, want one each for %q and %q: %w", len(m.SHA256), m.Features, m.Labels, ErrManifest)
	}
	for _, name := range []string{m.Features, m.Labels} {
		sum, ok := m.SHA256[name]
		if !ok {
			return fmt.Errorf("sha256 has no entry for %q: %w", name, ErrManifest)
		}
		if !ident.IsSHA256(sum) {
			return fmt.Errorf("sha256 of %q is not %d lowercase hex digits: %w", name, 2*sha256.Size, ErrManifest)
		}
	}
	return nil
}

// checkName keeps dataset names short and printable, since they end up in
// logs and reports.
func checkName(name string) error {
	if err := ident.Name(name); err != nil {
		return fmt.Errorf("name %w", err)
	}
	return nil
}

// checkFileName accepts only a plain file name, so a manifest can never
// point outside its own directory.
func checkFileName(name string) error {
	if name == "" || len(name) > maxFileNameBytes || name == "." || name == ".." || name == ManifestFile ||
		strings.ContainsAny(name, `/\:`) || !filepath.IsLocal(name) {
		return fmt.Errorf("file name %q is not a plain file name in the dataset directory: %w", name, ErrManifest)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("file name %q has a control character: %w", name, ErrManifest)
		}
	}
	return nil
}

// ReadOption configures [ReadDir].
type ReadOption func(*readConfig)

type readConfig struct {
	maxExamples int
	maxBytes    int64
}

// WithMaxExamples refuses datasets with more than n examples. The default
// is 1<<24.
func WithMaxExamples(n int) ReadOption {
	return func(c *readConfig) { c.maxExamples = n }
}

// WithMaxBytes refuses datasets whose feature and label files together
// exceed n bytes. The default is 1 GiB.
func WithMaxBytes(n int64) ReadOption {
	return func(c *readConfig) { c.maxBytes = n }
}

// ReadDir reads a dataset directory written by [WriteDir]. It checks the
// manifest (see [DecodeManifest]) and the size limits before reading any
// data, then that each file has exactly the size the counts imply and the
// SHA-256 digest the manifest records, that every label is below
// num_classes and that every feature is finite. Files are opened through
// the directory itself, so neither the manifest nor a symbolic link can
// make it read outside dir.
func ReadDir(dir string, opts ...ReadOption) (*Dataset, error) {
	cfg := readConfig{maxExamples: defaultMaxExamples, maxBytes: defaultMaxBytes}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxExamples < 0 || cfg.maxBytes < 0 {
		return nil, fmt.Errorf("data: read dir: negative limit (max examples %d, max bytes %d): %w",
			cfg.maxExamples, cfg.maxBytes, ErrInvalidArgument)
	}

	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("data: read dir: %w", err)
	}
	defer root.Close()

	raw, err := readRootFile(root, ManifestFile, -1, maxManifestBytes)
	if err != nil {
		return nil, fmt.Errorf("data: read dir: %w", err)
	}
	m, err := DecodeManifest(raw)
	if err != nil {
		return nil, fmt.Errorf("data: read dir: %w", err)
	}
	if m.NumExamples > cfg.maxExamples {
		return nil, fmt.Errorf("data: read dir: %d examples exceeds limit %d: %w", m.NumExamples, cfg.maxExamples, ErrTooLarge)
	}
	if total := m.featureBytes() + m.labelBytes(); total > cfg.maxBytes || total > math.MaxInt {
		return nil, fmt.Errorf("data: read dir: %d bytes of data exceeds limit %d: %w", total, cfg.maxBytes, ErrTooLarge)
	}

	fbuf, err := readVerified(root, m.Features, m.featureBytes(), m.SHA256[m.Features])
	if err != nil {
		return nil, fmt.Errorf("data: read dir: %w", err)
	}
	labels, err := readVerified(root, m.Labels, m.labelBytes(), m.SHA256[m.Labels])
	if err != nil {
		return nil, fmt.Errorf("data: read dir: %w", err)
	}
	if err := checkLabels(labels, m.NumClasses); err != nil {
		return nil, fmt.Errorf("data: read dir: %s: %w: %w", m.Labels, err, ErrInvalidDataset)
	}
	features := make([]float32, len(fbuf)/4)
	for i := range features {
		features[i] = math.Float32frombits(binary.LittleEndian.Uint32(fbuf[4*i:]))
	}
	if i := floats.FirstNonFinite(features); i >= 0 {
		return nil, fmt.Errorf("data: read dir: %s: feature %d of example %d is %v: %w",
			m.Features, i%m.Dim, i/m.Dim, features[i], ErrInvalidDataset)
	}
	return &Dataset{Features: features, Labels: labels, Dim: m.Dim, NumClasses: m.NumClasses}, nil
}

// readVerified reads a data file that must be exactly size bytes long and
// hash to wantHex.
func readVerified(root *os.Root, name string, size int64, wantHex string) ([]byte, error) {
	b, err := readRootFile(root, name, size, size)
	if err != nil {
		return nil, err
	}
	got := sha256.Sum256(b)
	if hex.EncodeToString(got[:]) != wantHex {
		return nil, fmt.Errorf("%s: sha256 %x, manifest says %s: %w", name, got, wantHex, ErrChecksum)
	}
	return b, nil
}

// readRootFile reads a regular file inside root. With want >= 0 the file
// must be exactly want bytes; otherwise it may be at most limit bytes. The
// size is checked before reading and again while reading, in case the file
// changes underneath.
func readRootFile(root *os.Root, name string, want, limit int64) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file: %w", name, ErrManifest)
	}
	size := fi.Size()
	switch {
	case want >= 0 && size != want:
		return nil, fmt.Errorf("%s: %d bytes, manifest implies %d: %w", name, size, want, ErrSize)
	case want < 0 && size > limit:
		return nil, fmt.Errorf("%s: %d bytes exceeds %d: %w", name, size, limit, ErrTooLarge)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: shrank while reading: %w", name, ErrSize)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var extra [1]byte
	if n, _ := f.Read(extra[:]); n > 0 {
		return nil, fmt.Errorf("%s: grew while reading: %w", name, ErrSize)
	}
	return b, nil
}

// WriteDir writes d to dir (created if missing, with owner-only access
// since a device's data is private) in the layout [ReadDir] reads. Each
// file is written atomically (package atomicfile), the manifest last: a
// reader never sees a partial file, and one racing the writer fails the
// checksum check rather than mixing old and new data.
func WriteDir(dir string, d *Dataset, name string) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("data: write dir: %w", err)
	}
	if err := checkName(name); err != nil {
		return fmt.Errorf("data: write dir: %w: %w", err, ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data: write dir: %w", err)
	}

	var pending []*atomicfile.File // written, not yet committed
	defer func() {
		for _, f := range pending {
			f.Abort()
		}
	}()

	fTmp, fSum, err := writeTemp(dir, featuresFile, func(w io.Writer) error {
		var buf [4 << 10]byte
		for i := 0; i < len(d.Features); {
			n := 0
			for ; n+4 <= len(buf) && i < len(d.Features); i++ {
				binary.LittleEndian.PutUint32(buf[n:], math.Float32bits(d.Features[i]))
				n += 4
			}
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
		}
		return nil
	})
	if fTmp != nil {
		pending = append(pending, fTmp)
	}
	if err != nil {
		return fmt.Errorf("data: write dir: %s: %w", featuresFile, err)
	}
	lTmp, lSum, err := writeTemp(dir, labelsFile, func(w io.Writer) error {
		_, err := w.Write(d.Labels)
		return err
	})
	if lTmp != nil {
		pending = append(pending, lTmp)
	}
	if err != nil {
		return fmt.Errorf("data: write dir: %s: %w", labelsFile, err)
	}

	m := Manifest{
		Format:      FormatV1,
		Name:        name,
		NumExamples: d.Len(),
		Dim:         d.Dim,
		NumClasses:  d.NumClasses,
		Features:    featuresFile,
		Labels:      labelsFile,
		SHA256:      map[string]string{featuresFile: fSum, labelsFile: lSum},
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("data: write dir: %s: %w", ManifestFile, err)
	}
	raw = append(raw, '\n')
	mTmp, _, err := writeTemp(dir, ManifestFile, func(w io.Writer) error {
		_, err := w.Write(raw)
		return err
	})
	if mTmp != nil {
		pending = append(pending, mTmp)
	}
	if err != nil {
		return fmt.Errorf("data: write dir: %s: %w", ManifestFile, err)
	}

	// In the order written, so the manifest comes last.
	for _, f := range pending {
		if err := f.Commit(); err != nil {
			return fmt.Errorf("data: write dir: %w", err)
		}
	}
	return nil
}

// writeTemp starts the file that Commit puts at dir/final and returns it
// with the hex SHA-256 of what was written; on error it leaves nothing.
func writeTemp(dir, final string, write func(io.Writer) error) (*atomicfile.File, string, error) {
	f, err := atomicfile.Create(filepath.Join(dir, final), 0o600)
	if err != nil {
		return nil, "", err
	}
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, h), 64<<10)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		f.Abort()
		return nil, "", err
	}
	return f, hex.EncodeToString(h.Sum(nil)), nil
}
