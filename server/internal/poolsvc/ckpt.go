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
	dir  *checkpoint.Dir
	key  string // job/rank, the key of its byte count
	path string
	mu   sync.Mutex
	// fresh are blobs put since the rank's last commit: GC must keep them,
	// since the manifest naming them is still on its way.
	fresh map[checkpoint.Digest]struct{}
}

// ckptStores opens rank stores under root/<job>/rank-<n> and keeps each
// rank's stored bytes (blobs and manifests) under its share of the job's
// cap, so that one rank cannot spend what its job's other ranks need.
type ckptStores struct {
	root  string
	limit int64 // a job's cap where reserve is given none

	mu     sync.Mutex
	stores map[string]*rankStore
	used   map[string]int64 // bytes per rank store, counted from disk on first use
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
	path := filepath.Join(c.jobDir(job), fmt.Sprintf("rank-%d", rank))
	d, err := checkpoint.OpenDir(path)
	if err != nil {
		return nil, fmt.Errorf("poolsvc: checkpoint store: %w", err)
	}
	st := &rankStore{dir: d, key: key, path: path, fresh: map[checkpoint.Digest]struct{}{}}
	c.stores[key] = st
	return st, nil
}

// reserve counts n more bytes against the rank store st, or refuses them
// over limit (0: the stores' own cap).
func (c *ckptStores) reserve(st *rankStore, n, limit int64) (bool, int64, error) {
	if limit <= 0 {
		limit = c.limit
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	used, ok := c.used[st.key]
	if !ok {
		var err error
		if used, err = dirSize(st.path); err != nil {
			return false, 0, err
		}
	}
	if used+n > limit {
		c.used[st.key] = used
		return false, used, nil
	}
	c.used[st.key] = used + n
	return true, used + n, nil
}

func (c *ckptStores) release(st *rankStore, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.used[st.key]; ok {
		c.used[st.key] = max(u-n, 0)
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
func (c *ckptStores) gc(st *rankStore, keep map[string]bool) ([]string, error) {
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
	var freed int64
	if len(drop) > 0 {
		for _, id := range drop {
			if m, err := st.dir.Manifest(id); err == nil {
				if b, _, err := m.Encode(); err == nil {
					freed += int64(len(b)) // canonical: the bytes stored
				}
			}
		}
		if err := st.dir.DeleteManifests(drop); err != nil {
			return nil, err
		}
		c.release(st, freed)
		freed = 0
	}
	blobs, err := st.dir.ListBlobs()
	if err != nil {
		return dropped, err
	}
	for _, b := range blobs {
		if _, ok := live[b]; ok {
			continue
		}
		if _, ok := st.fresh[b]; ok {
			continue
		}
		// The size on disk is what reserve counted; reading the blob to
		// learn it would cost a read and a hash of every byte freed.
		size, err := st.dir.BlobSize(b)
		if err != nil {
			size = 0
		}
		if err := st.dir.DeleteBlob(b); err != nil {
			return dropped, err
		}
		freed += size
	}
	c.release(st, freed)
	return dropped, nil
}

// MaxCheckpointsAhead bounds the checkpoints a rank holds past its job's
// committed step. Ranks of one job run in step (they average, or their
// script's collectives wait for each other), so an honest rank is at most
// one checkpoint ahead of the slowest; without a bound a rank could commit
// a checkpoint at every boundary of a long job, and GC keeps every one
// past the committed step. The count is of the running attempt's: a new
// attempt forgets what earlier ones left past its resume step (dropStale),
// so those can never block the commits it needs.
const MaxCheckpointsAhead = 4

// checkpointSlack is what a built-in job's derived cap allows besides its
// tensors: room for the manifests (one of the largest a manifest may be).
const checkpointSlack = 16 << 20

// storageCap is the checkpoint byte cap of each rank of the job and what
// it comes from: Deps.MaxJobStorageBytes split evenly between the ranks,
// or less for a built-in job trained from its arch (not from a registered
// model), whose model is of known size: a rank keeps at most
// MaxCheckpointsAhead checkpoints past the committed step, the committed
// one, one older and one being uploaded, each its parameters and at most
// two AdamW moments per parameter, besides checkpointSlack.
func (s *Service) storageCap(rt *jobRT) (int64, string) {
	ranks := int64(max(rt.spec.Ranks, 1))
	limit := s.d.MaxJobStorageBytes / ranks
	why := fmt.Sprintf("the server's cap per job, %d bytes, over %d ranks", s.d.MaxJobStorageBytes, ranks)
	b := rt.rec.GetSpec().GetBuiltin()
	arch := b.GetArch()
	if b == nil || b.GetInitModel() != "" || len(arch) < 2 {
		return limit, why
	}
	var params int64
	for i := 1; i < len(arch); i++ {
		params += int64(arch[i-1])*int64(arch[i]) + int64(arch[i])
	}
	if derived := checkpointSlack + (MaxCheckpointsAhead+3)*(3*4*params+4); derived < limit {
		return derived, fmt.Sprintf("what one rank of a %d-parameter model keeps", params)
	}
	return limit, why
}

// dropStale forgets the checkpoints past step, the resume step of the
// attempt being placed: an earlier attempt's, which this one computes
// again. Their files go at the rank's next commit (GC keeps only what the
// records name).
func (s *Service) dropStale(rt *jobRT, step int64) {
	for rank, bySteps := range rt.ckpts {
		var stale []string
		for st, id := range bySteps {
			if st > step {
				stale = append(stale, id)
			}
		}
		if len(stale) > 0 {
			s.forget(rt.id(), rank, stale)
		}
	}
}
