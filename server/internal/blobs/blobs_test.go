package blobs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

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
	s := blobs.New(js, obs)
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

// TestPutFlowControl: a blob many times larger than the stream's ingest
// queue is stored, because PutReader keeps at most PutWindow chunks
// unacknowledged, which the queue always takes. nats.go's
// ObjectStore.Put publishes every chunk without waiting and overflows such
// a queue (429 "IPQ size limit reached", the failure a 1 GiB model import
// met against nats-server's default 128 MiB queue, scaled down here to 16
// MiB and a 96 MiB blob) whenever JetStream stores more slowly than it
// publishes; whether it did is logged, not asserted, since that is a race.
func TestPutFlowControl(t *testing.T) {
	opts := natstest.Options(t)
	opts.StreamMaxBufferedSize = 16 << 20
	if window := blobs.PutWindow * (blobs.ChunkBytes + 1024); window > int(opts.StreamMaxBufferedSize) {
		t.Fatalf("a window of %d bytes does not fit the test's ingest queue", window)
	}
	_, js := natstest.Connect(t, natstest.Run(t, opts))
	ctx := t.Context()
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: wire.BlobBucket})
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 96<<20)
	for i := range big {
		big[i] = byte(i * 31 >> 10)
	}
	_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: "unpaced", Opts: &jetstream.ObjectMetaOptions{ChunkSize: blobs.ChunkBytes}},
		bytes.NewReader(big))
	t.Logf("nats.go ObjectStore.Put of 96 MiB into a 16 MiB ingest queue: %v", err)

	s := blobs.New(js, obs)
	name, err := s.Put(ctx, big)
	if err != nil {
		t.Fatalf("paced put: %v", err)
	}
	got, err := s.Get(ctx, name)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	// nats.go reads what PutReader wrote as any object.
	info, err := obs.GetInfo(ctx, name)
	if err != nil || info.Size != uint64(len(big)) || info.Chunks != 96 {
		t.Fatalf("info: %+v, %v", info, err)
	}
	r, err := s.Open(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	head := make([]byte, 100)
	if _, err := io.ReadFull(r, head); err != nil || !bytes.Equal(head, big[:100]) {
		t.Fatalf("open: %v", err)
	}
}

// TestPutLeavesNothingOnFailure: content that does not hash to the name it
// is put under, and a reader that fails part way, store no object and leave
// no chunks in the bucket's stream.
func TestPutLeavesNothingOnFailure(t *testing.T) {
	ctx := t.Context()
	js := natstest.JetStream(t)
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: wire.BlobBucket})
	if err != nil {
		t.Fatal(err)
	}
	s := blobs.New(js, obs)
	data := bytes.Repeat([]byte("chunk"), blobs.ChunkBytes) // five chunks
	boom := errors.New("disk gone")
	for _, c := range []struct {
		name string
		r    io.Reader
		want string
	}{
		{wire.SHA256([]byte("other")), bytes.NewReader(data), "hashes to"},
		{wire.SHA256(data), io.MultiReader(bytes.NewReader(data[:3*blobs.ChunkBytes+5]), iotest.ErrReader(boom)), "disk gone"},
	} {
		if err := s.PutReader(ctx, c.name, c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("put: err = %v, want %q", err, c.want)
		}
		if ok, err := s.Has(ctx, c.name); ok || err != nil {
			t.Fatalf("failed put left an object (%v)", err)
		}
	}
	st, err := js.Stream(ctx, "OBJ_"+wire.BlobBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("failed puts left %d messages (%d bytes) in the bucket", info.State.Msgs, info.State.Bytes)
	}
}

// TestReadOutlastsAPITimeout: nats.go bounds a whole object read by its API
// timeout when the context has none; a blob read more slowly than that (a
// large model on a loaded machine, here a reader that pauses) is still read
// whole.
func TestReadOutlastsAPITimeout(t *testing.T) {
	const apiTimeout = 2 * time.Second
	nc, _ := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(apiTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: wire.BlobBucket})
	if err != nil {
		t.Fatal(err)
	}
	s := blobs.New(js, obs)
	big := bytes.Repeat([]byte("slow reader "), 3*blobs.ChunkBytes/12)
	name, err := s.Put(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	head := make([]byte, 10)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	time.Sleep(apiTimeout + apiTimeout/2)
	rest, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(append(head, rest...), big) {
		t.Fatalf("read after a pause: %d bytes, %v", len(head)+len(rest), err)
	}
}
