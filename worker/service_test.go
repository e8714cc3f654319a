package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/remote"
)

// pool is a small PoolWorkerService for one worker: it hands out the
// leases and stops a test queues, keeps each rank's checkpoints in a
// checkpoint.Dir shared by the attempts, and refuses calls for attempts it
// did not lease last.
type pool struct {
	apiv1.UnimplementedPoolWorkerServiceServer
	root     string
	interval time.Duration

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change
	starts   []*pb.RankLease
	stops    []*pb.RankStop
	held     map[string]uint32 // job -> attempt
	stores   map[string]*checkpoint.Dir
	statuses []*pb.RankStatus
	exits    []*pb.RankExitedRequest
	logs     []string
	// gate, when set, runs before a commit of a manifest at that step.
	gate func(step int64)
}

func newPool(t *testing.T) (*pool, string) {
	t.Helper()
	p := &pool{root: t.TempDir(), interval: 100 * time.Millisecond, changed: make(chan struct{}), held: map[string]uint32{}, stores: map[string]*checkpoint.Dir{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(remote.MaxMessageBytes), grpc.MaxSendMsgSize(remote.MaxMessageBytes))
	apiv1.RegisterPoolWorkerServiceServer(srv, p)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return p, ln.Addr().String()
}

// update changes the state under the lock and wakes the waiters.
func (p *pool) update(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
}

// waitFor waits until cond, read under the lock, holds.
func (p *pool) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	guard := time.After(60 * time.Second) // a hang guard only
	for {
		p.mu.Lock()
		ok, ch := cond(), p.changed
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-guard:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (p *pool) lease(l *pb.RankLease) {
	p.update(func() {
		p.held[l.GetJobId()] = l.GetAttempt()
		p.starts = append(p.starts, l)
	})
}

func (p *pool) RegisterWorker(context.Context, *pb.RegisterWorkerRequest) (*pb.RegisterWorkerResponse, error) {
	return &pb.RegisterWorkerResponse{WorkerId: "w-1", HeartbeatInterval: durationpb.New(p.interval), HeartbeatsToLoss: 3}, nil
}

func (p *pool) Heartbeat(ctx context.Context, r *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if r.GetWorkerId() != "w-1" {
		return nil, status.Error(codes.NotFound, "unknown worker")
	}
	p.update(func() { p.statuses = r.GetRanks() })
	t := time.NewTimer(p.interval)
	defer t.Stop()
	for {
		p.mu.Lock()
		resp := &pb.HeartbeatResponse{Start: p.starts, Stop: p.stops}
		p.starts, p.stops = nil, nil
		ch := p.changed
		p.mu.Unlock()
		if len(resp.Start)+len(resp.Stop) > 0 {
			return resp, nil
		}
		select {
		case <-ch:
		case <-t.C:
			return resp, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (p *pool) RankExited(_ context.Context, r *pb.RankExitedRequest) (*pb.RankExitedResponse, error) {
	p.update(func() { p.exits = append(p.exits, r) })
	return &pb.RankExitedResponse{}, nil
}

func (p *pool) AppendLogs(_ context.Context, r *pb.AppendLogsRequest) (*pb.AppendLogsResponse, error) {
	if _, err := p.store(r.GetRef()); err != nil {
		return nil, err
	}
	p.update(func() {
		for _, l := range r.GetLines() {
			p.logs = append(p.logs, fmt.Sprintf("%d/%s: %s", l.GetAttempt(), l.GetStream(), l.GetText()))
		}
	})
	return &pb.AppendLogsResponse{}, nil
}

// store is the rank's store, for a call of the attempt the worker holds.
func (p *pool) store(ref *pb.RankRef) (*checkpoint.Dir, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ref.GetWorkerId() != "w-1" || p.held[ref.GetJobId()] != ref.GetAttempt() {
		return nil, status.Errorf(codes.FailedPrecondition, "attempt %d of %s is not leased to %s", ref.GetAttempt(), ref.GetJobId(), ref.GetWorkerId())
	}
	key := fmt.Sprintf("%s-%d", ref.GetJobId(), ref.GetRank())
	if s := p.stores[key]; s != nil {
		return s, nil
	}
	s, err := checkpoint.OpenDir(filepath.Join(p.root, key))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	p.stores[key] = s
	return s, nil
}

func gerr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, checkpoint.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

func (p *pool) PutCheckpointBlob(_ context.Context, r *pb.PutCheckpointBlobRequest) (*pb.PutCheckpointBlobResponse, error) {
	s, err := p.store(r.GetRef())
	if err != nil {
		return nil, err
	}
	d, err := checkpoint.ParseDigest(r.GetDigest())
	if err == nil {
		err = s.PutBlob(d, r.GetData())
	}
	return &pb.PutCheckpointBlobResponse{}, gerr(err)
}

func (p *pool) HasCheckpointBlob(_ context.Context, r *pb.HasCheckpointBlobRequest) (*pb.HasCheckpointBlobResponse, error) {
	s, err := p.store(r.GetRef())
	if err != nil {
		return nil, err
	}
	d, err := checkpoint.ParseDigest(r.GetDigest())
	var ok bool
	if err == nil {
		ok, err = s.HasBlob(d)
	}
	return &pb.HasCheckpointBlobResponse{Present: ok}, gerr(err)
}

func (p *pool) GetCheckpointBlob(_ context.Context, r *pb.GetCheckpointBlobRequest) (*pb.GetCheckpointBlobResponse, error) {
	s, err := p.store(r.GetRef())
	if err != nil {
		return nil, err
	}
	d, err := checkpoint.ParseDigest(r.GetDigest())
	var b []byte
	if err == nil {
		b, err = s.GetBlob(d)
	}
	return &pb.GetCheckpointBlobResponse{Data: b}, gerr(err)
}

func (p *pool) CommitCheckpoint(_ context.Context, r *pb.CommitCheckpointRequest) (*pb.CommitCheckpointResponse, error) {
	s, err := p.store(r.GetRef())
	if err != nil {
		return nil, err
	}
	m, err := checkpoint.DecodeManifest(r.GetManifest())
	if err != nil {
		return nil, gerr(err)
	}
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	if gate != nil {
		gate(m.Step)
	}
	id, err := s.Commit(m)
	return &pb.CommitCheckpointResponse{Id: id.String()}, gerr(err)
}

func (p *pool) GetRankCheckpoint(_ context.Context, r *pb.GetRankCheckpointRequest) (*pb.GetRankCheckpointResponse, error) {
	s, err := p.store(r.GetRef())
	if err != nil {
		return nil, err
	}
	var id checkpoint.Digest
	var m *checkpoint.Manifest
	if r.GetId() == "" {
		id, m, err = s.Latest()
		if errors.Is(err, checkpoint.ErrNoCheckpoint) {
			return &pb.GetRankCheckpointResponse{}, nil
		}
	} else if id, err = checkpoint.ParseDigest(r.GetId()); err == nil {
		m, err = s.Manifest(id)
	}
	if err != nil {
		return nil, gerr(err)
	}
	b, _, err := m.Encode()
	return &pb.GetRankCheckpointResponse{Id: id.String(), Manifest: b}, gerr(err)
}

func (p *pool) ListRankCheckpoints(_ context.Context, r *pb.ListRankCheckpointsRequest) (*pb.ListRankCheckpointsResponse, error) {
	s, err := p.store(r.GetRef())
	if err != nil {
		return nil, err
	}
	ids, err := s.List()
	out := &pb.ListRankCheckpointsResponse{}
	for _, id := range ids {
		out.Ids = append(out.Ids, id.String())
	}
	return out, gerr(err)
}

func (p *pool) exit(job string, attempt uint32) *pb.RankExitedRequest {
	for _, e := range p.exits {
		if e.GetJobId() == job && e.GetAttempt() == attempt {
			return e
		}
	}
	return nil
}

func (p *pool) logged(sub string) bool {
	for _, l := range p.logs {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}
