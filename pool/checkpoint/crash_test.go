package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

var errCrash = errors.New("injected crash")

// crashFS performs the same steps as atomicfile (create a temporary file,
// write, chmod, sync, close, link or rename, remove the temporary name, sync
// the directory) one at a time on the real disk, and after a chosen number
// of steps fails every further one. crash then throws away what a power
// loss could: the contents of files not yet synced, and directory changes
// (new names, replaced names, removals) made since their directory was last
// synced. Each of its calls holds a lock while it runs, so that a Saver's
// concurrent writes are a sequence of steps a crash can cut anywhere.
type crashFS struct {
	mu      sync.Mutex
	limit   int // steps allowed before the crash; -1 for none
	steps   []string
	crashed bool
	// unsynced files, by path, whose data a crash loses.
	unsynced map[string]bool
	// pending directory changes, oldest first, undone by a crash unless
	// their directory was synced.
	pending []dirChange
}

type dirChange struct {
	dir  string
	name string // full path of the entry that changed
	old  []byte // previous contents; nil with had false for a new name
	had  bool
	tree bool // a new directory
}

func newCrashFS(limit int) *crashFS {
	return &crashFS{limit: limit, unsynced: map[string]bool{}}
}

func (c *crashFS) step(what string) error {
	if c.crashed {
		return errCrash
	}
	if c.limit >= 0 && len(c.steps) == c.limit {
		c.crashed = true
		return fmt.Errorf("before %s: %w", what, errCrash)
	}
	c.steps = append(c.steps, what)
	return nil
}

func (c *crashFS) noteChange(path string) {
	old, err := os.ReadFile(path)
	c.pending = append(c.pending, dirChange{dir: filepath.Dir(path), name: path, old: old, had: err == nil})
}

func (c *crashFS) writeFile(path string, data []byte, exclusive bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	base := filepath.Base(path)
	if err := c.step("create temp for " + base); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	c.pending = append(c.pending, dirChange{dir: filepath.Dir(path), name: tmp})
	c.unsynced[tmp] = true
	defer f.Close()
	for _, s := range []struct {
		what string
		do   func() error
	}{
		{"write", func() error { _, err := f.Write(data); return err }},
		{"chmod", func() error { return f.Chmod(0o644) }},
		{"fsync", func() error { err := f.Sync(); delete(c.unsynced, tmp); return err }},
		{"close", f.Close},
	} {
		if err := c.step(s.what + " " + base); err != nil {
			return err
		}
		if err := s.do(); err != nil {
			return err
		}
	}
	if exclusive {
		if err := c.step("link " + base); err != nil {
			return err
		}
		c.noteChange(path)
		if err := os.Link(tmp, path); err != nil {
			c.pending = c.pending[:len(c.pending)-1]
			os.Remove(tmp)
			return err
		}
		if err := c.step("remove temp of " + base); err != nil {
			return err
		}
		if err := os.Remove(tmp); err != nil {
			return err
		}
	} else {
		if err := c.step("rename " + base); err != nil {
			return err
		}
		c.noteChange(path)
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return c.syncDirLocked(filepath.Dir(path))
}

func (c *crashFS) remove(path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.step("remove " + filepath.Base(path)); err != nil {
		return err
	}
	c.noteChange(path)
	return os.Remove(path)
}

func (c *crashFS) mkdir(path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.step("mkdir " + filepath.Base(path)); err != nil {
		return err
	}
	// As osFS: a directory another writer made first is not an error.
	if err := os.Mkdir(path, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return err
	}
	c.pending = append(c.pending, dirChange{dir: filepath.Dir(path), name: path, tree: true})
	return nil
}

func (c *crashFS) syncDir(dir string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.syncDirLocked(dir)
}

func (c *crashFS) syncDirLocked(dir string) error {
	if err := c.step("fsync dir " + filepath.Base(dir)); err != nil {
		return err
	}
	c.pending = slices.DeleteFunc(c.pending, func(d dirChange) bool { return d.dir == dir })
	return osFS{}.syncDir(dir)
}

// crash applies the losses of a power cut to the disk.
func (c *crashFS) crash(t *testing.T) {
	t.Helper()
	for p := range c.unsynced {
		if err := os.Truncate(p, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	for i := len(c.pending) - 1; i >= 0; i-- {
		d := c.pending[i]
		var err error
		if d.tree {
			err = os.RemoveAll(d.name)
		} else if d.had {
			err = os.WriteFile(d.name, d.old, 0o644)
		} else {
			err = os.Remove(d.name)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
}

// TestCrashAtEveryStep writes a checkpoint that shares some chunks with the
// committed one before it, crashing after step N for every N, and checks
// that the reopened store always has the old checkpoint or the new one as
// Latest, loading bit for bit, never a manifest with missing or torn data.
func TestCrashAtEveryStep(t *testing.T) {
	a := testCheckpoint(1, 40)
	b := testCheckpoint(2, 40)
	b.Params.Tensors[0].Data[0] = 99 // one chunk of w changes, the rest dedupe
	crashAtEveryStep(t, a, b)
}

// TestCrashAtEveryStepWithFiles does the same for a command job's
// checkpoint: files only, one chunk of the model file changed, the state
// file new.
func TestCrashAtEveryStepWithFiles(t *testing.T) {
	a := filesCheckpoint(1)
	b := filesCheckpoint(2)
	b.Files[1].Data[130] ^= 0xff
	crashAtEveryStep(t, a, b)
}

// crashAtEveryStep writes b, after a unless first, crashing after every
// step of the write in turn.
func crashAtEveryStep(t *testing.T, a, b *Checkpoint) {
	opts := Options{ChunkSize: 64}
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("first=%v", first), func(t *testing.T) {
			total := -1
			for n := 0; ; n++ {
				dir := t.TempDir()
				var prev Digest
				if !first {
					s, err := OpenDir(dir)
					if err != nil {
						t.Fatal(err)
					}
					if prev, err = Write(s, a, opts); err != nil {
						t.Fatal(err)
					}
				}
				cfs := newCrashFS(n)
				s, err := openDir(dir, cfs)
				if err != nil {
					t.Fatal(err)
				}
				next, err := Write(s, b, opts)
				if !cfs.crashed {
					if err != nil {
						t.Fatalf("no crash at step %d, yet: %v", n, err)
					}
					total = n
					// A power cut right after Write returned must keep
					// the new checkpoint: success means durable.
					cfs.crash(t)
					checkLatest(t, dir, next, b)
					break
				}
				if !errors.Is(err, errCrash) {
					t.Fatalf("crash after step %d: Write returned %v, want the injected crash", n, err)
				}
				cfs.crash(t)
				last := "start"
				if n > 0 {
					last = cfs.steps[n-1]
				}
				t.Logf("crash after step %d (%s)", n, last)
				r, err := OpenDir(dir)
				if err != nil {
					t.Fatal(err)
				}
				id, _, err := r.Latest()
				switch {
				case first && errors.Is(err, ErrNoCheckpoint):
				case err != nil:
					t.Fatalf("crash after step %d (%s): Latest: %v", n, last, err)
				case id == prev && !first:
					checkLatest(t, dir, prev, a)
				default:
					// The new checkpoint can only be latest once its
					// manifest is committed; it must then load whole.
					checkLatest(t, dir, id, b)
				}
			}
			if total < 20 {
				t.Fatalf("only %d steps to write a checkpoint; the crash points did not cover the write", total)
			}
			t.Logf("%d steps", total)
		})
	}
}

func checkLatest(t *testing.T, dir string, want Digest, ck *Checkpoint) {
	t.Helper()
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := s.Latest()
	if err != nil || id != want {
		t.Fatalf("Latest = %s, %v; want %s", id, err, want)
	}
	got, err := LoadLatest(s)
	if err != nil {
		t.Fatalf("LoadLatest: %v", err)
	}
	if got.ID != want {
		t.Fatalf("LoadLatest loaded %s, want %s", got.ID, want)
	}
	assertSame(t, got, ck)
}

// TestCrashDuringGC crashes GC after every step and checks that what
// Latest names still loads: manifests are gone for good before any blob is.
func TestCrashDuringGC(t *testing.T) {
	opts := Options{ChunkSize: 64}
	for n := 0; ; n++ {
		dir := t.TempDir()
		s, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var ids []Digest
		for step := int64(1); step <= 3; step++ {
			ck := testCheckpoint(step, 32)
			ck.Params.Tensors[1].Data[0] = float32(step) // changes one chunk each time
			id, err := Write(s, ck, opts)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		cfs := newCrashFS(n)
		g, err := openDir(dir, cfs)
		if err != nil {
			t.Fatal(err)
		}
		_, err = GC(g, 1)
		if !cfs.crashed {
			if err != nil {
				t.Fatal(err)
			}
			cfs.crash(t)
			if left, _ := g.List(); len(left) != 1 || left[0] != ids[2] {
				t.Fatalf("after GC: manifests %v, want only %s", left, ids[2])
			}
			if n < 3 {
				t.Fatalf("GC took only %d steps", n)
			}
			break
		}
		cfs.crash(t)
		r, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		ms, err := r.List()
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ms {
			if _, err := Load(r, id); err != nil {
				t.Fatalf("crash after GC step %d: manifest %s survives but does not load: %v", n, id, err)
			}
		}
		if ck, err := LoadLatest(r); err != nil || ck.ID != ids[2] {
			t.Fatalf("crash after GC step %d: LoadLatest = %v; want %s", n, err, ids[2])
		}
	}
}

// TestCrashDuringSaver cuts power after every step of a Saver writing two
// checkpoints at once (two buffers, three workers storing chunks
// concurrently): the reopened store has no checkpoint, the first, or the
// second naming the first as its parent, each whole. Several saves in
// flight never let a later checkpoint commit before the one it names.
func TestCrashDuringSaver(t *testing.T) {
	a := testCheckpoint(1, 160)
	b := testCheckpoint(2, 160)
	b.Params.Tensors[0].Data[0] = 99
	crashed := 0
	for n := 0; ; n++ {
		if n > 10000 {
			t.Fatal("the saves never ran to the end")
		}
		dir := t.TempDir()
		cfs := newCrashFS(n)
		s, err := openDir(dir, cfs)
		if err != nil {
			t.Fatal(err)
		}
		sv, err := NewSaver(s, SaverOptions{Options: Options{ChunkSize: 64}, Buffers: 2, Workers: 3})
		if err != nil {
			t.Fatal(err)
		}
		errA := sv.Save(a)
		errB := sv.Save(b)
		last, err := sv.Wait()
		err = errors.Join(errA, errB, err)
		if !cfs.crashed {
			if err != nil {
				t.Fatalf("no crash at step %d, yet: %v", n, err)
			}
			cfs.crash(t)
			checkLatest(t, dir, last, b)
			break
		}
		if !errors.Is(err, errCrash) {
			t.Fatalf("crash after step %d: the saves returned %v, want the injected crash", n, err)
		}
		crashed++
		cfs.crash(t)
		r, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		got, err := LoadLatest(r)
		switch {
		case errors.Is(err, ErrNoCheckpoint):
		case err != nil:
			t.Fatalf("crash after step %d: LoadLatest: %v", n, err)
		case got.Step == 1:
			assertSame(t, got, a)
		default:
			assertSame(t, got, b)
			first, err := Load(r, got.Parent)
			if err != nil {
				t.Fatalf("crash after step %d: the second checkpoint is latest but its parent does not load: %v", n, err)
			}
			assertSame(t, first, a)
		}
	}
	if crashed < 40 {
		t.Fatalf("only %d crash points; they did not cover both writes", crashed)
	}
}
