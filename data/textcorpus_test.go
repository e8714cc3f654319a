package data

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// textTree writes files (slash paths) under a new directory and returns it.
func textTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestTextCorpus(t *testing.T) {
	dir := textTree(t, map[string]string{
		"poems/b.txt":         "second\n",
		"poems/a.txt":         "first\n",
		"poems/x/deep.md":     "deeper\n",
		"poems/x-y.md":        "dash\n",
		"poems/.hidden":       "no\n",
		"poems/_draft":        "no\n",
		"poems/image.png":     "\x89PNG\x00\x00",
		"letters/one":         "dear\n",
		"empty/only.bin":      "\x00",
		".git/config":         "no\n",
		"_scratch/s":          "no\n",
		"README":              "top level\n",
		"notes/sub/dir/n.txt": "note\n",
	})
	if err := os.Symlink(filepath.Join(dir, "README"), filepath.Join(dir, "poems", "link.txt")); err != nil {
		t.Skip("no symlinks:", err)
	}
	parts, st, err := TextCorpus(dir, TextCorpusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range parts {
		names = append(names, p.Path)
	}
	if want := []string{"letters", "notes", "poems"}; !slices.Equal(names, want) {
		t.Fatalf("parts %q, want %q", names, want)
	}
	poems := parts[2]
	if got := string(poems.Text); got != "first\nsecond\ndash\ndeeper\n" || poems.Files != 4 || poems.Truncated ||
		!slices.Equal(poems.FileNames, []string{"a.txt", "b.txt", "x-y.md", "x/deep.md"}) {
		t.Errorf("poems = %q from %q (%d files, truncated %v)", got, poems.FileNames, poems.Files, poems.Truncated)
	}
	if parts[1].FileNames[0] != "sub/dir/n.txt" {
		t.Errorf("notes files %q", parts[1].FileNames)
	}
	if st.TopLevelFiles != 1 || st.BinaryFiles != 2 || st.Skipped != 5 {
		t.Errorf("stats %+v, want 1 top-level file, 2 binary, 5 skipped (2 hidden dirs, 2 hidden files, 1 symlink)", st)
	}
	again, _, err := TextCorpus(dir, TextCorpusOptions{})
	if err != nil || len(again) != len(parts) || string(again[2].Text) != string(poems.Text) {
		t.Errorf("a second read differs: %v", err)
	}
}

func TestTextCorpusBounds(t *testing.T) {
	files := map[string]string{"big/a": strings.Repeat("a", 100), "big/b": "b"}
	for i := range 5 {
		files[fmt.Sprintf("p%d/f", i)] = "ppp"
	}
	dir := textTree(t, files)

	parts, _, err := TextCorpus(dir, TextCorpusOptions{MaxPartBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 6 || string(parts[0].Text) != strings.Repeat("a", 10) || !parts[0].Truncated || parts[0].Files != 1 {
		t.Errorf("MaxPartBytes 10: %d parts, first %q truncated %v", len(parts), parts[0].Text, parts[0].Truncated)
	}
	parts, _, err = TextCorpus(dir, TextCorpusOptions{MaxParts: 2})
	if err != nil || len(parts) != 2 || parts[1].Path != "p0" {
		t.Errorf("MaxParts 2: %d parts, %v", len(parts), err)
	}
	parts, _, err = TextCorpus(dir, TextCorpusOptions{MaxTotalBytes: 103})
	if err != nil || len(parts) != 2 || string(parts[1].Text) != "pp" || !parts[1].Truncated {
		t.Errorf("MaxTotalBytes 103: %d parts, %v", len(parts), err)
	}
	if _, _, err := TextCorpus(dir, TextCorpusOptions{MaxEntries: 8}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxEntries 8 of 13: %v, want ErrTooLarge", err)
	}
	deep := textTree(t, map[string]string{"p/1/2/3/f": "x"})
	if _, _, err := TextCorpus(deep, TextCorpusOptions{MaxDepth: 3}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("depth 4 with MaxDepth 3: %v, want ErrTooLarge", err)
	}
	if parts, _, err := TextCorpus(deep, TextCorpusOptions{MaxDepth: 4}); err != nil || len(parts) != 1 {
		t.Errorf("depth 4 with MaxDepth 4: %d parts, %v", len(parts), err)
	}
	if _, _, err := TextCorpus(dir, TextCorpusOptions{MaxDepth: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative bound: %v", err)
	}
	if _, _, err := TextCorpus(filepath.Join(dir, "missing"), TextCorpusOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
}

// TestTextCorpusStaysInside checks that a symbolic link to a directory
// outside the corpus is neither a part nor followed.
func TestTextCorpusStaysInside(t *testing.T) {
	outside := textTree(t, map[string]string{"secret/s.txt": "secret\n"})
	dir := textTree(t, map[string]string{"a/a.txt": "a\n"})
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "linked")); err != nil {
		t.Skip("no symlinks:", err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "a", "inner")); err != nil {
		t.Fatal(err)
	}
	parts, _, err := TextCorpus(dir, TextCorpusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 1 || string(parts[0].Text) != "a\n" {
		t.Errorf("got %+v, want part a alone", parts)
	}
}
