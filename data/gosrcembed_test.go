package data

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// installedGoroot returns the installed Go's GOROOT when it is the release
// the embedded copy was made from, and skips the test otherwise.
func installedGoroot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	goroot := strings.TrimSpace(string(out))
	if err != nil || goroot == "" {
		t.Skip("go env GOROOT unavailable:", err)
	}
	v, err := os.ReadFile(filepath.Join(goroot, "VERSION"))
	if err != nil {
		t.Skip("the installed Go has no VERSION file:", err)
	}
	if got, _, _ := strings.Cut(string(v), "\n"); got != EmbeddedGoVersion {
		t.Skipf("the installed Go is %s, the embedded copy %s: their sources differ", got, EmbeddedGoVersion)
	}
	return goroot
}

// TestEmbeddedGoSourceMatchesGOROOT checks the embedded copy against the
// release it was made from: every package is what GoSource reads there,
// with the default bounds and with a tighter package bound.
func TestEmbeddedGoSourceMatchesGOROOT(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the whole standard library")
	}
	src := filepath.Join(installedGoroot(t), "src")
	lic, err := os.ReadFile(filepath.Join(src, "..", "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(EmbeddedGoLicense(), lic) {
		t.Error("the embedded licence differs from GOROOT/LICENSE")
	}
	for _, opts := range []GoSourceOptions{{}, {MaxPackageBytes: 48 << 10}} {
		emb, err := EmbeddedGoSource(opts)
		if err != nil {
			t.Fatal(err)
		}
		all, err := GoSource(src, opts)
		if err != nil {
			t.Fatal(err)
		}
		byPath := map[string]GoPackage{}
		for _, p := range all {
			byPath[p.Path] = p
		}
		for _, e := range emb {
			g, ok := byPath[e.Path]
			if !ok {
				t.Errorf("%+v: embedded package %s is not in GOROOT", opts, e.Path)
				continue
			}
			if !bytes.Equal(e.Text, g.Text) || e.Files != g.Files || !slices.Equal(e.FileNames, g.FileNames) || e.Truncated != g.Truncated {
				t.Errorf("%+v: %s: embedded %d bytes, files %q, truncated %v; GOROOT %d bytes, files %q, truncated %v",
					opts, e.Path, len(e.Text), e.FileNames, e.Truncated, len(g.Text), g.FileNames, g.Truncated)
			}
		}
		// The public packages all, and a prefix of the private ones.
		var private []string
		for _, p := range all {
			if PublicGoPackage(p.Path, DefaultPublicBuckets) {
				if !slices.ContainsFunc(emb, func(e GoPackage) bool { return e.Path == p.Path }) {
					t.Errorf("public package %s is missing", p.Path)
				}
			} else {
				private = append(private, p.Path)
			}
		}
		var embPrivate []string
		for _, e := range emb {
			if !PublicGoPackage(e.Path, DefaultPublicBuckets) {
				embPrivate = append(embPrivate, e.Path)
			}
		}
		if len(embPrivate) == 0 || !slices.Equal(embPrivate, private[:len(embPrivate)]) {
			t.Errorf("embedded private packages %q are not the first of %q", embPrivate, private)
		}
	}
}

func TestEmbeddedGoSource(t *testing.T) {
	pkgs, err := EmbeddedGoSource(GoSourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	public, private, total := 0, 0, 0
	for i, p := range pkgs {
		if i > 0 && pkgs[i-1].Path >= p.Path {
			t.Errorf("%s after %s: not in path order", p.Path, pkgs[i-1].Path)
		}
		if PublicGoPackage(p.Path, DefaultPublicBuckets) {
			public++
		} else {
			private++
		}
		if len(p.Text) == 0 || len(p.Text) > DefaultGoMaxPackageBytes || p.Files != len(p.FileNames) {
			t.Errorf("%s: %d bytes, %d files named %q", p.Path, len(p.Text), p.Files, p.FileNames)
		}
		total += len(p.Text)
	}
	if public < 10 || private < 8 {
		t.Errorf("%d public and %d private packages: too few for the recipe and the demo", public, private)
	}
	if lic := string(EmbeddedGoLicense()); !strings.Contains(lic, "Redistribution and use in source and binary forms") {
		t.Errorf("licence %.80q... is not Go's BSD licence", lic)
	}

	// Bounds apply as they do to GoSource.
	two, err := EmbeddedGoSource(GoSourceOptions{MaxPackages: 2})
	if err != nil || len(two) != 2 || two[1].Path != pkgs[1].Path {
		t.Errorf("MaxPackages 2: %d packages, %v", len(two), err)
	}
	first := len(pkgs[0].Text)
	cut, err := EmbeddedGoSource(GoSourceOptions{MaxTotalBytes: first + 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(cut) != 2 || len(cut[1].Text) != 10 || !cut[1].Truncated || cut[1].Files != 1 || len(cut[1].FileNames) != 1 || !bytes.Equal(cut[1].Text, pkgs[1].Text[:10]) {
		t.Errorf("MaxTotalBytes: %d packages, the second %d bytes of %d files, truncated %v", len(cut), len(cut[1].Text), cut[1].Files, cut[1].Truncated)
	}
	small, err := EmbeddedGoSource(GoSourceOptions{MaxPackageBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range small {
		if len(p.Text) > 100 {
			t.Fatalf("%s: %d bytes over MaxPackageBytes 100", p.Path, len(p.Text))
		}
	}
	if _, err := EmbeddedGoSource(GoSourceOptions{MaxPackages: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative bound: %v", err)
	}
	// Each call returns its own copy.
	again, _ := EmbeddedGoSource(GoSourceOptions{})
	again[0].Text[0] ^= 0xff
	if fresh, _ := EmbeddedGoSource(GoSourceOptions{}); fresh[0].Text[0] != pkgs[0].Text[0] {
		t.Error("a caller's change to the text reached the next call")
	}
}

// archiveEntry is one tar entry of a test archive.
type archiveEntry struct {
	name string
	text string
	typ  byte
}

// goArchive builds a gzipped tar and returns it with its tar stream's
// digest and size.
func goArchive(t testing.TB, entries []archiveEntry) ([]byte, string, int64) {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		hdr := &tar.Header{Typeflag: typ, Name: e.name, Mode: 0o644, Size: int64(len(e.text)), ModTime: time.Unix(0, 0)}
		if typ != tar.TypeReg {
			hdr.Size, hdr.Linkname = 0, "../../etc/passwd"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write([]byte(e.text))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tb.Bytes())
	zw.Close()
	sum := sha256.Sum256(tb.Bytes())
	return gz.Bytes(), hex.EncodeToString(sum[:]), int64(tb.Len())
}

var testArchiveTable = []embeddedGoPackage{{"a", 2, 7, false}, {"b/c", 1, 3, true}}

func TestReadGoArchive(t *testing.T) {
	good := []archiveEntry{{name: "src/a/1.go", text: "abc"}, {name: "src/a/2.go", text: "defg"}, {name: "src/b/c/x.go", text: "xyz"}}
	gz, sum, size := goArchive(t, good)
	pkgs, err := readGoArchive(bytes.NewReader(gz), testArchiveTable, sum, size)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) != 2 || string(pkgs[0].Text) != "abcdefg" || !slices.Equal(pkgs[0].FileNames, []string{"1.go", "2.go"}) ||
		pkgs[1].Path != "b/c" || !pkgs[1].Truncated || pkgs[1].Truncated == pkgs[0].Truncated {
		t.Fatalf("read %+v", pkgs)
	}

	for _, tc := range []struct {
		name    string
		entries []archiveEntry
		want    error
	}{
		{"missing package", good[:2], ErrInvalidArgument},
		{"extra package", append(slices.Clone(good), archiveEntry{name: "src/d/d.go", text: "d"}), ErrInvalidArgument},
		{"wrong order", []archiveEntry{good[2], good[0], good[1]}, ErrInvalidArgument},
		{"package split", []archiveEntry{good[0], good[2], good[1]}, ErrInvalidArgument},
		{"file over its package", []archiveEntry{good[0], {name: "src/a/2.go", text: "defgh"}, good[2]}, ErrTooLarge},
		{"short package", []archiveEntry{good[0], {name: "src/a/2.go", text: "de"}, good[2]}, ErrInvalidArgument},
		{"traversal", []archiveEntry{{name: "src/../a/1.go", text: "abc"}, good[1], good[2]}, ErrInvalidArgument},
		{"not under src", []archiveEntry{{name: "a/1.go", text: "abc"}, good[1], good[2]}, ErrInvalidArgument},
		{"no package", []archiveEntry{{name: "src/1.go", text: "abc"}, good[1], good[2]}, ErrInvalidArgument},
		{"symlink", []archiveEntry{{name: "src/a/1.go", typ: tar.TypeSymlink}, good[1], good[2]}, ErrInvalidArgument},
		{"long name", []archiveEntry{{name: "src/a/" + strings.Repeat("x", 300), text: "abc"}, good[1], good[2]}, ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gz, sum, size := goArchive(t, tc.entries)
			if _, err := readGoArchive(bytes.NewReader(gz), testArchiveTable, sum, size); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
	// The digest and size of the tar stream are checked.
	if _, err := readGoArchive(bytes.NewReader(gz), testArchiveTable, strings.Repeat("0", 64), size); !errors.Is(err, ErrChecksum) {
		t.Errorf("wrong digest: %v", err)
	}
	if _, err := readGoArchive(bytes.NewReader(gz), testArchiveTable, sum, size-512); err == nil {
		t.Error("longer than recorded: no error")
	}
	if _, err := readGoArchive(bytes.NewReader(gz[:len(gz)/2]), testArchiveTable, sum, size); err == nil {
		t.Error("half an archive: no error")
	}
	if _, err := readGoArchive(strings.NewReader("not gzip"), testArchiveTable, sum, size); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("not gzip: %v", err)
	}
}

func TestReadGoArchiveEntryBound(t *testing.T) {
	entries := make([]archiveEntry, maxEmbeddedGoEntries+1)
	table := []embeddedGoPackage{{"a", len(entries), len(entries), false}}
	for i := range entries {
		entries[i] = archiveEntry{name: "src/a/f.go", text: "x"}
	}
	gz, sum, size := goArchive(t, entries)
	if _, err := readGoArchive(bytes.NewReader(gz), table, sum, size); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("%d entries: %v, want ErrTooLarge", len(entries), err)
	}
}

func FuzzReadGoArchive(f *testing.F) {
	gz, sum, size := goArchive(f, []archiveEntry{{name: "src/a/1.go", text: "abc"}, {name: "src/a/2.go", text: "defg"}, {name: "src/b/c/x.go", text: "xyz"}})
	f.Add(gz)
	f.Add(gz[:20])
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, in []byte) {
		pkgs, err := readGoArchive(bytes.NewReader(in), testArchiveTable, sum, size)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrChecksum) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		for i, p := range pkgs {
			if p.Path != testArchiveTable[i].Path || len(p.Text) != testArchiveTable[i].Bytes {
				t.Fatalf("accepted %+v", pkgs)
			}
		}
	})
}
