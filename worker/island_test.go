package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/remote"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

// outerPool is the OuterSync half of PoolWorkerService for one DiLoCo job:
// an outer step closes once quorum contributions for it have arrived, with
// the weighted mean of their pseudo-gradients applied by aggregator.Outer.
type outerPool struct {
	apiv1.UnimplementedPoolWorkerServiceServer
	quorum int
	steps  int64
	int8   bool

	mu    sync.Mutex
	held  map[string]uint32 // island job -> attempt
	outer *aggregator.Outer
	theta []float32
	step  int64
	pgs   [][]float32
	ws    []float64
	round chan struct{}
	// contributed lists the outer steps contributions were for.
	contributed []int64
	// closeFirst, when set for step k, closes k without the contribution
	// that arrives for it, which is then late.
	closeFirst map[int64]bool
	// onClose runs, under mu, after outer step k closes.
	onClose func(k int64)
}

func islandLease(job string, island, islands uint32, attempt uint32, h, total int64, int8 bool) *pb.RankLease {
	id := fmt.Sprintf("%s-i%d", job, island)
	return &pb.RankLease{JobId: id, Attempt: attempt, Rank: 0, WorldSize: 1, LocalWorldSize: 1, GroupWorldSize: 1, Island: island,
		Spec: &pb.PoolJobSpec{Id: id, Ranks: 1, TotalSteps: total, CheckpointInterval: h,
			Diloco: &pb.PoolDiLoCo{Islands: islands, InnerSteps: h, Int8: int8},
			Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{
				Arch: []uint32{synDim, 16, 4}, InitSeed: 3, Seed: 7, BatchSize: 16, LearningRate: 0.1,
				Dataset: &pb.PoolDataset{Source: "dir:syn", First: 100, Count: 512}}}}}
}

const synDim = 24

// synRoot is a data root holding "syn": 700 examples of 4 classes, each
// class a noisy prototype, small enough for tests under the race detector.
func synRoot(t *testing.T) string {
	t.Helper()
	d := &data.Dataset{Dim: synDim, NumClasses: 4}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 700 {
		c := i % 4
		for j := range synDim {
			x := r.Float32() * 0.3
			if j%4 == c {
				x += 0.7
			}
			d.Features = append(d.Features, x)
		}
		d.Labels = append(d.Labels, uint8(c))
	}
	root := t.TempDir()
	if err := data.WriteDir(filepath.Join(root, "syn"), d, "syn"); err != nil {
		t.Fatal(err)
	}
	return root
}

func newOuterPool(t *testing.T, quorum int, steps int64, int8 bool) (*outerPool, string) {
	t.Helper()
	init, err := train.InitMLP([]int{synDim, 16, 4}, 3)
	if err != nil {
		t.Fatal(err)
	}
	theta := init.Flatten()
	o, err := aggregator.NewOuter(len(theta))
	if err != nil {
		t.Fatal(err)
	}
	p := &outerPool{quorum: quorum, steps: steps, int8: int8, held: map[string]uint32{}, outer: o, theta: theta,
		round: make(chan struct{}), closeFirst: map[int64]bool{}}
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

// poolAnswer is an OuterSync answer before it is streamed.
type poolAnswer struct {
	res    *pb.OuterSyncResult
	params []byte
}

func (p *outerPool) answer(late bool) *poolAnswer {
	b := make([]byte, 0, 4*len(p.theta))
	for _, v := range p.theta {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return &poolAnswer{res: &pb.OuterSyncResult{OuterStep: p.step, Done: p.step == p.steps, Late: late}, params: b}
}

// closeStep applies the mean of the open step's contributions; p.mu is
// held.
func (p *outerPool) closeStep() error {
	delta := make([]float32, len(p.theta))
	if len(p.pgs) > 0 {
		var err error
		if delta, err = aggregator.WeightedMean(p.pgs, p.ws); err != nil {
			return err
		}
	}
	if err := p.outer.Apply(p.theta, delta); err != nil {
		return err
	}
	p.step++
	p.pgs, p.ws = nil, nil
	close(p.round)
	p.round = make(chan struct{})
	if p.onClose != nil {
		p.onClose(p.step - 1)
	}
	return nil
}

// OuterSync gathers the island's stream whole (a test's models are small),
// contributes it and streams the answer back in chunks of 1000 bytes.
func (p *outerPool) OuterSync(st grpc.BidiStreamingServer[pb.OuterSyncRequest, pb.OuterSyncResponse]) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	r := first.GetStart()
	if r == nil {
		return status.Error(codes.InvalidArgument, "stream without start")
	}
	var pg []byte
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if c := m.GetChunk(); c == nil || c.GetOffset() != int64(len(pg)) {
			return status.Error(codes.InvalidArgument, "chunk out of order")
		}
		pg = append(pg, m.GetChunk().GetData()...)
	}
	if int64(len(pg)) != r.GetSize() {
		return status.Errorf(codes.InvalidArgument, "%d bytes announced, %d sent", r.GetSize(), len(pg))
	}
	a, err := p.contribute(st.Context(), r, pg)
	if err != nil {
		return err
	}
	if err := st.Send(&pb.OuterSyncResponse{Part: &pb.OuterSyncResponse_Result{Result: a.res}}); err != nil {
		return err
	}
	for off := 0; off < len(a.params); off += 1000 {
		c := &pb.SyncChunk{Offset: int64(off), Data: a.params[off:min(off+1000, len(a.params))]}
		if err := st.Send(&pb.OuterSyncResponse{Part: &pb.OuterSyncResponse_Chunk{Chunk: c}}); err != nil {
			return err
		}
	}
	return nil
}

func (p *outerPool) contribute(ctx context.Context, r *pb.OuterSyncStart, b []byte) (*poolAnswer, error) {
	p.mu.Lock()
	if a, ok := p.held[r.GetRef().GetJobId()]; !ok || a != r.GetRef().GetAttempt() || r.GetRef().GetWorkerId() != "w-1" {
		p.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "%s attempt %d is not leased", r.GetRef().GetJobId(), r.GetRef().GetAttempt())
	}
	if len(b) == 0 {
		defer p.mu.Unlock()
		return p.answer(false), nil
	}
	k := r.GetOuterStep()
	p.contributed = append(p.contributed, k)
	if p.closeFirst[k] && k == p.step {
		if err := p.closeStep(); err != nil {
			p.mu.Unlock()
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if k != p.step {
		defer p.mu.Unlock()
		return p.answer(true), nil
	}
	pg, err := p.decode(b)
	if err != nil {
		p.mu.Unlock()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	p.pgs, p.ws = append(p.pgs, pg), append(p.ws, r.GetWeight())
	round := p.round
	if len(p.pgs) == p.quorum {
		if err := p.closeStep(); err != nil {
			p.mu.Unlock()
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	p.mu.Unlock()
	select {
	case <-round:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.answer(false), nil
}

func (p *outerPool) decode(b []byte) ([]float32, error) {
	if p.int8 {
		q, err := quant.Decode(b, len(p.theta))
		if err != nil {
			return nil, err
		}
		return q.Dequantize(), nil
	}
	if len(b) != 4*len(p.theta) {
		return nil, fmt.Errorf("%d bytes for %d parameters", len(b), len(p.theta))
	}
	pg := make([]float32, len(p.theta))
	for i := range pg {
		pg[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return pg, nil
}

// runIslandRank runs runRank in process for lease l, as the agent would
// run the rank process, and returns its error and output.
// onLog, when set, sees every write to standard error.
func runIslandRank(t *testing.T, p *outerPool, addr, root string, l *pb.RankLease, usr1 chan os.Signal, onLog func(string)) (stdout, stderr string, err error) {
	t.Helper()
	p.mu.Lock()
	p.held[l.GetJobId()] = l.GetAttempt()
	p.mu.Unlock()
	raw, err := proto.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "lease.json")
	if err := writeLeaseFile(path, &leaseFile{Server: addr, Insecure: true, Token: "t", WorkerID: "w-1", DataRoot: root, Lease: raw}); err != nil {
		t.Fatal(err)
	}
	if usr1 == nil {
		usr1 = make(chan os.Signal, 1)
	}
	var out, logs bytes.Buffer
	err = runRank(t.Context(), path, usr1, &lockedWriter{w: &out}, &lockedWriter{w: &logs, onWrite: onLog})
	return out.String(), logs.String(), err
}

type lockedWriter struct {
	mu      sync.Mutex
	w       *bytes.Buffer
	onWrite func(string)
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.onWrite != nil {
		w.onWrite(string(b))
	}
	return w.w.Write(b)
}

// progressSteps are the steps of a rank's progress report lines.
func progressSteps(stdout string) []int64 {
	var steps []int64
	for _, line := range strings.Split(stdout, "\n") {
		var step int64
		var loss float64
		if _, err := fmt.Sscanf(line, reportPrefix+reportProgress+" %d %g", &step, &loss); err == nil {
			steps = append(steps, step)
		}
	}
	return steps
}

// TestIslandRanksTrainTogether runs two islands of an int8 DiLoCo job as
// rank processes would: each reports its own shard's digest and the
// global inner steps, and both end on the server's final parameters.
func TestIslandRanksTrainTogether(t *testing.T) {
	const h, total = 4, 12
	p, addr := newOuterPool(t, 2, total/h, true)
	root := synRoot(t)
	type run struct {
		err            error
		stdout, stderr string
	}
	runs := make([]run, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &runs[i]
			r.stdout, r.stderr, r.err = runIslandRank(t, p, addr, root, islandLease("dl", uint32(i), 2, 1, h, total, true), nil, nil)
		}()
	}
	wg.Wait()
	init, err := train.InitMLP([]int{synDim, 16, 4}, 3)
	if err != nil {
		t.Fatal(err)
	}
	final, err := init.Layout().Unflatten(p.theta)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range runs {
		if r.err != nil {
			t.Fatalf("island %d: %v\n%s", i, r.err, r.stderr)
		}
		want := fmt.Sprintf("island %d of 2: job dl-i%d attempt 1, 256 examples, H 4, outer steps 3, joining at outer step 0", i, i)
		if !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "completed outer step 3") || !strings.Contains(r.stderr, "model "+final.HashHex()) {
			t.Fatalf("island %d log:\n%s", i, r.stderr)
		}
		if got := progressSteps(r.stdout); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) {
			t.Fatalf("island %d progress steps %v", i, got)
		}
		cfg, digest, err := islandConfig(islandLease("dl", uint32(i), 2, 1, h, total, true), root)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.stdout, reportPrefix+reportData+" "+digest) || cfg.Data.Len() != 256 {
			t.Fatalf("island %d did not report its shard's digest %s:\n%s", i, digest, r.stdout)
		}
	}
	if len(p.contributed) != 6 {
		t.Fatalf("contributions %v, want two per outer step", p.contributed)
	}
}

// TestIslandRankStopsAtOuterSyncAndRejoins asks an island to stop while it
// waits on outer step 1: it stops right after that sync, at outer step 2,
// and its next attempt rejoins there, carries on at global inner step 9,
// and finishes despite a late contribution.
func TestIslandRankStopsAtOuterSyncAndRejoins(t *testing.T) {
	const h, total = 4, 16
	p, addr := newOuterPool(t, 1, total/h, false)
	root := synRoot(t)
	usr1 := make(chan os.Signal, 1)
	taken := make(chan struct{})
	var once sync.Once
	onLog := func(s string) {
		if strings.Contains(s, "stop requested") {
			once.Do(func() { close(taken) })
		}
	}
	// The answer to step 1 waits until the rank has taken the signal, so
	// that the sync it stops after is that one.
	p.onClose = func(k int64) {
		if k == 1 {
			usr1 <- StopAtCheckpointSignal
			<-taken
		}
	}
	stdout, stderr, err := runIslandRank(t, p, addr, root, islandLease("dl", 1, 3, 1, h, total, false), usr1, onLog)
	if !errors.Is(err, ErrRankStopped) || RankExitCode(err) != RankExitStopped {
		t.Fatalf("attempt 1: %v, want stopped\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "stop requested: stopping after the next outer sync") || !strings.Contains(stderr, "stopped at outer step 2") {
		t.Fatalf("attempt 1 log:\n%s", stderr)
	}
	if got := progressSteps(stdout); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("attempt 1 progress steps %v, want 1 to 8", got)
	}

	p.mu.Lock()
	p.onClose, p.closeFirst[2] = nil, true
	p.mu.Unlock()
	stdout, stderr, err = runIslandRank(t, p, addr, root, islandLease("dl", 1, 3, 2, h, total, false), nil, nil)
	if err != nil {
		t.Fatalf("attempt 2: %v\n%s", err, stderr)
	}
	for _, want := range []string{
		"island 1 of 3: job dl-i1 attempt 2, 171 examples, H 4, outer steps 4, joining at outer step 2",
		"contribution to outer step 2 was late: outer step 2 closed without it; continuing from outer step 3",
		"completed outer step 4 (joined at outer step 2, 8 inner steps, 1 late contributions)",
	} {
		if !strings.Contains(stderr, want) {
			t.Fatalf("attempt 2 log lacks %q:\n%s", want, stderr)
		}
	}
	if got := progressSteps(stdout); !slices.Equal(got, []int64{9, 10, 11, 12, 13, 14, 15, 16}) {
		t.Fatalf("attempt 2 progress steps %v, want 9 to 16", got)
	}
	if !slices.Equal(p.contributed, []int64{0, 1, 2, 3}) {
		t.Fatalf("contributions for outer steps %v", p.contributed)
	}
}

func TestIslandLeaseRefused(t *testing.T) {
	cases := map[string]func(*pb.RankLease){
		"two ranks":          func(l *pb.RankLease) { l.WorldSize = 2 },
		"rank 1":             func(l *pb.RankLease) { l.Rank = 1 },
		"one island":         func(l *pb.RankLease) { l.Spec.Diloco.Islands = 1 },
		"too many islands":   func(l *pb.RankLease) { l.Spec.Diloco.Islands = maxIslands + 1 },
		"island past end":    func(l *pb.RankLease) { l.Island = 2 },
		"no inner steps":     func(l *pb.RankLease) { l.Spec.Diloco.InnerSteps = 0 },
		"huge inner steps":   func(l *pb.RankLease) { l.Spec.Diloco.InnerSteps = trainer.MaxSteps + 1 },
		"total not multiple": func(l *pb.RankLease) { l.Spec.TotalSteps = 10 },
		"total below H":      func(l *pb.RankLease) { l.Spec.TotalSteps = 2 },
		"not built-in": func(l *pb.RankLease) {
			l.Spec.Program = &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"true"}}}
		},
		"bad batch size": func(l *pb.RankLease) { l.Spec.GetBuiltin().BatchSize = 0 },
	}
	root := synRoot(t)
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			l := islandLease("dl", 1, 2, 1, 4, 12, false)
			mod(l)
			if _, _, err := islandConfig(l, root); !errors.Is(err, ErrLease) {
				t.Fatalf("islandConfig = %v, want ErrLease", err)
			}
		})
	}
}
