package poolsvc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/kube"
)

// KubeExecutor runs jobs as JobSets on a Kubernetes cluster; kube.Controller
// is one.
type KubeExecutor interface {
	// Start creates the JobSet of the job's current attempt.
	Start(ctx context.Context, job *pb.PoolJob) error
	// Stop deletes the JobSet of an attempt.
	Stop(ctx context.Context, jobID string, attempt uint32) error
	// Watch reports JobSets' status to sink until ctx ends.
	Watch(ctx context.Context, sink kube.Sink) error
}

// maxKubeModelBytes bounds the final model the server reads from the
// checkpoint volume.
const maxKubeModelBytes = 8 << 30

func onKube(spec *pb.PoolJobSpec) bool {
	return spec.GetExecutor() == pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES
}

// checkKube bounds a job for the Kubernetes executor.
func (s *Service) checkKube(in *pb.PoolJobSpec) error {
	if !onKube(in) {
		return nil
	}
	switch {
	case s.d.Kube == nil:
		return errorf(codes.FailedPrecondition, "spec.executor: this server runs no Kubernetes executor; start it with --pool-kubernetes, or leave the executor unset to use the workers")
	case in.GetCommand() == nil:
		return invalidf("spec.executor: the Kubernetes executor runs command jobs (the image runs the argv); built-in trainer jobs run on the workers")
	case in.GetCarbon() != nil:
		return invalidf("spec.executor: carbon-aware placement chooses among the workers' zones; it does not apply to the Kubernetes executor")
	}
	return nil
}

// startKube creates the JobSet of a recorded job; a failure fails the job.
// It runs off the loop: it talks to the API server.
func (s *Service) startKube(ctx context.Context, job *pb.PoolJob) *pb.PoolJob {
	// The job is recorded: a client that hangs up must not leave it
	// without its JobSet, nor a JobSet the API server took without a job.
	ctx = context.WithoutCancel(ctx)
	id := job.GetSpec().GetId()
	err := s.d.Kube.Start(ctx, job)
	if err == nil {
		// A cancel, or a newer attempt, that came while the JobSet was
		// being created found nothing to delete: delete it here instead.
		stale := false
		_ = s.do(ctx, func() error {
			rt := s.jobs[id]
			stale = rt == nil || rt.terminal() || rt.rec.GetAttempt() != job.GetAttempt()
			return nil
		})
		if stale {
			if serr := s.d.Kube.Stop(ctx, id, job.GetAttempt()); serr != nil {
				s.log.Warn("removing the JobSet of an attempt that ended while it was created", "job", id, "attempt", job.GetAttempt(), "err", serr)
			}
		}
		return job
	}
	s.log.Error("creating a pool job's JobSet", "job", job.GetSpec().GetId(), "err", err)
	if serr := s.d.Kube.Stop(ctx, job.GetSpec().GetId(), job.GetAttempt()); serr != nil {
		s.log.Warn("removing what may be left of a failed JobSet", "job", job.GetSpec().GetId(), "err", serr)
	}
	out := job
	_ = s.do(context.WithoutCancel(ctx), func() error {
		if rt := s.jobs[job.GetSpec().GetId()]; rt != nil && !rt.terminal() {
			s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_FAILED, clip("creating its JobSet failed: "+err.Error(), 1024))
			out = rt.snapshot()
		}
		return nil
	})
	return out
}

// kubeProgressEvery is how often running Kubernetes jobs' checkpoints are
// read, in heartbeat intervals: a JobSet says nothing new while its ranks
// train and checkpoint.
const kubeProgressEvery = 5

// watchKube feeds the cluster's JobSets into the jobs until ctx ends, and
// reads running jobs' progress from the checkpoint volume.
func (s *Service) watchKube(ctx context.Context) {
	if s.d.KubeCheckpointDir != "" {
		go s.pollKubeProgress(ctx)
	}
	s.resumeKube(ctx)
	for ctx.Err() == nil {
		err := s.d.Kube.Watch(ctx, kubeSink{s: s, ctx: ctx})
		if ctx.Err() != nil {
			return
		}
		s.log.Error("watching JobSets; Kubernetes jobs do not move until it works", "err", err)
		if !clock.Sleep(s.clk, s.lossAfter(), ctx.Done()) {
			return
		}
	}
}

// resumeKube makes sure every restored Kubernetes job has its current
// attempt's JobSet and not the one before: a server that stopped between
// recording a new attempt and replacing the JobSet left that undone. Both
// calls are idempotent.
func (s *Service) resumeKube(ctx context.Context) {
	var jobs []*pb.PoolJob
	_ = s.do(ctx, func() error {
		for _, rt := range s.jobs {
			if onKube(rt.rec.GetSpec()) && !rt.terminal() {
				jobs = append(jobs, rt.snapshot())
			}
		}
		return nil
	})
	for _, j := range jobs {
		if a := j.GetAttempt(); a > 1 {
			if err := s.d.Kube.Stop(ctx, j.GetSpec().GetId(), a-1); err != nil {
				s.log.Warn("removing a replaced attempt's JobSet", "job", j.GetSpec().GetId(), "attempt", a-1, "err", err)
			}
		}
		s.startKube(ctx, j)
	}
}

// pollKubeProgress reads the committed step of every running Kubernetes
// job from the volume, off the loop, and records it.
func (s *Service) pollKubeProgress(ctx context.Context) {
	for clock.Sleep(s.clk, kubeProgressEvery*s.d.HeartbeatInterval, ctx.Done()) {
		type running struct {
			id    string
			ranks int
			total int64
		}
		var jobs []running
		_ = s.do(ctx, func() error {
			for id, rt := range s.jobs {
				if onKube(rt.rec.GetSpec()) && rt.rec.GetState() == pb.PoolJobState_POOL_JOB_STATE_RUNNING {
					jobs = append(jobs, running{id, rt.spec.Ranks, rt.spec.TotalSteps})
				}
			}
			return nil
		})
		for _, j := range jobs {
			rd := s.readKubeCheckpoints(j.id, j.ranks, j.total, false)
			_ = s.do(ctx, func() error {
				if rt := s.jobs[j.id]; rt != nil && !rt.terminal() && s.kubeProgress(rt, rd) {
					s.save(rt)
				}
				return nil
			})
		}
	}
}

// kubeSink reads what a JobSet's state needs from the checkpoint volume,
// off the loop, then applies it on the loop.
type kubeSink struct {
	s   *Service
	ctx context.Context
}

// kubeRead is what the checkpoint volume says about a job: the step every
// rank has committed (err, if it could not be read), and the final model
// (finalErr, if it could not be read).
type kubeRead struct {
	committed int64
	err       error
	final     *model.Model
	finalSum  string
	finalErr  error
}

func (k kubeSink) JobSetState(job string, attempt uint32, st kube.Status) {
	s := k.s
	var ranks int
	var total int64
	_ = s.do(k.ctx, func() error {
		if rt := s.jobs[job]; rt != nil && onKube(rt.rec.GetSpec()) {
			ranks, total = rt.spec.Ranks, rt.spec.TotalSteps
		}
		return nil
	})
	if ranks == 0 {
		return
	}
	var rd kubeRead
	if s.d.KubeCheckpointDir != "" {
		// Queued and Failed read it too: a replaced attempt resumes from
		// what the ranks committed before they were stopped.
		rd = s.readKubeCheckpoints(job, ranks, total, st.State == pool.Succeeded)
	}
	var next *pb.PoolJob
	_ = s.do(k.ctx, func() error {
		next = s.kubeState(job, attempt, st, rd)
		return nil
	})
	if next == nil {
		return
	}
	// The old attempt's JobSet goes before the next one is created, so the
	// two never hold quota or pods at once.
	if err := s.d.Kube.Stop(k.ctx, job, attempt); err != nil {
		s.log.Warn("removing a replaced attempt's JobSet", "job", job, "attempt", attempt, "err", err)
	}
	s.startKube(k.ctx, next)
}

func (k kubeSink) JobSetGone(job string, attempt uint32) {
	s := k.s
	_ = s.do(k.ctx, func() error {
		rt := s.jobs[job]
		if rt == nil || !onKube(rt.rec.GetSpec()) || rt.terminal() || rt.rec.GetAttempt() != attempt {
			return nil
		}
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_FAILED,
			fmt.Sprintf("its JobSet %s was deleted outside Fleetlearn", kube.JobSetName(job, attempt)))
		return nil
	})
}

// readKubeCheckpoints finds the step every rank has committed on the
// volume and, for a succeeded job, reads rank 0's model at the last step.
func (s *Service) readKubeCheckpoints(job string, ranks int, total int64, final bool) kubeRead {
	rd := kubeRead{committed: -1}
	for r := range ranks {
		step, _, err := stepdir.Latest(kube.RankCheckpointDir(s.d.KubeCheckpointDir, job, strconv.Itoa(r)))
		if errors.Is(err, stepdir.ErrNoCheckpoint) {
			step, err = 0, nil
		}
		if err != nil {
			rd.err = err
			return rd
		}
		if rd.committed < 0 || step < rd.committed {
			rd.committed = step
		}
	}
	rd.committed = min(max(rd.committed, 0), total)
	if !final {
		return rd
	}
	path := filepath.Join(kube.RankCheckpointDir(s.d.KubeCheckpointDir, job, "0"), "step-"+strconv.FormatInt(total, 10), stepdir.ModelFile)
	b, err := smallfile.Read(path, maxKubeModelBytes)
	if err != nil {
		rd.finalErr = fmt.Errorf("the last step's checkpoint: %w", err)
		return rd
	}
	m, err := model.ReadSafetensors(bytes.NewReader(b), model.WithInputSize(int64(len(b))))
	if err != nil {
		rd.finalErr = fmt.Errorf("%s: %w", path, err)
		return rd
	}
	sum := sha256.Sum256(b)
	rd.final, rd.finalSum = m, hex.EncodeToString(sum[:])
	return rd
}

// kubeState moves a Kubernetes job to what its JobSet says. When the
// attempt must be replaced — its gang failed in a way worth a restart, or
// Kueue evicted it after admitting it — it records the next attempt and
// returns the job to start; the caller stops the old JobSet and starts the
// new one off the loop.
func (s *Service) kubeState(job string, attempt uint32, st kube.Status, rd kubeRead) *pb.PoolJob {
	rt := s.jobs[job]
	if rt == nil || !onKube(rt.rec.GetSpec()) || rt.terminal() || rt.rec.GetAttempt() != attempt {
		return nil
	}
	r := rt.rec
	changed := s.kubeProgress(rt, rd)
	reason := clip("Kubernetes: "+st.Reason, 1024)
	switch st.State {
	case pool.Queued:
		if r.GetState() == pb.PoolJobState_POOL_JOB_STATE_RUNNING {
			// Kueue suspends an admitted workload to preempt it or because
			// its pods did not get ready in time; the JobSet's pods are
			// gone. Readmitted as it is, the ranks would resume from the
			// step this attempt started from, so the next attempt resumes
			// from what they committed. An eviction is not the job's fault:
			// it does not count against max_restarts.
			return s.kubeReplace(rt, fmt.Sprintf("evicted by Kueue (%s); attempt %d resumes from checkpoint step %d once admitted again",
				st.Reason, r.GetAttempt()+1, r.GetCommittedStep()))
		}
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_QUEUED, reason)
	case pool.Running:
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_RUNNING, reason)
	case pool.Failed:
		if st.Retryable {
			if limit := rt.spec.MaxRestarts; int(r.GetRestarts()) < limit {
				r.Restarts++
				return s.kubeReplace(rt, fmt.Sprintf("restart %d of %d from checkpoint step %d: the gang failed (%s)",
					r.GetRestarts(), limit, r.GetCommittedStep(), st.Reason))
			}
			reason = clip(fmt.Sprintf("Kubernetes: %s; no restarts left (%d of %d made)", st.Reason, r.GetRestarts(), rt.spec.MaxRestarts), 1024)
		}
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_FAILED, reason)
	case pool.Succeeded:
		s.kubeHandoff(rt, rd)
		return nil
	}
	if changed {
		s.save(rt)
	}
	return nil
}

// kubeReplace records the job's next attempt, queued, and returns the job
// to create its JobSet from: it resumes at the committed step.
func (s *Service) kubeReplace(rt *jobRT, reason string) *pb.PoolJob {
	rt.rec.Attempt++
	s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_QUEUED, clip(reason, 1024))
	return rt.snapshot()
}

// kubeProgress records the committed step the volume shows, if it is new.
func (s *Service) kubeProgress(rt *jobRT, rd kubeRead) bool {
	if rd.err != nil {
		s.log.Warn("reading a Kubernetes job's checkpoints", "job", rt.id(), "err", rd.err)
		return false
	}
	if r := rt.rec; rd.committed > r.CommittedStep {
		r.CommittedStep, r.Step = rd.committed, max(r.Step, rd.committed)
		return true
	}
	return false
}

// kubeHandoff records a succeeded Kubernetes job, with the model of its
// last checkpoint when the server sees the checkpoint volume.
func (s *Service) kubeHandoff(rt *jobRT, rd kubeRead) {
	ctx := context.Background()
	total := rt.spec.TotalSteps
	reason := fmt.Sprintf("completed %d steps on Kubernetes", total)
	switch {
	case s.d.KubeCheckpointDir == "":
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, reason+"; no model stored: the server does not mount the checkpoint volume (--pool-kube-checkpoint-dir)")
		return
	case rd.err != nil:
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, clip(fmt.Sprintf("%s; no model stored: %v", reason, rd.err), 1024))
		return
	case rd.final == nil:
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, clip(fmt.Sprintf("%s; no model stored: %v", reason, rd.finalErr), 1024))
		return
	}
	out := &model.Model{Tensors: rd.final.Tensors, Lineage: model.Lineage{Job: rt.id(), Source: "pool"}}
	if err := out.Validate(); err != nil {
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, clip(fmt.Sprintf("%s; no model stored: %v", reason, err), 1024))
		return
	}
	rt.rec.CommittedStep, rt.rec.Step = total, total
	lin := &pb.PoolLineage{JobId: rt.id(), SpecDigest: rt.rec.SpecDigest, Checkpoint: rd.finalSum,
		Usage: proto.CloneOf(rt.rec.Usage), Steps: total}
	m, err := s.d.StoreModel(ctx, rt.spec.OutputModel, out, lin)
	var ev audit.ModelImported
	if err == nil {
		ev = imported(m, rt.spec.OutputModel, rt.id())
	}
	s.succeeded(ctx, rt, reason, m, ev, err)
}
