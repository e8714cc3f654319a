package atomicfile_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
)

// entries lists dir, so that a test can see that no temporary file is left.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if err := atomicfile.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.WriteFile(path, []byte("new"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != "new" {
		t.Errorf("content %q, want new", got)
	}
	if got := entries(t, dir); len(got) != 1 || got[0] != "token" {
		t.Errorf("directory holds %v, want only token", got)
	}
	if runtime.GOOS != "windows" {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o640 {
			t.Errorf("mode %04o, want 0640", fi.Mode().Perm())
		}
	}
}

// The mode is exact: a umask such as 022 would turn 0666 into 0644.
func TestModeIgnoresUmask(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix modes")
	}
	path := filepath.Join(t.TempDir(), "shared")
	if err := atomicfile.WriteFile(path, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o666 || fi.Size() != 0 {
		t.Errorf("mode %04o size %d, want 0666 and empty", fi.Mode().Perm(), fi.Size())
	}
}

func TestWriteNewKeepsExisting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	if err := atomicfile.WriteNew(path, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := atomicfile.WriteNew(path, []byte("second"), 0o600)
	if !errors.Is(err, fs.ErrExist) || !strings.HasPrefix(err.Error(), "atomicfile: commit new "+path) {
		t.Errorf("second WriteNew: %v, want fs.ErrExist prefixed with the operation", err)
	}
	if got := readFile(t, path); got != "first" {
		t.Errorf("content %q, want first", got)
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("directory holds %v, want only key", got)
	}
}

// Of writers racing to create one file, exactly one wins and the file is
// wholly that writer's.
func TestWriteNewRace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seed")
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = atomicfile.WriteNew(path, bytes.Repeat([]byte{byte('a' + i)}, 64<<10), 0o600)
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("writers %d and %d both created the file", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, fs.ErrExist):
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no writer created the file")
	}
	if got := readFile(t, path); got != strings.Repeat(string(rune('a'+winner)), 64<<10) {
		t.Errorf("file is not wholly writer %d's", winner)
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("directory holds %v, want only seed", got)
	}
}

// Until Commit the old content stays in place, and Abort leaves it there.
func TestStreamCommitAndAbort(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.safetensors")
	if err := atomicfile.WriteFile(path, []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}

	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(f, "v2, ")
	if got := readFile(t, path); got != "v1" {
		t.Errorf("mid-write content %q, want v1", got)
	}
	fmt.Fprint(f, "whole")
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := f.Abort(); err != nil {
		t.Errorf("Abort after Commit: %v", err)
	}
	if err := f.Commit(); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("second Commit: %v, want fs.ErrClosed", err)
	}
	if got := readFile(t, path); got != "v2, whole" {
		t.Errorf("content %q after Commit", got)
	}

	g, err := atomicfile.Create(path, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(g, "v3, cut short")
	if err := g.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := g.CommitNew(); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("CommitNew after Abort: %v, want fs.ErrClosed", err)
	}
	if got := readFile(t, path); got != "v2, whole" {
		t.Errorf("content %q after Abort", got)
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("directory holds %v, want only the model", got)
	}
}

// A commit that cannot rename leaves no temporary file and says what it
// was doing.
func TestCommitFailureCleansUp(t *testing.T) {
	dir := t.TempDir()
	// A rename onto a non-empty directory fails on every platform.
	path := filepath.Join(dir, "out")
	if err := os.MkdirAll(filepath.Join(path, "inside"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := atomicfile.WriteFile(path, []byte("x"), 0o600)
	if err == nil || !strings.HasPrefix(err.Error(), "atomicfile: commit "+path+": ") {
		t.Fatalf("WriteFile onto a directory: %v", err)
	}
	if got := entries(t, dir); len(got) != 1 || got[0] != "out" {
		t.Errorf("directory holds %v, want only out", got)
	}

	_, err = atomicfile.Create(filepath.Join(dir, "missing", "f"), 0o600)
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "atomicfile: create ") {
		t.Errorf("Create in a missing directory: %v", err)
	}
}

// A relative path with no directory part writes in the working directory.
func TestRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := atomicfile.WriteFile("plain", []byte("here"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, "plain"); got != "here" {
		t.Errorf("content %q", got)
	}
}
