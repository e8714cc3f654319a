package poolsvc

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// refusals reads fleetlearn_pool_refusals_total{reason}.
func refusals(t *testing.T, m *metrics.M, reason string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "fleetlearn_pool_refusals_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no fleetlearn_pool_refusals_total{reason=%q}", reason)
	return 0
}

// sameToken registers a worker with the token of w (one principal).
func (w *worker) sameToken(capacity *pb.PoolResources) (*worker, error) {
	res, err := w.c.RegisterWorker(w.ctx, &pb.RegisterWorkerRequest{Name: "again", Capacity: capacity})
	if err != nil {
		return nil, err
	}
	return &worker{e: w.e, ctx: w.ctx, c: w.c, id: res.GetWorkerId()}, nil
}

// runToEnd commits the last checkpoint of the one-rank job that l leases
// to w and reports the rank's exit; the job must succeed.
func runToEnd(t *testing.T, e *env, w *worker, l *pb.RankLease) {
	t.Helper()
	if _, err := w.commit(ref(w, l), l.GetJobId(), l.GetSpec().GetTotalSteps(), 1, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := w.c.RankExited(w.ctx, &pb.RankExitedRequest{WorkerId: w.id, JobId: l.GetJobId(), Attempt: l.GetAttempt(),
		Rank: l.GetRank(), Completed: true}); err != nil {
		t.Fatal(err)
	}
	if j := e.job(l.GetJobId()); j.GetState() != succeeded {
		t.Fatalf("honest job %s: %v (%s)", l.GetJobId(), j.GetState(), j.GetStateReason())
	}
}

// TestWorkerCapPerToken: one pool-worker token registers workers until its
// cap, then is refused with ResourceExhausted naming the cap and the fix;
// another token's worker registers and runs a job meanwhile. Once the
// server declares the token's silent workers lost they no longer count.
func TestWorkerCapPerToken(t *testing.T) {
	m := metrics.New()
	e := newEnv(t, func(d *Deps) { d.Metrics = m })
	first := e.register("mallory", &pb.PoolResources{MilliCpu: 1, MemoryBytes: 1})
	for range DefaultMaxWorkersPerPrincipal - 1 {
		if _, err := first.sameToken(&pb.PoolResources{MilliCpu: 1, MemoryBytes: 1}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := first.sameToken(&pb.PoolResources{MilliCpu: 1, MemoryBytes: 1})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a registration over the token's cap: %v, want ResourceExhausted", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "holds 4 live workers") || !strings.Contains(msg, "--pool-max-workers-per-token") ||
		!strings.Contains(msg, "its own token") {
		t.Errorf("refusal %q: want the cap, the setting and what to do", msg)
	}
	if n := refusals(t, m, metrics.PoolRefusedWorkersPerToken); n != 1 {
		t.Errorf("refusals counted %v, want 1", n)
	}

	// Honest work proceeds: another token registers and runs a job.
	honest := e.register("gpu-node-1", oneRank)
	e.submit(spec("honest", 1), nil)
	res, err := honest.heartbeat()
	if err != nil || len(res.GetStart()) != 1 {
		t.Fatalf("honest worker's lease: %v %v", res, err)
	}
	l := res.GetStart()[0]
	// The attacker's workers fall silent; the honest one keeps calling,
	// listing its rank, until the others are lost.
	for range DefaultHeartbeatsToLoss {
		honest.beat(&pb.RankStatus{JobId: "honest", Attempt: 1, Rank: 0, Step: 5})
	}
	if _, err := first.sameToken(&pb.PoolResources{MilliCpu: 1, MemoryBytes: 1}); err != nil {
		t.Fatalf("registering after the token's workers were lost: %v", err)
	}
	runToEnd(t, e, honest, l)
}

// TestUnstartedLeaseIsRevoked: a worker claiming 8 GPUs is leased the job
// (it fits the most ranks) and never reports the rank while it keeps
// calling. After the start timeout the lease is revoked with no restart
// charged, the job runs on the honest worker, and the faker, even
// registered again with its token, is not offered the next job.
func TestUnstartedLeaseIsRevoked(t *testing.T) {
	m := metrics.New()
	e := newEnv(t, func(d *Deps) { d.Metrics = m; d.StartTimeout = 2 * hb })
	e.submit(spec("j", 1), nil)
	eight := &pb.PoolResources{MilliCpu: 8000, MemoryBytes: 8 * gib, Gpus: 8}
	fake := e.register("fake-gpus", eight)
	honest := e.register("gpu-node-1", oneRank)
	res, err := fake.heartbeat()
	if err != nil || len(res.GetStart()) != 1 {
		t.Fatalf("the 8-GPU claim should draw the lease: %v %v", res, err)
	}
	// The faker calls again without the rank, then waits in its poll.
	f := fake.poll()
	e.clk.Advance(2 * hb)
	recv(t, f)
	j := e.waitJob("j", func(j *pb.PoolJob) bool { return j.GetAttempt() == 2 && j.GetState() == running })
	if j.GetRestarts() != 0 || j.GetPlacement()[0].GetWorker() != honest.id {
		t.Fatalf("job after the revoked lease: %v", j)
	}
	if d := e.lastEvent("j", "submitted"); !strings.Contains(d, "worker "+fake.id+" did not start its ranks") {
		t.Fatalf("requeue event %q", d)
	}
	if n := refusals(t, m, metrics.PoolRefusedNoStart); n != 1 {
		t.Errorf("no-starts counted %v, want 1", n)
	}
	// The revoked attempt is fenced off for the faker.
	_, err = fake.commit(ref(fake, res.GetStart()[0]), "j", 10, 1)
	wantCode(t, "commit of the revoked lease", err, codes.FailedPrecondition)

	r, err := honest.heartbeat()
	if err != nil || len(r.GetStart()) != 1 {
		t.Fatalf("honest lease: %v %v", r, err)
	}
	l := r.GetStart()[0]
	// An honest worker that reports its rank keeps it past the timeout.
	for range 2 {
		honest.beat(&pb.RankStatus{JobId: "j", Attempt: 2, Rank: 0, Step: 5})
	}
	if j := e.job("j"); j.GetAttempt() != 2 || j.GetState() != running {
		t.Fatalf("reported lease revoked: %v", j)
	}

	// The faker registers again with its token: its record follows it,
	// and the next job waits for the honest worker rather than go to it.
	again, err := fake.sameToken(eight)
	if err != nil {
		t.Fatal(err)
	}
	e.submit(spec("k", 1), nil)
	if k := e.job("k"); k.GetState() != queued {
		t.Fatalf("job k on a distrusted worker: %v", k)
	}
	runToEnd(t, e, honest, l)
	k := e.waitJob("k", func(j *pb.PoolJob) bool { return j.GetState() == running })
	if w := k.GetPlacement()[0].GetWorker(); w != honest.id {
		t.Fatalf("job k on %s, want the honest worker %s (not %s)", w, honest.id, again.id)
	}
}
