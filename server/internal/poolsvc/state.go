package poolsvc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/carbon"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// lease is one rank of the current attempt of a job.
type lease struct {
	l       *pb.RankLease
	worker  string
	exited  bool
	usage   *pb.PoolUsage // cumulative, as last reported
	meterAt time.Time     // GPU time is metered up to here
	step    int64
	data    string // data digest the rank reported on exit
	pass    uint64 // scheduling pass that issued it
}

// jobRT is a job as the loop holds it.
type jobRT struct {
	rec  *pb.PoolJob
	then *pb.Task
	spec pool.Spec

	leases []*lease // current attempt by rank; nil when none was placed
	// live: the attempt runs; final: it completed the job, and its ranks
	// may still report exits and logs.
	live, final bool
	stopping    bool
	placement   []pool.Assignment

	ckpts     map[uint32]map[int64]string // rank → step → manifest id, committed
	stepRanks map[int64]map[uint32]bool   // this attempt's commits
	weights   map[uint32]float64          // Average weight, fixed per rank
	lastSync  map[uint32]int64            // this attempt's last contributed step
	sync      *syncRound
	// synced is the attempt's last full average, kept so that a rank
	// whose answer was lost can ask again.
	synced *syncRound
	// syncSize is the bytes a rank's Average carries, once known from
	// the job's model (averageSize); 0 before, or for a command job.
	syncSize int64

	handoffDue time.Time // when to hand off even without every rank's exit
	// firstStart is when the job was first placed: the start of the run a
	// carbon job's emissions are priced over.
	firstStart time.Time
	// forecast is the chosen zone's forecast at submission, for pricing the
	// run when the source cannot be read at its end.
	forecast carbon.Forecast
	changed  chan struct{}

	// ending are the ranks of ended attempts that have not reported their
	// exit: they may still report it, with their last usage, and their last
	// log lines, but do nothing else. A terminal job stays in memory until
	// they have, or until endedAt plus retainEnded.
	ending  map[rankAttempt]*lease
	endedAt time.Time

	// diloco is a DiLoCo job's outer loop; such a job is not scheduled,
	// its islands are (their records name it as parent).
	diloco *dilocoRT
}

// rankAttempt names one rank of one attempt.
type rankAttempt struct {
	job     string
	attempt uint32
	rank    uint32
}

func newJobRT(rec *pb.PoolJob, then *pb.Task, spec pool.Spec) *jobRT {
	return &jobRT{rec: rec, then: then, spec: spec, ckpts: map[uint32]map[int64]string{},
		weights: map[uint32]float64{}, lastSync: map[uint32]int64{}, stepRanks: map[int64]map[uint32]bool{},
		changed: make(chan struct{}), ending: map[rankAttempt]*lease{}}
}

func (rt *jobRT) id() string { return rt.rec.GetSpec().GetId() }

// notify wakes watchers of the job.
func (rt *jobRT) notify() {
	close(rt.changed)
	rt.changed = make(chan struct{})
}

func (rt *jobRT) snapshot() *pb.PoolJob { return proto.CloneOf(rt.rec) }

func (rt *jobRT) terminal() bool { return terminalState(rt.rec.GetState()) }

func terminalState(st pb.PoolJobState) bool {
	return st == pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || st == pb.PoolJobState_POOL_JOB_STATE_FAILED ||
		st == pb.PoolJobState_POOL_JOB_STATE_CANCELLED
}

// workerRT is a registered worker.
type workerRT struct {
	rec              *pb.PoolWorker
	subject, tokenID string
	host             string
	lastSeen         time.Time
	lost             bool
	starts           []*pb.RankLease
	stops            []*pb.RankStop
	wake             chan struct{}
	// stopSent is when each ended attempt's stop was last sent, so that a
	// rank still shutting down is not told again at every heartbeat.
	stopSent map[rankAttempt]time.Time
	// awaiting are the leases delivered to the worker whose ranks it has
	// not reported yet (checkStarts).
	awaiting map[rankAttempt]*awaiting
}

func (w *workerRT) signal() {
	close(w.wake)
	w.wake = make(chan struct{})
}

func (w *workerRT) pending() bool { return len(w.starts) > 0 || len(w.stops) > 0 }

var poolStates = map[pool.State]pb.PoolJobState{
	pool.Queued: pb.PoolJobState_POOL_JOB_STATE_QUEUED, pool.Running: pb.PoolJobState_POOL_JOB_STATE_RUNNING,
	pool.Succeeded: pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, pool.Failed: pb.PoolJobState_POOL_JOB_STATE_FAILED,
	pool.Cancelled: pb.PoolJobState_POOL_JOB_STATE_CANCELLED,
}

func auditState(st pb.PoolJobState) string {
	for k, v := range poolStates {
		if v == st {
			return k.AuditState()
		}
	}
	return ""
}

func jobKind(spec *pb.PoolJobSpec) string {
	if spec.GetCommand() != nil {
		return "command"
	}
	return "pretrain"
}

func (s *Service) poolJobEvent(rt *jobRT, model string) audit.PoolJob {
	u := rt.rec.GetUsage()
	ev := audit.PoolJob{Job: rt.id(), Kind: jobKind(rt.rec.GetSpec()), State: auditState(rt.rec.GetState()),
		Model: model, Detail: clip(rt.rec.GetStateReason(), 1024)}
	if rt.terminal() {
		s.settleCarbon(rt)
		ev.CPUSeconds, ev.GPUSeconds, ev.EnergyJoules = u.GetCpuSeconds(), u.GetGpuSeconds(), u.GetEnergyJoules()
		ev.GPUBusySeconds = u.GetGpuBusySeconds()
		ev.PeakMemoryBytes = uint64(max(u.GetPeakMemoryBytes(), 0))
		ev.GCO2e = rt.rec.GetGco2E()
	}
	return ev
}

// transition moves the job's record to st, recording the audit event
// before the change is stored or acted on.
func (s *Service) transition(rt *jobRT, st pb.PoolJobState, reason string) {
	if rt.rec.State == st && rt.rec.StateReason == reason {
		return
	}
	rt.rec.State, rt.rec.StateReason = st, reason
	now := timestamppb.New(s.clk.Now())
	switch {
	case st == pb.PoolJobState_POOL_JOB_STATE_RUNNING:
		rt.rec.StartTime = now
	case terminalState(st):
		rt.rec.EndTime = now
	}
	_ = s.audit(context.Background(), s.poolJobEvent(rt, rt.rec.GetOutputVersion()))
	s.save(rt)
}

// save stores the record and wakes watchers.
func (s *Service) save(rt *jobRT) {
	if err := s.d.Store.UpdatePoolJob(context.Background(), rt.rec); err != nil {
		s.log.Error("storing pool job", "job", rt.id(), "err", err)
	}
	rt.notify()
}

// pass runs one scheduling pass and executes its decisions, then brings
// the records in line with the scheduler's view.
func (s *Service) pass() {
	s.passes++
	s.execute(s.sched.Schedule())
	for _, rt := range s.jobs {
		if rt.terminal() || rt.final {
			continue
		}
		j, ok := s.sched.Job(rt.id())
		if !ok {
			continue
		}
		r := rt.rec
		if r.StateReason != j.Reason || r.Restarts != uint32(j.Restarts) || r.Step != j.Step {
			r.StateReason, r.Restarts, r.Step = clip(j.Reason, 1024), uint32(j.Restarts), j.Step
			s.save(rt)
		}
	}
	for _, rt := range s.jobs {
		if rt.diloco != nil {
			s.advanceDiLoCo(rt)
		}
	}
	// Ended jobs are answered from the store; memory holds the jobs in
	// play, and ended ones whose ranks may still report their exit.
	// Islands stay while their DiLoCo job does: its result sums theirs.
	now := s.clk.Now()
	for id, rt := range s.jobs {
		if !rt.terminal() {
			continue
		}
		if rt.endedAt.IsZero() {
			rt.endedAt = now
		}
		if p := s.parentOf(rt); p != nil && !p.terminal() {
			continue
		}
		if len(rt.ending) == 0 || !now.Before(rt.endedAt.Add(s.retainEnded())) {
			delete(s.jobs, id)
		}
	}
}

func (s *Service) execute(ds []pool.Decision) {
	for _, d := range ds {
		rt := s.jobs[d.Job]
		if rt == nil {
			continue
		}
		switch d.Action {
		case pool.Place:
			s.place(rt, d)
		case pool.CheckpointStop:
			rt.stopping = true
			for _, w := range workersOf(rt.placement) {
				s.sendStop(w, &pb.RankStop{JobId: rt.id(), Attempt: rt.rec.Attempt, AtCheckpoint: true, Reason: clip(d.Reason, 1024)})
			}
			rt.rec.StateReason = clip(d.Reason, 1024)
			s.save(rt)
		case pool.Abort:
			s.stopNow(rt, pb.PoolJobState_POOL_JOB_STATE_QUEUED, d.Reason)
		case pool.Fail:
			s.stopNow(rt, pb.PoolJobState_POOL_JOB_STATE_FAILED, d.Reason)
		}
	}
}

// sync copies the scheduler's counters into the record.
func (s *Service) sync(rt *jobRT) {
	if j, ok := s.sched.Job(rt.id()); ok {
		rt.rec.Restarts, rt.rec.Step, rt.rec.CommittedStep = uint32(j.Restarts), j.Step, j.Committed
	}
}

func workersOf(pl []pool.Assignment) []string {
	var out []string
	for _, a := range pl {
		out = append(out, a.Worker)
	}
	return out
}

func (s *Service) sendStop(worker string, st *pb.RankStop) {
	w := s.workers[worker]
	if w == nil || w.lost {
		return
	}
	// A start of the same attempt not yet delivered is simply withdrawn.
	w.starts = slices.DeleteFunc(w.starts, func(l *pb.RankLease) bool {
		return l.JobId == st.JobId && l.Attempt == st.Attempt
	})
	w.stops = append(w.stops, st)
	w.stopSent[rankAttempt{job: st.JobId, attempt: st.Attempt}] = s.clk.Now()
	w.signal()
}

// masterPort is derived from the job and attempt, so a restarted gang
// rendezvouses on a port its predecessor may not still hold.
func masterPort(job string, attempt uint32) uint32 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d", job, attempt)
	return 29500 + h.Sum32()%1000
}

func (s *Service) place(rt *jobRT, d pool.Decision) {
	j, _ := s.sched.Job(rt.id())
	rt.rec.Attempt++
	rt.placement = slices.Clone(d.Placement)
	rt.live, rt.final, rt.stopping = true, false, false
	rt.stepRanks = map[int64]map[uint32]bool{}
	rt.lastSync = map[uint32]int64{}
	rt.synced = nil
	rt.rec.CommittedStep, rt.rec.Step = j.Committed, j.Committed
	rt.rec.Placement = nil
	s.dropStale(rt, j.Committed)
	world := uint32(rt.spec.Ranks)
	master := ""
	if len(d.Placement) > 0 {
		if w := s.workers[d.Placement[0].Worker]; w != nil {
			master = w.host
		}
	}
	now := s.clk.Now()
	if rt.firstStart.IsZero() {
		rt.firstStart = now
	}
	rt.leases = make([]*lease, 0, world)
	var rank uint32
	for gi, a := range d.Placement {
		rt.rec.Placement = append(rt.rec.Placement, &pb.PoolAssignment{Worker: a.Worker, FirstRank: rank, Ranks: uint32(a.Ranks)})
		for lr := range a.Ranks {
			l := &pb.RankLease{JobId: rt.id(), Attempt: rt.rec.Attempt, Rank: rank, WorldSize: world,
				Spec: proto.CloneOf(rt.rec.Spec), ResumeStep: j.Committed, MasterAddr: master,
				MasterPort: masterPort(rt.id(), rt.rec.Attempt), LocalRank: uint32(lr), LocalWorldSize: uint32(a.Ranks),
				GroupRank: uint32(gi), GroupWorldSize: uint32(len(d.Placement)), Island: rt.rec.GetIsland()}
			rt.leases = append(rt.leases, &lease{l: l, worker: a.Worker, usage: &pb.PoolUsage{}, meterAt: now,
				step: j.Committed, pass: s.passes})
			rank++
		}
	}
	s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_RUNNING, clip(j.Reason, 1024))
	for _, le := range rt.leases {
		if w := s.workers[le.worker]; w != nil {
			w.starts = append(w.starts, le.l)
		}
	}
	for _, a := range d.Placement {
		if w := s.workers[a.Worker]; w != nil {
			w.signal()
		}
	}
}

// stopNow records the job's move to st, then stops its ranks.
func (s *Service) stopNow(rt *jobRT, st pb.PoolJobState, reason string) {
	s.sync(rt)
	if rt.live {
		s.meterGPU(rt)
	}
	s.transition(rt, st, reason)
	s.endAttempt(rt, reason)
	s.save(rt)
}

// endAttempt stops the ranks of the running attempt now and abandons its
// sync; its leases stop answering.
func (s *Service) endAttempt(rt *jobRT, reason string) {
	if rt.live {
		s.meterGPU(rt)
		for _, w := range workersOf(rt.placement) {
			s.sendStop(w, &pb.RankStop{JobId: rt.id(), Attempt: rt.rec.Attempt, Reason: clip(reason, 1024)})
		}
		for i, le := range rt.leases {
			if !le.exited {
				rt.ending[rankAttempt{rt.id(), rt.rec.Attempt, uint32(i)}] = le
			}
		}
	}
	rt.live, rt.final, rt.stopping = false, false, false
	rt.placement, rt.rec.Placement = nil, nil
	rt.abortSync(reason)
}

// meterGPU charges GPU time of live ranks up to now.
func (s *Service) meterGPU(rt *jobRT) {
	now := s.clk.Now()
	var gpu float64
	for _, le := range rt.leases {
		if le.exited || !now.After(le.meterAt) {
			continue
		}
		gpu += float64(rt.spec.PerRank.GPUs) * now.Sub(le.meterAt).Seconds()
		le.meterAt = now
	}
	s.charge(rt, 0, gpu, 0, 0)
}

// charge adds usage to the job and meters it against the tenant budget.
func (s *Service) charge(rt *jobRT, cpu, gpu, energy float64, peak int64) {
	if rt.rec.Usage == nil {
		rt.rec.Usage = &pb.PoolUsage{}
	}
	u := rt.rec.Usage
	u.CpuSeconds += cpu
	u.GpuSeconds += gpu
	u.EnergyJoules += energy
	u.PeakMemoryBytes = max(u.PeakMemoryBytes, peak)
	s.meterTenant(rt.spec.Tenant, cpu, gpu, energy)
	if cpu > 0 || gpu > 0 {
		if err := s.sched.Meter(rt.id(), pool.Reading{At: s.clk.Now(), CPUSeconds: cpu, GPUSeconds: gpu}); err != nil {
			s.log.Warn("pool meter reading refused", "job", rt.id(), "err", err)
		}
	}
}

// expire declares silent workers lost and hands off jobs whose ranks did
// not all report their exits in time.
func (s *Service) expire() {
	now := s.clk.Now()
	ids := mapsKeys(s.workers)
	slices.Sort(ids)
	for _, id := range ids {
		w := s.workers[id]
		for k, at := range w.stopSent {
			if !now.Before(at.Add(s.lossAfter())) {
				delete(w.stopSent, k)
			}
		}
		if w.lost || now.Before(w.lastSeen.Add(s.lossAfter())) {
			continue
		}
		s.loseWorker(w, fmt.Sprintf("no call for %s", s.lossAfter()))
	}
	for _, rt := range s.jobs {
		if !rt.handoffDue.IsZero() && !now.Before(rt.handoffDue) {
			s.handoff(rt)
		}
	}
	s.checkStarts()
}

func (s *Service) loseWorker(w *workerRT, why string) {
	// Ranks of ended attempts on it will never report.
	for _, rt := range s.jobs {
		for k, le := range rt.ending {
			if le.worker == w.rec.Id {
				delete(rt.ending, k)
			}
		}
	}
	w.lost = true
	w.starts, w.stops = nil, nil
	clear(w.awaiting)
	w.rec.State = workerLost
	w.signal()
	if err := s.d.Store.PutPoolWorker(context.Background(), s.workerRow(w)); err != nil {
		s.log.Error("storing pool worker", "worker", w.rec.Id, "err", err)
	}
	s.log.Warn("pool worker lost", "worker", w.rec.Id, "why", why)
	ds, err := s.sched.LoseWorker(w.rec.Id)
	if err != nil {
		s.log.Error("losing pool worker", "worker", w.rec.Id, "err", err)
		return
	}
	// Exits of a completed job's ranks on the worker will not come.
	for _, rt := range s.jobs {
		if rt.final {
			for _, le := range rt.leases {
				if le.worker == w.rec.Id {
					le.exited = true
				}
			}
			s.maybeHandoff(rt)
		}
	}
	s.execute(ds)
}

func mapsKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// checkpointed runs when every rank of the attempt committed step.
func (s *Service) checkpointed(rt *jobRT, step int64) {
	if err := s.sched.Checkpointed(rt.id(), step); err != nil {
		s.log.Error("pool checkpoint refused by the scheduler", "job", rt.id(), "step", step, "err", err)
		return
	}
	j, _ := s.sched.Job(rt.id())
	rt.rec.CommittedStep, rt.rec.Step = j.Committed, j.Step
	rt.rec.Checkpoint = rt.ckpts[0][step]
	switch j.State {
	case pool.Succeeded:
		s.meterGPU(rt)
		rt.live, rt.final = false, true
		rt.rec.StateReason = j.Reason + "; storing the model"
		rt.handoffDue = s.clk.Now().Add(s.lossAfter())
		s.save(rt)
		s.maybeHandoff(rt)
	case pool.Queued:
		s.meterGPU(rt)
		rt.live, rt.stopping = false, false
		rt.placement, rt.rec.Placement = nil, nil
		rt.abortSync("the job stopped at its checkpoint")
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_QUEUED, j.Reason)
	default:
		s.save(rt)
	}
}

func (s *Service) maybeHandoff(rt *jobRT) {
	if !rt.final {
		return
	}
	for _, le := range rt.leases {
		if !le.exited {
			return
		}
	}
	s.handoff(rt)
}

// dataDigest is the SHA-256 over the ranks' shard digests in rank order;
// "" unless every rank reported one.
func dataDigest(ls []*lease) string {
	ds := make([]string, len(ls))
	for i, le := range ls {
		ds[i] = le.data
	}
	return digestOfDigests(ds)
}

// digestOfDigests is the SHA-256 over hex SHA-256 digests in order; "" if
// any is missing or malformed.
func digestOfDigests(ds []string) string {
	h := sha256.New()
	for _, d := range ds {
		b, err := hex.DecodeString(d)
		if err != nil || len(b) != sha256.Size {
			return ""
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func clip(v string, n int) string {
	if len(v) <= n {
		return v
	}
	for n > 0 && v[n]&0xC0 == 0x80 {
		n--
	}
	return v[:n]
}
