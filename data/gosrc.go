package data

// The Go standard library's source as a naturally partitioned text corpus:
// every package is one device with its own vocabulary and style, and the
// corpus is on every machine that has Go, so next-token experiments need no
// download. The layout and the splits are described in docs/DATASET.md.

import (
	"bufio"
	"bytes"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// The byte-level vocabulary: id 0 stands for every byte outside it (UTF-8
// continuation bytes, carriage returns, other control characters), then tab,
// newline and the 95 printable ASCII characters from space to tilde in
// order. Go source is almost entirely ASCII, so little is lost, and a
// fixed table keeps ids the same across machines and Go versions.
const (
	TokenOther   = 0
	TokenTab     = 1
	TokenNewline = 2
	// tokenPrintable is the id of ' '; '~' is tokenPrintable + 94.
	tokenPrintable = 3
	// VocabSize is the number of token ids, and the class count of the
	// next-token datasets.
	VocabSize = tokenPrintable + 95
)

// TokenID returns the vocabulary id of byte b.
func TokenID(b byte) uint8 {
	switch {
	case b == '\t':
		return TokenTab
	case b == '\n':
		return TokenNewline
	case b >= ' ' && b <= '~':
		return tokenPrintable + (b - ' ')
	}
	return TokenOther
}

// TokenByte returns the byte that id stands for; TokenOther and ids outside
// the vocabulary give 0.
func TokenByte(id uint8) byte {
	switch {
	case id == TokenTab:
		return '\t'
	case id == TokenNewline:
		return '\n'
	case id >= tokenPrintable && id < VocabSize:
		return ' ' + (id - tokenPrintable)
	}
	return 0
}

// Tokenize maps each byte of text to its vocabulary id.
func Tokenize(text []byte) []uint8 {
	ids := make([]uint8, len(text))
	for i, b := range text {
		ids[i] = TokenID(b)
	}
	return ids
}

// Default bounds of GoSource. The standard library outside cmd/ and
// internal/ is about 200 packages and 20 MB of non-test source; these keep
// a full run near 10 MB of text while leaving every package represented.
const (
	DefaultGoMaxPackageBytes = 128 << 10
	DefaultGoMaxTotalBytes   = 16 << 20
	DefaultGoMaxPackages     = 512
)

// GoSourceOptions bounds what GoSource reads. Zero fields take the defaults.
type GoSourceOptions struct {
	// MaxPackageBytes cuts each package's text after this many bytes.
	MaxPackageBytes int
	// MaxTotalBytes stops the walk once the packages so far hold this many
	// bytes; the package that crosses it is cut to the remainder.
	MaxTotalBytes int
	// MaxPackages keeps the first packages in path order.
	MaxPackages int
}

func (o *GoSourceOptions) fill() error {
	if o.MaxPackageBytes == 0 {
		o.MaxPackageBytes = DefaultGoMaxPackageBytes
	}
	if o.MaxTotalBytes == 0 {
		o.MaxTotalBytes = DefaultGoMaxTotalBytes
	}
	if o.MaxPackages == 0 {
		o.MaxPackages = DefaultGoMaxPackages
	}
	if o.MaxPackageBytes < 0 || o.MaxTotalBytes < 0 || o.MaxPackages < 0 {
		return fmt.Errorf("negative bound %+v: %w", *o, ErrInvalidArgument)
	}
	return nil
}

// GoPackage is one standard-library package's source text, or one part of
// a text corpus (TextCorpus: a subdirectory, Path its name).
type GoPackage struct {
	Path  string // import path, such as "net/http"
	Text  []byte // its files, in name order, concatenated
	Files int    // files that contributed to Text
	// FileNames are those files, relative to the package's directory, in
	// the order Text holds them; the last one may be cut short when
	// Truncated.
	FileNames []string
	Truncated bool // Text was cut by a byte bound
}

// skipGoDir reports directories GoSource does not descend into: what the go
// command itself ignores (testdata, names starting with . or _), vendored
// third-party code, and code that is not the public standard library
// (cmd/, whose tools are a different program style, and internal/, which
// holds generated tables and runtime plumbing more than library code).
func skipGoDir(p, name string) bool {
	return name == "testdata" || name == "vendor" || name == "internal" ||
		strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
		p == "cmd"
}

// useGoFile reports files GoSource reads: non-test .go files. Tests are left
// out because they are dominated by tables of inputs and golden outputs
// rather than the package's own code.
func useGoFile(name string) bool {
	return strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") &&
		!strings.HasPrefix(name, ".") && !strings.HasPrefix(name, "_")
}

// GoSource walks src, a GOROOT's src directory, and returns the standard
// library's packages in import-path order, each with its non-test,
// non-generated .go files concatenated in file-name order, within the
// bounds of opts. Symbolic links are not followed and nothing outside src
// is read. A package whose files are all generated or empty is left out.
func GoSource(src string, opts GoSourceOptions) ([]GoPackage, error) {
	if err := opts.fill(); err != nil {
		return nil, fmt.Errorf("data: go source: %w", err)
	}
	root, err := os.OpenRoot(src)
	if err != nil {
		return nil, fmt.Errorf("data: go source: %w", err)
	}
	defer root.Close()
	fsys := root.FS()

	// WalkDir visits a directory's children before its later siblings, so
	// "a/b" comes before "a-b" although it sorts after it: sort the paths
	// so that the MaxPackages cut and the output order are plain string
	// order.
	var dirs []string
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != "." && skipGoDir(p, d.Name()) {
			return fs.SkipDir
		}
		if p != "." {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("data: go source: walk %s: %w", src, err)
	}
	slices.Sort(dirs)

	var pkgs []GoPackage
	total := 0
	for _, dir := range dirs {
		if len(pkgs) == opts.MaxPackages || total == opts.MaxTotalBytes {
			break
		}
		budget := min(opts.MaxPackageBytes, opts.MaxTotalBytes-total)
		pkg, err := readGoPackage(fsys, dir, budget)
		if err != nil {
			return nil, fmt.Errorf("data: go source: %w", err)
		}
		if len(pkg.Text) == 0 {
			continue
		}
		total += len(pkg.Text)
		pkgs = append(pkgs, pkg)
	}
	return pkgs, nil
}

// readGoPackage concatenates dir's usable files, reading at most budget
// bytes of them.
func readGoPackage(fsys fs.FS, dir string, budget int) (GoPackage, error) {
	pkg := GoPackage{Path: dir}
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return pkg, err
	}
	var buf bytes.Buffer
	for _, e := range entries {
		if !e.Type().IsRegular() || !useGoFile(e.Name()) {
			continue
		}
		if buf.Len() == budget {
			pkg.Truncated = true
			break
		}
		text, cut, err := readGoFile(fsys, path.Join(dir, e.Name()), budget-buf.Len())
		if err != nil {
			return pkg, err
		}
		if text == nil {
			continue
		}
		buf.Write(text)
		pkg.Files++
		pkg.FileNames = append(pkg.FileNames, e.Name())
		if cut {
			pkg.Truncated = true
			break
		}
	}
	pkg.Text = buf.Bytes()
	return pkg, nil
}

// readGoFile returns at most limit bytes of the file and whether it was cut,
// or nil for a generated file.
func readGoFile(fsys fs.FS, name string, limit int) (text []byte, cut bool, err error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", name, err)
	}
	if generatedGo(b) {
		return nil, false, nil
	}
	if len(b) > limit {
		return b[:limit], true, nil
	}
	return b, false, nil
}

// generatedGo reports Go's convention for machine-written files, a line
// "// Code generated ... DO NOT EDIT." before the package clause: such
// files are tables (syscall numbers, Unicode ranges) that would drown the
// package's own style.
func generatedGo(b []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, len(b)+1)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "package ") {
			return false
		}
		if strings.HasPrefix(line, "// Code generated ") && strings.HasSuffix(line, " DO NOT EDIT.") {
			return true
		}
	}
	return false
}

// Defaults of the next-token windows.
const (
	DefaultWindow         = 64
	DefaultStride         = 64
	DefaultHeldOutPercent = 10
	DefaultPublicBuckets  = 10
	// MaxWindow bounds the window, the feature dimension of an example.
	MaxWindow = 4096
)

// WindowOptions shapes the next-token examples of a package. Zero fields
// take the defaults.
type WindowOptions struct {
	Window         int // tokens per example, the feature dimension
	Stride         int // tokens between the starts of consecutive windows
	HeldOutPercent int // share of a package's windows held out, from its end
	// PublicBuckets: a package is public when the FNV-1a hash of its path
	// is 0 modulo PublicBuckets, so about one package in PublicBuckets is.
	PublicBuckets int
}

func (o *WindowOptions) fill() error {
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.Stride == 0 {
		o.Stride = DefaultStride
	}
	if o.HeldOutPercent == 0 {
		o.HeldOutPercent = DefaultHeldOutPercent
	}
	if o.PublicBuckets == 0 {
		o.PublicBuckets = DefaultPublicBuckets
	}
	switch {
	case o.Window < 1 || o.Window > MaxWindow:
		return fmt.Errorf("window %d outside [1, %d]: %w", o.Window, MaxWindow, ErrInvalidArgument)
	case o.Stride < 1:
		return fmt.Errorf("stride %d < 1: %w", o.Stride, ErrInvalidArgument)
	case o.HeldOutPercent < 0 || o.HeldOutPercent >= 100:
		return fmt.Errorf("held-out percent %d outside [0, 100): %w", o.HeldOutPercent, ErrInvalidArgument)
	case o.PublicBuckets < 1:
		return fmt.Errorf("public buckets %d < 1: %w", o.PublicBuckets, ErrInvalidArgument)
	}
	return nil
}

// PublicGoPackage reports whether the package at path belongs to the public
// pretraining set when one package in buckets is public.
func PublicGoPackage(path string, buckets int) bool {
	if buckets < 1 {
		return false
	}
	h := fnv.New64a()
	h.Write([]byte(path))
	return h.Sum64()%uint64(buckets) == 0
}

// NextTokenExamples turns text into examples: example i is the window of
// window token ids starting at token i*stride, as float32 features, and its
// label is the token that follows the window. Only full windows with a
// following token are kept.
func NextTokenExamples(text []byte, window, stride int) (*Dataset, error) {
	opts := WindowOptions{Window: window, Stride: stride}
	if err := opts.fill(); err != nil {
		return nil, fmt.Errorf("data: next-token examples: %w", err)
	}
	return windows(Tokenize(text), opts.Window, opts.Stride), nil
}

func windows(ids []uint8, window, stride int) *Dataset {
	n := 0
	if len(ids) > window {
		n = (len(ids)-window-1)/stride + 1
	}
	d := &Dataset{Dim: window, NumClasses: VocabSize, Features: make([]float32, 0, n*window), Labels: make([]uint8, n)}
	for i := range n {
		p := i * stride
		for _, id := range ids[p : p+window] {
			d.Features = append(d.Features, float32(id))
		}
		d.Labels[i] = ids[p+window]
	}
	return d
}

// GoPackageSplit is one package's examples.
type GoPackageSplit struct {
	Path    string
	Public  bool
	Train   *Dataset
	HeldOut *Dataset
}

// SplitGoPackage windows a package's text and holds out its end: the last
// ceil(HeldOutPercent% of the windows) (at least one when there are two
// or more windows, never all of them) are HeldOut, and the training windows
// are those whose tokens and label all lie before the first held-out
// window, so no held-out token is ever trained on, even with overlapping
// windows.
func SplitGoPackage(pkg GoPackage, opts WindowOptions) (GoPackageSplit, error) {
	if err := opts.fill(); err != nil {
		return GoPackageSplit{}, fmt.Errorf("data: split %s: %w", pkg.Path, err)
	}
	all := windows(Tokenize(pkg.Text), opts.Window, opts.Stride)
	n := all.Len()
	held := (n*opts.HeldOutPercent + 99) / 100
	if held >= n {
		held = n - 1
	}
	held = max(held, 0)
	first := n - held // index of the first held-out window
	train := first
	if held > 0 {
		// Window i spans tokens [i*stride, i*stride+window]; keep it only
		// if that ends before the held-out span starts.
		for train > 0 && (train-1)*opts.Stride+opts.Window >= first*opts.Stride {
			train--
		}
	}
	s := GoPackageSplit{
		Path:    pkg.Path,
		Public:  PublicGoPackage(pkg.Path, opts.PublicBuckets),
		Train:   all.Subset(indexRange(0, train)),
		HeldOut: all.Subset(indexRange(first, n)),
	}
	return s, nil
}

func indexRange(lo, hi int) []int {
	idx := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		idx = append(idx, i)
	}
	return idx
}

// ConcatDatasets returns the examples of ds, in order, in one dataset. All
// must share Dim and NumClasses; nil entries are skipped.
func ConcatDatasets(ds ...*Dataset) (*Dataset, error) {
	var out *Dataset
	for _, d := range ds {
		if d == nil {
			continue
		}
		if out == nil {
			out = &Dataset{Dim: d.Dim, NumClasses: d.NumClasses}
		}
		if d.Dim != out.Dim || d.NumClasses != out.NumClasses {
			return nil, fmt.Errorf("data: concat: dim %d, %d classes after dim %d, %d classes: %w",
				d.Dim, d.NumClasses, out.Dim, out.NumClasses, ErrInvalidArgument)
		}
		out.Features = append(out.Features, d.Features...)
		out.Labels = append(out.Labels, d.Labels...)
	}
	if out == nil {
		return nil, fmt.Errorf("data: concat: no datasets: %w", ErrInvalidArgument)
	}
	return out, nil
}
