package data

// A copy of part of the Go standard library's source, built into the
// package so that next-token datasets can be made on a machine without Go:
// the release binaries are meant to run without a toolchain or the source
// tree. embedded/gosrc/README.md says what it holds and how it is made.

//go:generate go run ./internal/gengosrc

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/fleetlearn/fleetlearn/internal/countio"
)

// embeddedGoPackage is one package of the embedded source, as GoSource read
// it from the Go installation the copy was made from.
type embeddedGoPackage struct {
	Path      string
	Files     int
	Bytes     int
	Truncated bool
}

// Bounds of the archive reader. The archive is checked against its digest,
// but the reader does not rely on that to stay bounded: no entry may exceed
// a package's byte bound, and the entry count and total size are capped.
const (
	maxEmbeddedGoEntries = 4096
	maxEmbeddedGoName    = 256
)

// EmbeddedGoSource returns the packages of the copy of the Go standard
// library's source built into this package: every public package
// (PublicGoPackage with DefaultPublicBuckets) and the first private ones in
// path order, each exactly as GoSource read it, with the default bounds,
// from the src directory of Go release EmbeddedGoVersion. opts bounds the
// result as it bounds GoSource; bounds above the defaults give no more text
// than the copy holds.
func EmbeddedGoSource(opts GoSourceOptions) ([]GoPackage, error) {
	if err := opts.fill(); err != nil {
		return nil, fmt.Errorf("data: embedded go source: %w", err)
	}
	pkgs, err := readGoArchive(bytes.NewReader(embeddedGoTarGz), embeddedGoPackages, embeddedGoTarSHA256, embeddedGoTarSize)
	if err != nil {
		return nil, fmt.Errorf("data: embedded go source: %w", err)
	}
	return boundGoPackages(pkgs, opts), nil
}

// EmbeddedGoLicense returns the licence of the embedded source: the LICENSE
// file of the Go release it comes from (BSD 3-clause), which must go with
// any dataset made from it.
func EmbeddedGoLicense() []byte {
	return bytes.Clone(embeddedGoLicense)
}

// archivedPackage is a package read from the archive with the length of
// each of its files, so that a tighter bound can recount them.
type archivedPackage struct {
	GoPackage
	sizes []int
}

// readGoArchive reads a gzipped tar of src/PATH/FILE entries and checks it
// against table (packages in order, each with its file count, byte count
// and truncation), the SHA-256 of the tar stream and its size.
func readGoArchive(r io.Reader, table []embeddedGoPackage, wantSHA256 string, wantSize int64) ([]archivedPackage, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	h := sha256.New()
	counted := &countio.Reader{R: io.LimitReader(zr, wantSize+1)}
	tr := tar.NewReader(io.TeeReader(counted, h))
	pkgs := make([]archivedPackage, 0, len(table))
	entries := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("archive: %w: %w", ErrInvalidArgument, err)
		}
		if entries++; entries > maxEmbeddedGoEntries {
			return nil, fmt.Errorf("archive: more than %d entries: %w", maxEmbeddedGoEntries, ErrTooLarge)
		}
		dir, file, err := archiveEntryName(hdr)
		if err != nil {
			return nil, err
		}
		if n := len(pkgs); n == 0 || pkgs[n-1].Path != dir {
			if n > 0 {
				if err := checkArchived(pkgs[n-1], table[n-1]); err != nil {
					return nil, err
				}
			}
			if n == len(table) || table[n].Path != dir {
				return nil, fmt.Errorf("archive: %s: package %s is not the next one listed: %w", hdr.Name, dir, ErrInvalidArgument)
			}
			pkgs = append(pkgs, archivedPackage{GoPackage: GoPackage{Path: dir, Truncated: table[n].Truncated}})
		}
		p := &pkgs[len(pkgs)-1]
		room := table[len(pkgs)-1].Bytes - len(p.Text)
		if hdr.Size > int64(room) || hdr.Size > DefaultGoMaxPackageBytes {
			return nil, fmt.Errorf("archive: %s: %d bytes, more than its package's %d: %w", hdr.Name, hdr.Size, room, ErrTooLarge)
		}
		text := make([]byte, hdr.Size)
		if _, err := io.ReadFull(tr, text); err != nil {
			return nil, fmt.Errorf("archive: %s: %w: %w", hdr.Name, ErrTruncated, err)
		}
		p.Text = append(p.Text, text...)
		p.Files++
		p.FileNames = append(p.FileNames, file)
		p.sizes = append(p.sizes, len(text))
	}
	if len(pkgs) != len(table) {
		return nil, fmt.Errorf("archive: %d packages, %d listed: %w", len(pkgs), len(table), ErrInvalidArgument)
	}
	if len(pkgs) > 0 {
		if err := checkArchived(pkgs[len(pkgs)-1], table[len(pkgs)-1]); err != nil {
			return nil, err
		}
	}
	// The tar's end-of-archive blocks are part of the digest.
	if _, err := io.Copy(h, counted); err != nil {
		return nil, fmt.Errorf("archive: %w: %w", ErrTruncated, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); counted.N != wantSize || got != wantSHA256 {
		return nil, fmt.Errorf("archive: %d bytes with sha256 %s, recorded %d bytes with sha256 %s: %w",
			counted.N, got, wantSize, wantSHA256, ErrChecksum)
	}
	return pkgs, nil
}

// archiveEntryName splits a regular file's name, src/PATH/FILE, into the
// package path and the file name, refusing anything else.
func archiveEntryName(hdr *tar.Header) (dir, file string, err error) {
	bad := func(why string) error {
		return fmt.Errorf("archive: entry %.100q: %s: %w", hdr.Name, why, ErrInvalidArgument)
	}
	name := hdr.Name
	switch {
	case hdr.Typeflag != tar.TypeReg:
		return "", "", bad("not a regular file")
	case len(name) > maxEmbeddedGoName:
		return "", "", bad("name too long")
	case hdr.Size < 0:
		return "", "", bad("negative size")
	}
	rest, ok := strings.CutPrefix(name, "src/")
	if !ok || path.Clean(rest) != rest || path.IsAbs(rest) || strings.HasPrefix(rest, "../") || !strings.Contains(rest, "/") {
		return "", "", bad("want src/PACKAGE/FILE")
	}
	dir, file = path.Split(rest)
	return strings.TrimSuffix(dir, "/"), file, nil
}

func checkArchived(p archivedPackage, want embeddedGoPackage) error {
	if p.Files != want.Files || len(p.Text) != want.Bytes {
		return fmt.Errorf("archive: package %s has %d files and %d bytes, listed with %d and %d: %w",
			p.Path, p.Files, len(p.Text), want.Files, want.Bytes, ErrInvalidArgument)
	}
	return nil
}

// boundGoPackages applies GoSource's bounds to packages it read with the
// defaults: at most MaxPackages, each cut to MaxPackageBytes, and no more
// than MaxTotalBytes in all, the package that crosses it cut.
func boundGoPackages(pkgs []archivedPackage, opts GoSourceOptions) []GoPackage {
	var out []GoPackage
	total := 0
	for _, p := range pkgs {
		if len(out) == opts.MaxPackages || total == opts.MaxTotalBytes {
			break
		}
		budget := min(opts.MaxPackageBytes, opts.MaxTotalBytes-total)
		g := p.GoPackage
		if len(g.Text) > budget {
			g.Text, g.Truncated = g.Text[:budget], true
			// Files that start at or past the cut contributed nothing.
			files, start := 0, 0
			for _, n := range p.sizes {
				if start >= budget {
					break
				}
				files++
				start += n
			}
			g.Files, g.FileNames = files, g.FileNames[:files]
		}
		if len(g.Text) == 0 {
			continue
		}
		total += len(g.Text)
		out = append(out, g)
	}
	return out
}
