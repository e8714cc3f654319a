package remote_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/remote"
)

// service is the checkpoint half of PoolWorkerService over a checkpoint.Dir,
// answering only for one worker's attempt, with hooks that break the
// protocol on purpose.
type service struct {
	apiv1.UnimplementedPoolWorkerServiceServer
	dir     *checkpoint.Dir
	worker  string
	attempt uint32

	mu          sync.Mutex
	unavailable int  // fail this many calls with UNAVAILABLE first
	bigBlob     bool // GetCheckpointBlob answers 4 MiB + 1 bytes
	wrongID     bool // CommitCheckpoint answers another id
	stop        bool // CommitCheckpoint says stop
	shortAvg    bool // Average answers one value short
	calls       int
	stalls      []*float64 // stall_seconds of each commit, nil where unset
}

func (s *service) check(ref *pb.RankRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.unavailable > 0 {
		s.unavailable--
		return status.Error(codes.Unavailable, "restarting")
	}
	if ref.GetWorkerId() != s.worker || ref.GetAttempt() != s.attempt {
		return status.Errorf(codes.FailedPrecondition, "worker %s does not hold attempt %d", ref.GetWorkerId(), ref.GetAttempt())
	}
	return nil
}

func digest(h string) (checkpoint.Digest, error) {
	d, err := checkpoint.ParseDigest(h)
	if err != nil {
		return d, status.Error(codes.InvalidArgument, err.Error())
	}
	return d, nil
}

func (s *service) PutCheckpointBlob(_ context.Context, r *pb.PutCheckpointBlobRequest) (*pb.PutCheckpointBlobResponse, error) {
	if err := s.check(r.GetRef()); err != nil {
		return nil, err
	}
	d, err := digest(r.GetDigest())
	if err != nil {
		return nil, err
	}
	if err := s.dir.PutBlob(d, r.GetData()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &pb.PutCheckpointBlobResponse{}, nil
}

func (s *service) HasCheckpointBlob(_ context.Context, r *pb.HasCheckpointBlobRequest) (*pb.HasCheckpointBlobResponse, error) {
	if err := s.check(r.GetRef()); err != nil {
		return nil, err
	}
	d, err := digest(r.GetDigest())
	if err != nil {
		return nil, err
	}
	ok, err := s.dir.HasBlob(d)
	return &pb.HasCheckpointBlobResponse{Present: ok}, err
}

func (s *service) GetCheckpointBlob(_ context.Context, r *pb.GetCheckpointBlobRequest) (*pb.GetCheckpointBlobResponse, error) {
	if err := s.check(r.GetRef()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	big := s.bigBlob
	s.mu.Unlock()
	if big {
		return &pb.GetCheckpointBlobResponse{Data: make([]byte, remote.MaxBlobBytes+1)}, nil
	}
	d, err := digest(r.GetDigest())
	if err != nil {
		return nil, err
	}
	b, err := s.dir.GetBlob(d)
	if errors.Is(err, checkpoint.ErrNotFound) {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	return &pb.GetCheckpointBlobResponse{Data: b}, err
}

func (s *service) CommitCheckpoint(_ context.Context, r *pb.CommitCheckpointRequest) (*pb.CommitCheckpointResponse, error) {
	if err := s.check(r.GetRef()); err != nil {
		return nil, err
	}
	m, err := checkpoint.DecodeManifest(r.GetManifest())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id, err := s.dir.Commit(m)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalls = append(s.stalls, r.StallSeconds)
	if s.wrongID {
		id[0] ^= 1
	}
	return &pb.CommitCheckpointResponse{Id: id.String(), Stop: s.stop}, nil
}

func (s *service) GetRankCheckpoint(_ context.Context, r *pb.GetRankCheckpointRequest) (*pb.GetRankCheckpointResponse, error) {
	if err := s.check(r.GetRef()); err != nil {
		return nil, err
	}
	var id checkpoint.Digest
	var m *checkpoint.Manifest
	var err error
	if r.GetId() == "" {
		id, m, err = s.dir.Latest()
		if errors.Is(err, checkpoint.ErrNoCheckpoint) {
			return &pb.GetRankCheckpointResponse{}, nil
		}
	} else if id, err = digest(r.GetId()); err == nil {
		m, err = s.dir.Manifest(id)
	}
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	b, _, err := m.Encode()
	return &pb.GetRankCheckpointResponse{Id: id.String(), Manifest: b}, err
}

func (s *service) ListRankCheckpoints(_ context.Context, r *pb.ListRankCheckpointsRequest) (*pb.ListRankCheckpointsResponse, error) {
	if err := s.check(r.GetRef()); err != nil {
		return nil, err
	}
	ids, err := s.dir.List()
	out := &pb.ListRankCheckpointsResponse{}
	for _, id := range ids {
		out.Ids = append(out.Ids, id.String())
	}
	return out, err
}

// Average of one rank is its own parameters, sent back in chunks of 1000
// bytes, so that the answer is reassembled from several.
func (s *service) Average(st grpc.BidiStreamingServer[pb.AverageRequest, pb.AverageResponse]) error {
	r, err := gather(st, func(m *pb.AverageRequest) (*pb.AverageStart, bool) { return m.GetStart(), m.GetStart() != nil },
		(*pb.AverageRequest).GetChunk)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.check(r.start.GetRef()); err != nil {
		return err
	}
	p := r.body
	s.mu.Lock()
	short := s.shortAvg
	s.mu.Unlock()
	if short {
		p = p[:len(p)-4]
	}
	for _, c := range cut(p, 1000) {
		if err := st.Send(&pb.AverageResponse{Chunk: c}); err != nil {
			return err
		}
	}
	return nil
}

func start(t *testing.T) (*service, apiv1.PoolWorkerServiceClient) {
	t.Helper()
	dir, err := checkpoint.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	svc := &service{dir: dir, worker: "w-1", attempt: 2}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(remote.MaxMessageBytes), grpc.MaxSendMsgSize(remote.MaxMessageBytes))
	apiv1.RegisterPoolWorkerServiceServer(srv, svc)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return svc, apiv1.NewPoolWorkerServiceClient(conn)
}

var ref = &pb.RankRef{WorkerId: "w-1", JobId: "job", Attempt: 2, Rank: 0}

func fastRetry() remote.Retry {
	return remote.Retry{Initial: time.Millisecond, Max: 5 * time.Millisecond, Attempts: 5}
}

func newStore(t *testing.T, c apiv1.PoolWorkerServiceClient, r *pb.RankRef) *remote.Store {
	t.Helper()
	s, err := remote.NewStore(t.Context(), c, r, fastRetry())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// opts cuts tensors into many chunks, so that a checkpoint is many blobs.
var opts = checkpoint.Options{ChunkSize: 64 << 10}

// ckpt is a checkpoint of a few hundred KiB.
func ckpt(t *testing.T, step int64) *checkpoint.Checkpoint {
	t.Helper()
	m, err := train.InitMLP([]int{784, 64, 10}, uint64(step))
	if err != nil {
		t.Fatal(err)
	}
	return &checkpoint.Checkpoint{Job: "job", Step: step, Params: m, Cursor: checkpoint.Cursor{Epoch: 1, Offset: 8, Shard: "rank 0 of 1"}, RNG: []byte{1, 2}}
}

func TestRoundTripBitwise(t *testing.T) {
	svc, c := start(t)
	s := newStore(t, c, ref)
	if _, _, err := s.Latest(); !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		t.Fatalf("latest of an empty store: %v, want ErrNoCheckpoint", err)
	}
	var ids []checkpoint.Digest
	for step := int64(1); step <= 2; step++ {
		id, err := checkpoint.Write(s, ckpt(t, step), opts)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if s.StopRequested() {
		t.Fatal("stop requested without the server asking")
	}
	got, err := checkpoint.LoadLatest(s)
	if err != nil {
		t.Fatal(err)
	}
	local, err := checkpoint.LoadLatest(svc.dir)
	if err != nil {
		t.Fatal(err)
	}
	want := ckpt(t, 2)
	if got.ID != ids[1] || local.ID != ids[1] || got.Params.HashHex() != want.Params.HashHex() || got.Params.HashHex() != local.Params.HashHex() {
		t.Fatalf("loaded %s (hash %s), want %s (hash %s)", got.ID, got.Params.HashHex(), ids[1], want.Params.HashHex())
	}
	if got.Step != 2 || got.Cursor != want.Cursor || !bytes.Equal(got.RNG, want.RNG) {
		t.Fatalf("state %d %+v %v", got.Step, got.Cursor, got.RNG)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 {
		t.Fatalf("list = %v, %v", list, err)
	}
	if _, err := s.Manifest(ids[0]); err != nil {
		t.Fatal(err)
	}
	svc.mu.Lock()
	svc.stop = true
	svc.mu.Unlock()
	if _, err := checkpoint.Write(s, ckpt(t, 3), opts); err != nil {
		t.Fatal(err)
	}
	if !s.StopRequested() {
		t.Fatal("the commit's stop was not kept")
	}
}

// TestCommitCarriesStall: a Saver's commit tells the server how long the
// checkpoint's Save blocked; Write, which blocks for the whole write and
// measures no stall, sends none.
func TestCommitCarriesStall(t *testing.T) {
	svc, c := start(t)
	s := newStore(t, c, ref)
	if _, err := checkpoint.Write(s, ckpt(t, 1), opts); err != nil {
		t.Fatal(err)
	}
	sv, err := checkpoint.NewSaver(s, checkpoint.SaverOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	if err := sv.Save(ckpt(t, 2)); err != nil {
		t.Fatal(err)
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if len(svc.stalls) != 2 || svc.stalls[0] != nil || svc.stalls[1] == nil {
		t.Fatalf("commits carried stalls %v, want none and then one", svc.stalls)
	}
	if got, want := *svc.stalls[1], sv.Stats().Stall.Seconds(); got != want {
		t.Fatalf("commit carried a stall of %v s, the Save took %v s", got, want)
	}
}

func TestRefusedCallsAreErrors(t *testing.T) {
	svc, c := start(t)
	old := &pb.RankRef{WorkerId: "w-1", JobId: "job", Attempt: 1}
	s := newStore(t, c, old)
	if _, err := checkpoint.Write(s, ckpt(t, 1), opts); !remote.IsRefused(err) || code(err) != codes.FailedPrecondition {
		t.Fatalf("write for an old attempt: %v", err)
	}
	if _, _, err := s.Latest(); !remote.IsRefused(err) {
		t.Fatalf("latest for an old attempt: %v", err)
	}
	svc.mu.Lock()
	calls := svc.calls
	svc.mu.Unlock()
	if calls != 2 {
		t.Fatalf("%d calls: a refusal was retried", calls)
	}
	if _, err := remote.NewStore(t.Context(), c, &pb.RankRef{JobId: "job"}, fastRetry()); !errors.Is(err, remote.ErrInvalid) {
		t.Fatalf("store without a worker: %v", err)
	}
}

func TestUnavailableIsRetried(t *testing.T) {
	svc, c := start(t)
	s := newStore(t, c, ref)
	svc.mu.Lock()
	svc.unavailable = 3
	svc.mu.Unlock()
	if _, err := checkpoint.Write(s, ckpt(t, 1), opts); err != nil {
		t.Fatalf("write after three unavailable answers: %v", err)
	}
	svc.mu.Lock()
	svc.unavailable = 100
	svc.mu.Unlock()
	if _, _, err := s.Latest(); code(err) != codes.Unavailable || remote.IsRefused(err) {
		t.Fatalf("latest while unavailable: %v", err)
	}
	svc.mu.Lock()
	left := svc.unavailable
	svc.mu.Unlock()
	if left != 100-5 {
		t.Fatalf("%d calls while unavailable, want the 5 attempts", 100-left)
	}
}

func code(err error) codes.Code {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code()
	}
	return codes.OK
}

func TestBadResponsesRefused(t *testing.T) {
	svc, c := start(t)
	s := newStore(t, c, ref)
	id, err := checkpoint.Write(s, ckpt(t, 1), opts)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Manifest(id)
	if err != nil {
		t.Fatal(err)
	}
	svc.mu.Lock()
	svc.bigBlob = true
	svc.mu.Unlock()
	if _, err := s.GetBlob(m.Params[0].Chunks[0].Digest); !errors.Is(err, remote.ErrBadResponse) {
		t.Fatalf("oversized blob: %v", err)
	}
	svc.mu.Lock()
	svc.bigBlob, svc.wrongID = false, true
	svc.mu.Unlock()
	if _, err := checkpoint.Write(s, ckpt(t, 2), opts); !errors.Is(err, remote.ErrBadResponse) {
		t.Fatalf("commit answered with another id: %v", err)
	}
	if err := s.PutBlob(checkpoint.Digest{}, make([]byte, remote.MaxBlobBytes+4)); !errors.Is(err, remote.ErrTooLarge) {
		t.Fatalf("oversized put: %v", err)
	}
	sy, err := remote.NewSyncer(c, ref, fastRetry())
	if err != nil {
		t.Fatal(err)
	}
	p := make([]float32, 1000)
	for i := range p {
		p[i] = float32(i) / 7
	}
	got, err := sy.Average(t.Context(), 5, p, 1)
	if err != nil || !slices.Equal(got, p) {
		t.Fatalf("average of %d values: %d back, %v", len(p), len(got), err)
	}
	svc.mu.Lock()
	svc.shortAvg = true
	svc.mu.Unlock()
	if _, err := sy.Average(t.Context(), 10, p, 1); !errors.Is(err, remote.ErrBadResponse) {
		t.Fatalf("short average: %v", err)
	}
}
