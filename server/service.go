package server

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/ident"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/blobs"
	"github.com/fleetlearn/fleetlearn/server/internal/coord"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// service implements the API's backend on the server's parts.
type service struct {
	s     *Server
	blobs *blobs.Store
}

var _ backend.Backend = (*service)(nil)

const (
	defaultPage = 100
	maxPage     = 1000
)

func pageSize(p backend.Page) int {
	switch {
	case p.Size <= 0:
		return defaultPage
	case p.Size > maxPage:
		return maxPage
	}
	return p.Size
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), backend.ErrInvalid)
}

// checkName refuses what is not a name (ident.Name): names end up in
// listings, logs and the audit log.
func checkName(kind, name string) error {
	if err := ident.Name(name); err != nil {
		return invalid("%s name %v", kind, err)
	}
	return nil
}

// serviceActor is who the API's domain events name; the operator behind
// each call is recorded by the API's own OperatorAction event.
var serviceActor = audit.Service("api")

// recorded records an event for a change already made; a failure fails the
// call, which the client sees as an internal error: an action the audit log
// does not show must not look done.
func (v *service) recorded(ctx context.Context, p audit.Payload) error {
	if err := v.s.record(ctx, serviceActor, p); err != nil {
		return fmt.Errorf("the change was made but could not be recorded in the audit log: %w", err)
	}
	return nil
}

// taskCreatedEvent describes a new task's design choices.
func taskCreatedEvent(t *pb.Task) (audit.TaskCreated, error) {
	cfg, err := proto.MarshalOptions{Deterministic: true}.Marshal(t)
	if err != nil {
		return audit.TaskCreated{}, err
	}
	settings := map[string]string{
		"over_selection":    strconv.FormatFloat(t.GetOverSelection(), 'g', -1, 64),
		"selection_timeout": t.GetSelectionTimeout().AsDuration().String(),
		"report_timeout":    t.GetReportTimeout().AsDuration().String(),
		"eval_every":        strconv.FormatUint(uint64(t.GetEvalEvery()), 10),
	}
	if h := t.GetHyperparameters(); len(h) > 0 {
		settings["hyperparameters"] = string(h)
	}
	if a := t.GetAsync(); a != nil {
		settings["mode"] = "async"
		settings["async_concurrency"] = strconv.FormatUint(uint64(a.GetConcurrency()), 10)
		settings["async_buffer"] = strconv.FormatUint(uint64(a.GetBuffer()), 10)
		settings["async_max_staleness"] = strconv.FormatUint(uint64(a.GetMaxStaleness()), 10)
		settings["async_staleness_weight"] = "1/sqrt(1+s)"
	}
	if n := t.GetAggregation().GetMaxUpdateNorm(); n > 0 {
		settings["max_update_norm"] = strconv.FormatFloat(n, 'g', -1, 64)
	}
	if t.GetAggregation().GetUnboundedUpdates() {
		// The operator's explicit opt-out, for auditors to see.
		settings["unbounded_updates"] = "true"
	}
	if n := t.GetAggregation().GetMaxExamplesPerReport(); n > 0 {
		settings["max_examples_per_report"] = strconv.FormatUint(n, 10)
	}
	if d := t.GetServerEvalDataset(); d != "" {
		settings["server_eval_dataset"] = d
	}
	if e := t.GetUpdateEncoding(); e != pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
		settings["update_encoding"] = coord.EncodingName(e)
	}
	if d := t.GetDp(); d.GetMechanism() > pb.DPMechanism_DP_MECHANISM_NONE {
		f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
		settings["dp_mechanism"] = d.GetMechanism().String()
		settings["dp_clip_norm"], settings["dp_noise_multiplier"] = f(d.GetClipNorm()), f(d.GetNoiseMultiplier())
		settings["dp_target_epsilon"], settings["dp_delta"] = f(d.GetTargetEpsilon()), f(d.GetDelta())
		settings["dp_sampling_rate"] = f(d.GetSamplingRate())
		settings["dp_accountant"] = d.GetAccountant().String()
		settings["dp_max_rounds_per_device"] = strconv.FormatUint(uint64(d.GetMaxRoundsPerDevice()), 10)
		if b := d.GetMinSeparation(); b > 0 {
			settings["dp_min_separation"] = strconv.FormatUint(uint64(b), 10)
		}
	}
	if sa := t.GetSecagg(); sa != nil {
		settings["secagg_k"], settings["secagg_threshold"] = strconv.FormatUint(uint64(sa.GetK()), 10), strconv.FormatUint(uint64(sa.GetThreshold()), 10)
		settings["secagg_bits"] = strconv.FormatUint(uint64(sa.GetBits()), 10)
		settings["secagg_clip_range"] = strconv.FormatFloat(sa.GetClipRange(), 'g', -1, 64)
	}
	return audit.TaskCreated{Task: t.GetId(), Name: t.GetName(), BaseModel: t.GetModel().GetVersion(),
		Module: t.GetModule().GetSha256(), Rounds: uint64(t.GetRoundsTotal()), CohortTarget: uint64(t.GetCohortTarget()),
		ReportGoal: uint64(t.GetReportGoal()), AggregationRule: t.GetAggregation().GetRule().String(),
		SecAgg: t.GetSecagg() != nil, DP: t.GetDp().GetMechanism() > pb.DPMechanism_DP_MECHANISM_NONE,
		ConfigSHA256: wire.SHA256(cfg), Settings: settings}, nil
}

func (v *service) newTaskID() string {
	v.s.idMu.Lock()
	defer v.s.idMu.Unlock()
	var b [6]byte
	for i := range b {
		b[i] = byte(v.s.ids.Uint32())
	}
	return "t-" + hex.EncodeToString(b[:])
}

// checkTask validates a task as created through the API.
func (v *service) checkTask(ctx context.Context, t *pb.Task) error {
	if err := checkName("task", t.GetName()); err != nil {
		return err
	}
	// Before everything that reads the cohort: an async task's is its buffer.
	if err := coord.CheckAsync(t); err != nil {
		return invalid("%v", err)
	}
	if t.GetCohortTarget() < 1 || t.GetCohortTarget() > 100000 {
		return invalid("cohort_target %d not in [1,100000]", t.GetCohortTarget())
	}
	if t.GetReportGoal() < 1 || t.GetReportGoal() > t.GetCohortTarget() {
		return invalid("report_goal %d must be in [1, cohort_target %d]", t.GetReportGoal(), t.GetCohortTarget())
	}
	if o := t.GetOverSelection(); o < 0 || o > 9 || o != o {
		return invalid("over_selection %v not in [0,9] (an extra fraction: 0.3 selects 30%% more)", o)
	}
	if t.GetRoundsTotal() < 1 {
		return invalid("rounds_total must be at least 1")
	}
	if h := t.GetHyperparameters(); len(h) > 0 && !json.Valid(h) {
		return invalid("hyperparameters are not valid JSON")
	}
	if t.GetSelectionTimeout().AsDuration() < 0 || t.GetReportTimeout().AsDuration() < 0 {
		return invalid("timeouts must not be negative")
	}
	// Before the secure aggregation check: int8 sets the ring's bits.
	if err := coord.CheckUpdateEncoding(t); err != nil {
		return invalid("%v", err)
	}
	// Refuse what this server cannot honour rather than run unprotected rounds.
	if err := privacyconf.CheckSecAgg(t, privacyconf.APINames); err != nil {
		return invalid("%v", err)
	}
	if t.GetAggregation() == nil {
		t.Aggregation = &pb.AggregationConfig{}
	}
	if t.Aggregation.Rule == pb.AggregationRule_AGGREGATION_RULE_UNSPECIFIED {
		t.Aggregation.Rule = pb.AggregationRule_AGGREGATION_RULE_FEDAVG
	}
	mrow, err := v.s.store.Model(ctx, t.GetModel().GetVersion())
	if err != nil {
		return invalid("model %q: %v", t.GetModel().GetVersion(), err)
	}
	// A task that names the digest it expects trains on that model or on
	// none: a version reused or mistyped must not start rounds on other
	// weights than the ones the operator checked.
	if sha := t.GetModel().GetSha256(); sha != "" && sha != mrow.Version {
		return invalid("base model %s has digest %s, not the %s the task expects: check the version (fleetlearn model lineage %s)",
			mrow.Version, mrow.Version, sha, mrow.Version)
	}
	mod, err := v.s.store.Module(ctx, t.GetModule().GetSha256())
	if err != nil {
		return invalid("module %q: %v", t.GetModule().GetSha256(), err)
	}
	base, err := v.model(ctx, t.GetModel().GetVersion())
	if err != nil {
		return err
	}
	// Everything below sizes the update, which holds the trained tensors only.
	idx, sub, err := coord.Trainable(t, base)
	if err != nil {
		return invalid("%v", err)
	}
	if abi := mod.Ref.GetAbiVersion(); idx != nil && abi < 2 {
		return invalid("trainable %v needs a module of ABI 2 or later (such as fleetlearn module example lm); module %s declares ABI %d, which cannot be told what to freeze",
			t.GetTrainable(), t.GetModule().GetSha256(), max(abi, 1))
	}
	params := sub.Layout().Size()
	rule, err := coord.NewRule(t.Aggregation, max(params, 1))
	if err != nil {
		return invalid("aggregation: %v", err)
	}
	// A rule that keeps every update holds one per seat of a round.
	if err := aggregator.CheckSamples(rule.Kind(), params, coord.Wanted(t)); err != nil {
		return invalid("aggregation: %v", err)
	}
	// The bounds on one device's influence are fixed now, with the model's
	// defaults, and stored with the task (and its audit event).
	rb, err := coord.ResolveRobustness(t, sub)
	if err != nil {
		return invalid("aggregation: %v", err)
	}
	rb.Apply(t)
	if err := coord.CheckDP(t, params); err != nil {
		return invalid("%v", err)
	}
	return nil
}

func (v *service) CreateTask(ctx context.Context, in *pb.Task) (*pb.Task, []string, error) {
	t := proto.Clone(in).(*pb.Task)
	if err := v.checkTask(ctx, t); err != nil {
		return nil, nil, err
	}
	mod, _ := v.s.store.Module(ctx, t.GetModule().GetSha256())
	t.Module = mod.Ref
	t.Id = v.newTaskID()
	t.State = pb.TaskState_TASK_STATE_RUNNING
	t.CurrentRound, t.CurrentModel, t.StateReason, t.CreateTime, t.UpdateTime, t.BaseMetrics = 0, nil, "", nil, nil, nil
	ev, err := taskCreatedEvent(t)
	if err != nil {
		return nil, nil, err
	}
	// A fleet too small for the cohort is worth a warning, not a refusal:
	// devices may enroll before the first round ends.
	var warnings []string
	if fleet, err := v.s.coord.Fleet(ctx); err != nil {
		v.s.o.log.Warn("counting the fleet for a new task", "err", err)
	} else {
		warnings = coord.CohortWarnings(t, fleet)
	}
	if err := v.s.store.InsertTask(ctx, t, v.s.o.now()); err != nil {
		return nil, nil, err
	}
	// Recorded before the first round can open, so the log shows the task
	// before any of its rounds.
	recErr := v.recorded(ctx, ev)
	v.s.coord.StartTask(t.Id)
	if recErr != nil {
		return nil, nil, recErr
	}
	created, err := v.GetTask(ctx, t.Id)
	if err != nil {
		return nil, nil, err
	}
	return created, warnings, nil
}

func (v *service) GetTask(ctx context.Context, id string) (*pb.Task, error) {
	r, err := v.s.store.Task(ctx, id)
	if err != nil {
		return nil, err
	}
	return r.Proto(), nil
}

func (v *service) ListTasks(ctx context.Context, state pb.TaskState, p backend.Page) ([]*pb.Task, string, error) {
	n := pageSize(p)
	rows, err := v.s.store.Tasks(ctx, state, p.Token, n+1)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(rows) > n {
		rows = rows[:n]
		next = rows[n-1].Spec.Id
	}
	out := make([]*pb.Task, len(rows))
	for i, r := range rows {
		out[i] = r.Proto()
	}
	return out, next, nil
}

func (v *service) StopTask(ctx context.Context, id, reason string) (*pb.Task, error) {
	r, err := v.s.store.Task(ctx, id)
	if err != nil {
		return nil, err
	}
	if r.State != pb.TaskState_TASK_STATE_RUNNING && r.State != pb.TaskState_TASK_STATE_PAUSED {
		return nil, fmt.Errorf("task %s is %v: %w", id, r.State, backend.ErrPrecondition)
	}
	if reason == "" {
		reason = "stopped by operator"
	}
	if err := v.s.store.SetTaskState(ctx, id, pb.TaskState_TASK_STATE_STOPPED, reason, v.s.o.now()); err != nil {
		return nil, err
	}
	if err := v.s.coord.StopTask(ctx, id, "task stopped: "+reason); err != nil {
		return nil, err
	}
	if err := v.recorded(ctx, audit.TaskStopped{Task: id, State: audit.TaskStoppedBy, Reason: reason,
		Rounds: uint64(r.TrainRounds)}); err != nil {
		return nil, err
	}
	return v.GetTask(ctx, id)
}

// ResumeTask marks a paused task running, records the change and starts
// its runner.
func (v *service) ResumeTask(ctx context.Context, id string) (*pb.Task, error) {
	r, err := v.s.store.Task(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := v.s.store.ResumeTask(ctx, id, v.s.o.now()); err != nil {
		return nil, err
	}
	// Recorded before the runner starts, so the log shows the resumption
	// before the rounds it opens.
	recErr := v.recorded(ctx, audit.TaskChanged{Task: id, Changes: []audit.Change{
		{Field: "state", Old: store.StateName(pb.TaskState_TASK_STATE_PAUSED), New: store.StateName(pb.TaskState_TASK_STATE_RUNNING)},
		{Field: "state_reason", Old: r.Reason, New: ""}}})
	if err := v.s.coord.ResumeTask(ctx, id); err != nil {
		return nil, err
	}
	if recErr != nil {
		return nil, recErr
	}
	return v.GetTask(ctx, id)
}

func (v *service) WatchTask(ctx context.Context, id string) (<-chan *pb.WatchTaskResponse, error) {
	task, err := v.s.store.Task(ctx, id)
	if err != nil {
		return nil, err
	}
	if task.State == pb.TaskState_TASK_STATE_PAUSED {
		// A watch of a paused task says why it is paused, and ends.
		ch := make(chan *pb.WatchTaskResponse, 1)
		ch <- &pb.WatchTaskResponse{Task: task.Proto()}
		close(ch)
		return ch, nil
	}
	ch, cancel := v.s.coord.Watch(id)
	if !v.s.coord.Running(id) {
		cancel() // finished: the stream ends at once
	}
	go func() {
		<-ctx.Done()
		cancel()
	}()
	return ch, nil
}

func (v *service) ListRounds(ctx context.Context, taskID string, p backend.Page) ([]*pb.RoundSummary, string, error) {
	if _, err := v.s.store.Task(ctx, taskID); err != nil {
		return nil, "", err
	}
	var after uint64
	if p.Token != "" {
		n, err := strconv.ParseUint(p.Token, 10, 64)
		if err != nil {
			return nil, "", invalid("page token %q", p.Token)
		}
		after = n
	}
	n := pageSize(p)
	rows, err := v.s.store.Rounds(ctx, taskID, after, n+1)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(rows) > n {
		rows = rows[:n]
		next = strconv.FormatUint(rows[n-1].Round, 10)
	}
	out := make([]*pb.RoundSummary, len(rows))
	for i, r := range rows {
		out[i] = r.Proto()
	}
	return out, next, nil
}

func (v *service) ExportModel(ctx context.Context, version string) (*pb.Model, []byte, error) {
	row, err := v.s.store.Model(ctx, version)
	if err != nil {
		return nil, nil, err
	}
	b, err := v.blobs.Get(ctx, version)
	if err != nil {
		return nil, nil, err
	}
	return row.Proto(), b, nil
}

func (v *service) GetModel(ctx context.Context, version string) (*pb.Model, error) {
	row, err := v.s.store.Model(ctx, version)
	if err != nil {
		return nil, err
	}
	return row.Proto(), nil
}

func (v *service) ListModels(ctx context.Context, name string, p backend.Page) ([]*pb.Model, string, error) {
	before, err := rowCursor(p.Token)
	if err != nil {
		return nil, "", err
	}
	n := pageSize(p)
	rows, last, err := v.s.store.Models(ctx, name, before, n)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(rows) == n {
		next = strconv.FormatInt(last, 10)
	}
	out := make([]*pb.Model, len(rows))
	for i, r := range rows {
		out[i] = r.Proto()
	}
	return out, next, nil
}

func (v *service) RegisterModule(ctx context.Context, h *pb.RegisterModuleHeader, code []byte) (*pb.Module, error) {
	if err := checkName("module", h.GetName()); err != nil {
		return nil, err
	}
	sha := wire.SHA256(code)
	if h.GetSha256() != "" && h.GetSha256() != sha {
		return nil, invalid("module bytes hash to %s, header says %s", sha, h.GetSha256())
	}
	if abi := h.GetAbiVersion(); abi != 0 && (abi < wasm.MinABIVersion || abi > wasm.ABIVersion) {
		return nil, invalid("module declares ABI v%d, this server supports v%d to v%d", abi, wasm.MinABIVersion, wasm.ABIVersion)
	}
	signed, err := v.checkModuleSignature(h, sha)
	if err != nil {
		return nil, err
	}
	mod, err := v.s.sandbox.Load(ctx, code, sha)
	if err != nil {
		return nil, invalid("%v", err)
	}
	abi := uint32(mod.ABIVersion())
	mod.Close(ctx)
	if h.GetAbiVersion() != 0 && h.GetAbiVersion() != abi {
		return nil, invalid("the header says module ABI v%d, the module declares v%d (fleetlearn_abi_version)", h.GetAbiVersion(), abi)
	}
	if _, err := v.blobs.Put(ctx, code); err != nil {
		return nil, err
	}
	m := &pb.Module{Ref: &pb.ModuleRef{Sha256: sha, AbiVersion: abi, SizeBytes: uint64(len(code)), Name: h.GetName()},
		Signature: h.GetSignature(), KeyId: signed.KeyID}
	if err := v.s.store.InsertModule(ctx, m, v.s.o.now()); err != nil {
		return nil, err
	}
	if err := v.recorded(ctx, audit.ModuleRegistered{Module: sha, Name: h.GetName(), ABI: uint64(abi),
		Size: uint64(len(code)), Signer: signed.KeyID}); err != nil {
		return nil, err
	}
	return v.s.store.Module(ctx, sha)
}

func (v *service) GetModule(ctx context.Context, sha string) (*pb.Module, error) {
	return v.s.store.Module(ctx, sha)
}

func (v *service) ListModules(ctx context.Context, name string, p backend.Page) ([]*pb.Module, string, error) {
	before, err := rowCursor(p.Token)
	if err != nil {
		return nil, "", err
	}
	n := pageSize(p)
	mods, last, err := v.s.store.Modules(ctx, name, before, n)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(mods) == n {
		next = strconv.FormatInt(last, 10)
	}
	return mods, next, nil
}

// rowCursor parses a page token holding a row id.
func rowCursor(token string) (int64, error) {
	if token == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(token, 10, 64)
	if err != nil || n <= 0 {
		return 0, invalid("page token %q", token)
	}
	return n, nil
}

// model reads and decodes a stored model version.
func (v *service) model(ctx context.Context, version string) (*model.Model, error) {
	b, err := v.blobs.Get(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", version, err)
	}
	m, err := model.DecodeSafetensors(b)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", version, err)
	}
	return m, nil
}
