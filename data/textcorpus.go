package data

// Any directory of text files as a naturally partitioned corpus: each
// subdirectory is one part (one device), as each package is in the Go
// source. The directory may come from anyone, so the walk is bounded in
// entries, depth and bytes, follows no symbolic link and reads nothing
// outside it.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// Default bounds of TextCorpus.
const (
	DefaultTextMaxPartBytes  = 1 << 20
	DefaultTextMaxTotalBytes = 64 << 20
	DefaultTextMaxParts      = 1024
	DefaultTextMaxEntries    = 100_000
	DefaultTextMaxDepth      = 16
)

// TextCorpusOptions bounds what TextCorpus reads. Zero fields take the
// defaults.
type TextCorpusOptions struct {
	// MaxPartBytes cuts each part's text after this many bytes.
	MaxPartBytes int
	// MaxTotalBytes stops the walk once the parts so far hold this many
	// bytes; the part that crosses it is cut to the remainder.
	MaxTotalBytes int
	// MaxParts keeps the first parts in name order.
	MaxParts int
	// MaxEntries bounds the directory entries looked at, in all; a tree
	// with more is refused (ErrTooLarge) rather than read in part.
	MaxEntries int
	// MaxDepth bounds how deep below a part's directory files are read;
	// a deeper tree is refused (ErrTooLarge).
	MaxDepth int
}

func (o *TextCorpusOptions) fill() error {
	for _, f := range []struct {
		v   *int
		def int
	}{{&o.MaxPartBytes, DefaultTextMaxPartBytes}, {&o.MaxTotalBytes, DefaultTextMaxTotalBytes},
		{&o.MaxParts, DefaultTextMaxParts}, {&o.MaxEntries, DefaultTextMaxEntries}, {&o.MaxDepth, DefaultTextMaxDepth}} {
		if *f.v < 0 {
			return fmt.Errorf("negative bound %+v: %w", *o, ErrInvalidArgument)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return nil
}

// TextCorpusStats says what TextCorpus left out.
type TextCorpusStats struct {
	// TopLevelFiles are files directly in the corpus directory, which
	// belong to no part.
	TopLevelFiles int
	// BinaryFiles were skipped because they hold a NUL byte.
	BinaryFiles int
	// Skipped are entries that are not regular files or directories
	// (symbolic links, devices) or whose names start with '.' or '_'.
	Skipped int
}

// TextCorpus reads the text corpus in dir: every subdirectory of dir is
// one part, named after it, in byte-wise name order, and its text is its
// regular files at any depth (up to MaxDepth), in byte-wise order of their
// slash-separated paths, concatenated. Names starting with '.' or '_' are
// skipped, as are symbolic links, other non-regular files and files with a
// NUL byte (binary); files directly in dir belong to no part. A part with
// no text is left out. The result uses GoPackage: Path is the part's name
// and FileNames the files' paths below it.
func TextCorpus(dir string, opts TextCorpusOptions) ([]GoPackage, TextCorpusStats, error) {
	var st TextCorpusStats
	if err := opts.fill(); err != nil {
		return nil, st, fmt.Errorf("data: text corpus: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, st, fmt.Errorf("data: text corpus: %w", err)
	}
	defer root.Close()
	w := &textWalk{fsys: root.FS(), opts: opts, st: &st}
	top, err := w.readDir(".")
	if err != nil {
		return nil, st, fmt.Errorf("data: text corpus: %s: %w", dir, err)
	}
	var parts []GoPackage
	total := 0
	for _, e := range top {
		if len(parts) == opts.MaxParts || total == opts.MaxTotalBytes {
			break
		}
		if skipTextName(e.Name()) || !e.IsDir() {
			if e.Type().IsRegular() && !skipTextName(e.Name()) {
				st.TopLevelFiles++
			} else {
				st.Skipped++
			}
			continue
		}
		files, err := w.files(e.Name(), 1)
		if err != nil {
			return nil, st, fmt.Errorf("data: text corpus: %s: %w", dir, err)
		}
		p, err := w.part(e.Name(), files, min(opts.MaxPartBytes, opts.MaxTotalBytes-total))
		if err != nil {
			return nil, st, fmt.Errorf("data: text corpus: %s: %w", dir, err)
		}
		if len(p.Text) == 0 {
			continue
		}
		total += len(p.Text)
		parts = append(parts, p)
	}
	return parts, st, nil
}

func skipTextName(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

type textWalk struct {
	fsys    fs.FS
	opts    TextCorpusOptions
	st      *TextCorpusStats
	entries int
}

// readDir lists dir in name order, counting its entries against
// MaxEntries as they are read, so that a directory of millions of entries
// is refused without listing it all.
func (w *textWalk) readDir(dir string) ([]fs.DirEntry, error) {
	f, err := w.fsys.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, ok := f.(fs.ReadDirFile)
	if !ok {
		return nil, fmt.Errorf("%s: not a directory: %w", dir, ErrInvalidArgument)
	}
	var all []fs.DirEntry
	for {
		batch, err := d.ReadDir(256)
		w.entries += len(batch)
		if w.entries > w.opts.MaxEntries {
			return nil, fmt.Errorf("more than %d files and directories: %w", w.opts.MaxEntries, ErrTooLarge)
		}
		all = append(all, batch...)
		if errors.Is(err, io.EOF) || err == nil && len(batch) == 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
	}
	slices.SortFunc(all, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return all, nil
}

// files returns the regular files below dir, as slash paths from the
// corpus root, in byte-wise path order.
func (w *textWalk) files(dir string, depth int) ([]string, error) {
	if depth > w.opts.MaxDepth {
		return nil, fmt.Errorf("%s: deeper than %d directories: %w", dir, w.opts.MaxDepth, ErrTooLarge)
	}
	entries, err := w.readDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		p := path.Join(dir, e.Name())
		switch {
		case skipTextName(e.Name()):
			w.st.Skipped++
		case e.IsDir():
			sub, err := w.files(p, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		case e.Type().IsRegular():
			out = append(out, p)
		default:
			w.st.Skipped++
		}
	}
	// "a/b" sorts after "a-b"; the walk visits it first.
	slices.Sort(out)
	return out, nil
}

// part concatenates files, reading at most budget bytes of them.
func (w *textWalk) part(name string, files []string, budget int) (GoPackage, error) {
	p := GoPackage{Path: name}
	var buf bytes.Buffer
	for _, file := range files {
		if buf.Len() == budget {
			p.Truncated = true
			break
		}
		text, cut, err := readTextFile(w.fsys, file, budget-buf.Len())
		if err != nil {
			return p, err
		}
		if bytes.IndexByte(text, 0) >= 0 {
			w.st.BinaryFiles++
			continue
		}
		buf.Write(text)
		p.Files++
		p.FileNames = append(p.FileNames, strings.TrimPrefix(file, name+"/"))
		if cut {
			p.Truncated = true
			break
		}
	}
	p.Text = buf.Bytes()
	return p, nil
}

// readTextFile returns at most limit bytes of the file and whether it was
// cut.
func readTextFile(fsys fs.FS, name string, limit int) ([]byte, bool, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > limit {
		return b[:limit], true, nil
	}
	return b, false, nil
}
