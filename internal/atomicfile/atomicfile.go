// Package atomicfile writes files that readers, and a crash, see either
// whole or not at all: the data goes to a temporary file in the target's
// directory, is synced, gets its mode, and is renamed (or hard-linked) into
// place; the directory is then synced so that the new name survives a
// power loss too.
//
// The mode is applied with chmod, so it is exact: the umask does not
// narrow it.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// WriteFile replaces path with data and mode perm.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return write(path, data, perm, (*File).Commit)
}

// WriteNew writes data to path with mode perm unless path exists, in which
// case it returns an error wrapping fs.ErrExist and leaves the file alone.
// Of two processes writing the same new path at once, exactly one wins.
func WriteNew(path string, data []byte, perm fs.FileMode) error {
	return write(path, data, perm, (*File).CommitNew)
}

func write(path string, data []byte, perm fs.FileMode, commit func(*File) error) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Abort()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	return commit(f)
}

// File is a file being written that appears at its path only when
// committed. Defer Abort right after Create: it discards the file unless
// Commit or CommitNew ran first.
type File struct {
	f    *os.File
	path string
	perm fs.FileMode
	done bool
}

// Create starts a file that Commit will put at path with mode perm. The
// directory must exist.
func Create(path string, perm fs.FileMode) (*File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// A leading dot keeps the partial file out of globs and listings.
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("atomicfile: create %s: %w", path, err)
	}
	return &File{f: f, path: path, perm: perm}, nil
}

// Write appends p to the pending file.
func (f *File) Write(p []byte) (int, error) { return f.f.Write(p) }

// Commit replaces the file at path, if any, with the one written.
func (f *File) Commit() error {
	return f.commit("commit", os.Rename)
}

// CommitNew puts the file written at path unless path exists; then it
// returns an error wrapping fs.ErrExist. A hard link, unlike a rename,
// fails on an existing name, which makes the check and the creation one
// step.
func (f *File) CommitNew() error {
	return f.commit("commit new", func(tmp, path string) error {
		err := os.Link(tmp, path)
		if err == nil {
			// The file stays under path; only the temporary name goes.
			os.Remove(tmp)
		}
		return err
	})
}

func (f *File) commit(op string, place func(tmp, path string) error) error {
	if f.done {
		return fmt.Errorf("atomicfile: %s %s: %w", op, f.path, fs.ErrClosed)
	}
	f.done = true
	tmp := f.f.Name()
	err := f.f.Chmod(f.perm)
	if err == nil {
		err = f.f.Sync()
	}
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = place(tmp, f.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("atomicfile: %s %s: %w", op, f.path, err)
	}
	if err := SyncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("atomicfile: %s %s: sync directory: %w", op, f.path, err)
	}
	return nil
}

// Abort discards the pending file; after Commit or CommitNew it does
// nothing, so it is safe to defer.
func (f *File) Abort() error {
	if f.done {
		return nil
	}
	f.done = true
	err := errors.Join(f.f.Close(), os.Remove(f.f.Name()))
	if err != nil {
		return fmt.Errorf("atomicfile: abort %s: %w", f.path, err)
	}
	return nil
}

// SyncDir makes a rename, link or removal in dir durable. Windows cannot
// open a directory for syncing; there it is left to the file system.
func SyncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
