package cli

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
)

func textCLI(t *testing.T, args ...string) dataRun {
	t.Helper()
	return execute(t, newDataTextCommand(&app{getenv: func(string) string { return "" }}), args...)
}

// textCorpusDir writes a corpus of three authors, a shared part and files
// that are no part's.
func textCorpusDir(t *testing.T) string {
	t.Helper()
	files := map[string]string{
		"alice/letters/1.txt": strings.Repeat("Dear Bob, the weather is fine.\n", 20),
		"alice/notes.md":      strings.Repeat("- buy milk\n", 30),
		"bob/reply.txt":       strings.Repeat("Dear Alice, glad to hear it!\n", 25),
		"bob/photo.jpg":       "\xff\xd8\xff\x00\x10JFIF",
		"carol/poem.txt":      strings.Repeat("roses are red\n", 40),
		"shared/wiki.txt":     strings.Repeat("A wiki page of public text.\n", 50),
		"README.txt":          "about this corpus\n",
	}
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

func TestDataText(t *testing.T) {
	src := textCorpusDir(t)
	out := filepath.Join(t.TempDir(), "ds")
	r := textCLI(t, "--src", src, "--out", out, "--window", "16", "--stride", "16", "--public", "shared")
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.errOut)
	}
	entries, err := os.ReadDir(filepath.Join(out, gosrcDevicesDir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"alice", "bob", "carol"}; !slices.Equal(names, want) {
		t.Fatalf("devices %q, want %q", names, want)
	}
	parts, _, err := data.TextCorpus(src, data.TextCorpusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var held []*data.Dataset
	for _, p := range parts {
		s, err := data.SplitGoPackage(p, data.WindowOptions{Window: 16, Stride: 16})
		if err != nil {
			t.Fatal(err)
		}
		if p.Path == "shared" {
			pub, m := readDataset(t, filepath.Join(out, gosrcPublicDir))
			want, _ := data.ConcatDatasets(s.Train, s.HeldOut)
			if m.Name != "text-public" || pub.Digest() != want.Digest() {
				t.Errorf("public: %q, %d examples", m.Name, pub.Len())
			}
			continue
		}
		d, m := readDataset(t, filepath.Join(out, gosrcDevicesDir, p.Path))
		if m.Name != "text/"+p.Path || d.Digest() != s.Train.Digest() || d.Dim != 16 {
			t.Errorf("%s: %q, %d examples of dim %d", p.Path, m.Name, d.Len(), d.Dim)
		}
		held = append(held, s.HeldOut)
	}
	eval, m := readDataset(t, filepath.Join(out, gosrcEvalDir))
	want, _ := data.ConcatDatasets(held...)
	if m.Name != "text-heldout" || eval.Digest() != want.Digest() {
		t.Errorf("eval: %q, %d examples", m.Name, eval.Len())
	}
	if _, err := os.Stat(filepath.Join(out, corpusLicense)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a licence was written for a corpus that has none: %v", err)
	}
	for _, s := range []string{"Text from " + src + ": 4 parts", "wrote 3 device datasets", "public pretraining set", "1 part (shared)"} {
		if !strings.Contains(r.out, s) {
			t.Errorf("output lacks %q:\n%s", s, r.out)
		}
	}
	for _, s := range []string{"1 files directly in", "skipped 1 binary files"} {
		if !strings.Contains(r.errOut, s) {
			t.Errorf("stderr lacks %q:\n%s", s, r.errOut)
		}
	}
}

func TestDataTextRefuses(t *testing.T) {
	src := textCorpusDir(t)
	out := filepath.Join(t.TempDir(), "ds")
	flat := t.TempDir()
	if err := os.WriteFile(filepath.Join(flat, "a.txt"), []byte("only a top-level file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--src", src, "--out", out, "--public", "dave"}, "no part (subdirectory with text) of that name"},
		{[]string{"--src", flat, "--out", out}, "has no subdirectory holding text"},
		{[]string{"--src", src, "--out", out, "--window", "0"}, "--window 0"},
		{[]string{"--src", src, "--out", out, "--window", "4000"}, "long enough"},
		{[]string{"--src", "", "--out", out}, "--src must name a directory"},
	} {
		if r := textCLI(t, tc.args...); !errors.Is(r.err, ErrUsage) || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("%q: err %v, want ErrUsage saying %q", tc.args, r.err, tc.want)
		}
	}
	if r := textCLI(t, "--src", filepath.Join(src, "missing"), "--out", out); r.err == nil || !errors.Is(r.err, os.ErrNotExist) {
		t.Errorf("missing --src: %v", r.err)
	}
}
