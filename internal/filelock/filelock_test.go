//go:build unix

package filelock

import (
	"errors"
	"path/filepath"
	"testing"
)

func TestLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	f, err := Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file description: a second open in
	// the same process conflicts as another process's would.
	if _, err := Lock(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v", err)
	}
	f.Close()
	g, err := Lock(path)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	g.Close()
}
