// Package blobs stores model and module bytes in the JetStream object store,
// named by the lowercase hex sha256 of their content. Edges fetch them by the
// same name and verify the hash themselves.
package blobs

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// ChunkBytes is the object store chunk size for blobs. Every device of a
// round fetches the round's model chunk by chunk, one request each; at the
// object store's default of 128 KiB a 400 KB model took four. 1 MiB keeps
// chunks well under the 8 MiB message limit (wire.MaxMessageBytes).
const ChunkBytes = 1 << 20

// Store is a content-addressed view of an object store bucket.
type Store struct{ obs jetstream.ObjectStore }

// New wraps a bucket.
func New(obs jetstream.ObjectStore) *Store { return &Store{obs: obs} }

// Put stores b under its sha256 and returns the name; storing existing
// content again is a no-op.
func (s *Store) Put(ctx context.Context, b []byte) (string, error) {
	name := wire.SHA256(b)
	if _, err := s.obs.GetInfo(ctx, name); err == nil {
		return name, nil
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return "", fmt.Errorf("blobs: info %s: %w", name, err)
	}
	meta := jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: ChunkBytes}}
	if _, err := s.obs.Put(ctx, meta, bytes.NewReader(b)); err != nil {
		return "", fmt.Errorf("blobs: put %s: %w", name, err)
	}
	return name, nil
}

// Get returns the blob named sha after checking its content still hashes to it.
func (s *Store) Get(ctx context.Context, sha string) ([]byte, error) {
	b, err := s.obs.GetBytes(ctx, sha)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("blob %s: %w", sha, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("blobs: get %s: %w", sha, err)
	}
	if got := wire.SHA256(b); got != sha {
		return nil, fmt.Errorf("blobs: %s holds content hashing to %s", sha, got)
	}
	return b, nil
}
