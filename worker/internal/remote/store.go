package remote

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Store is the checkpoint store the server keeps for one rank of one
// attempt. checkpoint.Store has no context, so a Store carries the rank's:
// when it ends, every call fails with its error.
type Store struct {
	ctx   context.Context
	c     apiv1.PoolWorkerServiceClient
	ref   *pb.RankRef
	retry Retry

	stop atomic.Bool
}

var (
	_ checkpoint.Store         = (*Store)(nil)
	_ checkpoint.StallRecorder = (*Store)(nil)
)

// NewStore returns the store of the rank ref names, calling c under ctx.
func NewStore(ctx context.Context, c apiv1.PoolWorkerServiceClient, ref *pb.RankRef, r Retry) (*Store, error) {
	if err := checkRef(c, ref); err != nil {
		return nil, fmt.Errorf("remote: new store: %w", err)
	}
	return &Store{ctx: ctx, c: c, ref: proto.Clone(ref).(*pb.RankRef), retry: r}, nil
}

func checkRef(c apiv1.PoolWorkerServiceClient, ref *pb.RankRef) error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: no client", ErrInvalid)
	case ref == nil || ref.GetWorkerId() == "" || ref.GetJobId() == "" || ref.GetAttempt() == 0:
		return fmt.Errorf("%w: rank reference %v lacks worker, job or attempt", ErrInvalid, ref)
	}
	return nil
}

// StopRequested reports whether a commit's answer said the rank should stop.
func (s *Store) StopRequested() bool { return s.stop.Load() }

// notFound maps the server's NOT_FOUND to checkpoint.ErrNotFound, which
// checkpoint.LoadLatest treats as damage to fall back from.
func notFound(err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w: %w", checkpoint.ErrNotFound, err)
	}
	return err
}

// PutBlob implements checkpoint.Store.
func (s *Store) PutBlob(d checkpoint.Digest, data []byte) error {
	if len(data) > MaxBlobBytes {
		return fmt.Errorf("remote: put blob %s: %d bytes, limit %d (write with a chunk size of at most %d): %w", d, len(data), MaxBlobBytes, MaxBlobBytes, ErrTooLarge)
	}
	req := &pb.PutCheckpointBlobRequest{Ref: s.ref, Digest: d.String(), Data: data}
	err := s.retry.Do(s.ctx, func(ctx context.Context) error {
		_, err := s.c.PutCheckpointBlob(ctx, req, CallOptions()...)
		return err
	})
	if err != nil {
		return fmt.Errorf("remote: put blob %s: %w", d, err)
	}
	return nil
}

// HasBlob implements checkpoint.Store.
func (s *Store) HasBlob(d checkpoint.Digest) (bool, error) {
	var present bool
	err := s.retry.Do(s.ctx, func(ctx context.Context) error {
		r, err := s.c.HasCheckpointBlob(ctx, &pb.HasCheckpointBlobRequest{Ref: s.ref, Digest: d.String()}, CallOptions()...)
		present = r.GetPresent()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("remote: has blob %s: %w", d, err)
	}
	return present, nil
}

// GetBlob implements checkpoint.Store: a blob over MaxBlobBytes is refused
// and one whose digest is not d is reported as checkpoint.ErrCorrupt.
func (s *Store) GetBlob(d checkpoint.Digest) ([]byte, error) {
	var data []byte
	err := s.retry.Do(s.ctx, func(ctx context.Context) error {
		r, err := s.c.GetCheckpointBlob(ctx, &pb.GetCheckpointBlobRequest{Ref: s.ref, Digest: d.String()}, CallOptions()...)
		data = r.GetData()
		return err
	})
	switch {
	case err != nil:
		return nil, fmt.Errorf("remote: get blob %s: %w", d, notFound(err))
	case len(data) > MaxBlobBytes:
		return nil, fmt.Errorf("remote: get blob %s: %d bytes, limit %d: %w", d, len(data), MaxBlobBytes, ErrBadResponse)
	case checkpoint.Sum(data) != d:
		return nil, fmt.Errorf("remote: get blob %s: server sent data with digest %s: %w", d, checkpoint.Sum(data), checkpoint.ErrCorrupt)
	}
	return data, nil
}

// Commit implements checkpoint.Store. It remembers whether the server asked
// the rank to stop (StopRequested), and refuses an answer naming another id
// than the manifest's digest.
func (s *Store) Commit(m *checkpoint.Manifest) (checkpoint.Digest, error) {
	return s.commit(m, nil)
}

// CommitStall implements checkpoint.StallRecorder: Commit, telling the
// server how long taking the checkpoint blocked the rank's training, for
// the job's stall summary and metrics.
func (s *Store) CommitStall(m *checkpoint.Manifest, stall time.Duration) (checkpoint.Digest, error) {
	return s.commit(m, proto.Float64(max(stall, 0).Seconds()))
}

// commit is Commit with the stall in seconds, nil for none measured.
func (s *Store) commit(m *checkpoint.Manifest, stall *float64) (checkpoint.Digest, error) {
	b, id, err := m.Encode()
	if err != nil {
		return checkpoint.Digest{}, fmt.Errorf("remote: commit: %w", err)
	}
	if len(b) > MaxMessageBytes-MaxBlobBytes/4 {
		return checkpoint.Digest{}, fmt.Errorf("remote: commit %s: manifest of %d bytes, limit %d: %w", id, len(b), MaxMessageBytes-MaxBlobBytes/4, ErrTooLarge)
	}
	var resp *pb.CommitCheckpointResponse
	err = s.retry.Do(s.ctx, func(ctx context.Context) error {
		var err error
		resp, err = s.c.CommitCheckpoint(ctx, &pb.CommitCheckpointRequest{Ref: s.ref, Manifest: b, StallSeconds: stall}, CallOptions()...)
		return err
	})
	if err != nil {
		return checkpoint.Digest{}, fmt.Errorf("remote: commit %s: %w", id, err)
	}
	if resp.GetId() != id.String() {
		return checkpoint.Digest{}, fmt.Errorf("remote: commit %s: server answered with id %.80q: %w", id, resp.GetId(), ErrBadResponse)
	}
	if resp.GetStop() {
		s.stop.Store(true)
	}
	return id, nil
}

// getManifest asks for id ("" for the one to resume from) and returns the
// verified manifest; a zero id with a nil manifest means there is none.
func (s *Store) getManifest(id string) (checkpoint.Digest, *checkpoint.Manifest, error) {
	var resp *pb.GetRankCheckpointResponse
	err := s.retry.Do(s.ctx, func(ctx context.Context) error {
		var err error
		resp, err = s.c.GetRankCheckpoint(ctx, &pb.GetRankCheckpointRequest{Ref: s.ref, Id: id}, CallOptions()...)
		return err
	})
	if err != nil {
		return checkpoint.Digest{}, nil, notFound(err)
	}
	if resp.GetId() == "" {
		if id != "" || len(resp.GetManifest()) > 0 {
			return checkpoint.Digest{}, nil, fmt.Errorf("answer without an id: %w", ErrBadResponse)
		}
		return checkpoint.Digest{}, nil, nil
	}
	got, err := checkpoint.ParseDigest(resp.GetId())
	if err != nil {
		return checkpoint.Digest{}, nil, fmt.Errorf("answer id %.80q: %w: %w", resp.GetId(), ErrBadResponse, err)
	}
	if id != "" && got.String() != id {
		return checkpoint.Digest{}, nil, fmt.Errorf("asked for %s, server sent %s: %w", id, got, ErrBadResponse)
	}
	b := resp.GetManifest()
	if len(b) > checkpoint.MaxManifestBytes {
		return checkpoint.Digest{}, nil, fmt.Errorf("manifest of %d bytes, limit %d: %w", len(b), checkpoint.MaxManifestBytes, ErrBadResponse)
	}
	if checkpoint.Sum(b) != got {
		return checkpoint.Digest{}, nil, fmt.Errorf("manifest %s: bytes have digest %s: %w", got, checkpoint.Sum(b), checkpoint.ErrCorrupt)
	}
	m, err := checkpoint.DecodeManifest(b)
	if err != nil {
		return checkpoint.Digest{}, nil, fmt.Errorf("manifest %s: %w", got, err)
	}
	return got, m, nil
}

// Manifest implements checkpoint.Store.
func (s *Store) Manifest(id checkpoint.Digest) (*checkpoint.Manifest, error) {
	_, m, err := s.getManifest(id.String())
	if err != nil {
		return nil, fmt.Errorf("remote: manifest %s: %w", id, err)
	}
	return m, nil
}

// Latest implements checkpoint.Store: the checkpoint the server says this
// attempt resumes from, or checkpoint.ErrNoCheckpoint for a fresh start.
// Its blobs are not checked here; checkpoint.Load checks each as it reads.
func (s *Store) Latest() (checkpoint.Digest, *checkpoint.Manifest, error) {
	id, m, err := s.getManifest("")
	switch {
	case err != nil:
		return checkpoint.Digest{}, nil, fmt.Errorf("remote: latest: %w", err)
	case m == nil:
		return checkpoint.Digest{}, nil, fmt.Errorf("remote: latest: %w", checkpoint.ErrNoCheckpoint)
	}
	return id, m, nil
}

// List implements checkpoint.Store.
func (s *Store) List() ([]checkpoint.Digest, error) {
	var ids []string
	err := s.retry.Do(s.ctx, func(ctx context.Context) error {
		r, err := s.c.ListRankCheckpoints(ctx, &pb.ListRankCheckpointsRequest{Ref: s.ref}, CallOptions()...)
		ids = r.GetIds()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("remote: list: %w", err)
	}
	if len(ids) > MaxListed {
		return nil, fmt.Errorf("remote: list: %d ids, limit %d: %w", len(ids), MaxListed, ErrBadResponse)
	}
	out := make([]checkpoint.Digest, 0, len(ids))
	for _, h := range ids {
		d, err := checkpoint.ParseDigest(h)
		if err != nil {
			return nil, fmt.Errorf("remote: list: id %.80q: %w: %w", h, ErrBadResponse, err)
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b checkpoint.Digest) int { return slices.Compare(a[:], b[:]) })
	return slices.Compact(out), nil
}

// IsRefused reports whether err is the server refusing a call outright
// (not unavailable, not a local bound or context end): the agent reports
// such a rank as failed rather than waiting for it.
func IsRefused(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return false
	}
	c := se.GRPCStatus().Code()
	return c != codes.OK && c != codes.Unavailable && c != codes.Canceled && c != codes.DeadlineExceeded
}
