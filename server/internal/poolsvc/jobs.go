package poolsvc

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/carbon"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/kube"
)

type jobServer struct {
	apiv1.UnimplementedPoolServiceServer
	s *Service
}

func (v *jobServer) SubmitJob(ctx context.Context, req *pb.SubmitJobRequest) (*pb.SubmitJobResponse, error) {
	s := v.s
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetSpec() == nil {
		return nil, invalidf("submit job: spec is required")
	}
	in := proto.CloneOf(req.GetSpec())
	if in.Id == "" {
		in.Id = newID("job-")
	}
	if in.Tenant == "" {
		if _, ok := s.d.Tenants[DefaultTenant]; ok {
			in.Tenant = DefaultTenant
		}
	}
	if _, ok := s.d.Tenants[in.Tenant]; !ok {
		return nil, invalidf("submit job: spec.tenant %.64q is not configured; the server runs tenants %v", in.Tenant, tenantNames(s.d.Tenants))
	}
	if err := checkProgram(in); err != nil {
		return nil, err
	}
	if err := checkThenTask(req.GetThenTask()); err != nil {
		return nil, err
	}
	if err := checkCarbon(in); err != nil {
		return nil, err
	}
	if in.GetDiloco() != nil {
		if err := checkDiLoCo(in); err != nil {
			return nil, err
		}
	}
	if err := s.checkKube(in); err != nil {
		return nil, err
	}
	var forecasts []carbon.Forecast
	if in.GetCarbon() != nil {
		if forecasts, err = s.readForecasts(ctx); err != nil {
			return nil, err
		}
	}
	var out *pb.PoolJob
	err = s.do(ctx, func() error {
		now := s.clk.Now()
		sp, err := specOf(in, now)
		if err != nil {
			return err
		}
		if _, ok := s.jobs[sp.ID]; ok {
			return errorf(codes.AlreadyExists, "submit job: job id %s is taken; choose another or leave it empty", sp.ID)
		}
		if _, err := s.d.Store.PoolJob(ctx, sp.ID); err == nil {
			return errorf(codes.AlreadyExists, "submit job: job id %s is taken; choose another or leave it empty", sp.ID)
		}
		rec := &pb.PoolJob{Spec: in, SpecDigest: sp.Digest(), State: pb.PoolJobState_POOL_JOB_STATE_QUEUED,
			StateReason: "submitted", Submitter: p.Subject, SubmitTime: timestamppb.New(now), Usage: &pb.PoolUsage{}}
		var then *pb.Task
		if req.GetThenTask() != nil {
			then = proto.CloneOf(req.GetThenTask())
		}
		if in.GetDiloco() != nil {
			if err := s.submitDiLoCo(ctx, in, rec, then, sp); err != nil {
				return err
			}
			out = s.jobs[sp.ID].snapshot()
			return nil
		}
		if onKube(in) {
			// Kueue admits it: the job is not the scheduler's.
			rec.Attempt = 1
			rec.StateReason = "creating JobSet " + kube.JobSetName(sp.ID, 1)
		}
		var plan carbonPlan
		if in.GetCarbon() != nil {
			if plan, err = s.planCarbon(in, sp, forecasts, now); err != nil {
				return err
			}
			recordPlan(rec, plan.choice)
			applyCarbon(&sp, rec)
		}
		rt := newJobRT(rec, then, sp)
		rt.forecast = plan.forecast
		ev := s.poolJobEvent(rt, "")
		if in.GetCarbon() != nil {
			ev.Carbon, ev.ForecastSHA256 = carbonDetail(plan.choice), plan.choice.Digest
		}
		if err := s.audit(ctx, ev); err != nil {
			return errorf(codes.Internal, "submit job: the audit log did not take the submission; nothing was queued")
		}
		if err := s.d.Store.InsertPoolJob(ctx, rec, then); err != nil {
			if errors.Is(err, backend.ErrExists) {
				return errorf(codes.AlreadyExists, "submit job: job id %s is taken", sp.ID)
			}
			s.log.Error("storing a pool job", "job", sp.ID, "err", err)
			return errorf(codes.Internal, "submit job: storage failed")
		}
		if !onKube(in) {
			if err := s.sched.Submit(sp); err != nil {
				return invalidf("submit job: %v", err)
			}
		}
		s.jobs[sp.ID] = rt
		out = rt.snapshot()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if onKube(in) {
		out = s.startKube(ctx, out)
	}
	return &pb.SubmitJobResponse{Job: out}, nil
}

func tenantNames(m map[string]pool.Tenant) []string {
	out := mapsKeys(m)
	sortStrings(out)
	return out
}

// job returns the job as held now, or as stored if it is not in memory.
func (s *Service) job(ctx context.Context, id string) (*pb.PoolJob, <-chan struct{}, error) {
	if len(id) == 0 || len(id) > pool.MaxNameLen {
		return nil, nil, invalidf("job_id: want the job's id")
	}
	var out *pb.PoolJob
	var changed <-chan struct{}
	err := s.do(ctx, func() error {
		if rt := s.jobs[id]; rt != nil {
			out, changed = rt.snapshot(), rt.changed
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if out != nil {
		return out, changed, nil
	}
	row, err := s.d.Store.PoolJob(ctx, id)
	if errors.Is(err, backend.ErrNotFound) {
		return nil, nil, errorf(codes.NotFound, "pool job %s not found", id)
	}
	if err != nil {
		return nil, nil, errorf(codes.Internal, "pool job: storage failed")
	}
	return row.Job, nil, nil
}

func (v *jobServer) GetJob(ctx context.Context, req *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	j, _, err := v.s.job(ctx, req.GetJobId())
	if err != nil {
		return nil, err
	}
	return &pb.GetJobResponse{Job: j}, nil
}

const maxPage = 100

func (v *jobServer) ListJobs(ctx context.Context, req *pb.ListJobsRequest) (*pb.ListJobsResponse, error) {
	n := int(req.GetPageSize())
	if n < 0 {
		return nil, invalidf("list jobs: page_size %d is negative", n)
	}
	if n == 0 || n > maxPage {
		n = maxPage
	}
	var before int64
	if t := req.GetPageToken(); t != "" {
		var err error
		if before, err = strconv.ParseInt(t, 10, 64); err != nil || before <= 0 {
			return nil, invalidf("list jobs: page_token %.32q: pass next_page_token from the previous response", t)
		}
	}
	if _, ok := pb.PoolJobState_name[int32(req.GetState())]; !ok {
		return nil, invalidf("list jobs: state %d is not a pool job state", req.GetState())
	}
	rows, err := v.s.d.Store.PoolJobs(ctx, req.GetState(), before, n+1)
	if err != nil {
		return nil, errorf(codes.Internal, "list jobs: storage failed")
	}
	out := &pb.ListJobsResponse{}
	if len(rows) > n {
		rows = rows[:n]
		out.NextPageToken = strconv.FormatInt(rows[n-1].Seq, 10)
	}
	for _, r := range rows {
		out.Jobs = append(out.Jobs, r.Job)
	}
	return out, nil
}

func (v *jobServer) CancelJob(ctx context.Context, req *pb.CancelJobRequest) (*pb.CancelJobResponse, error) {
	s := v.s
	if err := checkText("reason", req.GetReason(), 1024); err != nil {
		return nil, err
	}
	id := req.GetJobId()
	var out *pb.PoolJob
	err := s.do(ctx, func() error {
		rt := s.jobs[id]
		if rt == nil {
			if _, err := s.d.Store.PoolJob(ctx, id); err == nil {
				return errorf(codes.FailedPrecondition, "cancel job: job %s has ended", id)
			}
			return errorf(codes.NotFound, "pool job %.64q not found", id)
		}
		if rt.terminal() || rt.final {
			return errorf(codes.FailedPrecondition, "cancel job: job %s has ended (%s)", id, rt.rec.State)
		}
		reason := "cancelled by client"
		if r := req.GetReason(); r != "" {
			reason += ": " + r
		}
		if rt.diloco != nil {
			s.endDiLoCo(rt, pb.PoolJobState_POOL_JOB_STATE_CANCELLED, reason)
			out = rt.snapshot()
			return nil
		}
		if onKube(rt.rec.GetSpec()) {
			s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_CANCELLED, reason)
			out = rt.snapshot()
			return nil
		}
		if err := s.sched.Cancel(id); err != nil {
			return errorf(codes.FailedPrecondition, "cancel job: %v", err)
		}
		s.stopNow(rt, pb.PoolJobState_POOL_JOB_STATE_CANCELLED, reason)
		out = rt.snapshot()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if onKube(out.GetSpec()) {
		if err := s.d.Kube.Stop(ctx, id, out.GetAttempt()); err != nil {
			s.log.Error("deleting a cancelled job's JobSet", "job", id, "err", err)
			return nil, errorf(codes.Unavailable, "cancel job: job %s is cancelled, but deleting its JobSet %s failed: %v; delete it with kubectl",
				id, kube.JobSetName(id, out.GetAttempt()), err)
		}
	}
	return &pb.CancelJobResponse{Job: out}, nil
}

func (v *jobServer) WatchJob(req *pb.WatchJobRequest, stream grpc.ServerStreamingServer[pb.WatchJobResponse]) error {
	ctx := stream.Context()
	for {
		j, changed, err := v.s.job(ctx, req.GetJobId())
		if err != nil {
			return err
		}
		if err := stream.Send(&pb.WatchJobResponse{Job: j}); err != nil {
			return err
		}
		if terminalState(j.GetState()) || changed == nil {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-v.s.stop:
			return errorf(codes.Unavailable, "pool service shutting down")
		}
	}
}

func (v *jobServer) JobLogs(req *pb.JobLogsRequest, stream grpc.ServerStreamingServer[pb.JobLogsResponse]) error {
	s := v.s
	ctx := stream.Context()
	if _, _, err := s.job(ctx, req.GetJobId()); err != nil {
		return err
	}
	var after uint64
	for {
		// Subscribed before reading, so a line stored in between wakes us.
		more := s.logs.wait(req.GetJobId())
		j, changed, err := s.job(ctx, req.GetJobId())
		if err != nil {
			return err
		}
		for {
			lines, err := s.d.Store.PoolLogs(ctx, req.GetJobId(), after, 500)
			if err != nil {
				return errorf(codes.Internal, "job logs: storage failed")
			}
			if len(lines) == 0 {
				break
			}
			after = lines[len(lines)-1].GetSeq()
			if err := stream.Send(&pb.JobLogsResponse{Lines: lines}); err != nil {
				return err
			}
		}
		if !req.GetFollow() || terminalState(j.GetState()) || changed == nil {
			return nil
		}
		select {
		case <-more:
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-s.stop:
			return errorf(codes.Unavailable, "pool service shutting down")
		}
	}
}

func (v *jobServer) ListWorkers(ctx context.Context, _ *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	s := v.s
	out := &pb.ListWorkersResponse{}
	err := s.do(ctx, func() error {
		free := map[string]pool.Resources{}
		for _, w := range s.sched.Workers() {
			free[w.ID] = w.Free
		}
		ids := mapsKeys(s.workers)
		sortStrings(ids)
		for _, id := range ids {
			w := proto.CloneOf(s.workers[id].rec)
			if f, ok := free[id]; ok {
				w.Free = &pb.PoolResources{MilliCpu: f.MilliCPU, MemoryBytes: f.Memory, Gpus: f.GPUs}
			} else {
				w.Free = &pb.PoolResources{}
			}
			out.Workers = append(out.Workers, w)
		}
		return nil
	})
	return out, err
}

// restore loads what the store holds: every queued or running job comes
// back queued from its committed step, with its committed checkpoints;
// workers are marked lost, to register again.
func (s *Service) restore(ctx context.Context) error {
	workers, err := s.d.Store.PoolWorkers(ctx)
	if err != nil {
		return fmt.Errorf("poolsvc: restore: %w", err)
	}
	for _, w := range workers {
		if w.Worker.GetState() != workerLost {
			w.Worker.State = workerLost
			if err := s.d.Store.PutPoolWorker(ctx, w); err != nil {
				return fmt.Errorf("poolsvc: restore: %w", err)
			}
		}
	}
	rows, err := s.d.Store.ActivePoolJobs(ctx)
	if err != nil {
		return fmt.Errorf("poolsvc: restore: %w", err)
	}
	for _, r := range rows {
		rec := r.Job
		sp, err := specOf(rec.GetSpec(), rec.GetSubmitTime().AsTime())
		if err != nil {
			return fmt.Errorf("poolsvc: restore job %s: %w", rec.GetSpec().GetId(), err)
		}
		applyCarbon(&sp, rec)
		if rec.GetSpec().GetDiloco() != nil && rec.GetParent() == "" {
			if err := s.restoreDiLoCo(rec, r.ThenTask, sp); err != nil {
				return fmt.Errorf("poolsvc: restore job %s: %w", sp.ID, err)
			}
			continue
		}
		if onKube(rec.GetSpec()) {
			// The JobSet lives on in the cluster; the watch's first list
			// brings the record up to date.
			if s.d.Kube == nil {
				rt := newJobRT(rec, r.ThenTask, sp)
				s.jobs[sp.ID] = rt
				s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_FAILED, "server restarted without --pool-kubernetes; its JobSet is no longer followed")
				continue
			}
			s.jobs[sp.ID] = newJobRT(rec, r.ThenTask, sp)
			continue
		}
		rt := newJobRT(rec, r.ThenTask, sp)
		if rec.GetStartTime() != nil {
			rt.firstStart = rec.GetStartTime().AsTime()
		}
		cks, err := s.d.Store.PoolCheckpoints(ctx, sp.ID)
		if err != nil {
			return fmt.Errorf("poolsvc: restore: %w", err)
		}
		for _, c := range cks {
			if rt.ckpts[c.Rank] == nil {
				rt.ckpts[c.Rank] = map[int64]string{}
			}
			rt.ckpts[c.Rank][c.Step] = c.Manifest
		}
		// A committed step at total steps whose handoff did not finish
		// resumes from the checkpoint before it; the last interval is
		// trained and committed again.
		committed := rec.GetCommittedStep()
		if committed >= sp.TotalSteps {
			committed = (sp.TotalSteps - 1) / sp.CheckpointInterval * sp.CheckpointInterval
		}
		reason := rec.GetStateReason()
		if rec.GetState() == pb.PoolJobState_POOL_JOB_STATE_RUNNING {
			reason = fmt.Sprintf("server restarted; resuming from checkpoint step %d", committed)
		}
		if err := s.sched.Restore(pool.Job{Spec: sp, State: pool.Queued, Reason: reason, Submitted: rec.GetSubmitTime().AsTime(),
			Restarts: int(rec.GetRestarts()), Committed: committed}); err != nil {
			return fmt.Errorf("poolsvc: restore job %s: %w", sp.ID, err)
		}
		rec.CommittedStep, rec.Step, rec.Placement = committed, committed, nil
		rec.Checkpoint = rt.ckpts[0][committed]
		s.jobs[sp.ID] = rt
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_QUEUED, reason)
	}
	return nil
}
