package poolsvc

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

const (
	cancelled = pb.PoolJobState_POOL_JOB_STATE_CANCELLED
	failed    = pb.PoolJobState_POOL_JOB_STATE_FAILED
	innerH    = 10
)

// dilocoSpec is a DiLoCo job of islands islands and outerSteps outer steps
// of innerH inner steps, on a small MLP.
func dilocoSpec(id string, islands uint32, outerSteps int64) *pb.PoolJobSpec {
	return &pb.PoolJobSpec{Id: id, Ranks: 1, PerRank: oneRank, MaxRestarts: 2, TotalSteps: outerSteps * innerH,
		OutputModel: "mnist-diloco",
		Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: []uint32{4, 3, 2}, InitSeed: 7, BatchSize: 8,
			LearningRate: 0.1, Dataset: &pb.PoolDataset{Source: "mnist-train"}}},
		Diloco: &pb.PoolDiLoCo{Islands: islands, InnerSteps: innerH}}
}

// island is one island's rank as its worker sees it, with the sync bytes
// it sent and received.
type island struct {
	t *testing.T
	w *worker
	l *pb.RankLease

	mu       sync.Mutex
	sent     int64 // request bytes: the server's sync_bytes_received
	received int64 // response bytes: the server's sync_bytes_sent
}

func (is *island) ref() *pb.RankRef { return ref(is.w, is.l) }

func (is *island) sync(step int64, pg []byte, weight float64) (*outerResp, error) {
	res, sent, err := is.w.outerSync(is.ref(), step, pg, weight)
	if err == nil {
		is.mu.Lock()
		is.sent += sent
		is.received += res.received
		is.mu.Unlock()
	}
	return res, err
}

type syncResult struct {
	res *outerResp
	err error
}

// syncAsync contributes in the background; the result arrives on the
// channel.
func (is *island) syncAsync(step int64, pg []byte, weight float64) <-chan syncResult {
	ch := make(chan syncResult, 1)
	go func() {
		res, err := is.sync(step, pg, weight)
		ch <- syncResult{res, err}
	}()
	return ch
}

func (is *island) join() *outerResp {
	is.t.Helper()
	res, err := is.sync(0, nil, 0)
	if err != nil {
		is.t.Fatalf("island %d joins: %v", is.l.GetIsland(), err)
	}
	return res
}

func (is *island) bytes() (sent, received int64) {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.sent, is.received
}

func wait(t *testing.T, what string, ch <-chan syncResult) (*outerResp, error) {
	t.Helper()
	select {
	case r := <-ch:
		return r.res, r.err
	case <-time.After(hangFor):
		t.Fatalf("%s: outer sync not answered", what)
	}
	return nil, nil
}

func mustWait(t *testing.T, what string, ch <-chan syncResult) *outerResp {
	t.Helper()
	res, err := wait(t, what, ch)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return res
}

// placeIslands registers one worker per island of job (named prefix-N)
// and returns the islands by index, checking each lease.
func placeIslands(t *testing.T, e *env, job, prefix string, n int) []*island {
	t.Helper()
	out := make([]*island, n)
	for i := range n {
		w := e.register(prefix+"-"+string(rune('a'+i)), oneRank)
		res, err := w.heartbeat()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.GetStart()) != 1 {
			t.Fatalf("worker %d got %v, want one island's lease", i, res)
		}
		l := res.GetStart()[0]
		k := int(l.GetIsland())
		if k >= n || out[k] != nil || l.GetJobId() != job+islandSuffix(k) || l.GetWorldSize() != 1 {
			t.Fatalf("lease %v", l)
		}
		out[k] = &island{t: t, w: w, l: l}
	}
	return out
}

// outerRef mirrors the service's outer loop with the aggregator's own
// optimizer, to compare θ bit for bit.
type outerRef struct {
	o     *aggregator.Outer
	theta []float32
}

func newOuterRef(t *testing.T, sp *pb.PoolJobSpec, lr, mu float64) *outerRef {
	t.Helper()
	var arch []int
	for _, w := range sp.GetBuiltin().GetArch() {
		arch = append(arch, int(w))
	}
	m, err := train.InitMLP(arch, sp.GetBuiltin().GetInitSeed())
	if err != nil {
		t.Fatal(err)
	}
	theta := m.Flatten()
	o, err := aggregator.NewOuter(len(theta), aggregator.WithServerLR(lr), aggregator.WithMomentum(mu))
	if err != nil {
		t.Fatal(err)
	}
	return &outerRef{o: o, theta: theta}
}

func (r *outerRef) params() []byte { return encodeParams(r.theta) }

// step takes one outer step from pseudo-gradients in island order.
func (r *outerRef) step(t *testing.T, pgs [][]float32, ws []float64) []byte {
	t.Helper()
	mean, err := aggregator.WeightedMean(pgs, ws)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.o.Apply(r.theta, mean); err != nil {
		t.Fatal(err)
	}
	return r.params()
}

// pseudoGrad is island i's synthetic pseudo-gradient for outer step k.
func pseudoGrad(i, k, dim int) []float32 {
	v := make([]float32, dim)
	for j := range v {
		v[j] = float32(0.01 * math.Sin(float64(31*i+7*k+j+1)))
	}
	return v
}

// outerAt reads, on the loop, the job's outer step and how many
// contributions its open round holds.
func (e *env) outerAt(job string) (step int64, arrived int) {
	_ = e.svc.do(e.t.Context(), func() error {
		if rt := e.svc.jobs[job]; rt != nil && rt.diloco != nil {
			step = rt.diloco.step
			if r := rt.diloco.open; r != nil {
				arrived = len(r.spools)
			}
		}
		return nil
	})
	return step, arrived
}

// waitArrived waits until the open round of job's outer step holds n
// contributions.
func (e *env) waitArrived(job string, step int64, n int) {
	e.t.Helper()
	deadline := time.Now().Add(hangFor) // a hang guard only
	for {
		st, got := e.outerAt(job)
		if st == step && got == n {
			return
		}
		if st != step || time.Now().After(deadline) {
			e.t.Fatalf("job %s at outer step %d with %d contributions, want step %d with %d", job, st, got, step, n)
		}
		runtime.Gosched()
	}
}

func state(st pb.PoolJobState) func(*pb.PoolJob) bool {
	return func(j *pb.PoolJob) bool { return j.GetState() == st }
}

func TestDiLoCoSubmitValidation(t *testing.T) {
	e := newEnv(t, nil)
	c, ctx := e.ops()
	for _, tc := range []struct {
		name, field string
		mod         func(*pb.PoolJobSpec)
	}{
		{"command program", "spec.diloco", func(s *pb.PoolJobSpec) {
			s.Program = &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"python3", "train.py"}}}
		}},
		{"two ranks", "spec.ranks", func(s *pb.PoolJobSpec) { s.Ranks, s.GetBuiltin().SyncEvery = 2, 5 }},
		{"one island", "spec.diloco.islands", func(s *pb.PoolJobSpec) { s.Diloco.Islands = 1 }},
		{"65 islands", "spec.diloco.islands", func(s *pb.PoolJobSpec) { s.Diloco.Islands = MaxIslands + 1 }},
		{"id too long for island names", "spec.id", func(s *pb.PoolJobSpec) { s.Id = strings.Repeat("x", 60) }},
		{"no inner steps", "spec.diloco.inner_steps", func(s *pb.PoolJobSpec) { s.Diloco.InnerSteps = 0 }},
		{"inner steps over total", "spec.diloco.inner_steps", func(s *pb.PoolJobSpec) { s.Diloco.InnerSteps = s.TotalSteps + 10 }},
		{"total not a multiple of H", "spec.total_steps", func(s *pb.PoolJobSpec) { s.TotalSteps = 25 }},
		{"checkpoint interval not H", "spec.checkpoint_interval", func(s *pb.PoolJobSpec) { s.CheckpointInterval = 5 }},
		{"model over the parameter bound", "spec.builtin.arch", func(s *pb.PoolJobSpec) { s.GetBuiltin().Arch = []uint32{65536, 65536, 10} }},
		{"sync_every", "spec.builtin.sync_every", func(s *pb.PoolJobSpec) { s.GetBuiltin().SyncEvery = 5 }},
		{"init_model", "spec.builtin.init_model", func(s *pb.PoolJobSpec) { s.GetBuiltin().InitModel = strings.Repeat("ab", 32) }},
		{"carbon", "spec.carbon", func(s *pb.PoolJobSpec) {
			s.Deadline = timestamppb.New(t0.Add(48 * time.Hour))
			s.Carbon = &pb.PoolCarbon{ExpectedDuration: durationpb.New(time.Hour), ExpectedPowerWatts: 300}
		}},
		{"NaN outer learning rate", "spec.diloco.outer_learning_rate", func(s *pb.PoolJobSpec) { s.Diloco.OuterLearningRate = math.NaN() }},
		{"negative outer learning rate", "spec.diloco.outer_learning_rate", func(s *pb.PoolJobSpec) { s.Diloco.OuterLearningRate = -0.1 }},
		{"huge outer learning rate", "spec.diloco.outer_learning_rate", func(s *pb.PoolJobSpec) { s.Diloco.OuterLearningRate = 11 }},
		{"momentum 1", "spec.diloco.outer_momentum", func(s *pb.PoolJobSpec) { s.Diloco.OuterMomentum = proto.Float64(1) }},
		{"negative momentum", "spec.diloco.outer_momentum", func(s *pb.PoolJobSpec) { s.Diloco.OuterMomentum = proto.Float64(-0.5) }},
		{"NaN momentum", "spec.diloco.outer_momentum", func(s *pb.PoolJobSpec) { s.Diloco.OuterMomentum = proto.Float64(math.NaN()) }},
		{"quorum over islands", "spec.diloco.quorum", func(s *pb.PoolJobSpec) { s.Diloco.Quorum = 4 }},
		{"zero grace", "spec.diloco.grace", func(s *pb.PoolJobSpec) { s.Diloco.Grace = durationpb.New(0) }},
		{"negative grace", "spec.diloco.grace", func(s *pb.PoolJobSpec) { s.Diloco.Grace = durationpb.New(-time.Second) }},
		{"grace over a day", "spec.diloco.grace", func(s *pb.PoolJobSpec) { s.Diloco.Grace = durationpb.New(25 * time.Hour) }},
		{"invalid grace", "spec.diloco.grace", func(s *pb.PoolJobSpec) { s.Diloco.Grace = &durationpb.Duration{Seconds: 1, Nanos: -1} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := dilocoSpec("bad", 3, 2)
			tc.mod(sp)
			_, err := c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: sp})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("submit: %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	if _, err := c.GetJob(ctx, &pb.GetJobRequest{JobId: "bad-i0"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused spec left island bad-i0: %v", err)
	}

	// An island name taken by another job refuses the whole submission.
	e.submit(spec("taken-i1", 1), nil)
	_, err := c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: dilocoSpec("taken", 3, 2)})
	wantCode(t, "island id taken", err, codes.AlreadyExists)
	for _, id := range []string{"taken", "taken-i0"} {
		if _, err := c.GetJob(ctx, &pb.GetJobRequest{JobId: id}); status.Code(err) != codes.NotFound {
			t.Fatalf("after a refused submission %s exists: %v", id, err)
		}
	}

	// The longest id and checkpoint_interval = H are accepted.
	sp := dilocoSpec(strings.Repeat("y", 59), MaxIslands, 2)
	sp.CheckpointInterval = innerH
	j := e.submit(sp, nil)
	if j.GetState() != queued || j.GetDiloco().GetOuterSteps() != 2 || j.GetSpec().GetCheckpointInterval() != innerH {
		t.Fatalf("accepted job %v", j)
	}
	k := e.job(sp.Id + "-i63")
	if k.GetParent() != sp.Id || k.GetIsland() != 63 || k.GetState() != queued || k.GetSpec().GetId() != sp.Id+"-i63" {
		t.Fatalf("island 63 %v", k)
	}
}

func TestDiLoCoRunMatchesOuterOptimizer(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 3, 2)
	j := e.submit(sp, nil)
	if j.GetState() != queued || j.GetDiloco().GetOuterSteps() != 2 || j.GetSpec().GetCheckpointInterval() != innerH {
		t.Fatalf("submitted %v", j)
	}
	for i := range 3 {
		k := e.job("dl" + islandSuffix(i))
		if k.GetParent() != "dl" || k.GetIsland() != uint32(i) || k.GetState() != queued {
			t.Fatalf("island %d: %v", i, k)
		}
	}
	is := placeIslands(t, e, "dl", "host", 3)
	if p := e.job("dl"); p.GetState() != running {
		t.Fatalf("parent with its islands placed: %v", p)
	}
	ref := newOuterRef(t, sp, aggregator.DefaultOuterLR, aggregator.DefaultOuterMomentum)
	dim := len(ref.theta)
	for i, x := range is {
		if r := x.join(); r.GetOuterStep() != 0 || !bytes.Equal(r.GetParams(), ref.params()) || r.GetDone() || r.GetLate() {
			t.Fatalf("island %d joined with %d params at step %d, want θ₀ of %d", i, len(r.GetParams())/4, r.GetOuterStep(), dim)
		}
	}
	// The weights differ, so the mean is a weighted one; they are shard
	// sizes of one slice, examples i mod 3, within one of each other.
	weights := []float64{2001, 2000, 2000}
	var steps [][]byte
	for k := range 2 {
		pgs := make([][]float32, 3)
		chs := make([]<-chan syncResult, 3)
		for i, x := range is {
			pgs[i] = pseudoGrad(i, k, dim)
			chs[i] = x.syncAsync(int64(k), f32(pgs[i]...), weights[i])
		}
		want := ref.step(t, pgs, weights)
		steps = append(steps, want)
		for i := range is {
			r := mustWait(t, "contribution", chs[i])
			if r.GetOuterStep() != int64(k+1) || !bytes.Equal(r.GetParams(), want) || r.GetLate() || r.GetDone() != (k == 1) {
				t.Fatalf("step %d: island %d got step %d done %v late %v, params equal %v", k, i, r.GetOuterStep(), r.GetDone(),
					r.GetLate(), bytes.Equal(r.GetParams(), want))
			}
		}
		p := e.job("dl")
		if p.GetDiloco().GetOuterStep() != int64(k+1) || !slices.Equal(p.GetDiloco().GetLastIslands(), []uint32{0, 1, 2}) ||
			p.GetStep() != int64(k+1)*innerH {
			t.Fatalf("parent after step %d: %v", k, p)
		}
		if k == 0 {
			// An outer step is every island's checkpoint.
			for i := range is {
				if c := e.job("dl" + islandSuffix(i)).GetCommittedStep(); c != innerH {
					t.Fatalf("island %d committed step %d after outer step 1, want %d", i, c, innerH)
				}
			}
		}
	}
	// After the last step a join says done, with the final θ.
	if r := is[0].join(); !r.GetDone() || r.GetOuterStep() != 2 || !bytes.Equal(r.GetParams(), steps[1]) {
		t.Fatalf("join after the last step: step %d done %v", r.GetOuterStep(), r.GetDone())
	}
	if p := e.job("dl"); p.GetState() != running {
		t.Fatalf("parent before its islands exited: %v", p)
	}

	// Each island's rank reports its completed exit.
	data := sha256.New()
	for i, x := range is {
		d := sha256.Sum256([]byte{byte(i)})
		if _, err := x.w.c.RankExited(x.w.ctx, &pb.RankExitedRequest{WorkerId: x.w.id, JobId: x.l.GetJobId(), Attempt: x.l.GetAttempt(),
			Completed: true, DataSha256: hex.EncodeToString(d[:])}); err != nil {
			t.Fatal(err)
		}
		// The island's own data digest is over its one rank's.
		dd := sha256.Sum256(d[:])
		data.Write(dd[:])
		e.waitJob(x.l.GetJobId(), state(succeeded))
	}
	p := e.waitJob("dl", state(succeeded))
	e.mu.Lock()
	models := slices.Clone(e.models)
	e.mu.Unlock()
	if len(models) != 1 {
		t.Fatalf("%d models stored", len(models))
	}
	m := models[0]
	if !bytes.Equal(encodeParams(m.m.Flatten()), steps[1]) || m.name != "mnist-diloco" {
		t.Fatalf("model %s is not θ₂", m.name)
	}
	if p.GetOutputVersion() != m.m.HashHex() || p.GetDataSha256() != hex.EncodeToString(data.Sum(nil)) {
		t.Fatalf("parent %v", p)
	}
	if lin := m.lineage; lin.GetJobId() != "dl" || lin.GetSteps() != 20 || !isHex64(lin.GetCheckpoint()) ||
		lin.GetDataSha256() != p.GetDataSha256() || lin.GetSpecDigest() != p.GetSpecDigest() {
		t.Fatalf("lineage %v", lin)
	}

	// Every request and answer is counted, on the island and the parent.
	var in, out int64
	for i, x := range is {
		sent, received := x.bytes()
		k := e.job(x.l.GetJobId())
		if k.GetSyncBytesReceived() != sent || k.GetSyncBytesSent() != received {
			t.Errorf("island %d counted %d in / %d out, its worker sent %d and received %d", i, k.GetSyncBytesReceived(),
				k.GetSyncBytesSent(), sent, received)
		}
		in, out = in+sent, out+received
	}
	if p.GetSyncBytesReceived() != in || p.GetSyncBytesSent() != out || in < int64(6*4*dim) || out < int64(9*4*dim) {
		t.Errorf("parent counted %d in / %d out, the islands %d / %d", p.GetSyncBytesReceived(), p.GetSyncBytesSent(), in, out)
	}
	var states []string
	for _, ev := range e.poolEvents() {
		if ev.Job == "dl" {
			states = append(states, ev.State)
		}
	}
	if strings.Join(states, ",") != "submitted,running,succeeded" {
		t.Fatalf("parent's pool job events %v", states)
	}
}

func TestDiLoCoLostIslandRejoins(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 3, 2)
	sp.Diloco.Quorum = 2
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 3)
	ref := newOuterRef(t, sp, aggregator.DefaultOuterLR, aggregator.DefaultOuterMomentum)
	dim := len(ref.theta)
	ws := []float64{20, 20, 19}

	c0 := is[0].syncAsync(0, f32(pseudoGrad(0, 0, dim)...), ws[0])
	c1 := is[1].syncAsync(0, f32(pseudoGrad(1, 0, dim)...), ws[1])
	e.waitArrived("dl", 0, 2)
	// Island 2's worker falls silent; the others stay in touch.
	e.clk.Advance(3 * time.Second)
	if st, n := e.outerAt("dl"); st != 0 || n != 2 {
		t.Fatalf("the round closed (step %d, %d) while island 2 was running", st, n)
	}
	p0, p1 := is[0].w.poll(), is[1].w.poll()
	e.clk.Advance(3 * time.Second)
	recv(t, p0)
	recv(t, p1)
	want := ref.step(t, [][]float32{pseudoGrad(0, 0, dim), pseudoGrad(1, 0, dim)}, ws[:2])
	for i, ch := range []<-chan syncResult{c0, c1} {
		if r := mustWait(t, "contribution", ch); r.GetOuterStep() != 1 || !bytes.Equal(r.GetParams(), want) {
			t.Fatalf("island %d: step %d", i, r.GetOuterStep())
		}
	}
	if p := e.job("dl"); !slices.Equal(p.GetDiloco().GetLastIslands(), []uint32{0, 1}) || p.GetState() != running {
		t.Fatalf("parent %v", p)
	}
	if k := e.job("dl-i2"); k.GetState() != queued {
		t.Fatalf("island 2 after its worker was lost: %v", k)
	}
	if e.workerState(is[2].w.id) != "lost" {
		t.Fatalf("island 2's worker is %s", e.workerState(is[2].w.id))
	}

	// Placed again on a new worker, it joins at the current step.
	w := e.register("host-d", oneRank)
	res, err := w.heartbeat()
	if err != nil || len(res.GetStart()) != 1 {
		t.Fatalf("%v %v", res, err)
	}
	l := res.GetStart()[0]
	if l.GetJobId() != "dl-i2" || l.GetIsland() != 2 || l.GetAttempt() != 2 {
		t.Fatalf("lease %v", l)
	}
	back := &island{t: t, w: w, l: l}
	if r := back.join(); r.GetOuterStep() != 1 || !bytes.Equal(r.GetParams(), want) {
		t.Fatalf("rejoin at step %d", r.GetOuterStep())
	}
	// The next step waits for it and includes it.
	x := []*island{is[0], is[1], back}
	chs := make([]<-chan syncResult, 3)
	pgs := make([][]float32, 3)
	for i := range x {
		pgs[i] = pseudoGrad(i, 1, dim)
		chs[i] = x[i].syncAsync(1, f32(pgs[i]...), ws[i])
		if i == 1 {
			e.waitArrived("dl", 1, 2)
			if st, _ := e.outerAt("dl"); st != 1 {
				t.Fatal("the step closed without the rejoined island")
			}
		}
	}
	want = ref.step(t, pgs, ws)
	for i := range x {
		if r := mustWait(t, "contribution", chs[i]); r.GetOuterStep() != 2 || !r.GetDone() || !bytes.Equal(r.GetParams(), want) {
			t.Fatalf("island %d after the last step: step %d done %v", i, r.GetOuterStep(), r.GetDone())
		}
	}
	if p := e.job("dl"); !slices.Equal(p.GetDiloco().GetLastIslands(), []uint32{0, 1, 2}) {
		t.Fatalf("last islands %v", p.GetDiloco().GetLastIslands())
	}
}

func TestDiLoCoGraceClosesWithoutSilentIsland(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 3, 2)
	sp.Diloco.Grace = durationpb.New(4 * time.Second) // shorter than a worker's loss
	sp.Diloco.OuterLearningRate, sp.Diloco.OuterMomentum = 0.5, proto.Float64(0.5)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 3)
	ref := newOuterRef(t, sp, 0.5, 0.5)
	dim := len(ref.theta)
	c0 := is[0].syncAsync(0, f32(pseudoGrad(0, 0, dim)...), 7)
	c1 := is[1].syncAsync(0, f32(pseudoGrad(1, 0, dim)...), 6)
	e.waitArrived("dl", 0, 2)
	e.clk.Advance(3 * time.Second)
	if st, n := e.outerAt("dl"); st != 0 || n != 2 {
		t.Fatalf("closed before the grace ran out: step %d, %d contributions", st, n)
	}
	e.clk.Advance(time.Second)
	want := ref.step(t, [][]float32{pseudoGrad(0, 0, dim), pseudoGrad(1, 0, dim)}, []float64{7, 6})
	for i, ch := range []<-chan syncResult{c0, c1} {
		if r := mustWait(t, "contribution", ch); r.GetOuterStep() != 1 || !bytes.Equal(r.GetParams(), want) || r.GetLate() {
			t.Fatalf("island %d: step %d late %v", i, r.GetOuterStep(), r.GetLate())
		}
	}
	if p := e.job("dl"); !slices.Equal(p.GetDiloco().GetLastIslands(), []uint32{0, 1}) {
		t.Fatalf("last islands %v", p.GetDiloco().GetLastIslands())
	}
	// The silent island was running: it too checkpointed at the step.
	if k := e.job("dl-i2"); k.GetState() != running || k.GetCommittedStep() != innerH {
		t.Fatalf("island 2 %v", k)
	}
	r, err := is[2].sync(0, f32(pseudoGrad(2, 0, dim)...), 9)
	if err != nil || !r.GetLate() || r.GetOuterStep() != 1 || !bytes.Equal(r.GetParams(), want) || r.GetDone() {
		t.Fatalf("late contribution: %v %v", r, err)
	}
	if n := e.job("dl").GetDiloco().GetLateContributions(); n != 1 {
		t.Fatalf("%d late contributions counted", n)
	}
}

func TestDiLoCoRetryOfClosedStepGetsItsAnswer(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 2, 3)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 2)
	dim := len(newOuterRef(t, sp, 0.7, 0.9).theta)
	pg := [][]byte{f32(pseudoGrad(0, 0, dim)...), f32(pseudoGrad(1, 0, dim)...)}
	c0 := is[0].syncAsync(0, pg[0], 1)
	r1, err := is[1].sync(0, pg[1], 1)
	if err != nil {
		t.Fatal(err)
	}
	r0 := mustWait(t, "contribution", c0)
	if !r0.same(r1) || r0.GetOuterStep() != 1 {
		t.Fatalf("answers differ: %v / %v", r0, r1)
	}
	again, err := is[0].sync(0, pg[0], 1)
	if err != nil || !again.same(r0) {
		t.Fatalf("retry: %v %v", again, err)
	}
	// Other bytes, or another weight, for the closed step are late.
	if r, err := is[0].sync(0, pg[1], 1); err != nil || !r.GetLate() || r.GetOuterStep() != 1 {
		t.Fatalf("other bytes for a closed step: %v %v", r, err)
	}
	if r, err := is[1].sync(0, pg[1], 2); err != nil || !r.GetLate() {
		t.Fatalf("another weight for a closed step: %v %v", r, err)
	}
	if n := e.job("dl").GetDiloco().GetLateContributions(); n != 2 {
		t.Fatalf("%d late contributions, want 2", n)
	}
}

func TestDiLoCoHostileOuterSync(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 2, 2)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 2)
	e.submit(spec("plain", 1), nil)
	pw := e.register("host-plain", oneRank)
	res, err := pw.heartbeat()
	if err != nil || len(res.GetStart()) != 1 || res.GetStart()[0].GetJobId() != "plain" {
		t.Fatalf("%v %v", res, err)
	}
	plain := &island{t: t, w: pw, l: res.GetStart()[0]}
	dim := len(newOuterRef(t, sp, 0.7, 0.9).theta)
	good := f32(pseudoGrad(0, 0, dim)...)
	nan := slices.Clone(good)
	binary.LittleEndian.PutUint32(nan[8:], math.Float32bits(float32(math.NaN())))
	inf := slices.Clone(good)
	binary.LittleEndian.PutUint32(inf[4*(dim-1):], math.Float32bits(float32(math.Inf(-1))))

	x := is[0]
	for _, tc := range []struct {
		name   string
		step   int64
		pg     []byte
		weight float64
		code   codes.Code
	}{
		{"future step", 1, good, 1, codes.InvalidArgument},
		{"negative step", -1, good, 1, codes.InvalidArgument},
		{"too few values", 0, good[:4*(dim-1)], 1, codes.InvalidArgument},
		{"too many values", 0, f32(pseudoGrad(0, 0, dim+1)...), 1, codes.InvalidArgument},
		{"ragged bytes", 0, good[:len(good)-1], 1, codes.InvalidArgument},
		{"NaN", 0, nan, 1, codes.InvalidArgument},
		{"infinity", 0, inf, 1, codes.InvalidArgument},
		{"zero weight", 0, good, 0, codes.InvalidArgument},
		{"fractional weight", 0, good, 2.5, codes.InvalidArgument},
		{"negative weight", 0, good, -3, codes.InvalidArgument},
		{"NaN weight", 0, good, math.NaN(), codes.InvalidArgument},
		{"weight over 2^31", 0, good, 1<<31 + 1, codes.InvalidArgument},
	} {
		_, err := x.sync(tc.step, tc.pg, tc.weight)
		wantCode(t, tc.name, err, tc.code)
	}
	if _, err := plain.sync(0, good, 1); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("contribution of a job that is not an island: %v", err)
	}
	if _, err := plain.sync(0, nil, 0); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("join of a job that is not an island: %v", err)
	}
	_, _, err = x.w.outerSync(&pb.RankRef{WorkerId: x.w.id, JobId: "dl", Attempt: 1}, 0, nil, 0)
	wantCode(t, "join as the parent job", err, codes.FailedPrecondition)
	_, _, err = x.w.outerSync(&pb.RankRef{WorkerId: x.w.id, JobId: "dl-i1", Attempt: 1}, 0, nil, 0)
	wantCode(t, "join as another worker's island", err, codes.FailedPrecondition)
	thief := &worker{e: e, ctx: e.as("mallory", identity.RolePoolWorker), c: x.w.c, id: x.w.id}
	_, _, err = thief.outerSync(x.ref(), 0, nil, 0)
	wantCode(t, "join as another principal", err, codes.PermissionDenied)
	_, ctx := e.ops()
	_, _, err = (&worker{e: e, ctx: ctx, c: x.w.c, id: x.w.id}).outerSync(x.ref(), 0, nil, 0)
	wantCode(t, "join with an operator token", err, codes.PermissionDenied)
	if st, n := e.outerAt("dl"); st != 0 || n != 0 {
		t.Fatalf("refused contributions reached the round: step %d, %d", st, n)
	}
	if j := e.job("dl-i0"); j.GetSyncBytesReceived() != 0 {
		t.Fatalf("refused calls counted %d bytes", j.GetSyncBytesReceived())
	}

	// Once island 0 contributed, other bytes or another weight for the
	// same step are refused; the same again joins the wait.
	c0 := x.syncAsync(0, good, 4)
	e.waitArrived("dl", 0, 1)
	_, err = x.sync(0, f32(pseudoGrad(5, 0, dim)...), 4)
	wantCode(t, "second contribution with other bytes", err, codes.InvalidArgument)
	_, err = x.sync(0, good, 5)
	wantCode(t, "second contribution with another weight", err, codes.InvalidArgument)
	c0again := x.syncAsync(0, good, 4)
	r1, err := is[1].sync(0, f32(pseudoGrad(1, 0, dim)...), 4)
	if err != nil {
		t.Fatal(err)
	}
	if r0, r0b := mustWait(t, "contribution", c0), mustWait(t, "retried contribution", c0again); !r0.same(r1) || !r0b.same(r1) {
		t.Fatalf("answers %v / %v / %v", r0, r0b, r1)
	}
}

func TestDiLoCoInt8(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 2, 2)
	sp.Diloco.Int8 = true
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 2)
	ref := newOuterRef(t, sp, 0.7, 0.9)
	dim := len(ref.theta)
	_, err := is[0].sync(0, f32(pseudoGrad(0, 0, dim)...), 1)
	wantCode(t, "float32 pseudo-gradient to an int8 job", err, codes.InvalidArgument)
	rng := rand.NewPCG(1, 2)
	var deq [][]float32
	var enc [][]byte
	for i := range 2 {
		q, err := quant.Quantize(pseudoGrad(i, 0, dim), quant.DefaultBlock, rng)
		if err != nil {
			t.Fatal(err)
		}
		b, err := q.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		deq, enc = append(deq, q.Dequantize()), append(enc, b)
	}
	_, err = is[0].sync(0, enc[0][:len(enc[0])-1], 1)
	wantCode(t, "truncated FLQ8", err, codes.InvalidArgument)
	short, err := quant.Quantize(pseudoGrad(0, 0, dim-1), quant.DefaultBlock, rng)
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := short.MarshalBinary()
	_, err = is[0].sync(0, sb, 1)
	wantCode(t, "FLQ8 of the wrong length", err, codes.InvalidArgument)
	c0 := is[0].syncAsync(0, enc[0], 2)
	r1, err := is[1].sync(0, enc[1], 1)
	if err != nil {
		t.Fatal(err)
	}
	want := ref.step(t, deq, []float64{2, 1})
	if r0 := mustWait(t, "contribution", c0); !r0.same(r1) || !bytes.Equal(r1.GetParams(), want) || r1.GetOuterStep() != 1 {
		t.Fatalf("int8 step: %d, params equal %v", r1.GetOuterStep(), bytes.Equal(r1.GetParams(), want))
	}
}

func TestDiLoCoRestartRestoresOuterState(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 2, 3)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 2)
	ref := newOuterRef(t, sp, 0.7, 0.9)
	dim := len(ref.theta)
	ws := []float64{2, 3}
	for k := range 2 {
		pgs := [][]float32{pseudoGrad(0, k, dim), pseudoGrad(1, k, dim)}
		c0 := is[0].syncAsync(int64(k), f32(pgs[0]...), ws[0])
		r1, err := is[1].sync(int64(k), f32(pgs[1]...), ws[1])
		if err != nil {
			t.Fatal(err)
		}
		mustWait(t, "contribution", c0)
		if want := ref.step(t, pgs, ws); !bytes.Equal(r1.GetParams(), want) {
			t.Fatalf("step %d differs", k)
		}
	}
	e.restart()
	p := e.job("dl")
	if p.GetDiloco().GetOuterStep() != 2 || p.GetState() != running || !strings.Contains(p.GetStateReason(), "outer step 2 of 3") {
		t.Fatalf("restored parent %v", p)
	}
	for i := range 2 {
		if k := e.job("dl" + islandSuffix(i)); k.GetState() != queued || k.GetCommittedStep() != 2*innerH {
			t.Fatalf("restored island %d: %v", i, k)
		}
	}
	is = placeIslands(t, e, "dl", "again", 2)
	for i, x := range is {
		if x.l.GetAttempt() != 2 || x.l.GetResumeStep() != 2*innerH {
			t.Fatalf("island %d lease %v", i, x.l)
		}
		if r := x.join(); r.GetOuterStep() != 2 || !bytes.Equal(r.GetParams(), ref.params()) {
			t.Fatalf("island %d joined at step %d after the restart; θ equal %v", i, r.GetOuterStep(), bytes.Equal(r.GetParams(), ref.params()))
		}
	}
	// The momentum came back too: the last step matches as well.
	pgs := [][]float32{pseudoGrad(0, 2, dim), pseudoGrad(1, 2, dim)}
	c0 := is[0].syncAsync(2, f32(pgs[0]...), ws[0])
	r1, err := is[1].sync(2, f32(pgs[1]...), ws[1])
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, "contribution", c0)
	if want := ref.step(t, pgs, ws); !bytes.Equal(r1.GetParams(), want) || !r1.GetDone() || r1.GetOuterStep() != 3 {
		t.Fatalf("the step after the restart: %d done %v, θ equal %v", r1.GetOuterStep(), r1.GetDone(), bytes.Equal(r1.GetParams(), want))
	}
}

func TestDiLoCoCancelParent(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 2, 2)
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 2)
	dim := len(newOuterRef(t, sp, 0.7, 0.9).theta)
	c0 := is[0].syncAsync(0, f32(pseudoGrad(0, 0, dim)...), 1)
	e.waitArrived("dl", 0, 1)
	c, ctx := e.ops()
	res, err := c.CancelJob(ctx, &pb.CancelJobRequest{JobId: "dl", Reason: "enough"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetJob().GetState() != cancelled {
		t.Fatalf("cancelled parent %v", res.GetJob())
	}
	_, err = wait(t, "waiting contribution", c0)
	wantCode(t, "contribution waiting when the job was cancelled", err, codes.Aborted)
	for i, x := range is {
		if k := e.job(x.l.GetJobId()); k.GetState() != cancelled {
			t.Fatalf("island %d %v", i, k)
		}
		hb, err := x.w.heartbeat()
		if err != nil || len(hb.GetStop()) != 1 || hb.GetStop()[0].GetJobId() != x.l.GetJobId() {
			t.Fatalf("island %d's worker heard %v %v, want a stop", i, hb, err)
		}
	}
	_, err = c.CancelJob(ctx, &pb.CancelJobRequest{JobId: "dl"})
	wantCode(t, "second cancel", err, codes.FailedPrecondition)
}

func TestDiLoCoFailsBelowQuorum(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 2, 2)
	sp.MaxRestarts = 0
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 2)
	dim := len(newOuterRef(t, sp, 0.7, 0.9).theta)
	c1 := is[1].syncAsync(0, f32(pseudoGrad(1, 0, dim)...), 1)
	e.waitArrived("dl", 0, 1)
	x := is[0]
	if _, err := x.w.c.RankExited(x.w.ctx, &pb.RankExitedRequest{WorkerId: x.w.id, JobId: x.l.GetJobId(), Attempt: x.l.GetAttempt(),
		Error: "out of memory", ExitCode: 137}); err != nil {
		t.Fatal(err)
	}
	p := e.waitJob("dl", state(failed))
	if !strings.Contains(p.GetStateReason(), "quorum") {
		t.Fatalf("parent failed with %q", p.GetStateReason())
	}
	_, err := wait(t, "waiting contribution", c1)
	wantCode(t, "contribution waiting when the job failed", err, codes.Aborted)
	for i := range 2 {
		if k := e.job("dl" + islandSuffix(i)); k.GetState() != failed {
			t.Fatalf("island %d %v", i, k)
		}
	}
}

// outerStateFor is a valid outer state file of a job of spec sp after one
// outer step.
func outerStateFor(tb testing.TB, sp *pb.PoolJobSpec) []byte {
	tb.Helper()
	d, err := newDiLoCo(sp)
	if err != nil {
		tb.Fatal(err)
	}
	if err := d.outer.Apply(d.theta, pseudoGrad(0, 0, len(d.theta))); err != nil {
		tb.Fatal(err)
	}
	d.step = 1
	s := &Service{ckpt: newCkptStores(tb.TempDir(), 1<<20)}
	if err := s.saveOuter(sp.GetId(), d); err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(s.outerPath(sp.GetId()))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// resum replaces b's trailing checksum with the right one.
func resum(b []byte) []byte {
	b = slices.Clone(b)
	body := b[:len(b)-sha256.Size]
	sum := sha256.Sum256(body)
	copy(b[len(body):], sum[:])
	return b
}

func FuzzOuterState(f *testing.F) {
	sp := dilocoSpec("fz", 2, 3)
	valid := outerStateFor(f, sp)
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(valid[:21])
	beyond := slices.Clone(valid)
	binary.LittleEndian.PutUint64(beyond[5:], 4) // past the job's 3 outer steps
	f.Add(resum(beyond))
	hugeDim := slices.Clone(valid)
	binary.LittleEndian.PutUint64(hugeDim[13:], math.MaxUint64)
	f.Add(resum(hugeDim))
	s := &Service{ckpt: newCkptStores(f.TempDir(), 1<<20)}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := newDiLoCo(sp)
		if err != nil {
			t.Fatal(err)
		}
		if err := decodeOuterState(b, d); err != nil {
			return
		}
		if d.step < 0 || d.step > d.steps || len(d.theta) != d.layout.Size() {
			t.Fatalf("accepted step %d of %d with %d parameters", d.step, d.steps, len(d.theta))
		}
		if err := s.saveOuter(sp.GetId(), d); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(s.outerPath(sp.GetId()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("accepted %d bytes re-encode to %d other bytes", len(b), len(got))
		}
	})
}

func TestOuterStateRoundTripAndRefusals(t *testing.T) {
	sp := dilocoSpec("fz", 2, 3)
	valid := outerStateFor(t, sp)
	d, err := newDiLoCo(sp)
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeOuterState(valid, d); err != nil || d.step != 1 {
		t.Fatalf("valid state: step %d, %v", d.step, err)
	}
	flipped := slices.Clone(valid)
	flipped[30] ^= 1
	beyond := slices.Clone(valid)
	binary.LittleEndian.PutUint64(beyond[5:], 4)
	otherMagic := slices.Clone(valid)
	otherMagic[0] = 'X'
	for name, b := range map[string][]byte{"flipped bit": flipped, "step past the end": resum(beyond),
		"other magic": resum(otherMagic), "truncated": valid[:len(valid)-8], "empty": nil} {
		d, _ := newDiLoCo(sp)
		if err := decodeOuterState(b, d); err == nil || d.step != 0 {
			t.Errorf("%s: accepted (step %d)", name, d.step)
		}
	}
}

func TestDiLoCoAbsentIslandEndsWithTheRun(t *testing.T) {
	e := newEnv(t, nil)
	sp := dilocoSpec("dl", 3, 1)
	sp.Diloco.Quorum = 2
	e.submit(sp, nil)
	is := placeIslands(t, e, "dl", "host", 3)
	ref := newOuterRef(t, sp, 0.7, 0.9)
	dim := len(ref.theta)
	c0 := is[0].syncAsync(0, f32(pseudoGrad(0, 0, dim)...), 1)
	c1 := is[1].syncAsync(0, f32(pseudoGrad(1, 0, dim)...), 1)
	e.waitArrived("dl", 0, 2)
	// Island 2's worker is lost; the last step closes while it is queued.
	e.clk.Advance(3 * time.Second)
	p0, p1 := is[0].w.poll(), is[1].w.poll()
	e.clk.Advance(3 * time.Second)
	recv(t, p0)
	recv(t, p1)
	want := ref.step(t, [][]float32{pseudoGrad(0, 0, dim), pseudoGrad(1, 0, dim)}, []float64{1, 1})
	for i, ch := range []<-chan syncResult{c0, c1} {
		if r := mustWait(t, "contribution", ch); !r.GetDone() || !bytes.Equal(r.GetParams(), want) {
			t.Fatalf("island %d: step %d done %v", i, r.GetOuterStep(), r.GetDone())
		}
	}
	if k := e.job("dl-i2"); k.GetState() != succeeded {
		t.Fatalf("island 2, queued at the last step: %v", k)
	}
	if p := e.job("dl"); p.GetState() != running {
		t.Fatalf("parent before the running islands exited: %v", p)
	}
	for _, x := range is[:2] {
		if _, err := x.w.c.RankExited(x.w.ctx, &pb.RankExitedRequest{WorkerId: x.w.id, JobId: x.l.GetJobId(), Attempt: x.l.GetAttempt(),
			Completed: true}); err != nil {
			t.Fatal(err)
		}
	}
	p := e.waitJob("dl", state(succeeded))
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.models) != 1 || !bytes.Equal(encodeParams(e.models[0].m.Flatten()), want) || p.GetOutputVersion() == "" {
		t.Fatalf("%d models; parent %v", len(e.models), p)
	}
}
