package poolsvc

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// scaled is v times f.
func scaled(v []float32, f float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(float64(x) * f)
	}
	return out
}

// jobLogs reads every line of a job's log.
func (e *env) jobLogs(job string) string {
	e.t.Helper()
	c, ctx := e.ops()
	stream, err := c.JobLogs(ctx, &pb.JobLogsRequest{JobId: job})
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for {
		res, err := stream.Recv()
		if err != nil {
			break
		}
		for _, l := range res.GetLines() {
			b.WriteString(l.GetText() + "\n")
		}
	}
	return b.String()
}

// TestDiLoCoPoisonedPseudoGradientRefused: a hostile island sends a
// pseudo-gradient of finite but huge values (1e30 each, or past the
// bound by a tenth), float32 or int8. Finite values alone would let it replace θ with
// about −1e30; the job's norm bound (‖θ₀‖, at least 1) refuses it with a
// reason, and the honest islands' step closes without it once the grace
// window has passed, equal to the outer step of their contributions only.
func TestDiLoCoPoisonedPseudoGradientRefused(t *testing.T) {
	for _, int8 := range []bool{false, true} {
		name := "float32"
		if int8 {
			name = "int8"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil)
			sp := dilocoSpec("dl", 3, 2)
			sp.Diloco.Int8, sp.Diloco.Quorum, sp.Diloco.Grace = int8, 2, durationpb.New(4*time.Second)
			e.submit(sp, nil)
			is := placeIslands(t, e, "dl", "host", 3)
			ref := newOuterRef(t, sp, aggregator.DefaultOuterLR, aggregator.DefaultOuterMomentum)
			dim := len(ref.theta)
			bound := max(1, l2(ref.theta))
			rng := rand.NewPCG(3, 4)
			enc := func(v []float32) ([]byte, []float32) {
				if !int8 {
					return f32(v...), v
				}
				q, err := quant.Quantize(v, quant.DefaultBlock, rng)
				if err != nil {
					t.Fatal(err)
				}
				b, err := q.MarshalBinary()
				if err != nil {
					t.Fatal(err)
				}
				return b, q.Dequantize()
			}
			huge := make([]float32, dim)
			for i := range huge {
				huge[i] = 1e30
			}
			dir := pseudoGrad(2, 0, dim)
			over := scaled(dir, 1.1*bound/l2(dir))
			for _, tc := range []struct {
				name string
				pg   []float32
			}{
				{"1e30 in every value", huge},
				{"10% over the bound", over},
			} {
				b, _ := enc(tc.pg)
				_, err := is[2].sync(0, b, 20)
				wantCode(t, tc.name, err, codes.InvalidArgument)
				if msg := status.Convert(err).Message(); !strings.Contains(msg, "exceeds the job's bound") {
					t.Fatalf("%s: refusal %q does not name the bound", tc.name, msg)
				}
			}
			if st, n := e.outerAt("dl"); st != 0 || n != 0 {
				t.Fatalf("a refused pseudo-gradient reached the round: step %d, %d contributions", st, n)
			}

			// The honest islands' step waits its grace window for the
			// refused island, which is still running, then closes
			// without it.
			b0, d0 := enc(pseudoGrad(0, 0, dim))
			b1, d1 := enc(pseudoGrad(1, 0, dim))
			c0 := is[0].syncAsync(0, b0, 20)
			c1 := is[1].syncAsync(0, b1, 20)
			e.waitArrived("dl", 0, 2)
			e.clk.Advance(3 * time.Second)
			if st, n := e.outerAt("dl"); st != 0 || n != 2 {
				t.Fatalf("closed before the grace ran out: step %d, %d", st, n)
			}
			e.clk.Advance(time.Second)
			want := ref.step(t, [][]float32{d0, d1}, []float64{20, 20})
			for i, ch := range []<-chan syncResult{c0, c1} {
				if r := mustWait(t, "honest contribution", ch); r.GetOuterStep() != 1 || !bytes.Equal(r.GetParams(), want) {
					t.Fatalf("island %d: step %d, θ equal to the honest step %v", i, r.GetOuterStep(), bytes.Equal(r.GetParams(), want))
				}
			}
			if p := e.job("dl"); !slices.Equal(p.GetDiloco().GetLastIslands(), []uint32{0, 1}) || p.GetState() != running {
				t.Fatalf("parent %v", p)
			}
			// A pseudo-gradient within the bound is taken: the bound does not
			// refuse honest work of any size up to it.
			in, din := enc(scaled(dir, 0.9*bound/l2(dir)))
			cs := []<-chan syncResult{is[2].syncAsync(1, in, 20)}
			e.waitArrived("dl", 1, 1)
			b0, d0 = enc(pseudoGrad(0, 1, dim))
			b1, d1 = enc(pseudoGrad(1, 1, dim))
			cs = append(cs, is[0].syncAsync(1, b0, 20), is[1].syncAsync(1, b1, 20))
			want = ref.step(t, [][]float32{d0, d1, din}, []float64{20, 20, 20})
			for i, ch := range cs {
				if r := mustWait(t, "contribution within the bound", ch); r.GetOuterStep() != 2 || !r.GetDone() || !bytes.Equal(r.GetParams(), want) {
					t.Fatalf("contribution %d: step %d done %v, θ equal %v", i, r.GetOuterStep(), r.GetDone(), bytes.Equal(r.GetParams(), want))
				}
			}
		})
	}
}

// TestDiLoCoWeightClaimCannotDominate: a hostile island claims 2^31
// examples (the largest weight OuterSync takes) with a pseudo-gradient
// within the norm bound that points against the honest ones. Weighted by
// its claim it would be 99.99998% of the outer step; counted as at most
// one example more than the round's lightest island it is a third, and
// the job's log says whose claim was cut. A claim of 1 costs the liar
// only its own share.
func TestDiLoCoWeightClaimCannotDominate(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 3, 2)
	sp.Diloco.OuterLearningRate, sp.Diloco.OuterMomentum = 1, new(float64)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 3)
	ref := newOuterRef(t, sp, 1, 0)
	dim := len(ref.theta)
	bound := max(1, l2(ref.theta))
	honest := [][]float32{pseudoGrad(0, 0, dim), pseudoGrad(1, 0, dim)}
	evil := scaled(honest[0], -0.9*bound/l2(honest[0]))

	run := func(k int64, evilWeight float64, counted []float64) {
		t.Helper()
		chs := []<-chan syncResult{
			is[0].syncAsync(k, f32(honest[0]...), 2000),
			is[1].syncAsync(k, f32(honest[1]...), 1999),
			is[2].syncAsync(k, f32(evil...), evilWeight),
		}
		want := ref.step(t, [][]float32{honest[0], honest[1], evil}, counted)
		for i, ch := range chs {
			if r := mustWait(t, "contribution", ch); r.GetOuterStep() != k+1 || !bytes.Equal(r.GetParams(), want) {
				t.Fatalf("step %d, island %d: θ equal to the clamped mean %v", k, i, bytes.Equal(r.GetParams(), want))
			}
		}
	}
	before := slices.Clone(ref.theta)
	run(0, 1<<31, []float64{2000, 1999, 2000})
	// The outer step moved θ by the mean; the liar's third of it, not all.
	var moved, liar float64
	for i := range before {
		d := float64(before[i] - ref.theta[i])
		moved += d * d
	}
	liar = l2(evil)
	if math.Sqrt(moved) > 0.5*liar {
		t.Fatalf("θ moved by %.4g, the liar's pseudo-gradient is %.4g: it dominated", math.Sqrt(moved), liar)
	}
	if logs := e.jobLogs("dl"); !strings.Contains(logs, "island 2 claimed 2.147483648e+09 examples, counted as 2000") {
		t.Fatalf("the job's log does not say the claim was cut:\n%s", logs)
	}
	run(1, 1, []float64{2, 2, 1})
}

// TestDiLoCoIslandActsOnlyForItsOwnLease: an island's worker contributes
// in another island's name, and a worker whose island was declared lost
// (and requeued) keeps contributing with its old lease. Neither reaches a
// round: the island is the lease's, bound to worker, job and attempt.
func TestDiLoCoIslandActsOnlyForItsOwnLease(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 3, 2)
	sp.Diloco.Quorum = 2
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 3)
	ref := newOuterRef(t, sp, aggregator.DefaultOuterLR, aggregator.DefaultOuterMomentum)
	dim := len(ref.theta)
	pg := f32(pseudoGrad(0, 0, dim)...)

	other := &pb.RankRef{WorkerId: is[0].w.id, JobId: "dl-i1", Attempt: is[1].l.GetAttempt()}
	_, _, err := is[0].w.outerSync(other, 0, pg, 20)
	wantCode(t, "contribution in another island's name", err, codes.FailedPrecondition)
	if st, n := e.outerAt("dl"); st != 0 || n != 0 {
		t.Fatalf("a contribution in another's name reached the round: step %d, %d", st, n)
	}

	// Island 2's worker falls silent and is declared lost; islands 0 and 1
	// take the step without it.
	c0 := is[0].syncAsync(0, pg, 20)
	c1 := is[1].syncAsync(0, f32(pseudoGrad(1, 0, dim)...), 20)
	e.waitArrived("dl", 0, 2)
	e.clk.Advance(3 * time.Second)
	p0, p1 := is[0].w.poll(), is[1].w.poll()
	e.clk.Advance(3 * time.Second)
	recv(t, p0)
	recv(t, p1)
	want := ref.step(t, [][]float32{pseudoGrad(0, 0, dim), pseudoGrad(1, 0, dim)}, []float64{20, 20})
	for i, ch := range []<-chan syncResult{c0, c1} {
		if r := mustWait(t, "contribution", ch); r.GetOuterStep() != 1 || !bytes.Equal(r.GetParams(), want) {
			t.Fatalf("island %d: step %d", i, r.GetOuterStep())
		}
	}
	if k := e.job("dl-i2"); k.GetState() != queued {
		t.Fatalf("island 2 after its worker was lost: %v", k)
	}
	// Its old lease can neither contribute to the open step nor join: the
	// worker must register again.
	for _, tc := range []struct {
		name string
		pg   []byte
		step int64
	}{
		{"contribution after the island was dropped", f32(pseudoGrad(2, 1, dim)...), 1},
		{"late contribution after the island was dropped", f32(pseudoGrad(2, 0, dim)...), 0},
		{"join after the island was dropped", nil, 0},
	} {
		_, err := is[2].sync(tc.step, tc.pg, 20)
		wantCode(t, tc.name, err, codes.NotFound)
	}
	// Registered again, it is given the island's new attempt; the old
	// attempt's lease is still nobody's.
	w := e.register("host-c2", oneRank)
	res, err := w.heartbeat()
	if err != nil || len(res.GetStart()) != 1 || res.GetStart()[0].GetJobId() != "dl-i2" || res.GetStart()[0].GetAttempt() != 2 {
		t.Fatalf("%v %v", res, err)
	}
	old := &pb.RankRef{WorkerId: w.id, JobId: "dl-i2", Attempt: is[2].l.GetAttempt()}
	_, _, err = w.outerSync(old, 1, f32(pseudoGrad(2, 1, dim)...), 20)
	wantCode(t, "contribution with the dropped attempt's lease", err, codes.FailedPrecondition)
	if st, n := e.outerAt("dl"); st != 1 || n != 0 {
		t.Fatalf("a dropped island's contribution reached the round: step %d, %d", st, n)
	}
	if n := e.job("dl").GetDiloco().GetLateContributions(); n != 0 {
		t.Fatalf("a dropped island's call counted as %d late contributions", n)
	}
}

func TestCountedWeights(t *testing.T) {
	for _, tc := range []struct {
		in, want []float64
		clamped  []int
	}{
		{[]float64{2000, 2001, 2000}, []float64{2000, 2001, 2000}, nil},
		{[]float64{7}, []float64{7}, nil},
		{[]float64{2000, 1 << 31, 1999}, []float64{2000, 2000, 1999}, []int{1}},
		{[]float64{5, 1, 5}, []float64{2, 1, 2}, []int{0, 2}},
	} {
		got, clamped := countedWeights(tc.in)
		if !slices.Equal(got, tc.want) || !slices.Equal(clamped, tc.clamped) {
			t.Errorf("countedWeights(%v) = %v, %v; want %v, %v", tc.in, got, clamped, tc.want, tc.clamped)
		}
	}
}
