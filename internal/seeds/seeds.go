// Package seeds reads a test's seed files from its package's testdata
// folder: fuzz corpora and golden inputs kept as files. It fails the test
// when a folder holds none, since a renamed folder would otherwise leave a
// fuzz target or a golden test without inputs, silently.
package seeds

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Read returns the files testdata/dir/pattern matches, by base name.
func Read(tb testing.TB, dir, pattern string) map[string][]byte {
	tb.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", dir, pattern))
	if err != nil || len(paths) == 0 {
		tb.Fatalf("no seeds match testdata/%s/%s (%v)", dir, pattern, err)
	}
	out := make(map[string][]byte, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		out[filepath.Base(p)] = b
	}
	return out
}

// AddTo adds the files of Read to f's corpus, in name order.
func AddTo(f *testing.F, dir, pattern string) {
	f.Helper()
	files := Read(f, dir, pattern)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		f.Add(files[n])
	}
}
