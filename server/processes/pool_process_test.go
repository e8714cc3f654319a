package processes_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// poolHeartbeat is the servers' heartbeat long poll in these tests: a
// worker that stops calling is lost after three of them.
const poolHeartbeat = 300 * time.Millisecond

// A rank asks for one core and rankMemory; every worker offers one core and
// half as much memory again, so one rank fits and two do not.
const (
	rankMemory   = 256 << 20
	workerMemory = rankMemory * 3 / 2
)

// waitBound guards waits on the server against a hang; it is not a
// performance figure.
const waitBound = 90 * time.Second

// poolCluster is a fleetlearn-server with a short pool heartbeat, and the
// fleetlearn-worker processes that joined it.
type poolCluster struct {
	*cluster
	workerBin string
	jobs      apiv1.PoolServiceClient
	metrics   string // the server's /metrics listener
}

// poolWorker is one fleetlearn-worker process and the id the server gave it.
type poolWorker struct {
	name, id string
	p        *proc
}

func newPoolCluster(t testing.TB) *poolCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs separate processes")
	}
	if _, err := data.MNISTDir(); errors.Is(err, data.ErrMNISTNotFound) {
		t.Skip("MNIST is not available (data.MNISTDir); the built-in trainer's jobs need it")
	}
	s, e, cli := binaries(t)
	c := &cluster{t: t, serverBin: s, edgeBin: e, cli: cli, dataDir: t.TempDir(), grpcAddr: servertest.FreeAddr(t), nats: servertest.FreeAddr(t)}
	t.Setenv("FLEETLEARN_CA", server.CAFile(c.dataDir))
	t.Setenv("FLEETLEARN_TOKEN_FILE", server.AdminTokenPath(c.dataDir))
	keys := t.TempDir()
	c.publisherKey, c.jwks = filepath.Join(keys, "publisher.pem"), filepath.Join(keys, "publishers.jwks")
	if err := os.WriteFile(c.jwks, []byte(runCLI(t, cli, "", "module", "keygen", c.publisherKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	metricsAddr := servertest.FreeAddr(t)
	c.server = start(t, "server", c.serverBin, "-data-dir", c.dataDir, "-nats-listen", c.nats,
		"-grpc-addr", c.grpcAddr, "-metrics-addr", metricsAddr, "-pace-window", "200ms", "-log-level", "debug",
		"-module-publishers", c.jwks, "-pool-heartbeat", poolHeartbeat.String())
	c.dial()
	c.waitGRPC()
	return &poolCluster{cluster: c, workerBin: workerBin(s), jobs: apiv1.NewPoolServiceClient(c.conn), metrics: metricsAddr}
}

// startWorker mints a pool-worker token the way an operator would, starts
// fleetlearn-worker with room for one rank and the extra flags, and waits
// until it is ready.
func (pc *poolCluster) startWorker(name string, extra ...string) *poolWorker {
	t := pc.t
	t.Helper()
	dir := t.TempDir()
	tok := runCLI(t, pc.cli, "", "token", "mint", "--data-dir", pc.dataDir, "--subject", name, "--role", "pool-worker")
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"run", "--server", pc.grpcAddr, "--ca", server.CAFile(pc.dataDir),
		"--token-file", tokFile, "--work-dir", filepath.Join(dir, "work"), "--name", name,
		"--cpus", "1", "--memory", fmt.Sprint(workerMemory), "--log-level", "debug"}, extra...)
	p := start(t, name, pc.workerBin, args...)
	w := &poolWorker{name: name, p: p}
	pc.waitFor("worker "+name+" ready", func() bool {
		for _, wk := range pc.workers() {
			if wk.GetName() == name && wk.GetState() == "ready" {
				w.id = wk.GetId()
				return true
			}
		}
		return false
	})
	return w
}

// workers lists the pool's workers through the CLI.
func (pc *poolCluster) workers() []*pb.PoolWorker {
	var res pb.ListWorkersResponse
	pc.unmarshal(runCLI(pc.t, pc.cli, pc.grpcAddr, "pool", "workers", "-o", "json"), &res)
	return res.GetWorkers()
}

func (pc *poolCluster) unmarshal(s string, m proto.Message) {
	pc.t.Helper()
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(s), m); err != nil {
		pc.t.Fatalf("fleetlearn output is not a %T: %v\n%s", m, err, s)
	}
}

// submit runs fleetlearn pool submit with args and returns the job.
func (pc *poolCluster) submit(args ...string) *pb.PoolJob {
	pc.t.Helper()
	var j pb.PoolJob
	pc.unmarshal(runCLI(pc.t, pc.cli, pc.grpcAddr, append([]string{"pool", "submit", "-o", "json"}, args...)...), &j)
	return &j
}

// getCLI reads a job through fleetlearn pool get -o json.
func (pc *poolCluster) getCLI(id string) *pb.PoolJob {
	pc.t.Helper()
	var j pb.PoolJob
	pc.unmarshal(runCLI(pc.t, pc.cli, pc.grpcAddr, "pool", "get", id, "-o", "json"), &j)
	return &j
}

// get reads a job through the API; the polling loops use it, as cheaper
// than a CLI process every few milliseconds.
func (pc *poolCluster) get(id string) *pb.PoolJob {
	pc.t.Helper()
	res, err := pc.jobs.GetJob(context.Background(), &pb.GetJobRequest{JobId: id})
	if err != nil {
		pc.t.Fatalf("get job %s: %v", id, err)
	}
	return res.GetJob()
}

func (pc *poolCluster) waitFor(what string, cond func() bool) {
	pc.t.Helper()
	pc.waitForWithin(what, waitBound, cond)
}

// waitForWithin is waitFor with another bound, for jobs that train for
// longer than the tests' own.
func (pc *poolCluster) waitForWithin(what string, bound time.Duration, cond func() bool) {
	pc.t.Helper()
	end := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(end) {
			pc.t.Fatalf("%s: not after %v", what, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func terminal(s pb.PoolJobState) bool {
	switch s {
	case pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, pb.PoolJobState_POOL_JOB_STATE_FAILED, pb.PoolJobState_POOL_JOB_STATE_CANCELLED:
		return true
	}
	return false
}

// waitEnd waits for the job to end; a succeeded job must have its model
// stored (the handoff follows the last checkpoint).
func (pc *poolCluster) waitEnd(id string) *pb.PoolJob {
	pc.t.Helper()
	return pc.waitEndWithin(id, waitBound)
}

// waitEndWithin is waitEnd with another bound.
func (pc *poolCluster) waitEndWithin(id string, bound time.Duration) *pb.PoolJob {
	pc.t.Helper()
	var j *pb.PoolJob
	pc.waitForWithin("job "+id+" ended", bound, func() bool {
		j = pc.get(id)
		if j.GetState() == pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
			return j.GetOutputVersion() != "" || !strings.Contains(j.GetStateReason(), "storing the model")
		}
		return terminal(j.GetState())
	})
	return j
}

// logs reads every line the server kept for a job, with the times the
// workers read them (pool logs prints the same lines without the times).
func (pc *poolCluster) logs(id string) []*pb.PoolLogLine {
	pc.t.Helper()
	stream, err := pc.jobs.JobLogs(context.Background(), &pb.JobLogsRequest{JobId: id})
	if err != nil {
		pc.t.Fatal(err)
	}
	var out []*pb.PoolLogLine
	for {
		res, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			pc.t.Fatalf("logs of %s: %v", id, err)
		}
		out = append(out, res.GetLines()...)
	}
}

// rankStarts are the times the workers' notes say each rank of an attempt
// started.
func rankStarts(lines []*pb.PoolLogLine, attempt uint32) map[uint32]time.Time {
	out := map[uint32]time.Time{}
	for _, l := range lines {
		if l.GetStream() == "agent" && l.GetAttempt() == attempt && strings.Contains(l.GetText(), " started on worker ") {
			out[l.GetRank()] = l.GetTime().AsTime()
		}
	}
	return out
}

// poolEvent is a pool.job entry of the audit log as audit query --json
// prints it.
type poolEvent struct {
	Time    time.Time `json:"ts"`
	Payload struct {
		Job            string  `json:"job"`
		State          string  `json:"state"`
		Detail         string  `json:"detail"`
		GPUSeconds     float64 `json:"gpu_seconds"`
		GPUBusySeconds float64 `json:"gpu_busy_seconds"`
		EnergyJoules   float64 `json:"energy_joules"`
	} `json:"payload"`
}

// poolEvents reads the job's pool.job audit entries through the CLI.
func (pc *poolCluster) poolEvents(job string) []poolEvent {
	pc.t.Helper()
	out := runCLI(pc.t, pc.cli, pc.grpcAddr, "audit", "query", "--type", "pool.job", "--json")
	var evs []poolEvent
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Event poolEvent `json:"event"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			pc.t.Fatalf("audit query line %q: %v", sc.Text(), err)
		}
		if e.Event.Payload.Job == job {
			evs = append(evs, e.Event)
		}
	}
	return evs
}

// export downloads a version with fleetlearn model export and decodes it.
func (pc *poolCluster) export(version string) *model.Model {
	pc.t.Helper()
	path := filepath.Join(pc.t.TempDir(), "model.safetensors")
	runCLI(pc.t, pc.cli, pc.grpcAddr, "model", "export", version, "-o", path)
	b, err := os.ReadFile(path)
	if err != nil {
		pc.t.Fatal(err)
	}
	m, err := model.DecodeSafetensors(b)
	if err != nil {
		pc.t.Fatalf("exported %s does not decode: %v", version, err)
	}
	return m
}

// builtinJob is the flags of a 2-rank built-in trainer job.
func builtinJob(id string, steps, every int, dataset string) []string {
	return []string{"--id", id, "--ranks", "2", "--cpu", "1", "--memory", fmt.Sprint(rankMemory),
		"--arch", "mlp:784,32,10", "--dataset", dataset, "--steps", fmt.Sprint(steps),
		"--checkpoint-every", fmt.Sprint(every), "--sync-every", "10", "--seed", "7", "--init-seed", "3",
		"--output-model", "base"}
}

func placedOn(j *pb.PoolJob) []string {
	var out []string
	for _, p := range j.GetPlacement() {
		out = append(out, p.GetWorker())
	}
	slices.Sort(out)
	return out
}

// TestPoolGangStartsTogether: a 2-rank job with one worker of room for one
// rank waits whole, with no rank started; the second worker lets both ranks
// start in the same attempt, and the job ends as a model.
func TestPoolGangStartsTogether(t *testing.T) {
	pc := newPoolCluster(t)
	w1 := pc.startWorker("w1")
	pc.submit(builtinJob("gang", 40, 20, "mnist-train:0:2000")...)

	// Not happening is what is shown, so the wait is a fixed number of
	// heartbeat intervals: w1 heartbeats several times meanwhile.
	time.Sleep(6 * poolHeartbeat)
	j := pc.getCLI("gang")
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_QUEUED || len(j.GetPlacement()) != 0 || j.GetAttempt() > 0 {
		t.Fatalf("with one worker the 2-rank job is %v on %v (attempt %d), want queued and unplaced", j.GetState(), placedOn(j), j.GetAttempt())
	}
	// The pool's whole capacity is one rank's, so the server says the gang
	// does not fit; with room taken by other jobs it would wait for a
	// reservation instead.
	if r := strings.ToLower(j.GetStateReason()); !strings.Contains(r, "gang of 2 ranks") ||
		!strings.Contains(r, "does not fit") && !strings.Contains(r, "wait") && !strings.Contains(r, "reserv") {
		t.Fatalf("queued job's reason %q says neither that the gang of 2 does not fit nor that it waits for a reservation", j.GetStateReason())
	}
	if n := len(pc.logs("gang")); n != 0 {
		t.Fatalf("the unplaced job has %d log lines", n)
	}
	if b, _ := os.ReadFile(w1.p.log); strings.Contains(string(b), "rank") {
		t.Fatalf("worker w1 ran a rank of an unplaced gang:\n%s", b)
	}
	t.Logf("queued with one worker: %q", j.GetStateReason())

	w2 := pc.startWorker("w2")
	j = pc.waitEnd("gang")
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || j.GetOutputVersion() == "" {
		t.Fatalf("job %v (%s), model %q", j.GetState(), j.GetStateReason(), j.GetOutputVersion())
	}
	if j.GetAttempt() != 1 || j.GetRestarts() != 0 {
		t.Fatalf("job ran in attempt %d with %d restarts, want attempt 1", j.GetAttempt(), j.GetRestarts())
	}
	lines := pc.logs("gang")
	for _, l := range lines {
		if l.GetAttempt() != 1 {
			t.Fatalf("log line of attempt %d: %q", l.GetAttempt(), l.GetText())
		}
	}
	starts := rankStarts(lines, 1)
	if len(starts) != 2 {
		t.Fatalf("ranks started in attempt 1: %v, want 0 and 1", starts)
	}
	spread := starts[0].Sub(starts[1]).Abs()
	t.Logf("gang start spread: %v (%.2f heartbeat intervals of %v)", spread, float64(spread)/float64(poolHeartbeat), poolHeartbeat)
	for _, w := range []*poolWorker{w1, w2} {
		// A worker logs a rank's end after it reports it, so the job can be
		// over before the line is written.
		var b []byte
		for end := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			if b, _ = os.ReadFile(w.p.log); strings.Contains(string(b), "job=gang attempt=1") || time.Now().After(end) {
				break
			}
		}
		if !strings.Contains(string(b), "job=gang attempt=1") {
			t.Fatalf("worker %s did not run a rank of attempt 1:\n%s", w.name, tail(string(b), 2000))
		}
	}
	if m := pc.export(j.GetOutputVersion()); len(m.Tensors) != 4 {
		t.Fatalf("output model has %d tensors, want the MLP's 4", len(m.Tensors))
	}
	// Each rank timed every checkpoint's stall and sent it with the commit:
	// two ranks, checkpoints at steps 20 and 40.
	if st := pc.getCLI("gang").GetCheckpointStall(); st.GetCount() != 4 || st.GetMaxSeconds() <= 0 ||
		st.GetP50Seconds() > st.GetP99Seconds() || st.GetP99Seconds() > st.GetMaxSeconds() {
		t.Fatalf("checkpoint stall %v, want 4 stalls, p50 ≤ p99 ≤ max", st)
	}
	out := runCLI(t, pc.cli, pc.grpcAddr, "pool", "get", "gang")
	if !strings.Contains(out, "checkpoint stall") || !strings.Contains(out, "over 4 checkpoints") {
		t.Fatalf("pool get shows no checkpoint stall over 4 checkpoints:\n%s", out)
	}
	if n := scrapeCounter(t, pc.metrics, `fleetlearn_pool_checkpoint_stall_seconds_count{tenant="default"}`); n != 4 {
		t.Fatalf("fleetlearn_pool_checkpoint_stall_seconds counted %v stalls, want 4", n)
	}
}

// TestPoolWorkerKilledResumesBitwise: kill -9 a worker holding a rank after
// the second checkpoint; the server declares it lost, requeues the job from
// the checkpoint, resumes it on the other two workers, and the model equals
// bit for bit that of the same job run without interruption.
func TestPoolWorkerKilledResumesBitwise(t *testing.T) {
	pc := newPoolCluster(t)
	workers := map[string]*poolWorker{}
	for _, n := range []string{"w1", "w2", "w3"} {
		w := pc.startWorker(n)
		workers[w.id] = w
	}
	const steps, every = 200, 20
	spec := func(id string) []string { return builtinJob(id, steps, every, "mnist-train:0:4000") }
	pc.submit(spec("killed")...)

	var j *pb.PoolJob
	pc.waitFor("killed job's checkpoint at step 40", func() bool {
		j = pc.get("killed")
		return j.GetCommittedStep() >= 40 || terminal(j.GetState())
	})
	if j.GetCommittedStep() >= steps || terminal(j.GetState()) {
		t.Fatalf("the job ran to %v at step %d before a worker could be killed", j.GetState(), j.GetCommittedStep())
	}
	if len(j.GetPlacement()) != 2 {
		t.Fatalf("placement %v, want two workers", placedOn(j))
	}
	victim := workers[j.GetPlacement()[1].GetWorker()]
	if victim == nil {
		t.Fatalf("placement names unknown worker %s", j.GetPlacement()[1].GetWorker())
	}
	killedAt := time.Now()
	victim.p.kill9()
	t.Logf("kill -9 %s (%s) at committed step %d", victim.name, victim.id, j.GetCommittedStep())

	pc.waitFor("job requeued after the kill", func() bool {
		j = pc.get("killed")
		return j.GetAttempt() >= 2 || terminal(j.GetState())
	})
	if j.GetAttempt() != 2 || j.GetRestarts() != 1 {
		t.Fatalf("after the kill: attempt %d, %d restarts, state %v (%s)", j.GetAttempt(), j.GetRestarts(), j.GetState(), j.GetStateReason())
	}
	// The requeue may be followed at once by the placement on the two
	// workers left, so its reason is read from the audit log.
	var requeue *poolEvent
	evs := pc.poolEvents("killed")
	for i := range evs {
		if evs[i].Payload.State == "submitted" && strings.Contains(evs[i].Payload.Detail, "lost") {
			requeue = &evs[i]
			break
		}
	}
	if requeue == nil {
		t.Fatalf("no audit event requeues the job after the loss: %+v", evs)
	}
	d := requeue.Payload.Detail
	if !strings.Contains(d, "worker "+victim.id+" lost") || !strings.Contains(d, "restart 1 of 3") ||
		!strings.Contains(d, fmt.Sprintf("from checkpoint step %d", j.GetCommittedStep())) {
		t.Fatalf("requeue reason %q does not name lost worker %s, restart 1 of 3 and checkpoint step %d", d, victim.id, j.GetCommittedStep())
	}
	lag := requeue.Time.Sub(killedAt)
	t.Logf("kill to requeue: %v = %.1f heartbeat intervals (loss declared after 3); reason %q", lag, float64(lag)/float64(poolHeartbeat), d)

	lost := false
	for _, wk := range pc.workers() {
		if wk.GetId() == victim.id {
			lost = wk.GetState() == "lost"
		}
	}
	if !lost {
		t.Fatalf("pool workers does not show %s lost: %v", victim.id, pc.workers())
	}
	j = pc.waitEnd("killed")
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || j.GetOutputVersion() == "" || j.GetAttempt() != 2 {
		t.Fatalf("job %v (%s) attempt %d, model %q", j.GetState(), j.GetStateReason(), j.GetAttempt(), j.GetOutputVersion())
	}
	starts2 := rankStarts(pc.logs("killed"), 2)
	if len(starts2) != 2 {
		t.Fatalf("ranks started in attempt 2: %v", starts2)
	}
	// The placement of the attempt that finished, as the workers' notes
	// tell it (a succeeded job has no placement any more).
	resumed := 0
	for _, l := range pc.logs("killed") {
		if l.GetAttempt() == 2 && strings.Contains(l.GetText(), "started on worker "+victim.id) {
			t.Fatalf("attempt 2 placed a rank on the dead worker: %q", l.GetText())
		}
		// Each rank says where it starts: the committed step, not 0.
		if l.GetAttempt() == 2 && strings.Contains(l.GetText(), "resuming from the checkpoint at step ") {
			resumed++
		}
	}
	if resumed != 2 {
		t.Fatalf("%d ranks of attempt 2 say they resumed from the committed checkpoint, want 2", resumed)
	}

	// The same spec under another id, never interrupted: the parameters do
	// not depend on the job id.
	pc.submit(spec("straight")...)
	s := pc.waitEnd("straight")
	if s.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || s.GetOutputVersion() == "" || s.GetAttempt() != 1 {
		t.Fatalf("uninterrupted job %v (%s) attempt %d", s.GetState(), s.GetStateReason(), s.GetAttempt())
	}
	a, b := pc.export(j.GetOutputVersion()), pc.export(s.GetOutputVersion())
	if len(a.Tensors) != len(b.Tensors) || len(a.Tensors) == 0 {
		t.Fatalf("models have %d and %d tensors", len(a.Tensors), len(b.Tensors))
	}
	for i := range a.Tensors {
		ta, tb := a.Tensors[i], b.Tensors[i]
		if ta.Name != tb.Name || !slices.Equal(ta.Shape, tb.Shape) {
			t.Fatalf("tensor %d: %s %v vs %s %v", i, ta.Name, ta.Shape, tb.Name, tb.Shape)
		}
		for k := range ta.Data {
			if math.Float32bits(ta.Data[k]) != math.Float32bits(tb.Data[k]) {
				t.Fatalf("%s[%d]: resumed %v (%08x), uninterrupted %v (%08x)", ta.Name, k, ta.Data[k],
					math.Float32bits(ta.Data[k]), tb.Data[k], math.Float32bits(tb.Data[k]))
			}
		}
	}
	if a.Hash() != b.Hash() {
		t.Fatal("equal tensors, different model hashes")
	}
	// The versions are digests of the stored files, whose metadata names
	// the job, so they differ although the tensors do not.
	t.Logf("resumed and uninterrupted models: tensors bitwise equal (%d tensors); versions %s and %s",
		len(a.Tensors), shortVersion(j.GetOutputVersion()), shortVersion(s.GetOutputVersion()))
}

func shortVersion(v string) string {
	if len(v) > 12 {
		return v[:12]
	}
	return v
}

// trainScript follows the checkpoint contract of docs/POOL.md: a softmax
// layer (fc1, 3 classes of 8 features, the shape the Softmax module trains)
// whose parameters move deterministically each step, committed as
// step-N.tmp renamed to step-N, and resumed from FLEETLEARN_RESUME_FROM.
const trainScript = `import json, os, struct, sys

CLASSES, DIM = 3, 8


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, shape, vals in tensors:
        blob = struct.pack("<%df" % len(vals), *vals)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


env = os.environ
ckdir, steps, every = env["FLEETLEARN_CHECKPOINT_DIR"], int(env["FLEETLEARN_STEPS"]), int(env["FLEETLEARN_CHECKPOINT_EVERY"])
w, b, step = [0.0] * (CLASSES * DIM), [0.0] * CLASSES, 0
resume = env.get("FLEETLEARN_RESUME_FROM")
if resume:
    with open(os.path.join(resume, "state.json")) as f:
        st = json.load(f)
    w, b, step = st["w"], st["b"], st["step"]
    print("resumed step=%d" % step, flush=True)
while step < steps:
    step += 1
    w = [v + 0.001 * ((i + step) % 5 - 2) for i, v in enumerate(w)]
    b = [v + 0.01 * (c - 1) for c, v in enumerate(b)]
    if step % every == 0 or step == steps:
        final = os.path.join(ckdir, "step-%d" % step)
        tmp = final + ".tmp"
        os.makedirs(tmp)
        write_safetensors(os.path.join(tmp, "model.safetensors"), [("fc1.weight", [CLASSES, DIM], w), ("fc1.bias", [CLASSES], b)])
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({"step": step, "w": w, "b": b}, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(ckdir)
        print("checkpoint step=%d" % step, flush=True)
print("done step=%d" % step, flush=True)
`

// TestPoolCommandJobAndLineage: a python3 job of its own that follows the
// checkpoint contract becomes a pool model; the then-task created from it
// trains a round on edge devices, and fleetlearn model lineage shows the
// pool job, its spec digest and that task. A task whose model names another
// digest than its version's is refused.
func TestPoolCommandJobAndLineage(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed; the command job runs a Python script")
	}
	pc := newPoolCluster(t)
	// setup registers the Softmax module and imports another model, whose
	// digest the refused task names.
	init, _ := train.InitMLP([]int{8, 3}, 1)
	other, module := pc.setup(init, wasmtest.Softmax)
	pc.startWorker("w1")

	dir := t.TempDir()
	script := filepath.Join(dir, "train.py")
	if err := os.WriteFile(script, []byte(trainScript), 0o600); err != nil {
		t.Fatal(err)
	}
	hyper, _ := json.Marshal(sgd.Hyper{Epochs: 1, BatchSize: 16, LearningRate: 0.5, EvalBatchSize: 100})
	then := &pb.Task{Name: "finetune", Module: &pb.ModuleRef{Sha256: module}, Hyperparameters: hyper,
		CohortTarget: 2, ReportGoal: 2, OverSelection: 1, RoundsTotal: 1,
		SelectionTimeout: durationpb.New(10 * time.Second), ReportTimeout: durationpb.New(30 * time.Second)}
	tb, err := protojson.Marshal(then)
	if err != nil {
		t.Fatal(err)
	}
	taskFile := filepath.Join(dir, "task.json")
	if err := os.WriteFile(taskFile, tb, 0o600); err != nil {
		t.Fatal(err)
	}
	pc.submit("--id", "own-script", "--ranks", "1", "--cpu", "1", "--memory", fmt.Sprint(rankMemory),
		"--steps", "30", "--checkpoint-every", "10", "--output-model", "script-base", "--then-task", taskFile,
		"--", python, script)
	pc.startEdges([]*data.Dataset{datatest.Synthetic(300, 8, 3, 1), datatest.Synthetic(300, 8, 3, 2)})

	j := pc.waitEnd("own-script")
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || j.GetOutputVersion() == "" || j.GetThenTaskId() == "" {
		t.Fatalf("command job %v (%s), model %q, then task %q", j.GetState(), j.GetStateReason(), j.GetOutputVersion(), j.GetThenTaskId())
	}
	version := j.GetOutputVersion()
	m := pc.export(version)
	if len(m.Tensors) != 2 || m.Tensors[0].Name != "fc1.bias" && m.Tensors[1].Name != "fc1.bias" {
		t.Fatalf("the job's model is not the script's fc1: %v", m.Tensors)
	}
	var got pb.Model
	pc.unmarshal(runCLI(t, pc.cli, pc.grpcAddr, "model", "get", version, "-o", "json"), &got)
	if got.GetSource() != pb.ModelSource_MODEL_SOURCE_POOL || got.GetLineage().GetJobId() != "own-script" {
		t.Fatalf("model get: source %v, lineage %v", got.GetSource(), got.GetLineage())
	}
	if out := runCLI(t, pc.cli, pc.grpcAddr, "model", "get", version); !strings.Contains(out, "pool") {
		t.Fatalf("model get does not show source pool:\n%s", out)
	}

	task := pc.waitDone(j.GetThenTaskId(), waitBound)
	if task.State != pb.TaskState_TASK_STATE_COMPLETED || task.GetModel().GetVersion() != version {
		t.Fatalf("then task %v (%s) on model %s, want completed on %s", task.State, task.StateReason, task.GetModel().GetVersion(), version)
	}
	out := runCLI(t, pc.cli, pc.grpcAddr, "model", "lineage", version)
	for _, want := range []string{"pool job own-script", "spec " + j.GetSpecDigest()[:12], "federated task " + j.GetThenTaskId(), "this version"} {
		if !strings.Contains(out, want) {
			t.Fatalf("model lineage lacks %q:\n%s", want, out)
		}
	}
	t.Logf("fleetlearn model lineage %s:\n%s", shortVersion(version), out)

	// The refusal is of the API, whatever the client.
	bad := proto.CloneOf(then)
	bad.Model = &pb.ModelRef{Version: version, Sha256: other}
	_, err = apiv1.NewTaskServiceClient(pc.conn).CreateTask(context.Background(), &pb.CreateTaskRequest{Task: bad})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), other) {
		t.Fatalf("task on %s naming digest %s: %v, want INVALID_ARGUMENT naming the digest", version, other, err)
	}
}

// children are the processes whose parent is pid, from /proc.
func children(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc to find a worker's rank processes: %v", err)
	}
	var out []int
	for _, e := range ents {
		var child int
		if _, err := fmt.Sscan(e.Name(), &child); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok && strings.TrimSpace(v) == fmt.Sprint(pid) {
				out = append(out, child)
			}
		}
	}
	return out
}

// TestPoolCancel: cancelling a running job stops its ranks, frees the
// workers and is recorded in the audit log.
func TestPoolCancel(t *testing.T) {
	pc := newPoolCluster(t)
	ws := []*poolWorker{pc.startWorker("w1"), pc.startWorker("w2")}
	pc.submit(builtinJob("cancelme", 1_000_000, 1000, "mnist-train:0:2000")...)
	pc.waitFor("job running with progress", func() bool {
		j := pc.get("cancelme")
		return j.GetState() == pb.PoolJobState_POOL_JOB_STATE_RUNNING && j.GetStep() > 0 || terminal(j.GetState())
	})
	for _, w := range ws {
		if n := len(children(t, w.p.cmd.Process.Pid)); n != 1 {
			t.Fatalf("worker %s runs %d rank processes, want 1", w.name, n)
		}
	}
	var j pb.PoolJob
	pc.unmarshal(runCLI(t, pc.cli, pc.grpcAddr, "pool", "cancel", "cancelme", "--reason", "test over", "-o", "json"), &j)
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_CANCELLED || !strings.Contains(j.GetStateReason(), "test over") {
		t.Fatalf("cancel answered %v (%s)", j.GetState(), j.GetStateReason())
	}
	for _, w := range ws {
		pc.waitFor("worker "+w.name+"'s rank process gone", func() bool { return len(children(t, w.p.cmd.Process.Pid)) == 0 })
	}
	pc.waitFor("workers free", func() bool {
		for _, wk := range pc.workers() {
			if wk.GetState() != "ready" || wk.GetFree().GetMilliCpu() != wk.GetCapacity().GetMilliCpu() ||
				wk.GetFree().GetMemoryBytes() != wk.GetCapacity().GetMemoryBytes() {
				return false
			}
		}
		return true
	})
	if g := pc.getCLI("cancelme"); g.GetState() != pb.PoolJobState_POOL_JOB_STATE_CANCELLED || len(g.GetPlacement()) != 0 {
		t.Fatalf("after cancel: %v on %v", g.GetState(), placedOn(g))
	}
	found := false
	for _, e := range pc.poolEvents("cancelme") {
		found = found || e.Payload.State == "cancelled" && strings.Contains(e.Payload.Detail, "test over")
	}
	if !found {
		t.Fatalf("no cancelled pool.job event: %+v", pc.poolEvents("cancelme"))
	}
	for _, w := range ws {
		b, _ := os.ReadFile(w.p.log)
		t.Logf("worker %s: %d stop orders for the cancelled rank", w.name, strings.Count(string(b), `msg="stopping rank" job=cancelme`))
	}
}

// fakeSMI is an nvidia-smi that reports one GPU to detection and, to the
// meter's query, a constant 250 W at 80% utilization.
const fakeSMI = `#!/bin/sh
case "$*" in
*index,uuid*) echo "0, GPU-00000000-0000-0000-0000-000000000001, Fake GPU, 16384" ;;
*power.draw,utilization.gpu*) echo "250.00, 80" ;;
*) echo "fake nvidia-smi: unexpected $*" >&2; exit 2 ;;
esac
`

// TestPoolGPUMetering: a worker with nvidia-smi on its PATH (a fake one
// reporting 250 W at 80%) offers the GPU it detects; a job rank holding it
// is metered through nvidia-smi's power and utilization, and the GPUs'
// busy time and energy reach pool get and the job's final pool.job audit
// event, beside the GPU time held. The fake's constant readings make
// energy / busy time exactly 250 W / 0.8.
func TestPoolGPUMetering(t *testing.T) {
	pc := newPoolCluster(t)
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "nvidia-smi"), []byte(fakeSMI), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tok := runCLI(t, pc.cli, "", "token", "mint", "--data-dir", pc.dataDir, "--subject", "gpu-1", "--role", "pool-worker")
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// No --cpus or --memory: the worker detects what it offers, the GPU included.
	cmd := exec.Command(pc.workerBin, "run", "--server", pc.grpcAddr, "--ca", server.CAFile(pc.dataDir),
		"--token-file", tokFile, "--work-dir", filepath.Join(dir, "work"), "--name", "gpu-1", "--log-level", "debug")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	startCmd(t, "gpu-1", cmd)
	pc.waitFor("the GPU worker ready", func() bool {
		for _, w := range pc.workers() {
			if w.GetName() == "gpu-1" && w.GetState() == "ready" {
				return w.GetCapacity().GetGpus() == 1
			}
		}
		return false
	})
	pc.submit("--id", "gpu-job", "--ranks", "1", "--cpu", "1", "--gpus", "1", "--memory", fmt.Sprint(rankMemory),
		"--arch", "mlp:784,32,10", "--dataset", "mnist-train:0:2000", "--steps", "60", "--checkpoint-every", "20",
		"--seed", "7", "--init-seed", "3", "--output-model", "gpu-base")
	if j := pc.waitEnd("gpu-job"); j.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
		t.Fatalf("job %v: %s", j.GetState(), j.GetStateReason())
	}
	u := pc.getCLI("gpu-job").GetUsage()
	if u.GetGpuMeter() != "nvidia-smi" || !(u.GetGpuBusySeconds() > 0) || !(u.GetGpuSeconds() > 0) {
		t.Fatalf("usage %v: want GPU busy time from nvidia-smi", u)
	}
	if u.GetEnergySource() == "nvidia-smi" {
		// RAPL unreadable here: the energy is the GPU's alone.
		if r := u.GetEnergyJoules() / u.GetGpuBusySeconds(); math.Abs(r-250/0.8) > 1e-6*r {
			t.Fatalf("energy %v J over %v busy GPU-seconds = %v W, want 312.5", u.GetEnergyJoules(), u.GetGpuBusySeconds(), r)
		}
	} else if !strings.Contains(u.GetEnergySource(), "nvidia-smi") || !(u.GetEnergyJoules() >= 250/0.8*u.GetGpuBusySeconds()*(1-1e-6)) {
		t.Fatalf("energy %v J from %q with %v busy GPU-seconds", u.GetEnergyJoules(), u.GetEnergySource(), u.GetGpuBusySeconds())
	}
	if out := runCLI(t, pc.cli, pc.grpcAddr, "pool", "get", "gpu-job"); !strings.Contains(out, " GPU-s held, ") ||
		!strings.Contains(out, " busy (nvidia-smi)") {
		t.Fatalf("pool get shows no GPU busy time:\n%s", out)
	}
	var final *poolEvent
	for _, ev := range pc.poolEvents("gpu-job") {
		if ev.Payload.State == "succeeded" {
			final = &ev
		}
	}
	if final == nil || final.Payload.GPUBusySeconds != u.GetGpuBusySeconds() || final.Payload.EnergyJoules != u.GetEnergyJoules() ||
		final.Payload.GPUSeconds != u.GetGpuSeconds() {
		t.Fatalf("final pool.job event %+v, want the job's usage %v", final, u)
	}
	t.Logf("usage: %.2f GPU-s held, %.2f busy, %.1f J (%s)", u.GetGpuSeconds(), u.GetGpuBusySeconds(), u.GetEnergyJoules(), u.GetEnergySource())
}
