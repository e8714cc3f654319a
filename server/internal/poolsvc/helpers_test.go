package poolsvc

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/authz"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

var t0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

const (
	hb      = 2 * time.Second
	hangFor = 60 * time.Second
	gib     = 1 << 30
)

// oneRank is what one rank of the test jobs needs, and a worker with room
// for exactly one.
var oneRank = &pb.PoolResources{MilliCpu: 1000, MemoryBytes: gib, Gpus: 1}

type storedModel struct {
	name    string
	m       *model.Model
	lineage *pb.PoolLineage
}

// env is a job service on a real SQLite store behind a real gRPC server
// with the real authz interceptors, on a fake clock.
type env struct {
	t      *testing.T
	clk    *clock.Fake
	dir    string
	st     *store.Store
	svc    *Service
	srv    *grpc.Server
	conn   *grpc.ClientConn
	issuer *identity.APIIssuer
	deps   func(*Deps)

	mu      sync.Mutex
	events  []audit.Payload
	models  []storedModel
	tasks   []*pb.Task
	taskErr error
	polls   map[string]int
	cond    *sync.Cond
}

func newEnv(t *testing.T, deps func(*Deps)) *env {
	t.Helper()
	e := &env{t: t, clk: clock.NewFake(t0), dir: t.TempDir(), deps: deps, polls: map[string]int{}}
	e.cond = sync.NewCond(&e.mu)
	var err error
	if e.st, err = store.Open(context.Background(), filepath.Join(e.dir, "fleetlearn.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.st.Close() })
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	if e.issuer, err = identity.NewAPIIssuer(key, identity.WithClock(e.clk.Now)); err != nil {
		t.Fatal(err)
	}
	e.start()
	return e
}

func (e *env) start() {
	t := e.t
	d := Deps{Store: e.st, Clock: e.clk, CheckpointDir: filepath.Join(e.dir, "pool", "checkpoints"),
		Audit: e.audit, StoreModel: e.storeModel, CreateTask: e.createTask, HeartbeatInterval: hb}
	if e.deps != nil {
		e.deps(&d)
	}
	svc, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	svc.onPoll = func(w string) {
		e.mu.Lock()
		e.polls[w]++
		e.cond.Broadcast()
		e.mu.Unlock()
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ver, err := identity.NewAPIVerifier([]ed25519.PublicKey{e.issuer.PublicKey()}, identity.WithClock(e.clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	az, err := authz.New(ver, identity.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(8<<20),
		grpc.ChainUnaryInterceptor(az.AuthenticateUnary, az.AuthorizeUnary),
		grpc.ChainStreamInterceptor(az.AuthenticateStream, az.AuthorizeStream))
	svc.Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20), grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	e.svc, e.srv, e.conn = svc, srv, conn
	t.Cleanup(e.stop)
}

func (e *env) stop() {
	e.srv.Stop()
	e.svc.Shutdown()
	e.conn.Close()
}

// restart stops the service and starts a new one on the same store and
// checkpoint directory, as a server restart does.
func (e *env) restart() {
	e.stop()
	e.start()
}

func (e *env) audit(_ context.Context, ps ...audit.Payload) error {
	for _, p := range ps {
		if _, err := audit.NewEvent(audit.Service("pool"), p); err != nil {
			e.t.Errorf("invalid audit event %+v: %v", p, err)
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ps...)
	return nil
}

func (e *env) storeModel(_ context.Context, name string, m *model.Model, lin *pb.PoolLineage) (*pb.Model, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.models = append(e.models, storedModel{name, m, lin})
	v := m.HashHex()
	return &pb.Model{Ref: &pb.ModelRef{Version: v, Sha256: v, SizeBytes: 1234}, Name: name,
		Source: pb.ModelSource_MODEL_SOURCE_POOL, ParameterCount: uint64(len(m.Flatten())), Lineage: lin}, nil
}

func (e *env) createTask(_ context.Context, t *pb.Task) (*pb.Task, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.taskErr != nil {
		return nil, e.taskErr
	}
	e.tasks = append(e.tasks, t)
	c := proto.CloneOf(t)
	c.Id = "task-1"
	return c, nil
}

func (e *env) poolEvents() []audit.PoolJob {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []audit.PoolJob
	for _, p := range e.events {
		if pj, ok := p.(audit.PoolJob); ok {
			out = append(out, pj)
		}
	}
	return out
}

// as is a context carrying a token for subject with role.
func (e *env) as(subject string, role identity.Role) context.Context {
	tok, _, err := e.issuer.Mint(subject, []identity.Role{role}, time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangFor)
	e.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func (e *env) ops() (apiv1.PoolServiceClient, context.Context) {
	return apiv1.NewPoolServiceClient(e.conn), e.as("alice", identity.RoleOperator)
}

type worker struct {
	e   *env
	ctx context.Context
	c   apiv1.PoolWorkerServiceClient
	id  string
}

func (e *env) register(subject string, capacity *pb.PoolResources) *worker {
	e.t.Helper()
	w := &worker{e: e, ctx: e.as(subject, identity.RolePoolWorker), c: apiv1.NewPoolWorkerServiceClient(e.conn)}
	res, err := w.c.RegisterWorker(w.ctx, &pb.RegisterWorkerRequest{Name: subject, Capacity: capacity})
	if err != nil {
		e.t.Fatal(err)
	}
	w.id = res.GetWorkerId()
	return w
}

type hbResult struct {
	res *pb.HeartbeatResponse
	err error
}

// poll starts a heartbeat and waits until it is either answered or
// waiting in the service.
func (w *worker) poll(ranks ...*pb.RankStatus) <-chan hbResult {
	w.e.mu.Lock()
	n := w.e.polls[w.id]
	w.e.mu.Unlock()
	ch := make(chan hbResult, 1)
	done := make(chan struct{})
	go func() {
		res, err := w.c.Heartbeat(w.ctx, &pb.HeartbeatRequest{WorkerId: w.id, Ranks: ranks})
		ch <- hbResult{res, err}
		close(done)
	}()
	waiting := make(chan struct{})
	go func() {
		w.e.mu.Lock()
		for w.e.polls[w.id] == n {
			select {
			case <-done:
				w.e.mu.Unlock()
				close(waiting)
				return
			default:
			}
			w.e.cond.Wait()
		}
		w.e.mu.Unlock()
		close(waiting)
	}()
	// The answer may come without a wait; wake the waiter either way.
	go func() {
		<-done
		w.e.mu.Lock()
		w.e.cond.Broadcast()
		w.e.mu.Unlock()
	}()
	select {
	case <-waiting:
	case <-time.After(hangFor):
		w.e.t.Fatal("heartbeat neither answered nor waiting")
	}
	return ch
}

func recv(t *testing.T, ch <-chan hbResult) *pb.HeartbeatResponse {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("heartbeat: %v", r.err)
		}
		return r.res
	case <-time.After(hangFor):
		t.Fatal("heartbeat not answered")
	}
	return nil
}

// heartbeat calls and waits for the answer, advancing nothing.
func (w *worker) heartbeat(ranks ...*pb.RankStatus) (*pb.HeartbeatResponse, error) {
	return w.c.Heartbeat(w.ctx, &pb.HeartbeatRequest{WorkerId: w.id, Ranks: ranks})
}

func ref(w *worker, l *pb.RankLease) *pb.RankRef {
	return &pb.RankRef{WorkerId: w.id, JobId: l.GetJobId(), Attempt: l.GetAttempt(), Rank: l.GetRank()}
}

// commit writes a checkpoint of rank at step with params vals into the
// server's store for r, as a worker does: blobs, then the manifest.
func (w *worker) commit(r *pb.RankRef, job string, step int64, vals ...float32) (*pb.CommitCheckpointResponse, error) {
	w.e.t.Helper()
	b, err := manifestFor(w.e.t, job, step, vals, func(d checkpoint.Digest, data []byte) error {
		_, err := w.c.PutCheckpointBlob(w.ctx, &pb.PutCheckpointBlobRequest{Ref: r, Digest: d.String(), Data: data})
		return err
	})
	if err != nil {
		return nil, err
	}
	return w.c.CommitCheckpoint(w.ctx, &pb.CommitCheckpointRequest{Ref: r, Manifest: b})
}

// manifestFor writes a checkpoint to a scratch store, hands each blob to
// put and returns the canonical manifest.
func manifestFor(t *testing.T, job string, step int64, vals []float32, put func(checkpoint.Digest, []byte) error) ([]byte, error) {
	t.Helper()
	local, err := checkpoint.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{len(vals)}, Data: vals})
	if err != nil {
		t.Fatal(err)
	}
	id, err := checkpoint.Write(local, &checkpoint.Checkpoint{Job: job, Step: step, Params: m,
		Cursor: checkpoint.Cursor{Shard: "s"}}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	man, err := local.Manifest(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range man.Blobs() {
		data, err := local.GetBlob(c.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := put(c.Digest, data); err != nil {
			return nil, err
		}
	}
	b, _, err := man.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b, nil
}

func spec(id string, ranks uint32) *pb.PoolJobSpec {
	return &pb.PoolJobSpec{Id: id, Ranks: ranks, PerRank: oneRank, MaxRestarts: 2, CheckpointInterval: 10, TotalSteps: 100,
		OutputModel: "mnist-base", Program: &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"python3", "train.py"}}}}
}

func (e *env) submit(sp *pb.PoolJobSpec, then *pb.Task) *pb.PoolJob {
	e.t.Helper()
	c, ctx := e.ops()
	res, err := c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: sp, ThenTask: then})
	if err != nil {
		e.t.Fatal(err)
	}
	return res.GetJob()
}

func (e *env) job(id string) *pb.PoolJob {
	e.t.Helper()
	c, ctx := e.ops()
	res, err := c.GetJob(ctx, &pb.GetJobRequest{JobId: id})
	if err != nil {
		e.t.Fatal(err)
	}
	return res.GetJob()
}

// waitJob waits for the job to satisfy ok, as WatchJob reports it.
func (e *env) waitJob(id string, ok func(*pb.PoolJob) bool) *pb.PoolJob {
	e.t.Helper()
	c, ctx := e.ops()
	s, err := c.WatchJob(ctx, &pb.WatchJobRequest{JobId: id})
	if err != nil {
		e.t.Fatal(err)
	}
	var last *pb.PoolJob
	for {
		r, err := s.Recv()
		if err != nil {
			e.t.Fatalf("watch %s: %v (last %v)", id, err, last)
		}
		if last = r.GetJob(); ok(last) {
			return last
		}
	}
}

func wantCode(t *testing.T, what string, err error, c codes.Code) {
	t.Helper()
	if status.Code(err) != c {
		t.Errorf("%s: %v, want %s", what, err, c)
	}
}

// leases of the current attempt of job, read on the loop.
func (e *env) leases(job string) []*lease {
	var out []*lease
	_ = e.svc.do(context.Background(), func() error {
		if rt := e.svc.jobs[job]; rt != nil {
			for _, le := range rt.leases {
				c := *le
				out = append(out, &c)
			}
		}
		return nil
	})
	return out
}

// beat heartbeats and, if the service holds the call for lack of news,
// advances the clock one interval to release it.
func (w *worker) beat(ranks ...*pb.RankStatus) *pb.HeartbeatResponse {
	w.e.t.Helper()
	ch := w.poll(ranks...)
	select {
	case r := <-ch:
		if r.err != nil {
			w.e.t.Fatalf("heartbeat: %v", r.err)
		}
		return r.res
	default:
	}
	w.e.clk.Advance(hb)
	return recv(w.e.t, ch)
}

// lastEvent is the job's latest pool.job event in state.
func (e *env) lastEvent(job, state string) string {
	var d string
	for _, ev := range e.poolEvents() {
		if ev.Job == job && ev.State == state {
			d = ev.Detail
		}
	}
	return d
}

// cut splits data into chunks of at most size bytes, in order.
func cut(data []byte, size int) []*pb.SyncChunk {
	var out []*pb.SyncChunk
	for off := 0; off < len(data); off += size {
		out = append(out, &pb.SyncChunk{Offset: int64(off), Data: data[off:min(off+size, len(data))]})
	}
	return out
}

// avgStream is a rank's Average stream as a worker drives it.
type avgStream struct {
	st   grpc.BidiStreamingClient[pb.AverageRequest, pb.AverageResponse]
	sent int64 // request bytes: what the server counts as received
}

// openAverage starts an Average stream with start.
func (w *worker) openAverage(start *pb.AverageStart) (*avgStream, error) {
	st, err := w.c.Average(w.ctx)
	if err != nil {
		return nil, err
	}
	a := &avgStream{st: st}
	return a, a.send(&pb.AverageRequest{Part: &pb.AverageRequest_Start{Start: start}})
}

func (a *avgStream) send(m *pb.AverageRequest) error {
	a.sent += int64(proto.Size(m))
	return a.st.Send(m)
}

// chunks sends cs in the order given. The server may end the call early
// (a refusal): then the rest is not sent, and finish returns its status.
func (a *avgStream) chunks(cs ...*pb.SyncChunk) {
	for _, c := range cs {
		if a.send(&pb.AverageRequest{Part: &pb.AverageRequest_Chunk{Chunk: c}}) != nil {
			return
		}
	}
}

// finish closes the sending side and reads the mean.
func (a *avgStream) finish() ([]byte, error) {
	_ = a.st.CloseSend() // after a refusal too: Recv returns the status
	var out []byte
	for {
		m, err := a.st.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if c := m.GetChunk(); c.GetOffset() != int64(len(out)) {
			return nil, fmt.Errorf("mean chunk at byte %d after %d bytes", c.GetOffset(), len(out))
		}
		out = append(out, m.GetChunk().GetData()...)
	}
}

// average contributes params for step as a worker does, in 1 MiB chunks,
// and returns the mean's bytes.
func (w *worker) average(r *pb.RankRef, step int64, weight float64, params []byte) ([]byte, error) {
	a, err := w.openAverage(&pb.AverageStart{Ref: r, Step: step, Weight: weight, Size: int64(len(params))})
	if err == nil {
		a.chunks(cut(params, 1<<20)...)
	}
	if a == nil {
		return nil, err
	}
	return a.finish()
}

// outerResp is an OuterSync stream's answer, gathered.
type outerResp struct {
	step       int64
	params     []byte
	done, late bool
	received   int64 // response bytes: what the server counts as sent
}

func (r *outerResp) GetOuterStep() int64 { return r.step }
func (r *outerResp) GetParams() []byte   { return r.params }
func (r *outerResp) GetDone() bool       { return r.done }
func (r *outerResp) GetLate() bool       { return r.late }

// same says whether two answers are equal in everything they say.
func (r *outerResp) same(o *outerResp) bool {
	return r.step == o.step && r.done == o.done && r.late == o.late && bytes.Equal(r.params, o.params)
}

// outerStream is an island's OuterSync stream as a worker drives it.
type outerStream struct {
	st   grpc.BidiStreamingClient[pb.OuterSyncRequest, pb.OuterSyncResponse]
	sent int64
}

func (w *worker) openOuter(start *pb.OuterSyncStart) (*outerStream, error) {
	st, err := w.c.OuterSync(w.ctx)
	if err != nil {
		return nil, err
	}
	o := &outerStream{st: st}
	return o, o.send(&pb.OuterSyncRequest{Part: &pb.OuterSyncRequest_Start{Start: start}})
}

func (o *outerStream) send(m *pb.OuterSyncRequest) error {
	o.sent += int64(proto.Size(m))
	return o.st.Send(m)
}

func (o *outerStream) chunks(cs ...*pb.SyncChunk) {
	for _, c := range cs {
		if o.send(&pb.OuterSyncRequest{Part: &pb.OuterSyncRequest_Chunk{Chunk: c}}) != nil {
			return
		}
	}
}

// finish closes the sending side and reads the answer: the result first,
// then the parameters' chunks.
func (o *outerStream) finish() (*outerResp, error) {
	_ = o.st.CloseSend() // after a refusal too: Recv returns the status
	var res *outerResp
	for {
		m, err := o.st.Recv()
		if err == io.EOF {
			if res == nil {
				return nil, errors.New("outer sync answer without a result")
			}
			return res, nil
		}
		if err != nil {
			return nil, err
		}
		switch {
		case res == nil && m.GetResult() != nil:
			r := m.GetResult()
			res = &outerResp{step: r.GetOuterStep(), done: r.GetDone(), late: r.GetLate()}
		case res != nil && m.GetChunk().GetOffset() == int64(len(res.params)):
			res.params = append(res.params, m.GetChunk().GetData()...)
		default:
			return nil, fmt.Errorf("outer sync answer out of order: %v", m)
		}
		res.received += int64(proto.Size(m))
	}
}

// outerSync contributes pg (nil: joins) for step, in 1 MiB chunks.
func (w *worker) outerSync(r *pb.RankRef, step int64, pg []byte, weight float64) (*outerResp, int64, error) {
	o, err := w.openOuter(&pb.OuterSyncStart{Ref: r, OuterStep: step, Weight: weight, Size: int64(len(pg))})
	if o == nil {
		return nil, 0, err
	}
	if err == nil {
		o.chunks(cut(pg, 1<<20)...)
	}
	res, err := o.finish()
	return res, o.sent, err
}
