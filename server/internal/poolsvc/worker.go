package poolsvc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/authz"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// MaxWorkers bounds the workers the service holds.
const MaxWorkers = 4096

type workerServer struct {
	apiv1.UnimplementedPoolWorkerServiceServer
	s *Service
}

func principal(ctx context.Context) (identity.Principal, error) {
	p, ok := authz.Principal(ctx)
	if !ok || p.Subject == "" {
		return identity.Principal{}, errorf(codes.PermissionDenied, "no verified caller: pool workers need a pool-worker token")
	}
	return p, nil
}

func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	h, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return ""
	}
	return h
}

func (s *Service) workerRow(w *workerRT) store.PoolWorkerRow {
	return store.PoolWorkerRow{Worker: w.rec, Subject: w.subject, TokenID: w.tokenID}
}

// worker finds the caller's worker, refusing another principal, and counts
// the call as a sign of life. The loop calls it.
func (s *Service) worker(id string, p identity.Principal) (*workerRT, error) {
	w := s.workers[id]
	switch {
	case w == nil:
		return nil, errorf(codes.NotFound, "worker %.64q is not registered: register again", id)
	case w.subject != p.Subject || w.tokenID != p.TokenID:
		return nil, errorf(codes.PermissionDenied, "worker %s was registered by another principal", id)
	case w.lost:
		return nil, errorf(codes.NotFound, "worker %s was declared lost: register again", id)
	}
	w.lastSeen = s.clk.Now()
	w.rec.LastSeen = timestamppb.New(w.lastSeen)
	return w, nil
}

// leaseFor checks that the caller's worker holds the lease for ref now.
// With ended, a lease of an attempt that completed the job still answers
// (its ranks report their exits and last lines).
func (s *Service) leaseFor(ref *pb.RankRef, p identity.Principal, ended bool) (*jobRT, *lease, error) {
	if _, err := s.worker(ref.GetWorkerId(), p); err != nil {
		return nil, nil, err
	}
	rt := s.jobs[ref.GetJobId()]
	if rt == nil {
		return nil, nil, errorf(codes.NotFound, "pool job %.64q not found", ref.GetJobId())
	}
	ok := rt.live || ended && rt.final
	if !ok || ref.GetAttempt() != rt.rec.Attempt || int(ref.GetRank()) >= len(rt.leases) {
		return nil, nil, errorf(codes.FailedPrecondition, "job %s attempt %d rank %d is not running (the current attempt is %d): stop this rank",
			rt.id(), ref.GetAttempt(), ref.GetRank(), rt.rec.Attempt)
	}
	le := rt.leases[ref.GetRank()]
	if le.worker != ref.GetWorkerId() || le.exited {
		return nil, nil, errorf(codes.FailedPrecondition, "worker %s does not hold the lease of job %s attempt %d rank %d",
			ref.GetWorkerId(), rt.id(), ref.GetAttempt(), ref.GetRank())
	}
	return rt, le, nil
}

// reportLease is leaseFor for the calls a rank makes as it ends (its exit
// and last log lines): besides the running attempt's ranks, those of an
// ended attempt that have not reported their exit yet qualify. current
// says which it is.
func (s *Service) reportLease(ref *pb.RankRef, p identity.Principal) (rt *jobRT, le *lease, current bool, err error) {
	rt, le, err = s.leaseFor(ref, p, true)
	if err == nil {
		return rt, le, true, nil
	}
	if status.Code(err) != codes.FailedPrecondition && status.Code(err) != codes.NotFound {
		return nil, nil, false, err
	}
	if r := s.jobs[ref.GetJobId()]; r != nil {
		if e := r.ending[rankAttempt{ref.GetJobId(), ref.GetAttempt(), ref.GetRank()}]; e != nil && e.worker == ref.GetWorkerId() {
			return r, e, false, nil
		}
	}
	return nil, nil, false, err
}

func (v *workerServer) RegisterWorker(ctx context.Context, req *pb.RegisterWorkerRequest) (*pb.RegisterWorkerResponse, error) {
	s := v.s
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	c := req.GetCapacity()
	capacity := pool.Resources{MilliCPU: c.GetMilliCpu(), Memory: c.GetMemoryBytes(), GPUs: c.GetGpus()}
	if err := checkText("name", req.GetName(), 253); err != nil {
		return nil, err
	}
	if err := checkText("version", req.GetVersion(), 128); err != nil {
		return nil, err
	}
	if len(req.GetGpuModels()) > 1024 {
		return nil, invalidf("gpu_models: %d entries, at most 1024", len(req.GetGpuModels()))
	}
	for _, g := range req.GetGpuModels() {
		if err := checkText("gpu_models", g, 128); err != nil {
			return nil, err
		}
	}
	if z := req.GetZone(); z != "" {
		if err := pool.CheckZone(z); err != nil {
			return nil, invalidf("zone %.64q: %v; name it as the server's carbon forecast does (e.g. westus)", z, err)
		}
	}
	id := newID("w-")
	var out *pb.RegisterWorkerResponse
	err = s.do(ctx, func() error {
		if len(s.workers) >= MaxWorkers {
			// Lost workers make room: they can only register again.
			for id, w := range s.workers {
				if w.lost {
					delete(s.workers, id)
				}
			}
		}
		if err := s.admitWorker(p); err != nil {
			return err
		}
		if len(s.workers) >= MaxWorkers {
			s.d.Metrics.PoolRefused(metrics.PoolRefusedWorkers)
			return errorf(codes.ResourceExhausted, "register worker: the pool holds %d workers, the most it takes: "+
				"wait for stopped workers to be declared lost, or retire some", MaxWorkers)
		}
		if err := s.sched.AddWorkerInZone(id, req.GetZone(), capacity); err != nil {
			return invalidf("register worker: %v", err)
		}
		now := s.clk.Now()
		w := &workerRT{subject: p.Subject, tokenID: p.TokenID, host: peerHost(ctx), lastSeen: now, wake: make(chan struct{}),
			stopSent: map[rankAttempt]time.Time{}, awaiting: map[rankAttempt]*awaiting{},
			rec: &pb.PoolWorker{Id: id, Name: req.GetName(), Capacity: proto.CloneOf(c), Free: proto.CloneOf(c),
				LastSeen: timestamppb.New(now), GpuModels: req.GetGpuModels(), State: workerReady, Version: req.GetVersion(), Zone: req.GetZone()}}
		s.workers[id] = w
		s.inheritStrikes(w)
		if err := s.d.Store.PutPoolWorker(context.Background(), s.workerRow(w)); err != nil {
			s.log.Error("storing pool worker", "worker", id, "err", err)
		}
		out = &pb.RegisterWorkerResponse{WorkerId: id, HeartbeatInterval: durationpb.New(s.d.HeartbeatInterval),
			HeartbeatsToLoss: uint32(s.d.HeartbeatsToLoss)}
		return nil
	})
	return out, err
}

// checkUsage bounds a cumulative usage report against the previous one.
func checkUsage(u, prev *pb.PoolUsage) error {
	for _, f := range []struct {
		name    string
		v, prev float64
	}{{"cpu_seconds", u.GetCpuSeconds(), prev.GetCpuSeconds()}, {"gpu_seconds", u.GetGpuSeconds(), prev.GetGpuSeconds()},
		{"energy_joules", u.GetEnergyJoules(), prev.GetEnergyJoules()},
		{"gpu_busy_seconds", u.GetGpuBusySeconds(), prev.GetGpuBusySeconds()}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 || f.v > 1e15 {
			return invalidf("usage.%s %v: want a finite number in [0, 1e15]", f.name, f.v)
		}
		if f.v < f.prev {
			return invalidf("usage.%s went down from %v to %v: usage is cumulative over the attempt", f.name, f.prev, f.v)
		}
	}
	if m := u.GetPeakMemoryBytes(); m < 0 || m > 1<<50 {
		return invalidf("usage.peak_memory_bytes %d outside [0, 2^50]", m)
	}
	if err := checkText("usage.meter", u.GetMeter(), 32); err != nil {
		return err
	}
	if err := checkText("usage.gpu_meter", u.GetGpuMeter(), 32); err != nil {
		return err
	}
	return checkText("usage.energy_source", u.GetEnergySource(), 32)
}

// applyUsage turns the increase since the rank's last report into job
// usage and a meter reading. GPU time is the server's own measure: GPUs
// per rank times wall time since the last reading.
func (s *Service) applyUsage(rt *jobRT, le *lease, u *pb.PoolUsage) {
	if u == nil {
		u = le.usage
	}
	now := s.clk.Now()
	var gpu float64
	if now.After(le.meterAt) {
		gpu = float64(rt.spec.PerRank.GPUs) * now.Sub(le.meterAt).Seconds()
		le.meterAt = now
	}
	cpu := u.GetCpuSeconds() - le.usage.GetCpuSeconds()
	energy := u.GetEnergyJoules() - le.usage.GetEnergyJoules()
	s.charge(rt, cpu, gpu, energy, u.GetPeakMemoryBytes())
	// The GPUs' measured busy time, beside the held time the server counts.
	rt.rec.Usage.GpuBusySeconds += u.GetGpuBusySeconds() - le.usage.GetGpuBusySeconds()
	if u.GetGpuMeter() != "" {
		rt.rec.Usage.GpuMeter = u.GetGpuMeter()
	}
	if u.GetMeter() != "" {
		rt.rec.Usage.Meter = u.GetMeter()
	}
	if u.GetEnergySource() != "" {
		rt.rec.Usage.EnergySource = u.GetEnergySource()
	}
	le.usage = proto.CloneOf(u)
}

func (v *workerServer) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	s := v.s
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if len(req.GetRanks()) > pool.MaxRanks {
		return nil, invalidf("heartbeat: %d ranks, at most %d", len(req.GetRanks()), pool.MaxRanks)
	}
	first := true
	// The poll's timer starts on the loop, before anyone can learn that the
	// call waits: a clock advanced after that always reaches it.
	var t clock.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		var out *pb.HeartbeatResponse
		var wake <-chan struct{}
		err := s.do(ctx, func() error {
			w, err := s.worker(req.GetWorkerId(), p)
			if err != nil {
				return err
			}
			if first {
				first = false
				if err := s.heartbeatRanks(w, req.GetRanks()); err != nil {
					return err
				}
			}
			if w.pending() || ctx.Err() != nil {
				s.delivered(w, w.starts)
				out = &pb.HeartbeatResponse{Start: w.starts, Stop: w.stops}
				w.starts, w.stops = nil, nil
				return nil
			}
			wake = w.wake
			if t == nil {
				t = s.clk.NewTimer(s.d.HeartbeatInterval)
			}
			if s.onPoll != nil {
				s.onPoll(w.rec.Id)
			}
			return nil
		})
		if err != nil || out != nil {
			return out, err
		}
		select {
		case <-wake:
		case <-t.C():
			return &pb.HeartbeatResponse{}, nil
		case <-ctx.Done():
			return nil, errorf(codes.Canceled, "heartbeat: %v", ctx.Err())
		case <-s.stop:
			return nil, errorf(codes.Unavailable, "pool service shutting down")
		}
	}
}

// heartbeatRanks checks every status first, then applies them: progress,
// usage, and a stop for any rank the worker should not be running.
func (s *Service) heartbeatRanks(w *workerRT, ranks []*pb.RankStatus) error {
	type item struct {
		rs *pb.RankStatus
		rt *jobRT
		le *lease
	}
	var items, ended []item
	now := s.clk.Now()
	for _, rs := range ranks {
		rt := s.jobs[rs.GetJobId()]
		var le *lease
		if rt != nil && (rt.live || rt.final) && rs.GetAttempt() == rt.rec.Attempt && int(rs.GetRank()) < len(rt.leases) {
			if c := rt.leases[rs.GetRank()]; c.worker == w.rec.Id && !c.exited {
				le = c
			}
		}
		if le == nil {
			// A rank of an ended attempt, or one never leased here: it
			// is told to stop, once per loss interval (it may take a
			// while to shut down, and asks again at once), and an ended
			// attempt's rank still has its usage counted.
			if len(rs.GetJobId()) > pool.MaxNameLen {
				continue
			}
			k := rankAttempt{job: rs.GetJobId(), attempt: rs.GetAttempt()}
			if at, ok := w.stopSent[k]; !ok || !now.Before(at.Add(s.lossAfter())) {
				w.stops = append(w.stops, &pb.RankStop{JobId: rs.GetJobId(), Attempt: rs.GetAttempt(),
					Reason: "this attempt is not running on this worker"})
				w.stopSent[k] = now
			}
			if rt != nil {
				if e := rt.ending[rankAttempt{rs.GetJobId(), rs.GetAttempt(), rs.GetRank()}]; e != nil && e.worker == w.rec.Id {
					if err := checkUsage(rs.GetUsage(), e.usage); err != nil {
						return fmt.Errorf("heartbeat: job %s rank %d: %w", rt.id(), rs.GetRank(), err)
					}
					ended = append(ended, item{rs, rt, e})
				}
			}
			continue
		}
		// A step below the committed one is a rank that has not loaded its
		// checkpoint yet (it says 0 until then): no progress, not an error.
		if st := rs.GetStep(); st < 0 || st > rt.spec.TotalSteps {
			return invalidf("heartbeat: job %s rank %d step %d outside [0, %d]", rt.id(), rs.GetRank(), st, rt.spec.TotalSteps)
		}
		if err := checkUsage(rs.GetUsage(), le.usage); err != nil {
			return fmt.Errorf("heartbeat: job %s rank %d: %w", rt.id(), rs.GetRank(), err)
		}
		if l := rs.GetLoss(); math.IsNaN(l) || math.IsInf(l, 0) {
			return invalidf("heartbeat: job %s rank %d: loss %v is not finite", rt.id(), rs.GetRank(), l)
		}
		items = append(items, item{rs, rt, le})
	}
	for _, it := range ended {
		s.applyUsage(it.rt, it.le, it.rs.GetUsage())
	}
	listed := make(map[rankAttempt]bool, len(items))
	for _, it := range items {
		k := rankAttempt{it.rt.id(), it.rs.GetAttempt(), it.rs.GetRank()}
		listed[k] = true
		s.reported(w, it.rt, k)
	}
	w.missed(listed)
	for _, it := range items {
		it.le.step = max(it.le.step, it.rs.GetStep())
		s.applyUsage(it.rt, it.le, it.rs.GetUsage())
		if it.rt.live {
			step := it.rt.spec.TotalSteps
			for _, le := range it.rt.leases {
				step = min(step, le.step)
			}
			if err := s.sched.Progress(it.rt.id(), step); err != nil {
				s.log.Warn("pool progress refused", "job", it.rt.id(), "err", err)
			}
		}
	}
	return nil
}

func (v *workerServer) RankExited(ctx context.Context, req *pb.RankExitedRequest) (*pb.RankExitedResponse, error) {
	s := v.s
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkText("error", req.GetError(), 4096); err != nil {
		return nil, err
	}
	if d := req.GetDataSha256(); d != "" && !isHex64(d) {
		return nil, invalidf("data_sha256: want 64 lowercase hex digits")
	}
	ref := &pb.RankRef{WorkerId: req.GetWorkerId(), JobId: req.GetJobId(), Attempt: req.GetAttempt(), Rank: req.GetRank()}
	err = s.do(ctx, func() error {
		rt, le, current, err := s.reportLease(ref, p)
		if err != nil {
			return err
		}
		if req.GetUsage() != nil {
			if err := checkUsage(req.GetUsage(), le.usage); err != nil {
				return err
			}
		}
		s.applyUsage(rt, le, req.GetUsage())
		if w := s.workers[ref.GetWorkerId()]; w != nil {
			// A rank that ended was started, whatever its outcome.
			s.reported(w, rt, rankAttempt{ref.GetJobId(), ref.GetAttempt(), ref.GetRank()})
		}
		le.exited, le.data = true, req.GetDataSha256()
		if !current {
			// An ended attempt's rank: its usage counts, its outcome
			// changes nothing.
			delete(rt.ending, rankAttempt{ref.GetJobId(), ref.GetAttempt(), ref.GetRank()})
			s.save(rt)
			return nil
		}
		if rt.final {
			s.maybeHandoff(rt)
			return nil
		}
		if req.GetCompleted() || req.GetStopped() || rt.stopping {
			s.save(rt)
			return nil
		}
		detail := req.GetError()
		if detail == "" {
			detail = "rank exited without completing"
		}
		d, err := s.sched.Crashed(rt.id(), fmt.Sprintf("rank %d on worker %s: %s (exit code %d)", req.GetRank(), req.GetWorkerId(), detail, req.GetExitCode()))
		if err != nil {
			return errorf(codes.FailedPrecondition, "rank exited: %v", err)
		}
		s.execute([]pool.Decision{d})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pb.RankExitedResponse{}, nil
}

func (v *workerServer) PutCheckpointBlob(ctx context.Context, req *pb.PutCheckpointBlobRequest) (*pb.PutCheckpointBlobResponse, error) {
	s := v.s
	d, err := checkpoint.ParseDigest(req.GetDigest())
	if err != nil {
		return nil, invalidf("put checkpoint blob: digest: %v", err)
	}
	data := req.GetData()
	if len(data) > MaxBlobBytes {
		return nil, invalidf("put checkpoint blob: %d bytes, at most %d: cut tensors into chunks of the checkpoint chunk size", len(data), MaxBlobBytes)
	}
	st, limit, err := v.rankStoreCap(ctx, req.GetRef())
	if err != nil {
		return nil, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if has, err := st.dir.HasBlob(d); err == nil && has {
		if checkpoint.Sum(data) != d {
			return nil, invalidf("put checkpoint blob: data has digest %s, not %s", checkpoint.Sum(data), d)
		}
		st.fresh[d] = struct{}{}
		return &pb.PutCheckpointBlobResponse{}, nil
	}
	ok, used, err := s.ckpt.reserve(st, int64(len(data)), limit.bytes)
	if err != nil {
		return nil, errorf(codes.Internal, "put checkpoint blob: storage")
	}
	if !ok {
		return nil, s.overCap("put checkpoint blob", req.GetRef(), used, int64(len(data)), limit)
	}
	// Dir.PutBlob hashes a new blob before it stores it: the data is
	// hashed once, and data that is not d's is refused having stored
	// nothing.
	if err := st.dir.PutBlob(d, data); err != nil {
		s.ckpt.release(st, int64(len(data)))
		if errors.Is(err, checkpoint.ErrCorrupt) {
			return nil, invalidf("put checkpoint blob: data has digest %s, not %s", checkpoint.Sum(data), d)
		}
		s.log.Error("storing a checkpoint blob", "job", req.GetRef().GetJobId(), "err", err)
		return nil, errorf(codes.Internal, "put checkpoint blob: storage failed")
	}
	st.fresh[d] = struct{}{}
	return &pb.PutCheckpointBlobResponse{}, nil
}

// storageLimit is a job's checkpoint cap and what it comes from.
type storageLimit struct {
	bytes int64
	why   string
}

// overCap is the refusal of n more bytes for a rank of job, holding used,
// over limit.
func (s *Service) overCap(op string, ref *pb.RankRef, used, n int64, limit storageLimit) error {
	s.d.Metrics.PoolRefused(metrics.PoolRefusedCheckpointBytes)
	s.log.Warn("pool checkpoint storage refused: over the rank's cap", "job", ref.GetJobId(), "rank", ref.GetRank(),
		"worker", ref.GetWorkerId(), "used", used, "more", n, "cap", limit.bytes)
	return errorf(codes.ResourceExhausted, "%s: rank %d of job %s holds %d bytes of checkpoints and %d more would pass its cap of %d (%s): "+
		"a rank keeps its committed checkpoint, one older and at most %d ahead; upload only the blobs the next manifest names",
		op, ref.GetRank(), ref.GetJobId(), used, n, limit.bytes, limit.why, MaxCheckpointsAhead)
}

// rankStoreCap is rankStore for an upload: it also returns the job's cap.
func (v *workerServer) rankStoreCap(ctx context.Context, ref *pb.RankRef) (*rankStore, storageLimit, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, storageLimit{}, err
	}
	var limit storageLimit
	if err := v.s.do(ctx, func() error {
		rt, _, err := v.s.leaseFor(ref, p, false)
		if err == nil {
			limit.bytes, limit.why = v.s.storageCap(rt)
		}
		return err
	}); err != nil {
		return nil, storageLimit{}, err
	}
	st, err := v.s.ckpt.get(ref.GetJobId(), ref.GetRank())
	if err != nil {
		v.s.log.Error("opening a checkpoint store", "job", ref.GetJobId(), "err", err)
		return nil, storageLimit{}, errorf(codes.Internal, "checkpoint store unavailable")
	}
	return st, limit, nil
}

// rankStore checks the lease and opens the rank's store.
func (v *workerServer) rankStore(ctx context.Context, ref *pb.RankRef, ended bool) (*rankStore, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if err := v.s.do(ctx, func() error { _, _, err := v.s.leaseFor(ref, p, ended); return err }); err != nil {
		return nil, err
	}
	st, err := v.s.ckpt.get(ref.GetJobId(), ref.GetRank())
	if err != nil {
		v.s.log.Error("opening a checkpoint store", "job", ref.GetJobId(), "err", err)
		return nil, errorf(codes.Internal, "checkpoint store unavailable")
	}
	return st, nil
}

func (v *workerServer) HasCheckpointBlob(ctx context.Context, req *pb.HasCheckpointBlobRequest) (*pb.HasCheckpointBlobResponse, error) {
	d, err := checkpoint.ParseDigest(req.GetDigest())
	if err != nil {
		return nil, invalidf("has checkpoint blob: digest: %v", err)
	}
	st, err := v.rankStore(ctx, req.GetRef(), false)
	if err != nil {
		return nil, err
	}
	has, err := st.dir.HasBlob(d)
	if err != nil {
		return nil, errorf(codes.Internal, "has checkpoint blob: storage failed")
	}
	if has {
		st.mu.Lock()
		st.fresh[d] = struct{}{} // the rank will name it in its next manifest
		st.mu.Unlock()
	}
	return &pb.HasCheckpointBlobResponse{Present: has}, nil
}

func (v *workerServer) GetCheckpointBlob(ctx context.Context, req *pb.GetCheckpointBlobRequest) (*pb.GetCheckpointBlobResponse, error) {
	d, err := checkpoint.ParseDigest(req.GetDigest())
	if err != nil {
		return nil, invalidf("get checkpoint blob: digest: %v", err)
	}
	st, err := v.rankStore(ctx, req.GetRef(), false)
	if err != nil {
		return nil, err
	}
	b, err := st.dir.GetBlob(d)
	if err != nil {
		return nil, errorf(codes.NotFound, "get checkpoint blob %s: %v", d, err)
	}
	return &pb.GetCheckpointBlobResponse{Data: b}, nil
}

func (v *workerServer) CommitCheckpoint(ctx context.Context, req *pb.CommitCheckpointRequest) (*pb.CommitCheckpointResponse, error) {
	s := v.s
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	ref := req.GetRef()
	m, err := checkpoint.DecodeManifest(req.GetManifest())
	if err != nil {
		return nil, invalidf("commit checkpoint: %v", err)
	}
	stall, hasStall, err := reportedStall(req)
	if err != nil {
		return nil, err
	}
	var spec pool.Spec
	var rankCommitted int64
	var limit storageLimit
	err = s.do(ctx, func() error {
		rt, _, err := s.leaseFor(ref, p, false)
		if err != nil {
			return err
		}
		spec, rankCommitted = rt.spec, rt.rec.CommittedStep
		ahead := 0 // of this attempt: place forgets earlier attempts' (dropStale)
		for st := range rt.ckpts[ref.GetRank()] {
			if st > rt.rec.CommittedStep {
				ahead++
			}
			if st > rankCommitted && rt.stepRanks[st][ref.GetRank()] {
				rankCommitted = st
			}
		}
		if ahead >= MaxCheckpointsAhead {
			s.d.Metrics.PoolRefused(metrics.PoolRefusedCheckpointsAhead)
			s.log.Warn("pool checkpoint refused: rank too far ahead", "job", rt.id(), "rank", ref.GetRank(), "ahead", ahead)
			return errorf(codes.ResourceExhausted, "commit checkpoint: rank %d of job %s holds %d checkpoints past the job's committed step %d, "+
				"the most a rank may run ahead of the others: wait until every rank has committed the next one",
				ref.GetRank(), rt.id(), ahead, rt.rec.CommittedStep)
		}
		limit.bytes, limit.why = s.storageCap(rt)
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch {
	case m.Job != ref.GetJobId():
		return nil, invalidf("commit checkpoint: the manifest is for job %.64q, not %s", m.Job, ref.GetJobId())
	case m.Step > spec.TotalSteps || m.Step%spec.CheckpointInterval != 0 && m.Step != spec.TotalSteps:
		return nil, invalidf("commit checkpoint: step %d is not a checkpoint boundary (every %d steps, or %d)", m.Step, spec.CheckpointInterval, spec.TotalSteps)
	case m.Step <= rankCommitted:
		return nil, invalidf("commit checkpoint: step %d is not after rank %d's committed step %d", m.Step, ref.GetRank(), rankCommitted)
	}
	st, err := s.ckpt.get(ref.GetJobId(), ref.GetRank())
	if err != nil {
		return nil, errorf(codes.Internal, "checkpoint store unavailable")
	}
	st.mu.Lock()
	// The manifest is stored too, and counts against the job's cap.
	var charged int64
	if _, err := st.dir.Manifest(checkpoint.Sum(req.GetManifest())); err != nil {
		charged = int64(len(req.GetManifest()))
		ok, used, err := s.ckpt.reserve(st, charged, limit.bytes)
		if err != nil {
			st.mu.Unlock()
			return nil, errorf(codes.Internal, "commit checkpoint: storage")
		}
		if !ok {
			st.mu.Unlock()
			return nil, s.overCap("commit checkpoint", ref, used, charged, limit)
		}
	}
	id, err := st.dir.Commit(m)
	if err == nil {
		clear(st.fresh)
	} else {
		s.ckpt.release(st, charged)
	}
	st.mu.Unlock()
	if err != nil {
		return nil, errorf(codes.FailedPrecondition, "commit checkpoint: %v: put every blob the manifest names first", err)
	}
	var stop bool
	var keep map[string]bool
	err = s.do(ctx, func() error {
		rt, _, err := s.leaseFor(ref, p, false)
		if err != nil {
			return err
		}
		rank := ref.GetRank()
		if err := s.d.Store.PutPoolCheckpoint(context.Background(), rt.id(), rank, m.Step, id.String()); err != nil {
			return errorf(codes.Internal, "commit checkpoint: could not record it")
		}
		if rt.ckpts[rank] == nil {
			rt.ckpts[rank] = map[int64]string{}
		}
		rt.ckpts[rank][m.Step] = id.String()
		if rt.stepRanks[m.Step] == nil {
			rt.stepRanks[m.Step] = map[uint32]bool{}
		}
		rt.stepRanks[m.Step][rank] = true
		if hasStall {
			s.noteStall(rt, stall)
		}
		if len(rt.stepRanks[m.Step]) == len(rt.leases) && m.Step > rt.rec.CommittedStep {
			s.checkpointed(rt, m.Step)
		} else if hasStall {
			s.save(rt)
		}
		stop = rt.stopping || !rt.live && !rt.final
		keep = keepSet(rt.ckpts[rank], rt.rec.CommittedStep)
		return nil
	})
	if err != nil {
		return nil, err
	}
	dropped, err := s.ckpt.gc(st, keep)
	if err != nil {
		s.log.Warn("checkpoint gc", "job", ref.GetJobId(), "rank", ref.GetRank(), "err", err)
	}
	if len(dropped) > 0 {
		_ = s.do(ctx, func() error { s.forget(ref.GetJobId(), ref.GetRank(), dropped); return nil })
	}
	return &pb.CommitCheckpointResponse{Id: id.String(), Stop: stop}, nil
}

// keepSet is what GC keeps of a rank's checkpoints: every step at or after
// the job's committed step, and the newest one before it.
func keepSet(byStep map[int64]string, committed int64) map[string]bool {
	keep := map[string]bool{}
	older := int64(-1)
	for st, id := range byStep {
		if st >= committed {
			keep[id] = true
		} else if st > older {
			older = st
		}
	}
	if older >= 0 {
		keep[byStep[older]] = true
	}
	return keep
}

// forget drops the records of checkpoints GC deleted.
func (s *Service) forget(job string, rank uint32, ids []string) {
	rt := s.jobs[job]
	if rt == nil {
		return
	}
	gone := map[string]bool{}
	for _, id := range ids {
		gone[id] = true
	}
	for st, id := range rt.ckpts[rank] {
		if gone[id] {
			delete(rt.ckpts[rank], st)
			if err := s.d.Store.DeletePoolCheckpoint(context.Background(), job, rank, st); err != nil {
				s.log.Warn("forgetting a checkpoint", "job", job, "err", err)
			}
		}
	}
}

func (v *workerServer) GetRankCheckpoint(ctx context.Context, req *pb.GetRankCheckpointRequest) (*pb.GetRankCheckpointResponse, error) {
	s := v.s
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	ref := req.GetRef()
	want := req.GetId()
	if want != "" {
		if _, err := checkpoint.ParseDigest(want); err != nil {
			return nil, invalidf("get rank checkpoint: id: %v", err)
		}
	}
	err = s.do(ctx, func() error {
		rt, le, err := s.leaseFor(ref, p, false)
		if err != nil {
			return err
		}
		if want == "" {
			if le.l.ResumeStep == 0 {
				return nil
			}
			want = rt.ckpts[ref.GetRank()][le.l.ResumeStep]
			if want == "" {
				return errorf(codes.NotFound, "rank %d has no checkpoint at step %d", ref.GetRank(), le.l.ResumeStep)
			}
		}
		return nil
	})
	if err != nil || want == "" {
		return &pb.GetRankCheckpointResponse{}, err
	}
	st, err := s.ckpt.get(ref.GetJobId(), ref.GetRank())
	if err != nil {
		return nil, errorf(codes.Internal, "checkpoint store unavailable")
	}
	d, _ := checkpoint.ParseDigest(want)
	m, err := st.dir.Manifest(d)
	if err != nil {
		return nil, errorf(codes.NotFound, "get rank checkpoint %s: %v", want, err)
	}
	b, _, err := m.Encode()
	if err != nil {
		return nil, errorf(codes.Internal, "get rank checkpoint: encode")
	}
	return &pb.GetRankCheckpointResponse{Id: want, Manifest: b}, nil
}

func (v *workerServer) ListRankCheckpoints(ctx context.Context, req *pb.ListRankCheckpointsRequest) (*pb.ListRankCheckpointsResponse, error) {
	st, err := v.rankStore(ctx, req.GetRef(), false)
	if err != nil {
		return nil, err
	}
	ids, err := st.dir.List()
	if err != nil {
		return nil, errorf(codes.Internal, "list rank checkpoints: storage failed")
	}
	out := &pb.ListRankCheckpointsResponse{}
	for _, id := range ids {
		out.Ids = append(out.Ids, id.String())
	}
	return out, nil
}

var logStreams = map[string]bool{"stdout": true, "stderr": true, "agent": true}

// MaxLogLinesPerCall bounds one AppendLogs.
const MaxLogLinesPerCall = 1000

func (v *workerServer) AppendLogs(ctx context.Context, req *pb.AppendLogsRequest) (*pb.AppendLogsResponse, error) {
	s := v.s
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if len(req.GetLines()) > MaxLogLinesPerCall {
		return nil, invalidf("append logs: %d lines, at most %d per call", len(req.GetLines()), MaxLogLinesPerCall)
	}
	ref := req.GetRef()
	if err := s.do(ctx, func() error { _, _, _, err := s.reportLease(ref, p); return err }); err != nil {
		return nil, err
	}
	now := timestamppb.New(s.clk.Now())
	lines := make([]*pb.PoolLogLine, 0, len(req.GetLines()))
	for i, l := range req.GetLines() {
		if len(l.GetText()) > MaxLogLineBytes || !utf8.ValidString(l.GetText()) {
			return nil, invalidf("append logs: line %d: want valid UTF-8 of at most %d bytes; split longer lines", i, MaxLogLineBytes)
		}
		if !logStreams[l.GetStream()] {
			return nil, invalidf("append logs: line %d: stream %.16q; want stdout, stderr or agent", i, l.GetStream())
		}
		lines = append(lines, &pb.PoolLogLine{Attempt: ref.GetAttempt(), Rank: ref.GetRank(), Stream: l.GetStream(),
			Text: l.GetText(), Time: now})
	}
	if len(lines) == 0 {
		return &pb.AppendLogsResponse{}, nil
	}
	if _, err := s.d.Store.AppendPoolLogs(ctx, ref.GetJobId(), lines, MaxLogLines); err != nil {
		s.log.Error("storing pool logs", "job", ref.GetJobId(), "err", err)
		return nil, errorf(codes.Internal, "append logs: storage failed")
	}
	s.logs.notify(ref.GetJobId())
	return &pb.AppendLogsResponse{}, nil
}

func checkText(field, v string, limit int) error {
	if len(v) > limit || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return invalidf("%s: want UTF-8 text of at most %d bytes without NUL", field, limit)
	}
	return nil
}

func isHex64(v string) bool {
	if len(v) != 64 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
