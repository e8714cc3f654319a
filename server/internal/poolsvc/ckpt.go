package poolsvc

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
)

// rankStore is the server-held checkpoint store of one rank of a job.
type rankStore struct {
	dir *checkpoint.Dir
	mu  sync.Mutex
	// fresh are blobs put since the rank's last commit: GC must keep them,
	// since the manifest naming them is still on its way.
	fresh map[checkpoint.Digest]struct{}
}

// ckptStores opens rank stores under root/<job>/rank-<n> and keeps each
// job's stored bytes under a cap.
type ckptStores struct {
	root  string
	limit int64

	mu     sync.Mutex
	stores map[string]*rankStore
	used   map[string]int64 // bytes per job, counted from disk on first use
}

func newCkptStores(root string, limit int64) *ckptStores {
	return &ckptStores{root: root, limit: limit, stores: map[string]*rankStore{}, used: map[string]int64{}}
}

func (c *ckptStores) jobDir(job string) string { return filepath.Join(c.root, job) }

func (c *ckptStores) get(job string, rank uint32) (*rankStore, error) {
	key := job + "/" + strconv.FormatUint(uint64(rank), 10)
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.stores[key]; ok {
		return st, nil
	}
	d, err := checkpoint.OpenDir(filepath.Join(c.jobDir(job), fmt.Sprintf("rank-%d", rank)))
	if err != nil {
		return nil, fmt.Errorf("poolsvc: checkpoint store: %w", err)
	}
	st := &rankStore{dir: d, fresh: map[checkpoint.Digest]struct{}{}}
	c.stores[key] = st
	return st, nil
}

// reserve counts n more bytes against job, or refuses them over the cap.
func (c *ckptStores) reserve(job string, n int64) (bool, int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	used, ok := c.used[job]
	if !ok {
		var err error
		if used, err = dirSize(c.jobDir(job)); err != nil {
			return false, 0, err
		}
	}
	if used+n > c.limit {
		c.used[job] = used
		return false, used, nil
	}
	c.used[job] = used + n
	return true, used + n, nil
}

func (c *ckptStores) release(job string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.used[job]; ok {
		c.used[job] = max(u-n, 0)
	}
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("poolsvc: checkpoint storage of %s: %w", dir, err)
	}
	return n, nil
}

// gc deletes the rank's manifests not in keep, then every blob no kept
// manifest names and no commit is waiting for. Manifests go first, so a
// crash never leaves a kept manifest without its blobs.
func (c *ckptStores) gc(job string, st *rankStore, keep map[string]bool) ([]string, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ids, err := st.dir.List()
	if err != nil {
		return nil, err
	}
	live := map[checkpoint.Digest]struct{}{}
	var drop []checkpoint.Digest
	var dropped []string
	for _, id := range ids {
		if !keep[id.String()] {
			drop = append(drop, id)
			dropped = append(dropped, id.String())
			continue
		}
		m, err := st.dir.Manifest(id)
		if err != nil {
			continue // an unreadable manifest protects nothing
		}
		for _, b := range m.Blobs() {
			live[b.Digest] = struct{}{}
		}
	}
	if len(drop) > 0 {
		if err := st.dir.DeleteManifests(drop); err != nil {
			return nil, err
		}
	}
	blobs, err := st.dir.ListBlobs()
	if err != nil {
		return dropped, err
	}
	var freed int64
	for _, b := range blobs {
		if _, ok := live[b]; ok {
			continue
		}
		if _, ok := st.fresh[b]; ok {
			continue
		}
		data, err := st.dir.GetBlob(b)
		size := int64(len(data))
		if err != nil {
			size = 0
		}
		if err := st.dir.DeleteBlob(b); err != nil {
			return dropped, err
		}
		freed += size
	}
	c.release(job, freed)
	return dropped, nil
}
