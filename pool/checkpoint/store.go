package checkpoint

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
)

// Store holds blobs and manifests. It is small on purpose, so that an object
// store can back it as well as a directory. Implementations must make
// Commit durable only after every blob the manifest names is durable, and
// must be safe for concurrent use.
type Store interface {
	// PutBlob stores data under d, which must be Sum(data). Storing a blob
	// that is already there is not an error.
	PutBlob(d Digest, data []byte) error
	// HasBlob reports whether a blob is stored under d.
	HasBlob(d Digest) (bool, error)
	// GetBlob returns the blob stored under d after checking its digest
	// (ErrCorrupt) or ErrNotFound.
	GetBlob(d Digest) ([]byte, error)
	// Commit stores m, makes it the latest checkpoint and returns its id.
	// It refuses a manifest naming a blob the store lacks.
	Commit(m *Manifest) (Digest, error)
	// Manifest returns the verified manifest with the given id.
	Manifest(id Digest) (*Manifest, error)
	// Latest returns the latest committed checkpoint whose manifest
	// verifies and whose blobs are present, or ErrNoCheckpoint.
	Latest() (Digest, *Manifest, error)
	// List returns the ids of all stored manifests, sorted.
	List() ([]Digest, error)
}

// StallRecorder is a Store that keeps, with each commit, how long taking
// the checkpoint blocked training, as the pool server's store does. A Saver
// whose store is one commits through CommitStall with the time the
// checkpoint's Save blocked its caller; Write, which blocks for the whole
// write, uses Commit.
type StallRecorder interface {
	// CommitStall is Commit, with the checkpoint's stall.
	CommitStall(m *Manifest, stall time.Duration) (Digest, error)
}

// Collector is what GC needs beyond Store.
type Collector interface {
	Store
	// ListBlobs returns the digests of all stored blobs.
	ListBlobs() ([]Digest, error)
	// DeleteManifests removes manifests durably: once it returns, no
	// crash brings them back.
	DeleteManifests(ids []Digest) error
	// DeleteBlob removes a blob.
	DeleteBlob(d Digest) error
}

// fsys is the part of the file system that changes state. The crash tests
// swap it for one that stops after any write, sync or rename.
type fsys interface {
	// writeFile puts data at path atomically and durably; with exclusive
	// it fails with fs.ErrExist if path exists.
	writeFile(path string, data []byte, exclusive bool) error
	remove(path string) error
	// mkdir makes a directory; an existing one is not an error.
	mkdir(path string) error
	syncDir(dir string) error
}

type osFS struct{}

func (osFS) writeFile(path string, data []byte, exclusive bool) error {
	if exclusive {
		return atomicfile.WriteNew(path, data, 0o644)
	}
	return atomicfile.WriteFile(path, data, 0o644)
}

func (osFS) remove(path string) error { return os.Remove(path) }

func (osFS) mkdir(path string) error {
	if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

func (osFS) syncDir(dir string) error { return atomicfile.SyncDir(dir) }

// Dir is a Store in a directory:
//
//	blobs/<first two hex digits>/<digest>
//	manifests/<id>.json
//	LATEST            (the id of the latest commit, and a newline)
type Dir struct {
	root string
	fs   fsys
}

var _ Collector = (*Dir)(nil)

const latestMaxBytes = 128

// OpenDir opens, creating it if needed, a store in dir.
func OpenDir(dir string) (*Dir, error) { return openDir(dir, osFS{}) }

func openDir(dir string, f fsys) (*Dir, error) {
	s := &Dir{root: dir, fs: f}
	for _, sub := range []string{"blobs", "manifests"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("checkpoint: open %s: %w", dir, err)
		}
	}
	for _, d := range []string{filepath.Join(dir, "blobs"), dir, filepath.Dir(filepath.Clean(dir))} {
		if err := osFS.syncDir(osFS{}, d); err != nil {
			return nil, fmt.Errorf("checkpoint: open %s: sync %s: %w", dir, d, err)
		}
	}
	return s, nil
}

func (s *Dir) blobPath(d Digest) string {
	h := d.String()
	return filepath.Join(s.root, "blobs", h[:2], h)
}

func (s *Dir) manifestPath(id Digest) string {
	return filepath.Join(s.root, "manifests", id.String()+".json")
}

// PutBlob implements Store. A blob already present at the right size is
// kept without reading it; a new one has its digest checked first, since a
// blob stored under the wrong name would poison every checkpoint that
// dedupes against it. One of the wrong size is replaced.
func (s *Dir) PutBlob(d Digest, data []byte) error {
	if len(data) > MaxChunkBytes {
		return fmt.Errorf("checkpoint: put blob %s: %d bytes, limit %d: %w", d, len(data), MaxChunkBytes, ErrInvalidCheckpoint)
	}
	p := s.blobPath(d)
	st, err := os.Stat(p)
	if err == nil && st.Size() == int64(len(data)) {
		// Already stored: the common case for unchanged chunks. Content
		// damage of the right size is left for Load to find.
		return nil
	}
	if got := Sum(data); got != d {
		return fmt.Errorf("checkpoint: put blob %s: data has digest %s: %w", d, got, ErrCorrupt)
	}
	switch {
	case err == nil:
		// A blob of the wrong size is damage; replace it.
		err = s.fs.writeFile(p, data, false)
	case errors.Is(err, fs.ErrNotExist):
		if err = s.fanOut(filepath.Dir(p)); err != nil {
			break
		}
		err = s.fs.writeFile(p, data, true)
		if errors.Is(err, fs.ErrExist) {
			err = nil // another writer stored the same bytes
		}
	}
	if err != nil {
		return fmt.Errorf("checkpoint: put blob %s: %w", d, err)
	}
	return nil
}

// fanOut makes a blob's directory when it is missing, and syncs its parent
// before any blob goes in, so that a crash cannot lose the directory with
// blobs a committed manifest names.
func (s *Dir) fanOut(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := s.fs.mkdir(dir); err != nil {
		return err
	}
	return s.fs.syncDir(filepath.Dir(dir))
}

// HasBlob implements Store.
func (s *Dir) HasBlob(d Digest) (bool, error) {
	_, err := os.Stat(s.blobPath(d))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checkpoint: has blob %s: %w", d, err)
	}
	return true, nil
}

// BlobSize returns the size of the blob stored under d, from the file
// system and without reading it, or ErrNotFound: what a caller accounting
// for storage needs, where GetBlob would read and hash the whole blob.
func (s *Dir) BlobSize(d Digest) (int64, error) {
	st, err := os.Stat(s.blobPath(d))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("checkpoint: blob size %s: %w", d, ErrNotFound)
	case err != nil:
		return 0, fmt.Errorf("checkpoint: blob size %s: %w", d, err)
	}
	return st.Size(), nil
}

// GetBlob implements Store.
func (s *Dir) GetBlob(d Digest) ([]byte, error) {
	b, err := smallfile.Read(s.blobPath(d), MaxChunkBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("checkpoint: get blob %s: %w", d, ErrNotFound)
	case errors.Is(err, smallfile.ErrTooLarge):
		return nil, fmt.Errorf("checkpoint: get blob %s: %v: %w", d, err, ErrCorrupt)
	case err != nil:
		return nil, fmt.Errorf("checkpoint: get blob %s: %w", d, err)
	}
	if got := Sum(b); got != d {
		return nil, fmt.Errorf("checkpoint: get blob %s: content has digest %s: %w", d, got, ErrCorrupt)
	}
	return b, nil
}

// blobPresent checks a chunk without reading it: present and of the size
// the manifest records.
func (s *Dir) blobPresent(c Chunk) error {
	st, err := os.Stat(s.blobPath(c.Digest))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("blob %s: %w", c.Digest, ErrNotFound)
	case err != nil:
		return fmt.Errorf("blob %s: %w", c.Digest, err)
	case st.Size() != c.Size:
		return fmt.Errorf("blob %s: %d bytes, manifest says %d: %w", c.Digest, st.Size(), c.Size, ErrCorrupt)
	}
	return nil
}

// Commit implements Store: the manifest is written (and synced) only after
// its blobs are checked to be in place, and LATEST only after the manifest.
func (s *Dir) Commit(m *Manifest) (Digest, error) {
	b, id, err := m.Encode()
	if err != nil {
		return Digest{}, fmt.Errorf("checkpoint: commit: %w", err)
	}
	for _, c := range m.Blobs() {
		if err := s.blobPresent(c); err != nil {
			return Digest{}, fmt.Errorf("checkpoint: commit %s: %w", id, err)
		}
	}
	if err := s.fs.writeFile(s.manifestPath(id), b, true); err != nil && !errors.Is(err, fs.ErrExist) {
		return Digest{}, fmt.Errorf("checkpoint: commit %s: %w", id, err)
	}
	if err := s.fs.writeFile(filepath.Join(s.root, "LATEST"), []byte(id.String()+"\n"), false); err != nil {
		return Digest{}, fmt.Errorf("checkpoint: commit %s: latest pointer: %w", id, err)
	}
	return id, nil
}

// Manifest implements Store.
func (s *Dir) Manifest(id Digest) (*Manifest, error) {
	b, err := smallfile.Read(s.manifestPath(id), MaxManifestBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("checkpoint: manifest %s: %w", id, ErrNotFound)
	case errors.Is(err, smallfile.ErrTooLarge):
		return nil, fmt.Errorf("checkpoint: manifest %s: %v: %w", id, err, ErrCorrupt)
	case err != nil:
		return nil, fmt.Errorf("checkpoint: manifest %s: %w", id, err)
	}
	if got := Sum(b); got != id {
		return nil, fmt.Errorf("checkpoint: manifest %s: content has digest %s: %w", id, got, ErrCorrupt)
	}
	m, err := DecodeManifest(b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: manifest %s: %w", id, err)
	}
	return m, nil
}

// verified returns the manifest if it and all its blobs' presence and sizes
// check out. Blob contents are checked by Load, which reads them anyway.
func (s *Dir) verified(id Digest) (*Manifest, error) {
	m, err := s.Manifest(id)
	if err != nil {
		return nil, err
	}
	for _, c := range m.Blobs() {
		if err := s.blobPresent(c); err != nil {
			return nil, fmt.Errorf("checkpoint: manifest %s: %w", id, err)
		}
	}
	return m, nil
}

// Latest implements Store. LATEST is followed when it names a manifest that
// verifies; otherwise (a pointer lost or damaged, its manifest gone) the
// highest-step manifest that verifies wins, ties broken by the larger id so
// the answer does not depend on directory order.
func (s *Dir) Latest() (Digest, *Manifest, error) {
	if b, err := smallfile.Read(filepath.Join(s.root, "LATEST"), latestMaxBytes); err == nil {
		if id, err := ParseDigest(strings.TrimSuffix(string(b), "\n")); err == nil {
			if m, err := s.verified(id); err == nil {
				return id, m, nil
			}
		}
	}
	ms, err := s.verifiedByStep()
	if err != nil {
		return Digest{}, nil, err
	}
	if len(ms) == 0 {
		return Digest{}, nil, fmt.Errorf("checkpoint: latest in %s: %w", s.root, ErrNoCheckpoint)
	}
	return ms[0].id, ms[0].m, nil
}

type idManifest struct {
	id Digest
	m  *Manifest
}

// verifiedByStep returns the manifests that verify, highest step first.
func (s *Dir) verifiedByStep() ([]idManifest, error) {
	ids, err := s.List()
	if err != nil {
		return nil, err
	}
	var ms []idManifest
	for _, id := range ids {
		if m, err := s.verified(id); err == nil {
			ms = append(ms, idManifest{id, m})
		}
	}
	sortByStep(ms)
	return ms, nil
}

func sortByStep(ms []idManifest) {
	slices.SortFunc(ms, func(a, b idManifest) int {
		if c := cmp.Compare(b.m.Step, a.m.Step); c != 0 {
			return c
		}
		return slices.Compare(b.id[:], a.id[:])
	})
}

// List implements Store. Names that are not a digest (the temporary files
// of an interrupted write) are skipped.
func (s *Dir) List() ([]Digest, error) {
	es, err := os.ReadDir(filepath.Join(s.root, "manifests"))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list: %w", err)
	}
	var ids []Digest
	for _, e := range es {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if id, err := ParseDigest(name); err == nil {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ListBlobs implements Collector.
func (s *Dir) ListBlobs() ([]Digest, error) {
	var ds []Digest
	subs, err := os.ReadDir(filepath.Join(s.root, "blobs"))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list blobs: %w", err)
	}
	for _, sub := range subs {
		if !sub.IsDir() || len(sub.Name()) != 2 {
			continue
		}
		es, err := os.ReadDir(filepath.Join(s.root, "blobs", sub.Name()))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: list blobs: %w", err)
		}
		for _, e := range es {
			if d, err := ParseDigest(e.Name()); err == nil && e.Type().IsRegular() {
				ds = append(ds, d)
			}
		}
	}
	return ds, nil
}

// DeleteManifests implements Collector. The directory is synced before it
// returns, so that a blob deleted afterwards can never be named by a
// manifest that a crash resurrected.
func (s *Dir) DeleteManifests(ids []Digest) error {
	for _, id := range ids {
		if err := s.fs.remove(s.manifestPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("checkpoint: delete manifest %s: %w", id, err)
		}
	}
	if err := s.fs.syncDir(filepath.Join(s.root, "manifests")); err != nil {
		return fmt.Errorf("checkpoint: delete manifests: sync: %w", err)
	}
	return nil
}

// DeleteBlob implements Collector.
func (s *Dir) DeleteBlob(d Digest) error {
	if err := s.fs.remove(s.blobPath(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: delete blob %s: %w", d, err)
	}
	return nil
}
