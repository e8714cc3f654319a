package poolsvc

import (
	"bytes"
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// handoff turns a completed job's final checkpoint into a model version,
// records the job succeeded with it, and creates the then_task. It runs
// once every rank has reported its exit (their data digests go into the
// lineage), or when the wait for that times out.
func (s *Service) handoff(rt *jobRT) {
	if !rt.final {
		return
	}
	switch {
	case rt.diloco != nil:
		s.handoffDiLoCo(rt)
		return
	case rt.rec.GetParent() != "":
		s.finishIsland(rt)
		return
	}
	rt.final, rt.handoffDue = false, timeZero
	ctx := context.Background()
	total := rt.spec.TotalSteps
	reason := fmt.Sprintf("completed %d steps", total)
	rt.rec.DataSha256 = dataDigest(rt.leases)
	m, imported, err := s.storeModel(ctx, rt)
	s.succeeded(ctx, rt, reason, m, imported, err)
}

// succeeded records a job succeeded with its model m, imported being m's
// model.imported event, and creates the then_task; when storing the model
// failed (err), the job succeeded without one and says why.
func (s *Service) succeeded(ctx context.Context, rt *jobRT, reason string, m *pb.Model, imported audit.ModelImported, err error) {
	if err != nil {
		s.log.Error("storing a pool job's model", "job", rt.id(), "err", err)
		s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, clip(fmt.Sprintf("%s; the model could not be stored: %v", reason, err), 1024))
		return
	}
	rt.rec.OutputVersion = m.GetRef().GetVersion()
	rt.rec.State, rt.rec.StateReason = pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, reason
	rt.rec.EndTime = nowProto(s.clk)
	if err := s.audit(ctx, imported, s.poolJobEvent(rt, rt.rec.OutputVersion)); err != nil {
		rt.rec.StateReason = clip(reason+"; the audit log did not take the result: "+err.Error(), 1024)
	}
	s.save(rt)
	s.createThenTask(ctx, rt, m)
}

// imported is the model.imported event of a pool job's model m.
func imported(m *pb.Model, name, job string) audit.ModelImported {
	return audit.ModelImported{Model: m.GetRef().GetVersion(), SHA256: m.GetRef().GetSha256(), Name: name,
		SourceJob: job, Size: m.GetRef().GetSizeBytes(), Parameters: m.GetParameterCount()}
}

// finishIsland ends an island whose DiLoCo job took its last outer step;
// the job's own hand-over follows once every island has ended.
func (s *Service) finishIsland(rt *jobRT) {
	rt.final, rt.handoffDue = false, timeZero
	rt.rec.DataSha256 = dataDigest(rt.leases)
	s.transition(rt, pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED, fmt.Sprintf("completed: its DiLoCo job %s took its last outer step", rt.rec.GetParent()))
	if p := s.parentOf(rt); p != nil {
		s.advanceDiLoCo(p)
	}
}

// createThenTask creates the task a succeeded job was submitted with, on
// its model m.
func (s *Service) createThenTask(ctx context.Context, rt *jobRT, m *pb.Model) {
	if rt.then == nil {
		return
	}
	t := proto.CloneOf(rt.then)
	t.Model = &pb.ModelRef{Version: m.GetRef().GetVersion(), Sha256: m.GetRef().GetSha256()}
	created, err := s.d.CreateTask(ctx, t)
	if err != nil {
		rt.rec.StateReason = clip(fmt.Sprintf("%s; then_task not created: %v", rt.rec.StateReason, err), 1024)
	} else {
		rt.rec.ThenTaskId = created.GetId()
	}
	s.save(rt)
}

func (s *Service) storeModel(ctx context.Context, rt *jobRT) (*pb.Model, audit.ModelImported, error) {
	total := rt.spec.TotalSteps
	id := rt.ckpts[0][total]
	if id == "" {
		return nil, audit.ModelImported{}, fmt.Errorf("rank 0 has no checkpoint at step %d", total)
	}
	d, err := checkpoint.ParseDigest(id)
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	st, err := s.ckpt.get(rt.id(), 0)
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	ck, err := checkpoint.Load(st.dir, d)
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	params, err := finalParams(ck)
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	out := &model.Model{Tensors: params.Tensors, Lineage: model.Lineage{Job: rt.id(), Source: "pool"}}
	if err := out.Validate(); err != nil {
		return nil, audit.ModelImported{}, err
	}
	lin := &pb.PoolLineage{JobId: rt.id(), SpecDigest: rt.rec.SpecDigest, DataSha256: rt.rec.DataSha256,
		Checkpoint: id, Usage: proto.CloneOf(rt.rec.Usage), Steps: total}
	m, err := s.d.StoreModel(ctx, rt.spec.OutputModel, out, lin)
	if err != nil {
		return nil, audit.ModelImported{}, err
	}
	return m, imported(m, rt.spec.OutputModel, rt.id()), nil
}

// finalParams are the trained parameters in a final checkpoint: the
// built-in trainer's tensors, or a command job's model.safetensors file,
// which the model reader converts to float32 (F16, BF16 and F64 too).
func finalParams(ck *checkpoint.Checkpoint) (*model.Model, error) {
	if ck.Params != nil {
		return ck.Params, nil
	}
	for _, f := range ck.Files {
		if f.Name == modelFile {
			m, err := model.ReadSafetensors(bytes.NewReader(f.Data))
			if err != nil {
				return nil, fmt.Errorf("final checkpoint %s: %s: %w", ck.ID, modelFile, err)
			}
			return m, nil
		}
	}
	return nil, fmt.Errorf("final checkpoint %s holds neither parameters nor %s", ck.ID, modelFile)
}

// modelFile is the checkpoint contract's parameter file (docs/POOL.md).
const modelFile = "model.safetensors"
