package poolsvc

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// mlpSpec is a built-in job of ranks ranks averaging every 5 steps on
// an MLP of widths arch.
func mlpSpec(id string, ranks uint32, arch ...uint32) *pb.PoolJobSpec {
	sp := spec(id, ranks)
	sp.Program = &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: arch, BatchSize: 8, LearningRate: 0.1, SyncEvery: 5,
		Dataset: &pb.PoolDataset{Source: "mnist-train"}}}
	return sp
}

// vec is a deterministic vector of n values of many magnitudes and signs.
func vec(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 99))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-3)))
	}
	return v
}

// meanBytes is aggregator.WeightedMean over the whole vectors, encoded.
func meanBytes(t *testing.T, vs [][]float32, ws []float64) []byte {
	t.Helper()
	m, err := aggregator.WeightedMean(vs, ws)
	if err != nil {
		t.Fatal(err)
	}
	return encodeParams(m)
}

// spoolsLeft lists the files left in the service's spool.
func (e *env) spoolsLeft() []string {
	e.t.Helper()
	var left []string
	err := filepath.WalkDir(e.svc.spoolDir(), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			left = append(left, path)
		}
		if os.IsNotExist(err) {
			return nil
		}
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return left
}

// waitIntake waits until the rank's stream is past its start, taking its
// bytes in.
func (e *env) waitIntake(job string, attempt, rank uint32) {
	e.t.Helper()
	deadline := time.Now().Add(hangFor) // a hang guard only
	for {
		var open bool
		_ = e.svc.do(e.t.Context(), func() error {
			rs := e.svc.streams[rankAttempt{job, attempt, rank}]
			open = rs != nil && rs.intake
			return nil
		})
		if open {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no stream of job %s rank %d is taking its bytes in", job, rank)
		}
		runtime.Gosched()
	}
}

// waitSyncArrived waits until job's open average holds n contributions.
func (e *env) waitSyncArrived(job string, n int) {
	e.t.Helper()
	deadline := time.Now().Add(hangFor) // a hang guard only
	for e.syncArrived(job) != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("job %s's average holds %d contributions, want %d", job, e.syncArrived(job), n)
		}
		runtime.Gosched()
	}
}

type avgResult struct {
	mean []byte
	err  error
}

func (w *worker) averageAsync(r *pb.RankRef, step int64, weight float64, params []byte) <-chan avgResult {
	ch := make(chan avgResult, 1)
	go func() {
		m, err := w.average(r, step, weight, params)
		ch <- avgResult{m, err}
	}()
	return ch
}

func waitAvg(t *testing.T, what string, ch <-chan avgResult) []byte {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.mean
	case <-time.After(hangFor):
		t.Fatalf("%s: average not answered", what)
	}
	return nil
}

// TestAverageStreamsALargeModel: two ranks of a model of 3,003,000
// parameters, 12 MB of float32 each, past the 7 MiB one message could
// hold, stream their parameters in 1 MiB chunks at once; both get the
// weighted mean aggregator.WeightedMean forms from the whole vectors, to
// the bit, and the step leaves nothing in the spool.
func TestAverageStreamsALargeModel(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGangSpec(t, e, mlpSpec("big", 2, 1000, 3000))
	const dim = 1000*3000 + 3000
	if 4*dim <= 7<<20 {
		t.Fatalf("%d parameters fit the old cap", dim)
	}
	p0, p1 := vec(1, dim), vec(2, dim)
	c0 := ws[0].averageAsync(ref(ws[0], ls[0]), 5, 600, f32(p0...))
	c1 := ws[1].averageAsync(ref(ws[1], ls[1]), 5, 401, f32(p1...))
	want := meanBytes(t, [][]float32{p0, p1}, []float64{600, 401})
	for i, ch := range []<-chan avgResult{c0, c1} {
		if got := waitAvg(t, "rank average", ch); !bytes.Equal(got, want) {
			t.Fatalf("rank %d got %d bytes, not the whole vectors' weighted mean (%d bytes)", i, len(got), len(want))
		}
	}
	if left := e.spoolsLeft(); len(left) != 0 {
		t.Fatalf("spools left after the step: %v", left)
	}
	if j := e.job("big"); j.GetSyncBytesReceived() < 2*4*dim || j.GetSyncBytesSent() < 2*4*dim {
		t.Fatalf("sync traffic %d in, %d out for two ranks of %d bytes", j.GetSyncBytesReceived(), j.GetSyncBytesSent(), 4*dim)
	}
}

// TestAverageDoesNotDependOnArrivalOrder: three ranks arriving last to
// first get the mean of the vectors added in rank order, bit for bit.
func TestAverageDoesNotDependOnArrivalOrder(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGangSpec(t, e, mlpSpec("ord", 3, 300, 1000))
	const dim = 300*1000 + 1000
	ps := [][]float32{vec(3, dim), vec(4, dim), vec(5, dim)}
	weights := []float64{7, 1 << 30, 3}
	var chs [3]<-chan avgResult
	for i := 2; i >= 0; i-- {
		chs[i] = ws[i].averageAsync(ref(ws[i], ls[i]), 5, weights[i], f32(ps[i]...))
		if i > 0 {
			e.waitSyncArrived("ord", 3-i)
		}
	}
	want := meanBytes(t, ps, weights)
	for i, ch := range chs {
		if got := waitAvg(t, "rank average", ch); !bytes.Equal(got, want) {
			t.Fatalf("rank %d: not the rank-order weighted mean", i)
		}
	}
}

// TestAverageStreamAttacks: while rank 0 waits in an open step, rank 1
// (or someone else) sends contributions that break the stream in every
// way; each is refused with a reason, none reaches the step, and the
// step's mean is that of the two honest contributions.
func TestAverageStreamAttacks(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGangSpec(t, e, mlpSpec("j", 2, 600, 1000))
	const dim = 600*1000 + 1000
	const chunk = 256 << 10
	w0, w1 := ws[0], ws[1]
	r0, r1 := ref(w0, ls[0]), ref(w1, ls[1])
	p0, p1 := vec(6, dim), vec(7, dim)
	honest := f32(p1...)
	c0 := w0.averageAsync(r0, 5, 10, f32(p0...))
	e.waitSyncArrived("j", 1)

	start := &pb.AverageStart{Ref: r1, Step: 5, Weight: 20, Size: 4 * dim}
	nan := bytes.Clone(honest)
	binary.LittleEndian.PutUint32(nan[len(nan)-8:], math.Float32bits(float32(math.NaN())))
	cs := cut(honest, chunk)
	dup := append(append([]*pb.SyncChunk{}, cs[:3]...), cs[2:]...)
	swapped := append([]*pb.SyncChunk{}, cs...)
	swapped[1], swapped[2] = swapped[2], swapped[1]
	extra := append(append([]*pb.SyncChunk{}, cs...), &pb.SyncChunk{Offset: 4 * dim, Data: make([]byte, 4)})
	longer := proto.CloneOf(start)
	longer.Size = 4 * (dim + 1)
	shorter := proto.CloneOf(start)
	shorter.Size = 4 * (dim - 1)
	otherJob := e.submitAndPlace(t, "other", "worker-c")
	for _, tc := range []struct {
		name   string
		w      *worker
		start  *pb.AverageStart
		chunks []*pb.SyncChunk
		code   codes.Code
		says   string
	}{
		{"one value too many announced", w1, longer, cut(f32(vec(8, dim+1)...), chunk), codes.InvalidArgument, "the job's model has 601000 parameters"},
		{"one value too few announced", w1, shorter, cut(honest[:4*(dim-1)], chunk), codes.InvalidArgument, "the job's model has 601000 parameters"},
		{"bytes past the announced size", w1, start, extra, codes.InvalidArgument, "past the"},
		{"stream ends a value short", w1, start, cut(honest[:4*(dim-1)], chunk), codes.InvalidArgument, "too few values"},
		{"stream ends a chunk short", w1, start, cs[:len(cs)-1], codes.InvalidArgument, "too few values"},
		{"NaN in the last chunk", w1, start, cut(nan, chunk), codes.InvalidArgument, "is NaN"},
		{"a chunk twice", w1, start, dup, codes.InvalidArgument, "send each chunk once, in order"},
		{"chunks out of order", w1, start, swapped, codes.InvalidArgument, "send each chunk once, in order"},
		{"an empty chunk", w1, start, append([]*pb.SyncChunk{{Offset: 0}}, cs...), codes.InvalidArgument, "empty chunk"},
		{"start twice", w1, start, nil, codes.InvalidArgument, "not a chunk"},
		{"a rank of another job", otherJob, &pb.AverageStart{Ref: &pb.RankRef{WorkerId: otherJob.id, JobId: "j", Attempt: 1, Rank: 1},
			Step: 5, Weight: 20, Size: 4 * dim}, cs, codes.FailedPrecondition, "does not hold the lease"},
	} {
		a, err := tc.w.openAverage(tc.start)
		if err == nil {
			if tc.name == "start twice" {
				_ = a.send(&pb.AverageRequest{Part: &pb.AverageRequest_Start{Start: tc.start}})
			}
			a.chunks(tc.chunks...)
		}
		if a != nil {
			_, err = a.finish()
		}
		wantCode(t, tc.name, err, tc.code)
		if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.says) {
			t.Errorf("%s: refusal %q does not say %q", tc.name, msg, tc.says)
		}
		if n := e.syncArrived("j"); n != 1 {
			t.Fatalf("%s: the open step holds %d contributions", tc.name, n)
		}
	}

	// A second stream of rank 1 while its first takes its bytes in is
	// refused; the first goes on and completes the step.
	first, err := w1.openAverage(start)
	if err != nil {
		t.Fatal(err)
	}
	first.chunks(cs[:2]...)
	e.waitIntake("j", 1, 1)
	second, err := w1.openAverage(start)
	if err == nil {
		second.chunks(cs...)
		_, err = second.finish()
	}
	wantCode(t, "a second concurrent stream", err, codes.Unavailable)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "already streaming a contribution") {
		t.Errorf("second stream refused with %q", msg)
	}
	first.chunks(cs[2:]...)
	got, err := first.finish()
	if err != nil {
		t.Fatal(err)
	}
	want := meanBytes(t, [][]float32{p0, p1}, []float64{10, 20})
	if !bytes.Equal(got, want) || !bytes.Equal(waitAvg(t, "rank 0", c0), want) {
		t.Fatal("the step's mean is not the honest contributions'")
	}
	if left := e.spoolsLeft(); len(left) != 0 {
		t.Fatalf("refused or spent contributions left spools: %v", left)
	}
	_ = e.svc.do(t.Context(), func() error {
		if len(e.svc.streams) != 0 {
			t.Errorf("stream slots left after every call ended: %v", e.svc.streams)
		}
		return nil
	})
}

// submitAndPlace runs a one-rank command job on a worker of its own.
func (e *env) submitAndPlace(t *testing.T, job, name string) *worker {
	t.Helper()
	e.submit(spec(job, 1), nil)
	w := e.register(name, oneRank)
	res, err := w.heartbeat()
	if err != nil || len(res.GetStart()) != 1 || res.GetStart()[0].GetJobId() != job {
		t.Fatalf("placing %s: %v %v", job, res, err)
	}
	return w
}

// bigDiLoCoSpec is a DiLoCo job of 3 islands and 1 outer step on an MLP
// of 311,010 parameters, whose pseudo-gradients stream in many chunks.
func bigDiLoCoSpec(id string, int8 bool) *pb.PoolJobSpec {
	sp := dilocoSpec(id, 3, 1)
	sp.GetBuiltin().Arch = []uint32{300, 1000, 10}
	sp.Diloco.Int8 = int8
	return sp
}

// TestOuterSyncStreamAttacks: island 2 sends pseudo-gradients that break
// the stream, or the job's norm bound only once every chunk has passed;
// each is refused with a reason and none reaches the step, which then
// equals the outer step of the three honest contributions.
func TestOuterSyncStreamAttacks(t *testing.T) {
	e := newEnv(t, nil)
	sp := bigDiLoCoSpec("dl", false)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 3)
	ref := newOuterRef(t, sp, aggregator.DefaultOuterLR, aggregator.DefaultOuterMomentum)
	dim := len(ref.theta)
	const chunk = 64 << 10
	bound := max(1, l2(ref.theta))
	pgs := [][]float32{pseudoGrad(0, 0, dim), pseudoGrad(1, 0, dim), pseudoGrad(2, 0, dim)}
	// Past the bound only in the last chunk: every chunk before is honest.
	over := bytes.Clone(f32(pgs[2]...))
	binary.LittleEndian.PutUint32(over[len(over)-4:], math.Float32bits(float32(2*bound)))
	inf := bytes.Clone(f32(pgs[2]...))
	binary.LittleEndian.PutUint32(inf[len(inf)-4:], math.Float32bits(float32(math.Inf(-1))))
	honest := f32(pgs[2]...)
	cs := cut(honest, chunk)
	dup := append(append([]*pb.SyncChunk{}, cs[:5]...), cs[4:]...)
	swapped := append([]*pb.SyncChunk{}, cs...)
	swapped[3], swapped[4] = swapped[4], swapped[3]
	start := &pb.OuterSyncStart{Ref: is[2].ref(), OuterStep: 0, Weight: 20, Size: int64(len(honest))}
	longer := proto.CloneOf(start)
	longer.Size += 4
	for _, tc := range []struct {
		name   string
		start  *pb.OuterSyncStart
		chunks []*pb.SyncChunk
		says   string
	}{
		{"norm over the bound at the last value", start, cut(over, chunk), "exceeds the job's bound"},
		{"-Inf in the last chunk", start, cut(inf, chunk), "is -Inf"},
		{"one value too many", longer, cut(append(bytes.Clone(honest), 0, 0, 0, 0), chunk), "float32 pseudo-gradients of"},
		{"stream ends a chunk short", start, cs[:len(cs)-1], "too few values"},
		{"a chunk twice", start, dup, "send each chunk once, in order"},
		{"chunks out of order", start, swapped, "send each chunk once, in order"},
	} {
		o, err := is[2].w.openOuter(tc.start)
		if err == nil {
			o.chunks(tc.chunks...)
		}
		if o != nil {
			_, err = o.finish()
		}
		wantCode(t, tc.name, err, codes.InvalidArgument)
		if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.says) {
			t.Errorf("%s: refusal %q does not say %q", tc.name, msg, tc.says)
		}
		if st, n := e.outerAt("dl"); st != 0 || n != 0 {
			t.Fatalf("%s reached the round: step %d, %d contributions", tc.name, st, n)
		}
	}
	// Another island's name, from island 2's worker.
	other := &pb.RankRef{WorkerId: is[2].w.id, JobId: "dl-i1", Attempt: is[1].l.GetAttempt()}
	_, _, err := is[2].w.outerSync(other, 0, honest, 20)
	wantCode(t, "a contribution in another island's name", err, codes.FailedPrecondition)

	// A second stream of island 2 while its first takes its bytes in.
	first, err := is[2].w.openOuter(start)
	if err != nil {
		t.Fatal(err)
	}
	first.chunks(cs[:3]...)
	e.waitIntake("dl-i2", is[2].l.GetAttempt(), 0)
	_, _, err = is[2].w.outerSync(is[2].ref(), 0, honest, 20)
	wantCode(t, "a second concurrent stream", err, codes.Unavailable)

	c0 := is[0].syncAsync(0, f32(pgs[0]...), 20)
	c1 := is[1].syncAsync(0, f32(pgs[1]...), 20)
	e.waitArrived("dl", 0, 2)
	first.chunks(cs[3:]...)
	r2, err := first.finish()
	if err != nil {
		t.Fatal(err)
	}
	want := ref.step(t, pgs, []float64{20, 20, 20})
	for i, r := range []*outerResp{mustWait(t, "island 0", c0), mustWait(t, "island 1", c1), r2} {
		if r.GetOuterStep() != 1 || !r.GetDone() || !bytes.Equal(r.GetParams(), want) {
			t.Fatalf("island %d: step %d done %v, θ equal to the honest step %v", i, r.GetOuterStep(), r.GetDone(), bytes.Equal(r.GetParams(), want))
		}
	}
	if left := e.spoolsLeft(); len(left) != 0 {
		t.Fatalf("spools left: %v", left)
	}
}

// TestOuterSyncStreamsInt8: FLQ8 pseudo-gradients stream in chunks that
// cut through the header, the block scales and the codes; the step is the
// outer step of the dequantized whole encodings. A scale that breaks the
// format in a later chunk, or a header that names another length, is
// refused.
func TestOuterSyncStreamsInt8(t *testing.T) {
	e := newEnv(t, nil)
	sp := bigDiLoCoSpec("dl", true)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 3)
	ref := newOuterRef(t, sp, aggregator.DefaultOuterLR, aggregator.DefaultOuterMomentum)
	dim := len(ref.theta)
	rng := rand.NewPCG(5, 6)
	encs := make([][]byte, 3)
	deqs := make([][]float32, 3)
	for i := range 3 {
		q, err := quant.Quantize(pseudoGrad(i, 0, dim), quant.DefaultBlock, rng)
		if err != nil {
			t.Fatal(err)
		}
		if encs[i], err = q.MarshalBinary(); err != nil {
			t.Fatal(err)
		}
		deqs[i] = q.Dequantize()
	}
	const chunk = 1000 // cuts the header, and the scales many times
	badScale := bytes.Clone(encs[2])
	binary.LittleEndian.PutUint32(badScale[13+4*500:], math.Float32bits(-1))
	otherLen := bytes.Clone(encs[2])
	binary.LittleEndian.PutUint32(otherLen[5:], uint32(dim-1))
	for _, tc := range []struct {
		name string
		enc  []byte
		says string
	}{
		{"a negative scale in a later chunk", badScale, "scale 500"},
		{"a header naming one value less", otherLen, "values, want"},
		{"cut short", encs[2][:len(encs[2])-1], "int8 (FLQ8)"},
	} {
		o, err := is[2].w.openOuter(&pb.OuterSyncStart{Ref: is[2].ref(), Weight: 20, Size: int64(len(tc.enc))})
		if err == nil {
			o.chunks(cut(tc.enc, chunk)...)
		}
		if o != nil {
			_, err = o.finish()
		}
		wantCode(t, tc.name, err, codes.InvalidArgument)
		if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.says) {
			t.Errorf("%s: refusal %q does not say %q", tc.name, msg, tc.says)
		}
	}
	var chs []<-chan *outerResp
	for i, x := range is {
		ch := make(chan *outerResp, 1)
		go func() {
			o, err := x.w.openOuter(&pb.OuterSyncStart{Ref: x.ref(), Weight: 20, Size: int64(len(encs[i]))})
			if o == nil {
				t.Errorf("island %d: %v", i, err)
				ch <- nil
				return
			}
			if err == nil {
				o.chunks(cut(encs[i], chunk)...)
			}
			r, err := o.finish()
			if err != nil {
				t.Errorf("island %d: %v", i, err)
			}
			ch <- r
		}()
		chs = append(chs, ch)
	}
	want := ref.step(t, deqs, []float64{20, 20, 20})
	for i, ch := range chs {
		select {
		case r := <-ch:
			if r == nil || r.GetOuterStep() != 1 || !bytes.Equal(r.GetParams(), want) {
				t.Fatalf("island %d: not the outer step of the dequantized contributions", i)
			}
		case <-time.After(hangFor):
			t.Fatalf("island %d not answered", i)
		}
	}
}
