package remote_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"net"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/remote"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

// outerService is OuterSync for one island: each contribution closes its
// outer step at θ − pg, decoded as the job's encoding says.
type outerService struct {
	apiv1.UnimplementedPoolWorkerServiceServer
	int8 bool

	mu          sync.Mutex
	theta       []float32
	step, steps int64
	unavailable int        // fail this many calls with UNAVAILABLE first
	refuse      codes.Code // refuse every call with this code when set
	reqs        [][]byte   // every call's messages as received, deterministically encoded
	starts      []*pb.OuterSyncStart
	bodies      [][]byte // every call's pseudo-gradient bytes
	pgs         [][]float32
	tamper      func(*outerAnswer)
}

// outerAnswer is what the fake sends back: the result (none when nil),
// then chunks, by default params cut in chunks of 1000 bytes.
type outerAnswer struct {
	result *pb.OuterSyncResult
	params []byte
	chunks []*pb.SyncChunk
}

func (s *outerService) OuterSync(st grpc.BidiStreamingServer[pb.OuterSyncRequest, pb.OuterSyncResponse]) error {
	r, err := gather(st, func(m *pb.OuterSyncRequest) (*pb.OuterSyncStart, bool) { return m.GetStart(), m.GetStart() != nil },
		(*pb.OuterSyncRequest).GetChunk)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	a, err := s.contribute(r)
	if err != nil {
		return err
	}
	if a.result != nil {
		if err := st.Send(&pb.OuterSyncResponse{Part: &pb.OuterSyncResponse_Result{Result: a.result}}); err != nil {
			return err
		}
	}
	if a.chunks == nil {
		a.chunks = cut(a.params, 1000)
	}
	for _, c := range a.chunks {
		if err := st.Send(&pb.OuterSyncResponse{Part: &pb.OuterSyncResponse_Chunk{Chunk: c}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *outerService) contribute(r *received[*pb.OuterSyncStart]) (*outerAnswer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r.raw)
	s.starts, s.bodies = append(s.starts, r.start), append(s.bodies, r.body)
	if s.unavailable > 0 {
		s.unavailable--
		return nil, status.Error(codes.Unavailable, "restarting")
	}
	if s.refuse != codes.OK {
		return nil, status.Error(s.refuse, "refused")
	}
	if ref := r.start.GetRef(); ref.GetJobId() != "job-i1" || ref.GetAttempt() != 2 {
		return nil, status.Errorf(codes.FailedPrecondition, "not the island's attempt: %v", ref)
	}
	if r.start.GetSize() != int64(len(r.body)) {
		return nil, status.Errorf(codes.InvalidArgument, "%d bytes announced, %d sent", r.start.GetSize(), len(r.body))
	}
	if len(r.body) > 0 {
		if r.start.GetOuterStep() != s.step {
			return nil, status.Errorf(codes.InvalidArgument, "contribution for step %d at step %d", r.start.GetOuterStep(), s.step)
		}
		pg, err := s.decode(r.body)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		s.pgs = append(s.pgs, pg)
		for i := range s.theta {
			s.theta[i] = float32(float64(s.theta[i]) - float64(pg[i]))
		}
		s.step++
	}
	a := &outerAnswer{result: &pb.OuterSyncResult{OuterStep: s.step, Done: s.step == s.steps}, params: f32(s.theta)}
	if s.tamper != nil {
		s.tamper(a)
	}
	return a, nil
}

func (s *outerService) decode(b []byte) ([]float32, error) {
	if s.int8 {
		q, err := quant.Decode(b, len(s.theta))
		if err != nil {
			return nil, err
		}
		return q.Dequantize(), nil
	}
	if len(b) != 4*len(s.theta) {
		return nil, errors.New("wrong length")
	}
	pg := make([]float32, len(s.theta))
	for i := range pg {
		pg[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return pg, nil
}

func f32(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

const outerDim = 1000

var islandRef = &pb.RankRef{WorkerId: "w-1", JobId: "job-i1", Attempt: 2, Rank: 0}

func startOuter(t *testing.T, int8 bool) (*outerService, apiv1.PoolWorkerServiceClient) {
	t.Helper()
	theta := make([]float32, outerDim)
	for i := range theta {
		theta[i] = float32(i%13) / 13
	}
	svc := &outerService{int8: int8, theta: theta, steps: 3}
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

func newOuter(t *testing.T, c apiv1.PoolWorkerServiceClient, int8 bool) *remote.OuterSyncer {
	t.Helper()
	o, err := remote.NewOuterSyncer(c, islandRef, remote.OuterConfig{Dim: outerDim, Int8: int8, Seed: 7, Island: 1, Retry: fastRetry()})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// pgOf is a pseudo-gradient with values of many magnitudes and signs.
func pgOf(step int64) []float32 {
	pg := make([]float32, outerDim)
	for i := range pg {
		pg[i] = float32(math.Sin(float64(i)+float64(step))) * float32(1+i%5) * 1e-3
	}
	return pg
}

func TestOuterSyncFloat32(t *testing.T) {
	svc, c := startOuter(t, false)
	o := newOuter(t, c, false)
	join, err := o.Join(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	theta0 := slices.Clone(svc.theta)
	if join.Step != 0 || join.Done || join.Late || !slices.Equal(join.Params, theta0) {
		t.Fatalf("join answered step %d done %t late %t", join.Step, join.Done, join.Late)
	}
	if len(svc.reqs) != 1 {
		t.Fatalf("%d requests for a join", len(svc.reqs))
	}
	if len(svc.bodies[0]) != 0 || svc.starts[0].GetSize() != 0 {
		t.Fatalf("join carried %d pseudo-gradient bytes, announced %d", len(svc.bodies[0]), svc.starts[0].GetSize())
	}
	for k := int64(0); k < 3; k++ {
		pg := pgOf(k)
		s, err := o.Contribute(t.Context(), k, pg, 250)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range svc.pgs[k] {
			if math.Float32bits(v) != math.Float32bits(pg[i]) {
				t.Fatalf("step %d: server got pg[%d] = %v, sent %v", k, i, v, pg[i])
			}
		}
		if s.Step != k+1 || s.Done != (k == 2) || !slices.Equal(s.Params, svc.theta) {
			t.Fatalf("contribution %d answered %+v", k, s.Step)
		}
	}
	if r := svc.starts[1]; r.GetWeight() != 250 || r.GetOuterStep() != 0 || len(svc.bodies[1]) != 4*outerDim {
		t.Fatalf("contribution request: weight %v step %d, %d bytes", r.GetWeight(), r.GetOuterStep(), len(svc.bodies[1]))
	}
	svc.tamper = func(a *outerAnswer) { a.result.Late = true }
	if s, err := o.Join(t.Context()); err != nil || !s.Late || !s.Done {
		t.Fatalf("flags not passed on: %+v, %v", s, err)
	}
}

// TestOuterSyncInt8: the server decodes what an int8 island sends to
// within one quantization step (its block's scale) of the float32
// pseudo-gradient, from about a quarter of the bytes.
func TestOuterSyncInt8(t *testing.T) {
	svc, c := startOuter(t, true)
	o := newOuter(t, c, true)
	pg := pgOf(0)
	if _, err := o.Contribute(t.Context(), 0, pg, 1); err != nil {
		t.Fatal(err)
	}
	q, err := quant.Decode(svc.bodies[0], outerDim)
	if err != nil {
		t.Fatalf("not an FLQ8 encoding: %v", err)
	}
	if n := len(svc.bodies[0]); n*3 > 4*outerDim {
		t.Fatalf("int8 pseudo-gradient of %d bytes, float32 would be %d", n, 4*outerDim)
	}
	got := svc.pgs[0]
	var exact int
	for i, v := range got {
		step := float64(q.Scale(i))
		if d := math.Abs(float64(v) - float64(pg[i])); d > step*(1+1e-6) {
			t.Fatalf("pg[%d]: decoded %v, sent %v: off by %g, more than the step %g", i, v, pg[i], d, step)
		}
		if v == pg[i] {
			exact++
		}
	}
	if exact == outerDim {
		t.Fatal("every value decoded exactly: not quantized")
	}
}

// TestOuterSyncRetriesAreIdentical: a contribution retried through
// UNAVAILABLE answers is the same request byte for byte, and so is the
// one an island restarted at the same outer step sends; int8 rounding
// differs between steps.
func TestOuterSyncRetriesAreIdentical(t *testing.T) {
	svc, c := startOuter(t, true)
	svc.unavailable = 3
	o := newOuter(t, c, true)
	pg := pgOf(0)
	if _, err := o.Contribute(t.Context(), 0, pg, 10); err != nil {
		t.Fatalf("contribution after three unavailable answers: %v", err)
	}
	if len(svc.reqs) != 4 {
		t.Fatalf("%d requests, want 4", len(svc.reqs))
	}
	for i, b := range svc.reqs[1:] {
		if !bytes.Equal(b, svc.reqs[0]) {
			t.Fatalf("retry %d differs from the first request", i+1)
		}
	}

	// A restarted island: a new syncer, the same step, the same bytes.
	svc.step, svc.unavailable = 0, 0
	if _, err := newOuter(t, c, true).Contribute(t.Context(), 0, pg, 10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(svc.reqs[4], svc.reqs[0]) {
		t.Fatal("a restarted island's contribution differs")
	}
	if _, err := o.Contribute(t.Context(), 1, pg, 10); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(svc.bodies[0], svc.bodies[5]) {
		t.Fatal("steps 0 and 1 rounded the same pseudo-gradient identically: the seed ignores the step")
	}
}

func TestOuterSyncBadAnswersRefused(t *testing.T) {
	svc, c := startOuter(t, false)
	o := newOuter(t, c, false)
	cases := map[string]func(*outerAnswer){
		"short params":  func(a *outerAnswer) { a.params = a.params[:len(a.params)-4] },
		"long params":   func(a *outerAnswer) { a.params = append(a.params, 0, 0, 0, 0) },
		"ragged params": func(a *outerAnswer) { a.params = a.params[:len(a.params)-1] },
		"no params":     func(a *outerAnswer) { a.params = nil },
		"NaN": func(a *outerAnswer) {
			binary.LittleEndian.PutUint32(a.params[8:], math.Float32bits(float32(math.NaN())))
		},
		"Inf": func(a *outerAnswer) {
			binary.LittleEndian.PutUint32(a.params[4*(outerDim-1):], math.Float32bits(float32(math.Inf(1))))
		},
		"negative step": func(a *outerAnswer) { a.result.OuterStep = -1 },
		"no result":     func(a *outerAnswer) { a.result = nil },
		"repeated chunk": func(a *outerAnswer) {
			cs := cut(a.params, 1000)
			a.chunks = append(cs[:2:2], cs[1:]...)
		},
		"chunks swapped": func(a *outerAnswer) {
			cs := cut(a.params, 1000)
			cs[0], cs[1] = cs[1], cs[0]
			a.chunks = cs
		},
		"empty chunk": func(a *outerAnswer) {
			a.chunks = append([]*pb.SyncChunk{{Offset: 0}}, cut(a.params, 1000)...)
		},
	}
	for name, tamper := range cases {
		t.Run(name, func(t *testing.T) {
			svc.mu.Lock()
			svc.tamper, svc.step = tamper, 0
			svc.mu.Unlock()
			if _, err := o.Join(t.Context()); !errors.Is(err, remote.ErrBadResponse) {
				t.Fatalf("join: %v, want ErrBadResponse", err)
			}
			if _, err := o.Contribute(t.Context(), 0, pgOf(0), 1); !errors.Is(err, remote.ErrBadResponse) {
				t.Fatalf("contribute: %v, want ErrBadResponse", err)
			}
		})
	}
	svc.tamper = nil

	// Refusals are not retried.
	svc.refuse = codes.FailedPrecondition
	n := len(svc.reqs)
	if _, err := o.Contribute(t.Context(), 0, pgOf(0), 1); !remote.IsRefused(err) || code(err) != codes.FailedPrecondition {
		t.Fatalf("refused contribution: %v", err)
	}
	if len(svc.reqs) != n+1 {
		t.Fatalf("%d calls for a refusal", len(svc.reqs)-n)
	}
	svc.refuse = codes.OK

	bad := map[string]func() error{
		"short pseudo-gradient": func() error { _, err := o.Contribute(t.Context(), 0, pgOf(0)[1:], 1); return err },
		"zero weight":           func() error { _, err := o.Contribute(t.Context(), 0, pgOf(0), 0); return err },
		"NaN weight":            func() error { _, err := o.Contribute(t.Context(), 0, pgOf(0), math.NaN()); return err },
		"Inf weight":            func() error { _, err := o.Contribute(t.Context(), 0, pgOf(0), math.Inf(1)); return err },
		"negative step":         func() error { _, err := o.Contribute(t.Context(), -1, pgOf(0), 1); return err },
		"no client": func() error {
			_, err := remote.NewOuterSyncer(nil, islandRef, remote.OuterConfig{Dim: 1})
			return err
		},
		"no attempt": func() error {
			_, err := remote.NewOuterSyncer(c, &pb.RankRef{WorkerId: "w-1", JobId: "job-i1"}, remote.OuterConfig{Dim: 1})
			return err
		},
		"no parameters": func() error { _, err := remote.NewOuterSyncer(c, islandRef, remote.OuterConfig{}); return err },
		"island too big": func() error {
			_, err := remote.NewOuterSyncer(c, islandRef, remote.OuterConfig{Dim: 1, Island: 1 << 16})
			return err
		},
	}
	n = len(svc.reqs)
	for name, f := range bad {
		if err := f(); !errors.Is(err, remote.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if len(svc.reqs) != n {
		t.Fatalf("invalid calls reached the server")
	}
	big := remote.MaxSyncParams + 1
	if _, err := remote.NewOuterSyncer(c, islandRef, remote.OuterConfig{Dim: big}); !errors.Is(err, remote.ErrTooLarge) {
		t.Fatalf("%d parameters: %v, want ErrTooLarge", big, err)
	}
	huge := make([]float32, outerDim)
	huge[3] = 2 * quant.MaxAbs
	if _, err := newOuter(t, c, true).Contribute(t.Context(), 0, huge, 1); !errors.Is(err, remote.ErrInvalid) {
		t.Fatalf("unquantizable pseudo-gradient: %v, want ErrInvalid", err)
	}
}

// TestIslandOverGRPC runs the trainer's island loop over the syncer.
func TestIslandOverGRPC(t *testing.T) {
	svc, c := startOuter(t, true)
	m, err := trainerModel()
	if err != nil {
		t.Fatal(err)
	}
	svc.theta = m.Flatten()
	o, err := remote.NewOuterSyncer(c, islandRef, remote.OuterConfig{Dim: len(svc.theta), Int8: true, Seed: 3, Island: 1, Retry: fastRetry()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := trainer.RunIsland(t.Context(), trainer.IslandConfig{Job: "job-i1", Init: m, Data: tinyData(), Hyper: tinyHyper,
		Seed: 1, InnerSteps: 4, OuterSteps: 3, Outer: o})
	if err != nil {
		t.Fatal(err)
	}
	if res.Step != 3 || res.InnerSteps != 12 || len(svc.pgs) != 3 || res.Digest == m.HashHex() {
		t.Fatalf("island over gRPC: %+v, %d contributions", res, len(svc.pgs))
	}
}

var tinyHyper = sgd.Hyper{Epochs: 1, BatchSize: 8, LearningRate: 0.1, EvalBatchSize: 8}

func trainerModel() (*model.Model, error) { return train.InitMLP([]int{2, 2}, 1) }

// tinyData is a learnable 2-class problem of 40 examples.
func tinyData() *data.Dataset {
	d := &data.Dataset{Dim: 2, NumClasses: 2}
	for i := range 40 {
		x := float32(i%10) / 10
		d.Features = append(d.Features, x, 1-x)
		d.Labels = append(d.Labels, uint8(i%10/5))
	}
	return d
}
