package edge

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCommitFilesRollsBack: when one of an enrollment's writes fails, the
// files written before it are removed or put back as they were, and a
// directory the enrollment created goes too.
func TestCommitFilesRollsBack(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, CredsFile), []byte("old creds"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory where a file must go: its write fails after the others.
	if err := os.MkdirAll(filepath.Join(dir, NATSURLFile, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	err := commitFiles(dir, []stagedFile{
		{name: KeyFile, data: []byte("seed\n"), exclusive: true},
		{name: CredsFile, data: []byte("new creds")},
		{name: PublishersFile, data: []byte("{}")},
		{name: NATSURLFile, data: []byte("nats://x\n")},
		{name: idFile, data: []byte("d-1\n")},
	})
	if err == nil {
		t.Fatal("commitFiles over a directory succeeded")
	}
	for _, name := range []string{KeyFile, PublishersFile, idFile} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", name, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, CredsFile)); err != nil || string(b) != "old creds" {
		t.Errorf("%s = %q, %v; want the old contents back", CredsFile, b, err)
	}

	// A key already there is never replaced, and a directory the call
	// created is removed with what it wrote.
	nested := filepath.Join(t.TempDir(), "a", "b")
	if err := os.MkdirAll(nested, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(nested, KeyFile), []byte("mine"), 0o600)
	if err := commitFiles(nested, []stagedFile{{name: KeyFile, data: []byte("new"), exclusive: true}}); !errors.Is(err, os.ErrExist) {
		t.Fatalf("commitFiles over an existing key: %v, want ErrExist", err)
	}
	if b, _ := os.ReadFile(filepath.Join(nested, KeyFile)); string(b) != "mine" {
		t.Errorf("existing key replaced: %q", b)
	}
	fresh := filepath.Join(t.TempDir(), "a", "b")
	if err := commitFiles(fresh, []stagedFile{{name: idFile, data: []byte("d-1\n")}, {name: filepath.Join("missing", "f"), data: nil}}); err == nil {
		t.Fatal("commitFiles into a missing subdirectory succeeded")
	}
	if _, err := os.Stat(filepath.Dir(fresh)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("created directory left behind: %v", err)
	}
}
