package poolsvc

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

const (
	queued    = pb.PoolJobState_POOL_JOB_STATE_QUEUED
	running   = pb.PoolJobState_POOL_JOB_STATE_RUNNING
	succeeded = pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED
)

// startGang submits a job of ranks ranks and registers one worker per
// rank; it returns the workers and each one's lease, by rank.
func startGang(t *testing.T, e *env, id string, ranks int) ([]*worker, []*pb.RankLease) {
	t.Helper()
	return startGangSpec(t, e, spec(id, uint32(ranks)))
}

// startGangSpec is startGang for the job sp.
func startGangSpec(t *testing.T, e *env, sp *pb.PoolJobSpec) ([]*worker, []*pb.RankLease) {
	t.Helper()
	id, ranks := sp.GetId(), int(sp.GetRanks())
	e.submit(sp, nil)
	var ws []*worker
	for i := range ranks {
		ws = append(ws, e.register("worker-"+string(rune('a'+i)), oneRank))
	}
	ls := make([]*pb.RankLease, ranks)
	for _, w := range ws {
		res, err := w.heartbeat()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.GetStart()) != 1 {
			t.Fatalf("worker %s got %v", w.id, res)
		}
		l := res.GetStart()[0]
		ls[l.GetRank()] = l
	}
	// Workers by rank, so ws[r] holds rank r.
	byRank := make([]*worker, ranks)
	for _, w := range ws {
		for _, le := range e.leases(id) {
			if le.worker == w.id {
				byRank[le.l.GetRank()] = w
			}
		}
	}
	return byRank, ls
}

func TestGangStartsWholeWhenRoomAppears(t *testing.T) {
	e := newEnv(t, nil)
	e.submit(spec("gang", 2), nil)
	w1 := e.register("host-1", oneRank)
	p1 := w1.poll()
	if j := e.job("gang"); j.GetState() != queued {
		t.Fatalf("with room for one rank the gang is %v (%s)", j.GetState(), j.GetStateReason())
	}
	w2 := e.register("host-2", oneRank)
	r1 := recv(t, p1)
	r2, err := w2.heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	if len(r1.GetStart()) != 1 || len(r2.GetStart()) != 1 {
		t.Fatalf("leases: %v / %v", r1, r2)
	}
	ls := e.leases("gang")
	if len(ls) != 2 || ls[0].pass != ls[1].pass || !ls[0].meterAt.Equal(ls[1].meterAt) {
		t.Fatalf("leases not issued in one pass: %+v", ls)
	}
	a, b := r1.GetStart()[0], r2.GetStart()[0]
	if a.GetRank() == b.GetRank() || a.GetAttempt() != 1 || b.GetAttempt() != 1 || a.GetWorldSize() != 2 ||
		a.GetResumeStep() != 0 || a.GetMasterAddr() != "127.0.0.1" || a.GetMasterPort() != b.GetMasterPort() ||
		a.GetMasterPort() < 29500 || a.GetMasterPort() > 30499 || a.GetGroupWorldSize() != 2 {
		t.Fatalf("leases %v and %v", a, b)
	}
	j := e.job("gang")
	if j.GetState() != running || len(j.GetPlacement()) != 2 || !j.GetStartTime().AsTime().Equal(e.clk.Now()) {
		t.Fatalf("job %v", j)
	}
}

func TestWorkerLossRequeuesFromCommittedStep(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGang(t, e, "j", 2)
	for r := range 2 {
		if _, err := ws[r].commit(ref(ws[r], ls[r]), "j", 10, 1, 2); err != nil {
			t.Fatal(err)
		}
	}
	if j := e.job("j"); j.GetCommittedStep() != 10 {
		t.Fatalf("committed %d after both ranks committed 10", j.GetCommittedStep())
	}
	// Rank 0 waits in an average that rank 1 will never join.
	avg := make(chan error, 1)
	go func() {
		_, err := ws[0].average(ref(ws[0], ls[0]), 15, 10, f32(1, 2))
		avg <- err
	}()
	// ws[1] falls silent now; ws[0] keeps heartbeating.
	waitAvg := func() {
		for {
			var n int
			_ = e.svc.do(t.Context(), func() error {
				if s := e.svc.jobs["j"].sync; s != nil {
					n = s.arrived
				}
				return nil
			})
			if n == 1 {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitAvg()
	p := ws[0].poll()
	for range 2 {
		e.clk.Advance(hb)
		recv(t, p)
		p = ws[0].poll()
	}
	e.clk.Advance(hb - time.Millisecond)
	if st := e.workerState(ws[1].id); st != "ready" {
		t.Fatalf("worker lost after less than 3 intervals: %s", st)
	}
	e.clk.Advance(time.Millisecond)
	var stop *pb.RankStop
	for stop == nil {
		r := recv(t, p)
		if len(r.GetStop()) > 0 {
			stop = r.GetStop()[0]
			break
		}
		p = ws[0].poll()
	}
	if stop.GetJobId() != "j" || stop.GetAttempt() != 1 || stop.GetAtCheckpoint() {
		t.Fatalf("stop %v", stop)
	}
	if st := e.workerState(ws[1].id); st != "lost" {
		t.Fatalf("silent worker is %s", st)
	}
	wantCode(t, "average of the aborted attempt", <-avg, codes.Aborted)
	j := e.job("j")
	want := "worker " + ws[1].id + " lost; restart 1 of 2 from checkpoint step 10"
	if j.GetState() != queued || j.GetRestarts() != 1 || j.GetCommittedStep() != 10 || e.lastEvent("j", "submitted") != want {
		t.Fatalf("job %v: %s; requeue event %q", j.GetState(), j.GetStateReason(), e.lastEvent("j", "submitted"))
	}
	w3 := e.register("host-3", oneRank)
	r3, err := w3.heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	r0 := recv(t, ws[0].poll())
	var next []*pb.RankLease
	next = append(next, r3.GetStart()...)
	next = append(next, r0.GetStart()...)
	if len(next) != 2 {
		t.Fatalf("new leases %v %v", r3, r0)
	}
	for _, l := range next {
		if l.GetAttempt() != 2 || l.GetResumeStep() != 10 {
			t.Fatalf("lease %v, want attempt 2 from step 10", l)
		}
	}
	// A resumed rank that has not loaded its checkpoint yet says step 0:
	// that is no progress, not a bad heartbeat.
	if l := r3.GetStart(); len(l) == 1 {
		w3.beat(&pb.RankStatus{JobId: "j", Attempt: 2, Rank: l[0].GetRank(), Step: 0})
	}
	// The old attempt is fenced off everywhere.
	_, err = ws[0].commit(ref(ws[0], ls[0]), "j", 20, 1, 2)
	wantCode(t, "commit of attempt 1", err, codes.FailedPrecondition)
	_, err = ws[0].average(ref(ws[0], ls[0]), 20, 10, f32(1))
	wantCode(t, "average of attempt 1", err, codes.FailedPrecondition)
	// The old attempt's rank may still say it ended, with its last usage,
	// once; that changes nothing about the job.
	exit1 := &pb.RankExitedRequest{WorkerId: ws[0].id, JobId: "j", Attempt: 1, Rank: ls[0].GetRank(), Error: "zombie", ExitCode: 1,
		Usage: &pb.PoolUsage{CpuSeconds: 50}}
	if _, err = ws[0].c.RankExited(ws[0].ctx, exit1); err != nil {
		t.Fatalf("exit of attempt 1: %v", err)
	}
	_, err = ws[0].c.RankExited(ws[0].ctx, exit1)
	wantCode(t, "second exit of attempt 1", err, codes.FailedPrecondition)
	if u := e.job("j").GetUsage().GetCpuSeconds(); u < 50 {
		t.Fatalf("job CPU-seconds %v: the old attempt's last usage was not counted", u)
	}
	_, err = ws[1].heartbeat()
	wantCode(t, "lost worker", err, codes.NotFound)
	if j := e.job("j"); j.GetState() != running || j.GetAttempt() != 2 || j.GetRestarts() != 1 {
		t.Fatalf("job after the zombie's calls: %v", j)
	}
}

func (e *env) workerState(id string) string {
	c, ctx := e.ops()
	res, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, w := range res.GetWorkers() {
		if w.GetId() == id {
			return w.GetState()
		}
	}
	return "absent"
}

func f32(vs ...float32) []byte { return encodeParams(vs) }

func TestResumeFromTheStepEveryRankCommitted(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGang(t, e, "j", 2)
	commit := func(r int, step int64) {
		t.Helper()
		if _, err := ws[r].commit(ref(ws[r], ls[r]), "j", step, float32(step), float32(r)); err != nil {
			t.Fatal(err)
		}
	}
	commit(0, 10)
	if j := e.job("j"); j.GetCommittedStep() != 0 {
		t.Fatalf("committed %d with one rank at 10", j.GetCommittedStep())
	}
	commit(1, 10)
	commit(0, 20)
	if j := e.job("j"); j.GetCommittedStep() != 10 || j.GetCheckpoint() == "" {
		t.Fatalf("job %v", j)
	}
	// Rank 1 crashes before reaching 20: the gang restarts from 10.
	if _, err := ws[1].c.RankExited(ws[1].ctx, &pb.RankExitedRequest{WorkerId: ws[1].id, JobId: "j", Attempt: 1, Rank: 1,
		Error: "segfault", ExitCode: 139}); err != nil {
		t.Fatal(err)
	}
	var next [2]*pb.RankLease
	for _, w := range ws {
		for next[0] == nil || next[1] == nil {
			r, err := w.heartbeat()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range r.GetStart() {
				next[l.GetRank()] = l
			}
			if len(r.GetStart()) > 0 {
				break
			}
		}
	}
	j := e.job("j")
	if j.GetAttempt() != 2 || !strings.Contains(j.GetStateReason(), "") || j.GetRestarts() != 1 {
		t.Fatalf("job %v", j)
	}
	for r := range 2 {
		w := ws[r]
		got, err := w.c.GetRankCheckpoint(w.ctx, &pb.GetRankCheckpointRequest{Ref: ref(w, next[r])})
		if err != nil {
			t.Fatal(err)
		}
		m, err := checkpoint.DecodeManifest(got.GetManifest())
		if err != nil {
			t.Fatal(err)
		}
		if m.Step != 10 || next[r].GetResumeStep() != 10 {
			t.Fatalf("rank %d resumes from step %d (lease %d), want 10", r, m.Step, next[r].GetResumeStep())
		}
		if ids, err := w.c.ListRankCheckpoints(w.ctx, &pb.ListRankCheckpointsRequest{Ref: ref(w, next[r])}); err != nil || len(ids.GetIds()) == 0 {
			t.Fatalf("list: %v %v", ids, err)
		}
	}
}

func TestPreemptionStopsAtCheckpoint(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGang(t, e, "low", 1)
	w := ws[0]
	hi := spec("high", 1)
	hi.Priority = 10
	e.submit(hi, nil)
	r, err := w.heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetStop()) != 1 || !r.GetStop()[0].GetAtCheckpoint() || r.GetStop()[0].GetJobId() != "low" {
		t.Fatalf("heartbeat %v, want a checkpoint stop of low", r)
	}
	res, err := w.commit(ref(w, ls[0]), "low", 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !res.GetStop() {
		t.Fatal("commit after a checkpoint stop did not say stop")
	}
	j := e.job("low")
	if ev := e.lastEvent("low", "submitted"); j.GetState() != queued || j.GetCommittedStep() != 10 || j.GetRestarts() != 0 ||
		!strings.HasPrefix(ev, "preempted by high at checkpoint step 10") {
		t.Fatalf("preempted job %v: %s; requeue event %q", j, j.GetStateReason(), ev)
	}
	r, err = w.heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetStart()) != 1 || r.GetStart()[0].GetJobId() != "high" {
		t.Fatalf("heartbeat %v, want high's lease", r)
	}
}

func TestBudgetHoldsTenant(t *testing.T) {
	e := newEnv(t, func(d *Deps) {
		d.Tenants = map[string]pool.Tenant{"default": {Weight: 1, Budget: pool.Budget{CPUSeconds: 100, Window: time.Hour}}}
	})
	ws, ls := startGang(t, e, "first", 1)
	w := ws[0]
	e.clk.Advance(time.Second)
	st := &pb.RankStatus{JobId: "first", Attempt: 1, Rank: 0, Step: 5, Usage: &pb.PoolUsage{CpuSeconds: 150}}
	r, err := w.heartbeat(st)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetStop()) != 1 || !r.GetStop()[0].GetAtCheckpoint() {
		t.Fatalf("over budget: heartbeat %v, want a checkpoint stop", r)
	}
	e.submit(spec("second", 1), nil)
	j := e.job("second")
	if j.GetState() != queued || !strings.HasPrefix(j.GetStateReason(), "over budget: tenant default used 150 of 100 CPU-seconds") {
		t.Fatalf("second job %v: %s", j.GetState(), j.GetStateReason())
	}
	if u := e.job("first").GetUsage(); u.GetCpuSeconds() != 150 || u.GetGpuSeconds() != 1 {
		t.Fatalf("usage %v, want 150 CPU-s and 1 GPU-s", u)
	}
	_ = ls
}

func TestAttacksAreRefused(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGang(t, e, "j", 2)
	w0, w1 := ws[0], ws[1]
	r0, r1 := ref(w0, ls[0]), ref(w1, ls[1])

	thief := &worker{e: e, ctx: e.as("mallory", identity.RolePoolWorker), c: w0.c, id: w0.id}
	_, err := thief.heartbeat()
	wantCode(t, "heartbeat as another principal", err, codes.PermissionDenied)
	_, err = thief.commit(r0, "j", 10, 1)
	wantCode(t, "commit as another principal", err, codes.PermissionDenied)
	sameName := e.register("worker-a", oneRank) // same subject, another token
	_, err = (&worker{e: e, ctx: sameName.ctx, c: w0.c, id: w0.id}).heartbeat()
	wantCode(t, "heartbeat with another token of the same subject", err, codes.PermissionDenied)

	notMine := &pb.RankRef{WorkerId: w0.id, JobId: "j", Attempt: 1, Rank: 1}
	_, err = w0.commit(notMine, "j", 10, 1)
	wantCode(t, "commit for a rank leased to another worker", err, codes.FailedPrecondition)
	_, err = w0.commit(&pb.RankRef{WorkerId: w0.id, JobId: "j", Attempt: 1, Rank: 7}, "j", 10, 1)
	wantCode(t, "commit for a rank not in the job", err, codes.FailedPrecondition)
	_, err = w0.commit(r0, "other-job", 10, 1)
	wantCode(t, "manifest of another job", err, codes.InvalidArgument)
	_, err = w0.commit(r0, "j", 15, 1)
	wantCode(t, "non-boundary step", err, codes.InvalidArgument)
	_, err = w0.commit(r0, "j", 110, 1)
	wantCode(t, "step past the end", err, codes.InvalidArgument)
	if _, err := w0.commit(r0, "j", 20, 1); err != nil {
		t.Fatal(err)
	}
	_, err = w0.commit(r0, "j", 10, 1)
	wantCode(t, "step not after the rank's committed one", err, codes.InvalidArgument)

	data := []byte("blob")
	_, err = w0.c.PutCheckpointBlob(w0.ctx, &pb.PutCheckpointBlobRequest{Ref: r0, Digest: checkpoint.Sum([]byte("other")).String(), Data: data})
	wantCode(t, "blob digest mismatch", err, codes.InvalidArgument)
	big := make([]byte, MaxBlobBytes+1)
	_, err = w0.c.PutCheckpointBlob(w0.ctx, &pb.PutCheckpointBlobRequest{Ref: r0, Digest: checkpoint.Sum(big).String(), Data: big})
	wantCode(t, "oversized blob", err, codes.InvalidArgument)

	avg := func(w *worker, r *pb.RankRef, step int64, weight float64, vs ...float32) ([]byte, error) {
		return w.average(r, step, weight, f32(vs...))
	}
	nan := make([]byte, 4)
	binary.LittleEndian.PutUint32(nan, math.Float32bits(float32(math.NaN())))
	_, err = w0.average(r0, 5, 1, nan)
	wantCode(t, "average with NaN", err, codes.InvalidArgument)
	_, err = avg(w0, r0, 5, 0.5, 1)
	wantCode(t, "average with a fractional weight", err, codes.InvalidArgument)
	got := make(chan []byte, 1)
	go func() {
		b, err := avg(w0, r0, 5, 1, 1, 2)
		if err != nil {
			t.Errorf("rank 0 average: %v", err)
		}
		got <- b
	}()
	for e.syncArrived("j") != 1 {
		time.Sleep(time.Millisecond)
	}
	_, err = avg(w1, r1, 5, 3, 1, 2, 3)
	wantCode(t, "average of the wrong length", err, codes.InvalidArgument)
	mean, err := avg(w1, r1, 5, 3, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if want := f32(2.5, 3.5); string(mean) != string(want) || string(<-got) != string(want) {
		t.Fatalf("mean %v", mean)
	}
	// The same contribution again is a retry whose answer was lost: it
	// gets the result; other values for the same step are refused.
	again, err := avg(w0, r0, 5, 1, 1, 2)
	if err != nil || string(again) != string(f32(2.5, 3.5)) {
		t.Fatalf("retried average: %v, %v", again, err)
	}
	_, err = avg(w0, r0, 5, 1, 1, 9)
	wantCode(t, "duplicate average", err, codes.InvalidArgument)
	_, err = avg(w0, r0, 10, 2, 1, 2)
	wantCode(t, "changed weight", err, codes.InvalidArgument)

	_, err = w0.heartbeat(&pb.RankStatus{JobId: "j", Attempt: 1, Rank: 0, Step: 5, Usage: &pb.PoolUsage{CpuSeconds: -1}})
	wantCode(t, "negative usage", err, codes.InvalidArgument)
	w0.beat(&pb.RankStatus{JobId: "j", Attempt: 1, Rank: 0, Step: 5, Usage: &pb.PoolUsage{CpuSeconds: 10}})
	_, err = w0.heartbeat(&pb.RankStatus{JobId: "j", Attempt: 1, Rank: 0, Step: 5, Usage: &pb.PoolUsage{CpuSeconds: 5}})
	wantCode(t, "decreasing usage", err, codes.InvalidArgument)
	_, err = w0.heartbeat(&pb.RankStatus{JobId: "j", Attempt: 1, Rank: 0, Step: 5, Usage: &pb.PoolUsage{CpuSeconds: math.Inf(1)}})
	wantCode(t, "infinite usage", err, codes.InvalidArgument)

	c, ctx := e.ops()
	task := &pb.Task{Name: "fine-tune", Module: &pb.ModuleRef{Sha256: strings.Repeat("ab", 32)},
		Model: &pb.ModelRef{Version: strings.Repeat("cd", 32)}}
	_, err = c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: spec("with-model", 1), ThenTask: task})
	wantCode(t, "then_task with a model", err, codes.InvalidArgument)
	_, err = c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: spec("j", 1)})
	wantCode(t, "taken id", err, codes.AlreadyExists)
	bad := spec("bad", 1)
	bad.CheckpointInterval = 0
	_, err = c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: bad})
	wantCode(t, "zero checkpoint interval", err, codes.InvalidArgument)
	env := spec("env", 1)
	env.GetCommand().Env = map[string]string{"MASTER_PORT": "1"}
	_, err = c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: env})
	wantCode(t, "reserved env", err, codes.InvalidArgument)
	_, err = c.GetJob(ctx, &pb.GetJobRequest{JobId: "nope"})
	wantCode(t, "unknown job", err, codes.NotFound)
	// A worker may not call operator methods.
	_, err = c.SubmitJob(w0.ctx, &pb.SubmitJobRequest{Spec: spec("x", 1)})
	wantCode(t, "submit with a pool-worker token", err, codes.PermissionDenied)
}

func (e *env) syncArrived(job string) int {
	var n int
	_ = e.svc.do(e.t.Context(), func() error {
		if s := e.svc.jobs[job].sync; s != nil {
			n = s.arrived
		}
		return nil
	})
	return n
}

func TestSuccessHandsOffModelAndThenTask(t *testing.T) {
	e := newEnv(t, nil)
	sp := spec("pre", 1)
	sp.TotalSteps, sp.Program = 20, &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: []uint32{4, 2}, BatchSize: 8,
		LearningRate: 0.1, Dataset: &pb.PoolDataset{Source: "mnist-train"}}}
	then := &pb.Task{Name: "fine-tune", Module: &pb.ModuleRef{Sha256: strings.Repeat("ab", 32)}}
	e.submit(sp, then)
	w := e.register("host", oneRank)
	r, err := w.heartbeat()
	if err != nil || len(r.GetStart()) != 1 {
		t.Fatalf("%v %v", r, err)
	}
	l := r.GetStart()[0]
	for i := range 5 {
		w.beat(&pb.RankStatus{JobId: "pre", Attempt: 1, Step: int64(2 * i), Usage: &pb.PoolUsage{CpuSeconds: float64(i), PeakMemoryBytes: 1 << 20}})
	}
	if _, err := w.commit(ref(w, l), "pre", 10, 1, 2); err != nil {
		t.Fatal(err)
	}
	final, err := w.commit(ref(w, l), "pre", 20, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if j := e.job("pre"); j.GetState() != running || j.GetCommittedStep() != 20 {
		t.Fatalf("before the rank's exit: %v", j)
	}
	digest := strings.Repeat("0f", 32)
	if _, err := w.c.RankExited(w.ctx, &pb.RankExitedRequest{WorkerId: w.id, JobId: "pre", Attempt: 1, Completed: true,
		DataSha256: digest, Usage: &pb.PoolUsage{CpuSeconds: 9, PeakMemoryBytes: 2 << 20}}); err != nil {
		t.Fatal(err)
	}
	j := e.job("pre")
	if j.GetState() != succeeded || j.GetOutputVersion() == "" || j.GetThenTaskId() != "task-1" || j.GetStateReason() != "completed 20 steps" {
		t.Fatalf("job %v", j)
	}
	if len(e.models) != 1 {
		t.Fatalf("%d models stored", len(e.models))
	}
	m := e.models[0]
	if got := m.m.Flatten(); len(got) != 2 || got[0] != 3 || got[1] != 4 || m.name != "mnist-base" {
		t.Fatalf("model %s %v", m.name, got)
	}
	lin := m.lineage
	if lin.GetJobId() != "pre" || lin.GetCheckpoint() != final.GetId() || lin.GetSteps() != 20 || lin.GetSpecDigest() != j.GetSpecDigest() ||
		lin.GetDataSha256() == "" || lin.GetUsage().GetCpuSeconds() != 9 || lin.GetUsage().GetGpuSeconds() != 10 {
		t.Fatalf("lineage %v", lin)
	}
	if len(e.tasks) != 1 || e.tasks[0].GetModel().GetVersion() != j.GetOutputVersion() || e.tasks[0].GetModel().GetSha256() != j.GetOutputVersion() {
		t.Fatalf("then task %v", e.tasks)
	}
	var states []string
	for _, ev := range e.poolEvents() {
		states = append(states, ev.State)
	}
	if strings.Join(states, ",") != "submitted,running,succeeded" {
		t.Fatalf("pool job events %v", states)
	}
	e.mu.Lock()
	types := []string{}
	for _, p := range e.events {
		types = append(types, string(p.EventType()))
	}
	e.mu.Unlock()
	if strings.Join(types, ",") != "pool.job,pool.job,model.imported,pool.job" {
		t.Fatalf("audit events %v", types)
	}
	ev := e.poolEvents()[2]
	if ev.Model != j.GetOutputVersion() || ev.CPUSeconds != 9 || ev.GPUSeconds != 10 || ev.PeakMemoryBytes != 2<<20 || ev.Kind != "pretrain" {
		t.Fatalf("success event %+v", ev)
	}
}

func TestRestartRestoresJobs(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGang(t, e, "j", 1)
	w := ws[0]
	if _, err := w.commit(ref(w, ls[0]), "j", 10, 5); err != nil {
		t.Fatal(err)
	}
	e.submit(spec("waiting", 1), nil)
	e.restart()
	j := e.job("j")
	if j.GetState() != queued || j.GetCommittedStep() != 10 || j.GetRestarts() != 0 ||
		j.GetStateReason() != "server restarted; resuming from checkpoint step 10" {
		t.Fatalf("restored job %v: %s", j, j.GetStateReason())
	}
	if j := e.job("waiting"); j.GetState() != queued {
		t.Fatalf("waiting job %v", j)
	}
	old := &worker{e: e, ctx: w.ctx, c: apiv1.NewPoolWorkerServiceClient(e.conn), id: w.id}
	_, err := old.heartbeat()
	wantCode(t, "worker of the old server", err, codes.NotFound)
	w2 := e.register("host", oneRank)
	r, err := w2.heartbeat()
	if err != nil || len(r.GetStart()) != 1 {
		t.Fatalf("%v %v", r, err)
	}
	l := r.GetStart()[0]
	if l.GetJobId() != "j" || l.GetAttempt() != 2 || l.GetResumeStep() != 10 {
		t.Fatalf("lease %v", l)
	}
	got, err := w2.c.GetRankCheckpoint(w2.ctx, &pb.GetRankCheckpointRequest{Ref: ref(w2, l)})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := checkpoint.DecodeManifest(got.GetManifest()); err != nil || m.Step != 10 {
		t.Fatalf("resume manifest %v %v", m, err)
	}
	c, ctx := e.ops()
	list, err := c.ListJobs(ctx, &pb.ListJobsRequest{PageSize: 1})
	if err != nil || len(list.GetJobs()) != 1 || list.GetJobs()[0].GetSpec().GetId() != "waiting" || list.GetNextPageToken() == "" {
		t.Fatalf("list %v %v", list, err)
	}
	list, err = c.ListJobs(ctx, &pb.ListJobsRequest{PageSize: 1, PageToken: list.GetNextPageToken()})
	if err != nil || len(list.GetJobs()) != 1 || list.GetJobs()[0].GetSpec().GetId() != "j" {
		t.Fatalf("second page %v %v", list, err)
	}
}
