// Package blobs stores model and module bytes in the JetStream object store,
// named by the lowercase hex sha256 of their content. Edges fetch them by the
// same name and verify the hash themselves.
package blobs

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// ChunkBytes is the object store chunk size for blobs. Every device of a
// round fetches the round's model chunk by chunk, one request each; at the
// object store's default of 128 KiB a 400 KB model took four. 1 MiB keeps
// chunks well under the 8 MiB message limit (wire.MaxMessageBytes).
const ChunkBytes = 1 << 20

// PutWindow is how many chunks of one put may await JetStream's
// acknowledgement. nats.go's ObjectStore.Put publishes every chunk
// asynchronously with up to 4,000 unacknowledged, which for 1 MiB chunks
// is far more than a stream's ingest queue takes (128 MiB by default in
// nats-server): a 1 GiB put overflowed it and failed with 429 "IPQ size
// limit reached", and while it lasted the queue held the blob in the
// server's memory. Eight chunks keep disk writes and the next publish
// overlapping while bounding what one put holds in flight to 8 MiB.
const PutWindow = 8

// Store is a content-addressed view of an object store bucket.
type Store struct {
	js  jetstream.JetStream
	obs jetstream.ObjectStore
}

// New wraps a bucket; js is the JetStream context the bucket was opened
// with, through which Put publishes.
func New(js jetstream.JetStream, obs jetstream.ObjectStore) *Store { return &Store{js: js, obs: obs} }

// Put stores b under its sha256 and returns the name; storing existing
// content again is a no-op.
func (s *Store) Put(ctx context.Context, b []byte) (string, error) {
	name := wire.SHA256(b)
	return name, s.PutReader(ctx, name, bytes.NewReader(b))
}

// Has reports whether a blob named sha is stored.
func (s *Store) Has(ctx context.Context, sha string) (bool, error) {
	_, err := s.obs.GetInfo(ctx, sha)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("blobs: info %s: %w", sha, err)
	}
}

// PutReader stores what r holds under name, which must be its lowercase
// hex sha256: the content is hashed as it is published, and a mismatch
// stores nothing. It reads r one chunk at a time with at most PutWindow
// chunks unacknowledged, so a blob of any size is stored in bounded
// memory. Existing content is not stored again (r is not read). On any
// failure the chunks already published are purged.
//
// The object is written in the layout of the NATS object store (ADR-20,
// what nats.go's ObjectStore.Put writes and its Get reads): chunks on
// $O.<bucket>.C.<nuid>, then the object's info on $O.<bucket>.M.<name in
// base64url> as a subject rollup. nats.go's own Put cannot be told to wait
// for acknowledgements; see PutWindow.
func (s *Store) PutReader(ctx context.Context, name string, r io.Reader) error {
	if ok, err := s.Has(ctx, name); err != nil || ok {
		return err
	}
	st, err := s.obs.Status(ctx)
	if err != nil {
		return fmt.Errorf("blobs: put %s: %w", name, err)
	}
	bucket := st.Bucket()
	id := rand.Text() // the object's chunk subject, as a NUID names it in nats.go
	chunkSubj := "$O." + bucket + ".C." + id
	purge := func() {
		// Cleanup runs even when ctx was cancelled, which is often why the
		// put failed.
		ctx := context.WithoutCancel(ctx)
		if stream, err := s.js.Stream(ctx, "OBJ_"+bucket); err == nil {
			_ = stream.Purge(ctx, jetstream.WithPurgeSubject(chunkSubj))
		}
	}
	size, chunks, digest, err := s.publishChunks(ctx, chunkSubj, r)
	if err == nil && hex.EncodeToString(digest) != name {
		err = fmt.Errorf("blobs: put %s: the content hashes to %x", name, digest)
	}
	if err != nil {
		purge()
		return err
	}
	info := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: ChunkBytes}},
		Bucket:     bucket, NUID: id, Size: size, Chunks: chunks,
		Digest: "SHA-256=" + base64.URLEncoding.EncodeToString(digest),
	}
	meta, err := json.Marshal(info)
	if err != nil {
		purge()
		return fmt.Errorf("blobs: put %s: %w", name, err)
	}
	m := nats.NewMsg("$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = meta
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		purge()
		return fmt.Errorf("blobs: put %s: info: %w", name, err)
	}
	return nil
}

// publishChunks publishes r in ChunkBytes chunks on subj, waiting for the
// oldest acknowledgement whenever PutWindow are outstanding, and returns
// the size, the number of chunks and the sha256 of what it published.
func (s *Store) publishChunks(ctx context.Context, subj string, r io.Reader) (uint64, uint32, []byte, error) {
	type slot struct {
		buf []byte
		ack jetstream.PubAckFuture
	}
	var (
		ring   [PutWindow]slot
		size   uint64
		chunks uint32
		h      = sha256.New()
	)
	wait := func(sl *slot) error {
		if sl.ack == nil {
			return nil
		}
		ack := sl.ack
		sl.ack = nil
		select {
		case <-ack.Ok():
			return nil
		case err := <-ack.Err():
			return fmt.Errorf("blobs: put chunk %d: %w", chunks, err)
		case <-ctx.Done():
			return fmt.Errorf("blobs: put: %w", ctx.Err())
		}
	}
	waitAll := func() error {
		var first error
		for i := range ring {
			if err := wait(&ring[i]); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	for {
		sl := &ring[chunks%PutWindow]
		// The slot's buffer is reused only once JetStream has stored what
		// it last held.
		if err := wait(sl); err != nil {
			waitAll()
			return 0, 0, nil, err
		}
		if sl.buf == nil {
			sl.buf = make([]byte, ChunkBytes)
		}
		n, rerr := io.ReadFull(r, sl.buf)
		if n > 0 {
			h.Write(sl.buf[:n])
			m := nats.NewMsg(subj)
			m.Data = sl.buf[:n]
			ack, err := s.js.PublishMsgAsync(m)
			if err != nil {
				waitAll()
				return 0, 0, nil, fmt.Errorf("blobs: put chunk %d: %w", chunks, err)
			}
			sl.ack = ack
			size += uint64(n)
			chunks++
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			waitAll()
			return 0, 0, nil, fmt.Errorf("blobs: put: reading: %w", rerr)
		}
	}
	if err := waitAll(); err != nil {
		return 0, 0, nil, err
	}
	return size, chunks, h.Sum(nil), nil
}

// Get returns the blob named sha after checking its content still hashes to it.
func (s *Store) Get(ctx context.Context, sha string) ([]byte, error) {
	ctx, cancel, err := s.readContext(ctx, sha)
	if err != nil {
		return nil, err
	}
	defer cancel()
	b, err := s.obs.GetBytes(ctx, sha)
	if err != nil {
		return nil, s.getError(sha, err)
	}
	if got := wire.SHA256(b); got != sha {
		return nil, fmt.Errorf("blobs: %s holds content hashing to %s", sha, got)
	}
	return b, nil
}

// Open streams the blob named sha, for a reader that needs only part of it
// (a model's header) or must not hold all of it. The object store checks the
// content against the digest it recorded once the end is read; a reader
// that stops early gets no such check.
func (s *Store) Open(ctx context.Context, sha string) (io.ReadCloser, error) {
	ctx, cancel, err := s.readContext(ctx, sha)
	if err != nil {
		return nil, err
	}
	r, err := s.obs.Get(ctx, sha)
	if err != nil {
		cancel()
		return nil, s.getError(sha, err)
	}
	return &openBlob{ReadCloser: r, cancel: cancel}, nil
}

// minReadRate is the slowest a blob is read before a read whose context has
// no deadline gives up: readSlack plus a second per minReadRate bytes.
// nats.go bounds a whole object read, not one request, by its API timeout
// when the context has none, so a 96 MiB blob read on a loaded machine
// failed with "nats: timeout" after 5 s while every chunk was arriving.
const (
	minReadRate = 4 << 20
	readSlack   = 30 * time.Second
)

// readContext gives a read without a deadline one that grows with the
// blob's size; a caller's own deadline is kept as it is.
func (s *Store) readContext(ctx context.Context, sha string) (context.Context, context.CancelFunc, error) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}, nil
	}
	info, err := s.obs.GetInfo(ctx, sha)
	if err != nil {
		return nil, nil, s.getError(sha, err)
	}
	d := readSlack + time.Duration(info.Size/minReadRate)*time.Second
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, cancel, nil
}

func (s *Store) getError(sha string, err error) error {
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("blob %s: %w", sha, backend.ErrNotFound)
	}
	return fmt.Errorf("blobs: get %s: %w", sha, err)
}

// openBlob releases the read's deadline when its reader is closed.
type openBlob struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *openBlob) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
