package checkpoint

import (
	"fmt"
)

// GC keeps the keep highest-step checkpoints (and whatever Latest names)
// and removes every other manifest and every blob none of the kept ones
// refers to. Manifests go first, durably, so that a crash in the middle
// never leaves a manifest whose blobs are gone. It returns the number of
// blobs removed.
//
// GC must not run while a checkpoint is being written to the same store: it
// would delete the new blobs before their manifest exists. Saver runs it
// between saves.
func GC(s Collector, keep int) (int, error) {
	if keep < 1 {
		return 0, fmt.Errorf("checkpoint: gc: keep %d, want at least 1: %w", keep, ErrInvalidCheckpoint)
	}
	latest, _, err := s.Latest()
	if err != nil {
		return 0, fmt.Errorf("checkpoint: gc: %w", err)
	}
	ids, err := s.List()
	if err != nil {
		return 0, fmt.Errorf("checkpoint: gc: %w", err)
	}
	var ms []idManifest
	var drop []Digest
	for _, id := range ids {
		m, err := s.Manifest(id)
		if err != nil {
			if damaged(err) {
				// A manifest that does not verify can never be
				// loaded; its blobs are not worth keeping for it.
				drop = append(drop, id)
				continue
			}
			return 0, fmt.Errorf("checkpoint: gc: %w", err)
		}
		ms = append(ms, idManifest{id, m})
	}
	sortByStep(ms)
	live := make(map[Digest]struct{})
	for i, c := range ms {
		if i >= keep && c.id != latest {
			drop = append(drop, c.id)
			continue
		}
		for _, b := range c.m.Blobs() {
			live[b.Digest] = struct{}{}
		}
	}
	if len(drop) > 0 {
		if err := s.DeleteManifests(drop); err != nil {
			return 0, fmt.Errorf("checkpoint: gc: %w", err)
		}
	}
	blobs, err := s.ListBlobs()
	if err != nil {
		return 0, fmt.Errorf("checkpoint: gc: %w", err)
	}
	removed := 0
	for _, b := range blobs {
		if _, ok := live[b]; ok {
			continue
		}
		if err := s.DeleteBlob(b); err != nil {
			return removed, fmt.Errorf("checkpoint: gc: %w", err)
		}
		removed++
	}
	return removed, nil
}
