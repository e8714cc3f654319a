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
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
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
	case in.GetDiloco() != nil:
		return invalidf("spec.executor: DiLoCo islands run on the workers")
	case in.GetCarbon() != nil:
		return invalidf("spec.executor: carbon-aware placement chooses among the workers' zones; it does not apply to the Kubernetes executor")
	}
	return nil
}

// startKube creates the JobSet of a recorded job; a failure fails the job.
// It runs off the loop: it talks to the API server.
func (s *Service) startKube(ctx context.Context, job *pb.PoolJob) *pb.PoolJob {
	err := s.d.Kube.Start(ctx, job)
	if err == nil {
		return job
	}
	s.log.Error("creating a pool job's JobSet", "job", job.GetSpec().GetId(), "err", err)
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

// watchKube feeds the cluster's JobSets into the jobs until ctx ends.
func (s *Service) watchKube(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.d.Kube.Watch(ctx, kubeSink{s: s, ctx: ctx})
		if ctx.Err() != nil {
			return
		}
		s.log.Error("watching JobSets; Kubernetes jobs do not move until it works", "err", err)
		if !sleepOr(s, ctx, s.lossAfter()) {
			return
		}
	}
}

func sleepOr(s *Service, ctx context.Context, d time.Duration) bool {
	t := s.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// kubeSink reads what a JobSet's state needs from the checkpoint volume,
// off the loop, then applies it on the loop.
type kubeSink struct {
	s   *Service
	ctx context.Context
}

// kubeRead is what the checkpoint volume says about a job.
type kubeRead struct {
	committed int64
	final     *model.Model
	finalSum  string
	err       error
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
	if s.d.KubeCheckpointDir != "" && (st.State == pool.Running || st.State == pool.Succeeded) {
		rd = s.readKubeCheckpoints(job, ranks, total, st.State == pool.Succeeded)
	}
	_ = s.do(k.ctx, func() error {
		s.kubeState(job, attempt, st, rd)
		return nil
	})
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
		rd.err = fmt.Errorf("the last step's checkpoint: %w", err)
		return rd
	}
	m, err := model.ReadSafetensors(bytes.NewReader(b), model.WithInputSize(int64(len(b))))
	if err != nil {
		rd.err = fmt.Errorf("%s: %w", path, err)
		return rd
	}
	sum := sha256.Sum256(b)
	rd.final, rd.finalSum = m, hex.EncodeToString(sum[:])
	return rd
}

// kubeState moves a Kubernetes job to what its JobSet says.
func (s *Service) kubeState(job string, attempt uint32, st kube.Status, rd kubeRead) {
	rt := s.jobs[job]
	if rt == nil || !onKube(rt.rec.GetSpec()) || rt.terminal() || rt.rec.GetAttempt() != attempt {
		return
	}
	r := rt.rec
	changed := false
	if n := uint32(max(st.Restarts, 0)); n != r.Restarts {
		r.Restarts, changed = n, true
	}
	if rd.err == nil && rd.committed > r.CommittedStep {
		r.CommittedStep, r.Step, changed = rd.committed, max(r.Step, rd.committed), true
	}
	if rd.err != nil {
		s.log.Warn("reading a Kubernetes job's checkpoints", "job", job, "err", rd.err)
	}
	reason := clip("Kubernetes: "+st.Reason, 1024)
	switch st.State {
	case pool.Queued:
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_QUEUED, reason)
	case pool.Running:
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_RUNNING, reason)
	case pool.Failed:
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_FAILED, reason)
	case pool.Succeeded:
		s.kubeHandoff(rt, rd)
		return
	}
	if changed {
		s.save(rt)
	}
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
	case rd.err != nil || rd.final == nil:
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, clip(fmt.Sprintf("%s; no model stored: %v", reason, rd.err), 1024))
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
