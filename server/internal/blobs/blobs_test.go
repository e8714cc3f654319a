package blobs_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/blobs"
)

func TestStore(t *testing.T) {
	ctx := t.Context()
	js := natstest.JetStream(t)
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: wire.BlobBucket})
	if err != nil {
		t.Fatal(err)
	}
	s := blobs.New(obs)
	if blobs.ChunkBytes >= wire.MaxMessageBytes {
		t.Fatalf("chunks of %d bytes do not fit the %d-byte message limit", blobs.ChunkBytes, wire.MaxMessageBytes)
	}

	big := bytes.Repeat([]byte("fleetlearn"), (5*blobs.ChunkBytes/2)/10)
	name, err := s.Put(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	if name != wire.SHA256(big) {
		t.Fatalf("named %s, want its sha256", name)
	}
	info, err := obs.GetInfo(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Chunks != 3 {
		t.Errorf("%d bytes in %d chunks, want 3 of at most %d", len(big), info.Chunks, blobs.ChunkBytes)
	}
	if again, err := s.Put(ctx, big); err != nil || again != name {
		t.Fatalf("second put: %s, %v", again, err)
	}
	got, err := s.Get(ctx, name)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}

	if _, err := s.Get(ctx, wire.SHA256([]byte("absent"))); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("missing blob: err = %v, want ErrNotFound", err)
	}
	// Content that no longer hashes to its name is refused, not served.
	forged := wire.SHA256([]byte("genuine"))
	if _, err := obs.PutBytes(ctx, forged, []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, forged); err == nil || !strings.Contains(err.Error(), "hashing to") {
		t.Fatalf("forged blob: err = %v, want a hash mismatch", err)
	}
}
