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
	if _, err := s.obs.Put(ctx, jetstream.ObjectMeta{Name: name}, bytes.NewReader(b)); err != nil {
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
