package pool_test

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool"
)

// The simulation runs a pool in virtual time: one step takes stepDur on any
// gang, a running gang reports each checkpoint, and workers die and come
// back. Every event is followed by a scheduling pass and a check of the
// invariants.

const stepDur = time.Second

type simWorkload struct {
	specs    []pool.Spec
	arrivals []time.Duration // after t0, by spec
	workers  int
	failures []simFailure
}

type simFailure struct {
	at, down time.Duration
	worker   int
}

func genWorkload(seed uint64, jobs, workers, failures int) simWorkload {
	r := rand.New(rand.NewPCG(seed, 99))
	sizes := []int{1, 1, 1, 2, 2, 4, 8, 16, 32}
	tenants := []string{"acme", "globex", "initech"}
	var w simWorkload
	w.workers = workers
	var at time.Duration
	for i := range jobs {
		at += time.Duration(r.ExpFloat64() * float64(20*time.Second))
		total := int64(100 + r.IntN(1900))
		sp := pool.Spec{
			ID: fmt.Sprintf("j-%03d", i), Tenant: tenants[r.IntN(len(tenants))],
			Priority: []int{0, 0, 0, 1, 2}[r.IntN(5)], Ranks: sizes[r.IntN(len(sizes))], PerRank: rank1,
			MaxRestarts: 3, CheckpointInterval: int64(25 + r.IntN(100)), TotalSteps: total,
			OutputModel: "m",
		}
		sp.CheckpointInterval = min(sp.CheckpointInterval, total)
		w.specs = append(w.specs, sp)
		w.arrivals = append(w.arrivals, at)
	}
	for range failures {
		w.failures = append(w.failures, simFailure{
			at: time.Duration(r.Int64N(int64(at))), down: time.Duration(5+r.IntN(20)) * time.Minute, worker: r.IntN(workers)})
	}
	return w
}

type evKind uint8

const (
	evArrive evKind = iota
	evCheckpoint
	evWorkerDown
	evWorkerUp
)

type event struct {
	at   time.Time
	kind evKind
	idx  int // spec or worker index
	gen  int // placement generation, so stale checkpoints of a lost gang are dropped
	step int64
	seq  int
}

type evHeap []event

func (q evHeap) Len() int { return len(q) }
func (q evHeap) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q evHeap) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *evHeap) Push(x any)   { *q = append(*q, x.(event)) }
func (q *evHeap) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// eventQ orders events by time, then by insertion, so runs replay exactly.
type eventQ struct {
	h evHeap
	n int
}

func (q *eventQ) add(e event) {
	q.n++
	e.seq = q.n
	heap.Push(&q.h, e)
}
func (q *eventQ) pop() event { return heap.Pop(&q.h).(event) }
func (q *eventQ) Len() int   { return q.h.Len() }

func workerName(i int) string { return fmt.Sprintf("w-%02d", i) }
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

type simStats struct {
	done, failed, unfinished int
	util                     float64 // GPU-seconds of running gangs over capacity × makespan
	meanWait, p95Wait        time.Duration
	events                   int
	preempted, restarts      int
}

func (s simStats) String() string {
	return fmt.Sprintf("done %d failed %d unfinished %d, utilisation %.1f%%, queueing delay mean %s p95 %s",
		s.done, s.failed, s.unfinished, 100*s.util, s.meanWait.Round(time.Second), s.p95Wait.Round(time.Second))
}

// runSim drives the real scheduler through a workload, checking the
// invariants after every event.
func runSim(t testing.TB, w simWorkload) (simStats, []float64) {
	t.Helper()
	s, clk := newSched(t, map[string]pool.Tenant{"acme": {Weight: 1}, "globex": {Weight: 2}, "initech": {Weight: 1}})
	addWorkers(t, s, w.workers, gpuWorker)
	var q eventQ
	for i, a := range w.arrivals {
		q.add(event{at: t0.Add(a), kind: evArrive, idx: i})
	}
	for _, f := range w.failures {
		q.add(event{at: t0.Add(f.at), kind: evWorkerDown, idx: f.worker})
		q.add(event{at: t0.Add(f.at + f.down), kind: evWorkerUp, idx: f.worker})
	}
	byID := map[string]int{}
	for i, sp := range w.specs {
		byID[sp.ID] = i
	}
	gen := make([]int, len(w.specs))
	lastCkpt := make([]time.Time, len(w.specs)) // when the running gang last committed (or started)
	queuedSince := make([]time.Time, len(w.specs))
	waits := make([]float64, len(w.specs))
	down := map[int]bool{}
	var st simStats
	var gpuBusy int64 // rank-nanoseconds; integers, so map order cannot change the sum
	last := t0
	running := map[int]bool{}

	schedule := func() {
		now := clk.Now()
		// Report progress, so victims are chosen on real work at risk.
		for i := range running {
			j := job(t, s, w.specs[i].ID)
			step := j.Committed + int64(now.Sub(lastCkpt[i])/stepDur)
			step = min(step, j.Committed+j.Spec.CheckpointInterval-1, j.Spec.TotalSteps-1)
			if err := s.Progress(j.Spec.ID, max(step, j.Committed)); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range s.Schedule() {
			i := byID[d.Job]
			switch d.Action {
			case pool.Place:
				j := job(t, s, d.Job)
				gen[i]++
				running[i] = true
				lastCkpt[i] = now
				waits[i] += now.Sub(queuedSince[i]).Seconds()
				next := min((j.Committed/j.Spec.CheckpointInterval+1)*j.Spec.CheckpointInterval, j.Spec.TotalSteps)
				q.add(event{at: now.Add(time.Duration(next-j.Committed) * stepDur), kind: evCheckpoint, idx: i, gen: gen[i], step: next})
			case pool.CheckpointStop:
				st.preempted++
			case pool.Fail:
				delete(running, i)
			default:
				t.Fatalf("unexpected decision %+v", d)
			}
		}
		checkRunning(t, s, w.specs, running)
		// No deadlock: with nothing running, a pass leaves no queued job
		// that the pool, as it stands, could hold.
		if len(running) == 0 {
			for _, j := range s.Jobs() {
				if j.State == pool.Queued && int64(j.Spec.Ranks) <= int64(8*(w.workers-len(down))) {
					t.Fatalf("deadlock at %s: nothing runs and %s (%d ranks) waits: %s", now.Sub(t0), j.Spec.ID, j.Spec.Ranks, j.Reason)
				}
			}
		}
	}

	for q.Len() > 0 {
		e := q.pop()
		for i := range running {
			gpuBusy += int64(w.specs[i].Ranks) * int64(e.at.Sub(last))
		}
		last = e.at
		clk.Set(e.at)
		st.events++
		switch e.kind {
		case evArrive:
			submit(t, s, w.specs[e.idx])
			queuedSince[e.idx] = e.at
		case evCheckpoint:
			if e.gen != gen[e.idx] || !running[e.idx] {
				continue // the gang was lost or failed since
			}
			id := w.specs[e.idx].ID
			if err := s.Checkpointed(id, e.step); err != nil {
				t.Fatal(err)
			}
			lastCkpt[e.idx] = e.at
			j := job(t, s, id)
			switch j.State {
			case pool.Running:
				next := min(e.step+j.Spec.CheckpointInterval, j.Spec.TotalSteps)
				q.add(event{at: e.at.Add(time.Duration(next-e.step) * stepDur), kind: evCheckpoint, idx: e.idx, gen: gen[e.idx], step: next})
			case pool.Queued: // stopped at this checkpoint for a preemptor
				delete(running, e.idx)
				queuedSince[e.idx] = e.at
			case pool.Succeeded:
				delete(running, e.idx)
			}
		case evWorkerDown:
			if down[e.idx] {
				continue
			}
			down[e.idx] = true
			ds, err := s.LoseWorker(workerName(e.idx))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				i := byID[d.Job]
				delete(running, i)
				if d.Action == pool.Abort {
					st.restarts++
					queuedSince[i] = e.at
				}
			}
		case evWorkerUp:
			if !down[e.idx] {
				continue
			}
			delete(down, e.idx)
			if err := s.AddWorker(workerName(e.idx), gpuWorker); err != nil {
				t.Fatal(err)
			}
		}
		schedule()
	}
	for _, j := range s.Jobs() {
		switch j.State {
		case pool.Succeeded:
			st.done++
		case pool.Failed:
			st.failed++
		default:
			st.unfinished++
		}
	}
	if span := last.Sub(t0).Seconds(); span > 0 {
		st.util = float64(gpuBusy) / 1e9 / (span * float64(8*w.workers))
	}
	st.meanWait = time.Duration(mean(waits) * float64(time.Second))
	st.p95Wait = time.Duration(pct(waits, 0.95) * float64(time.Second))
	return st, waits
}

// checkRunning is checkCapacity for the simulation's running set: every
// gang it runs is placed whole, and the workers' free resources are their
// capacity less exactly those gangs, so a job the scheduler and the
// simulation disagree about shows up too.
func checkRunning(t testing.TB, s *pool.Scheduler, specs []pool.Spec, running map[int]bool) {
	t.Helper()
	used := map[string]int64{}
	for i := range running {
		j := job(t, s, specs[i].ID)
		if j.State != pool.Running {
			t.Fatalf("simulation runs %s, scheduler says %s", j.Spec.ID, j.State)
		}
		n := 0
		for _, a := range j.Placement {
			n += a.Ranks
			used[a.Worker] += int64(a.Ranks)
		}
		if n != j.Spec.Ranks {
			t.Fatalf("job %s placed %d of %d ranks", j.Spec.ID, n, j.Spec.Ranks)
		}
	}
	for _, w := range s.Workers() {
		u := rank1
		u.MilliCPU, u.Memory, u.GPUs = u.MilliCPU*used[w.ID], u.Memory*used[w.ID], u.GPUs*used[w.ID]
		if u.GPUs > w.Capacity.GPUs || u.MilliCPU > w.Capacity.MilliCPU || u.Memory > w.Capacity.Memory {
			t.Fatalf("worker %s overcommitted: %v of %v", w.ID, u, w.Capacity)
		}
		if w.Free.GPUs != w.Capacity.GPUs-u.GPUs || w.Free.MilliCPU != w.Capacity.MilliCPU-u.MilliCPU || w.Free.Memory != w.Capacity.Memory-u.Memory {
			t.Fatalf("worker %s free %v, running gangs leave %v", w.ID, w.Free, w.Capacity.GPUs-u.GPUs)
		}
	}
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(max(1, len(xs)))
}

func TestSimulation(t *testing.T) {
	w := genWorkload(1, 400, 24, 12)
	st, _ := runSim(t, w)
	t.Logf("gang scheduler, 400 jobs on 24×8 GPUs, 12 worker failures: %v; %d events, %d preemptions, %d restarts",
		st, st.events, st.preempted, st.restarts)
	if st.unfinished != 0 {
		t.Fatalf("%d jobs never ended", st.unfinished)
	}
	if st.done < 380 || st.preempted == 0 || st.restarts == 0 {
		t.Fatalf("workload did not exercise the scheduler: %+v", st)
	}
	// Same seed, same run (on a smaller pool, to keep the test quick).
	small := genWorkload(2, 150, 12, 6)
	a, aw := runSim(t, small)
	b, bw := runSim(t, small)
	if a != b || !slices.Equal(aw, bw) {
		t.Fatalf("not deterministic: %+v vs %+v", a, b)
	}
}

// naiveFIFO is the scheduler gang support replaces. In podByPod mode it is
// a per-rank scheduler (the default Kubernetes scheduler without a gang
// plugin): every queued gang's ranks are bound one at a time as slots free
// up, interleaved because controllers create them concurrently, and a
// bound rank holds its slot until the whole gang has started. In backfill
// mode it places whole gangs in FIFO order and lets anything that fits
// jump a gang that does not, with no reservation. Ranks are rank1, so a
// worker is 8 slots.
type naiveFIFO struct {
	podByPod bool
	free     []int // slots per worker
	queue    []int // spec indices, FIFO
	held     map[int][]int
}

func (n *naiveFIFO) pass(specs []pool.Spec) (started []int) {
	count := func(h []int) int {
		c := 0
		for _, x := range h {
			c += x
		}
		return c
	}
	if n.podByPod {
		for progress := true; progress; {
			progress = false
			for _, i := range n.queue {
				if count(n.held[i]) == specs[i].Ranks {
					continue
				}
				for wi := range n.free {
					if n.free[wi] > 0 {
						n.free[wi]--
						n.held[i][wi]++
						progress = true
						break
					}
				}
			}
		}
	} else {
		for _, i := range n.queue {
			total := 0
			for _, f := range n.free {
				total += f
			}
			if total < specs[i].Ranks {
				continue
			}
			for wi, left := 0, specs[i].Ranks; left > 0; wi++ {
				take := min(left, n.free[wi])
				n.free[wi] -= take
				n.held[i][wi] += take
				left -= take
			}
		}
	}
	var rest []int
	for _, i := range n.queue {
		if count(n.held[i]) == specs[i].Ranks {
			started = append(started, i)
		} else {
			rest = append(rest, i)
		}
	}
	n.queue = rest
	return started
}

// runNaive runs a failure-free workload on naiveFIFO. Jobs run TotalSteps
// without checkpoints (nothing preempts them). A wait of -1 is a job that
// never started: the run deadlocked or starved it.
func runNaive(w simWorkload, podByPod bool) (simStats, []float64) {
	n := &naiveFIFO{podByPod: podByPod, free: make([]int, w.workers), held: map[int][]int{}}
	for i := range n.free {
		n.free[i] = 8
	}
	var q eventQ
	for i, a := range w.arrivals {
		q.add(event{at: t0.Add(a), kind: evArrive, idx: i})
	}
	waits := make([]float64, len(w.specs))
	for i := range waits {
		waits[i] = -1
	}
	var st simStats
	var busy int64
	last := t0
	running := map[int]bool{}
	for q.Len() > 0 {
		e := q.pop()
		for i := range running {
			busy += int64(w.specs[i].Ranks) * int64(e.at.Sub(last))
		}
		last = e.at
		st.events++
		switch e.kind {
		case evArrive:
			n.queue = append(n.queue, e.idx)
			n.held[e.idx] = make([]int, w.workers)
		case evCheckpoint: // completion
			delete(running, e.idx)
			st.done++
			for wi, h := range n.held[e.idx] {
				n.free[wi] += h
			}
			delete(n.held, e.idx)
		}
		if q.Len() > 0 && q.h[0].at.Equal(e.at) {
			continue // bind once the instant's arrivals are all queued, as a real queue holds them
		}
		for _, i := range n.pass(w.specs) {
			running[i] = true
			waits[i] = e.at.Sub(t0.Add(w.arrivals[i])).Seconds()
			q.add(event{at: e.at.Add(time.Duration(w.specs[i].TotalSteps) * stepDur), kind: evCheckpoint, idx: i})
		}
	}
	st.unfinished = len(w.specs) - st.done
	if span := last.Sub(t0).Seconds(); span > 0 {
		// Over the time until the last event: for a deadlocked run, until
		// the pool froze.
		st.util = float64(busy) / 1e9 / (span * float64(8*w.workers))
	}
	var started []float64
	for _, x := range waits {
		if x >= 0 {
			started = append(started, x)
		}
	}
	st.meanWait = time.Duration(mean(started) * float64(time.Second))
	st.p95Wait = time.Duration(pct(started, 0.95) * float64(time.Second))
	return st, waits
}

// Two gangs that each need more than half the pool: per-rank binding
// splits the pool between them and neither ever starts.
func TestNaivePodByPodDeadlocks(t *testing.T) {
	w := simWorkload{workers: 2, arrivals: []time.Duration{0, 0}}
	for _, id := range []string{"a", "b"} {
		sp := spec(id, "acme", 0, 12)
		w.specs = append(w.specs, sp)
	}
	nst, _ := runNaive(w, true)
	gst, _ := runSim(t, w)
	t.Logf("two 12-rank gangs on 16 slots: per-rank FIFO %v; gang scheduler %v", nst, gst)
	if nst.unfinished != 2 {
		t.Fatalf("naive finished %d: the case no longer deadlocks", nst.done)
	}
	if gst.done != 2 {
		t.Fatalf("gang scheduler: %+v", gst)
	}
}

// A stream of 1-rank jobs keeps a 16-slot pool about three-quarters busy.
// FIFO with backfill never finds all 16 free at once, so the 16-rank gang
// waits until the stream ends; the reservation starts it once the small
// jobs running when it arrived have finished.
func TestReservationStopsStarvation(t *testing.T) {
	w := simWorkload{workers: 2}
	for i := range 400 {
		sp := spec(fmt.Sprintf("s-%03d", i), "acme", 0, 1)
		sp.TotalSteps, sp.CheckpointInterval = 60, 60
		w.specs = append(w.specs, sp)
		w.arrivals = append(w.arrivals, time.Duration(i)*5*time.Second)
	}
	big := spec("big", "acme", 0, 16)
	big.TotalSteps, big.CheckpointInterval = 300, 100
	w.specs = append(w.specs, big)
	w.arrivals = append(w.arrivals, 100*time.Second)
	nst, nw := runNaive(w, false)
	gst, gw := runSim(t, w)
	b := len(w.specs) - 1
	t.Logf("16-rank gang behind a stream of 1-rank jobs: FIFO+backfill waited %.0f s (%v); gang scheduler waited %.0f s (%v)",
		nw[b], nst, gw[b], gst)
	if nw[b] < 1800 {
		t.Fatalf("backfill started the gang after %.0f s: the case no longer starves", nw[b])
	}
	if gw[b] > 120 || gst.done != len(w.specs) {
		t.Fatalf("gang waited %.0f s under reservation; %v", gw[b], gst)
	}
}

// The mixed workload without failures, on both: per-rank FIFO deadlocks
// once big gangs split the pool; the gang scheduler runs everything.
func TestCompareWithNaiveFIFO(t *testing.T) {
	w := genWorkload(3, 300, 24, 0)
	gst, _ := runSim(t, w)
	pst, _ := runNaive(w, true)
	bst, _ := runNaive(w, false)
	t.Logf("gang scheduler:      %v", gst)
	t.Logf("per-rank FIFO:       %v (delays over started jobs only)", pst)
	t.Logf("FIFO+backfill:       %v", bst)
	if gst.unfinished != 0 || gst.done != len(w.specs) {
		t.Fatalf("gang scheduler left jobs: %v", gst)
	}
	if pst.unfinished == 0 {
		t.Fatalf("per-rank FIFO did not deadlock on this workload: %v", pst)
	}
}

// One pass over a full pool: 24 workers busy, 400 gangs queued, each
// considered in fair-share order against the reservation.
func BenchmarkSchedulePass(b *testing.B) {
	s, _ := newSched(b, map[string]pool.Tenant{"acme": {Weight: 1}, "globex": {Weight: 2}, "initech": {Weight: 1}})
	addWorkers(b, s, 24, gpuWorker)
	w := genWorkload(5, 600, 24, 0)
	for _, sp := range w.specs {
		submit(b, s, sp)
	}
	placed := len(byAction(s.Schedule(), pool.Place))
	for b.Loop() {
		s.Schedule()
	}
	b.ReportMetric(float64(len(w.specs)-placed), "queued")
}
