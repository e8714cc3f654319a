package smallfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(p, 5); err != nil || string(b) != "12345" {
		t.Fatalf("Read at the bound = %q, %v", b, err)
	}
	if _, err := Read(p, 4); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Read over the bound: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "missing"), 5); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Read of a missing file: %v", err)
	}
	if b, err := Read(filepath.Join(dir), 5); err == nil {
		t.Fatalf("Read of a directory = %q", b)
	}
}
