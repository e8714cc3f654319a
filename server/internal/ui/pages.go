package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Bounds on what one page asks the API for, so a large fleet or a long
// task costs a bounded number of calls per view.
const (
	pageSize     = 500
	maxDevices   = 20 * pageSize
	maxTasks     = 200
	maxRounds    = 5000
	maxJobs      = 1000
	maxEntries   = 100 // audit entries on one page of the browser
	maxTimeline  = 500 // audit events on a round's timeline
	maxReasonLen = 200 // of a reason drawn in a table
)

func (h *Handler) tasks() apiv1.TaskServiceClient     { return apiv1.NewTaskServiceClient(h.cfg.API) }
func (h *Handler) devices() apiv1.DeviceServiceClient { return apiv1.NewDeviceServiceClient(h.cfg.API) }
func (h *Handler) audit() apiv1.AuditServiceClient    { return apiv1.NewAuditServiceClient(h.cfg.API) }
func (h *Handler) pool() apiv1.PoolServiceClient      { return apiv1.NewPoolServiceClient(h.cfg.API) }

// enum renders a protobuf enum name without its type prefix:
// TASK_STATE_RUNNING is "running".
func enum(s fmt.Stringer, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), prefix)), "_", " ")
}

// fleet is the device registry seen through ListDevices.
type fleet struct {
	Devices                   []*pb.Device
	Enrolled, Online, Revoked int
	Truncated                 bool
}

// collect pages through a list call until the last page or limit items:
// each view costs a bounded number of API calls however large the state.
func collect[T any](limit int, page func(token string) ([]T, string, error)) (items []T, truncated bool, err error) {
	token := ""
	for {
		got, next, err := page(token)
		if err != nil {
			return nil, false, err
		}
		items = append(items, got...)
		if next == "" {
			return items, false, nil
		}
		if len(items) >= limit {
			return items, true, nil
		}
		token = next
	}
}

func (h *Handler) fleet(ctx context.Context) (*fleet, error) {
	devs, truncated, err := collect(maxDevices, func(tok string) ([]*pb.Device, string, error) {
		resp, err := h.devices().ListDevices(ctx, &pb.ListDevicesRequest{PageSize: pageSize, IncludeRevoked: true, PageToken: tok})
		return resp.GetDevices(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return nil, err
	}
	f := &fleet{Devices: devs, Truncated: truncated}
	for _, d := range devs {
		switch {
		case d.GetRevokeTime() != nil:
			f.Revoked++
		default:
			f.Enrolled++
			if d.GetOnline() {
				f.Online++
			}
		}
	}
	return f, nil
}

func (h *Handler) listTasks(ctx context.Context) ([]*pb.Task, error) {
	ts, _, err := collect(maxTasks, func(tok string) ([]*pb.Task, string, error) {
		resp, err := h.tasks().ListTasks(ctx, &pb.ListTasksRequest{PageSize: 100, PageToken: tok})
		return resp.GetTasks(), resp.GetNextPageToken(), err
	})
	return ts, err
}

func (h *Handler) rounds(ctx context.Context, task string) ([]*pb.RoundSummary, error) {
	rs, _, err := collect(maxRounds, func(tok string) ([]*pb.RoundSummary, string, error) {
		resp, err := h.tasks().ListRounds(ctx, &pb.ListRoundsRequest{TaskId: task, PageSize: pageSize, PageToken: tok})
		return resp.GetRounds(), resp.GetNextPageToken(), err
	})
	return rs, err
}

// poolView is the compute pool's queue and workers.
type poolView struct {
	Jobs    []*pb.PoolJob
	Workers []*pb.PoolWorker
	ByState map[string]int
	Tenants []tenantUsage
}

type tenantUsage struct {
	Tenant                 string
	Jobs                   int
	CPUSeconds, GPUSeconds float64
	EnergyJoules, GCO2e    float64
}

func (h *Handler) jobs(ctx context.Context) ([]*pb.PoolJob, error) {
	jobs, _, err := collect(maxJobs, func(tok string) ([]*pb.PoolJob, string, error) {
		resp, err := h.pool().ListJobs(ctx, &pb.ListJobsRequest{PageSize: 200, PageToken: tok})
		return resp.GetJobs(), resp.GetNextPageToken(), err
	})
	return jobs, err
}

func (h *Handler) poolView(ctx context.Context) (*poolView, error) {
	jobs, err := h.jobs(ctx)
	if err != nil {
		return nil, err
	}
	p := &poolView{ByState: map[string]int{}, Jobs: jobs}
	ws, err := h.pool().ListWorkers(ctx, &pb.ListWorkersRequest{})
	if err != nil {
		return nil, err
	}
	p.Workers = ws.GetWorkers()
	byTenant := map[string]*tenantUsage{}
	for _, j := range p.Jobs {
		p.ByState[enum(j.GetState(), "POOL_JOB_STATE_")]++
		t := j.GetSpec().GetTenant()
		u := byTenant[t]
		if u == nil {
			u = &tenantUsage{Tenant: t}
			byTenant[t] = u
		}
		u.Jobs++
		u.CPUSeconds += j.GetUsage().GetCpuSeconds()
		u.GPUSeconds += j.GetUsage().GetGpuSeconds()
		u.EnergyJoules += j.GetUsage().GetEnergyJoules()
		u.GCO2e += j.GetGco2E()
	}
	for _, u := range byTenant {
		p.Tenants = append(p.Tenants, *u)
	}
	sort.Slice(p.Tenants, func(i, j int) bool { return p.Tenants[i].Tenant < p.Tenants[j].Tenant })
	return p, nil
}

// poolAbsent reports a server that runs no compute pool.
func poolAbsent(err error) bool {
	c := status.Code(err)
	return c == codes.Unimplemented || c == codes.Unavailable
}

type overviewData struct {
	Fleet       *fleet
	FleetDenied *denied
	Tasks       []taskRow
	TasksDenied *denied
	Pool        *poolView
	PoolDenied  *denied
	NoPool      bool
	Checkpoint  *checkpointView
	AuditDenied *denied
}

type taskRow struct {
	*pb.Task
	State string
	// Counted says whether the rounds below were read: a viewer may list
	// tasks and not their rounds.
	Counted bool
	roundCounts
}

// roundCounts sums a task's rounds by outcome. The task's current_round is
// no measure of progress: it numbers abandoned tries and evaluation rounds
// too, so a paused task may be at round 3 of 2 with nothing trained.
type roundCounts struct {
	// Trained counts committed training rounds, the progress towards
	// rounds_total.
	Trained int
	// Evaluated counts committed evaluation rounds.
	Evaluated int
	// Abandoned counts rounds that ended without a result.
	Abandoned int
}

func countRounds(rs []*pb.RoundSummary) roundCounts {
	var c roundCounts
	for _, r := range rs {
		switch {
		case r.GetState() == pb.RoundState_ROUND_STATE_ABANDONED:
			c.Abandoned++
		case r.GetState() != pb.RoundState_ROUND_STATE_COMMITTED:
		case r.GetKind() == pb.RoundKind_ROUND_KIND_TRAIN:
			c.Trained++
		default:
			c.Evaluated++
		}
	}
	return c
}

// roundFetches bounds the ListRounds calls an overview makes at once.
const roundFetches = 8

// taskRows reads each task's rounds, a few tasks at a time, to show its
// progress as committed training rounds.
func (h *Handler) taskRows(ctx context.Context, v *viewer, ts []*pb.Task) ([]taskRow, error) {
	rows := make([]taskRow, len(ts))
	errs := make([]error, len(ts))
	sem := make(chan struct{}, roundFetches)
	var wg sync.WaitGroup
	for i, t := range ts {
		rows[i] = taskRow{Task: t, State: enum(t.GetState(), "TASK_STATE_"), Counted: true}
		if t.GetCurrentRound() == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rs, err := h.rounds(ctx, t.GetId())
			if err != nil {
				if _, err = h.section(v, err); err == nil {
					rows[i].Counted = false
				}
				errs[i] = err
				return
			}
			rows[i].roundCounts = countRounds(rs)
		}()
	}
	wg.Wait()
	return rows, errors.Join(errs...)
}

func (h *Handler) overview(r *http.Request, v *viewer) (string, frame, error) {
	ctx := v.ctx(r)
	d := overviewData{}
	var err error
	if d.Fleet, err = h.fleet(ctx); err != nil {
		if d.FleetDenied, err = h.section(v, err); err != nil {
			return "", frame{}, err
		}
	}
	ts, err := h.listTasks(ctx)
	if err != nil {
		if d.TasksDenied, err = h.section(v, err); err != nil {
			return "", frame{}, err
		}
	}
	if d.Tasks, err = h.taskRows(ctx, v, ts); err != nil {
		return "", frame{}, err
	}
	if d.Pool, err = h.poolView(ctx); err != nil {
		d.Pool = nil
		if poolAbsent(err) {
			d.NoPool = true
		} else if d.PoolDenied, err = h.section(v, err); err != nil {
			return "", frame{}, err
		}
	}
	k, err := h.keys(ctx)
	if err == nil {
		d.Checkpoint, err = h.checkpoint(ctx, k)
	}
	if err != nil {
		if d.AuditDenied, err = h.section(v, err); err != nil {
			return "", frame{}, err
		}
	}
	return "overview", frame{Title: "Overview", Nav: "overview", Live: "/events", Data: d}, nil
}

type devicesData struct {
	Fleet     *fleet
	CanRevoke bool
}

func (h *Handler) devicesPage(r *http.Request, v *viewer) (string, frame, error) {
	f, err := h.fleet(v.ctx(r))
	if err != nil {
		return "", frame{}, err
	}
	return "devices", frame{Title: "Fleet", Nav: "devices", Live: "/events",
		Data: devicesData{Fleet: f, CanRevoke: h.may(v, apiv1.DeviceService_RevokeDevice_FullMethodName)}}, nil
}

func (h *Handler) revokeDevice(w http.ResponseWriter, r *http.Request, v *viewer) error {
	reason := clip(strings.TrimSpace(r.PostFormValue("reason")), maxReasonLen)
	if reason == "" {
		reason = "revoked from the dashboard"
	}
	if _, err := h.devices().RevokeDevice(v.ctx(r), &pb.RevokeDeviceRequest{DeviceId: r.PathValue("id"), Reason: reason}); err != nil {
		return err
	}
	redirectBack(w, r, "/devices")
	return nil
}

// taskData is a task's page: its settings, rounds and what they spent.
type taskData struct {
	Task   *pb.Task
	State  string
	Rounds []roundRow
	roundCounts
	Charts []chartRef
	// Epsilon is the accountant's cumulative ε after the last round that
	// spent any; Budget is the task's target ε (0: none).
	Epsilon, Budget float64
	DP              bool
	Refusals        []reasonCount
	Dropped         uint32
	Assigned        uint32
	CanStop         bool
	CanResume       bool
	Running         bool
	// SecAgg and Privacy are the task's secure aggregation and DP
	// settings as its rounds run them; nil without.
	SecAgg  *secAggView
	Privacy *dpView
	// Async is an async task's mode and its last committed buffer; nil
	// for a task in rounds.
	Async *asyncView
}

// asyncView is an async task's settings and what its last committed buffer
// measured: the staleness of its reports and the devices training when it
// stepped.
type asyncView struct {
	*pb.AsyncConfig
	Last                          bool
	Version                       uint64
	StaleMean, StaleMax, Training float64
}

// asyncViewOf reads an async task's view from its rounds, oldest first.
func asyncViewOf(t *pb.Task, rs []*pb.RoundSummary) *asyncView {
	if t.GetAsync() == nil {
		return nil
	}
	v := &asyncView{AsyncConfig: t.GetAsync()}
	for _, r := range rs {
		m := r.GetMetrics().GetValues()
		if mean, ok := m["async_staleness_mean"]; ok && r.GetState() == pb.RoundState_ROUND_STATE_COMMITTED {
			v.Last, v.Version, v.StaleMean, v.StaleMax, v.Training = true, r.GetRound(), mean, m["async_staleness_max"], m["async_training"]
		}
	}
	return v
}

type roundRow struct {
	*pb.RoundSummary
	Kind, State string
	Metrics     []metricValue
}

type metricValue struct {
	Name  string
	Value float64
}

type reasonCount struct {
	Reason string
	Count  int
}

type chartRef struct {
	Metric string
	Points []point
}

func metricList(m *pb.Metrics) []metricValue {
	var out []metricValue
	for k, v := range m.GetValues() {
		out = append(out, metricValue{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// reasonClass folds a refusal's text into its class: the part before the
// first colon, which names the check that failed; the details after it
// name devices and values.
func reasonClass(s string) string {
	if i := strings.IndexByte(s, ':'); i > 0 {
		s = s[:i]
	}
	return clip(strings.TrimSpace(s), maxReasonLen)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

func (h *Handler) task(ctx context.Context, id string) (*taskData, error) {
	t, err := h.tasks().GetTask(ctx, &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		return nil, err
	}
	rs, err := h.rounds(ctx, id)
	if err != nil {
		return nil, err
	}
	d := &taskData{Task: t.GetTask(), State: enum(t.GetTask().GetState(), "TASK_STATE_"),
		DP:     t.GetTask().GetDp() != nil && t.GetTask().GetDp().GetMechanism() != pb.DPMechanism_DP_MECHANISM_UNSPECIFIED,
		Budget: t.GetTask().GetDp().GetTargetEpsilon(), SecAgg: secAggViewOf(t.GetTask()), Privacy: dpViewOf(t.GetTask())}
	reasons := map[string]int{}
	for _, r := range rs {
		d.Rounds = append(d.Rounds, roundRow{RoundSummary: r, Kind: enum(r.GetKind(), "ROUND_KIND_"),
			State: enum(r.GetState(), "ROUND_STATE_"), Metrics: metricList(r.GetMetrics())})
		if r.GetEpsilonSpent() > 0 {
			d.Epsilon = r.GetEpsilonSpent()
		}
		d.Assigned += r.GetAssigned()
		d.Dropped += r.GetDropped()
		for _, f := range r.GetFailures() {
			reasons[reasonClass(f.GetReason())]++
		}
	}
	for k, n := range reasons {
		d.Refusals = append(d.Refusals, reasonCount{k, n})
	}
	sort.Slice(d.Refusals, func(i, j int) bool {
		return d.Refusals[i].Count > d.Refusals[j].Count || d.Refusals[i].Count == d.Refusals[j].Count && d.Refusals[i].Reason < d.Refusals[j].Reason
	})
	d.roundCounts = countRounds(rs)
	d.Async = asyncViewOf(d.Task, rs)
	for _, m := range chartMetrics(rs) {
		d.Charts = append(d.Charts, chartRef{Metric: m, Points: series(rs, m)})
	}
	st := d.Task.GetState()
	d.Running = st == pb.TaskState_TASK_STATE_RUNNING || st == pb.TaskState_TASK_STATE_PENDING
	return d, nil
}

// chartMetrics are the metrics committed rounds report: held-out accuracy
// and loss (the server's evaluation set) first, then the devices' own.
func chartMetrics(rs []*pb.RoundSummary) []string {
	seen := map[string]bool{}
	for _, r := range rs {
		if r.GetState() != pb.RoundState_ROUND_STATE_COMMITTED {
			continue
		}
		for k := range r.GetMetrics().GetValues() {
			seen[k] = true
		}
	}
	var out []string
	for _, k := range []string{"server_accuracy", "accuracy", "train_accuracy", "server_loss", "loss", "train_loss"} {
		if seen[k] {
			out = append(out, k)
			delete(seen, k)
		}
	}
	rest := make([]string, 0, len(seen))
	for k := range seen {
		rest = append(rest, k)
	}
	slices.Sort(rest)
	if len(rest) > 6 {
		rest = rest[:6] // a module may report many; the table has them all
	}
	return append(out, rest...)
}

func (h *Handler) taskPage(r *http.Request, v *viewer) (string, frame, error) {
	id := r.PathValue("id")
	d, err := h.task(v.ctx(r), id)
	if err != nil {
		return "", frame{}, err
	}
	st := d.Task.GetState()
	d.CanStop = d.Running && h.may(v, apiv1.TaskService_StopTask_FullMethodName)
	d.CanResume = st == pb.TaskState_TASK_STATE_STOPPED && h.may(v, apiv1.TaskService_ResumeTask_FullMethodName)
	live := ""
	if d.Running {
		live = "/tasks/" + id + "/events"
	}
	return "task", frame{Title: "Task " + d.Task.GetName(), Nav: "overview", Live: live, Data: d}, nil
}

func (h *Handler) stopTask(w http.ResponseWriter, r *http.Request, v *viewer) error {
	reason := clip(strings.TrimSpace(r.PostFormValue("reason")), maxReasonLen)
	if reason == "" {
		reason = "stopped from the dashboard"
	}
	id := r.PathValue("id")
	if _, err := h.tasks().StopTask(v.ctx(r), &pb.StopTaskRequest{TaskId: id, Reason: reason}); err != nil {
		return err
	}
	redirectBack(w, r, "/tasks/"+id)
	return nil
}

func (h *Handler) resumeTask(w http.ResponseWriter, r *http.Request, v *viewer) error {
	id := r.PathValue("id")
	if _, err := h.tasks().ResumeTask(v.ctx(r), &pb.ResumeTaskRequest{TaskId: id}); err != nil {
		return err
	}
	redirectBack(w, r, "/tasks/"+id)
	return nil
}

type roundData struct {
	Task     *pb.Task
	Round    roundRow
	Events   []eventView
	Denied   *denied
	Failures []*pb.DeviceFailure
}

func (h *Handler) roundPage(r *http.Request, v *viewer) (string, frame, error) {
	ctx := v.ctx(r)
	id := r.PathValue("id")
	n, err := strconv.ParseUint(r.PathValue("round"), 10, 64)
	if err != nil || n == 0 {
		return "", frame{}, errNotFound
	}
	t, err := h.tasks().GetTask(ctx, &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		return "", frame{}, err
	}
	rs, err := h.rounds(ctx, id)
	if err != nil {
		return "", frame{}, err
	}
	var d roundData
	d.Task = t.GetTask()
	found := false
	for _, s := range rs {
		if s.GetRound() == n {
			d.Round = roundRow{RoundSummary: s, Kind: enum(s.GetKind(), "ROUND_KIND_"),
				State: enum(s.GetState(), "ROUND_STATE_"), Metrics: metricList(s.GetMetrics())}
			d.Failures = s.GetFailures()
			found = true
		}
	}
	if !found {
		return "", frame{}, errNotFound
	}
	k, err := h.keys(ctx)
	var evs []eventView
	if err == nil {
		evs, _, err = h.entries(ctx, k, &pb.AuditFilter{TaskId: id, Round: n}, "", maxTimeline)
	}
	if err != nil {
		if d.Denied, err = h.section(v, err); err != nil {
			return "", frame{}, err
		}
	}
	d.Events = evs
	live := ""
	if d.Round.GetState() == pb.RoundState_ROUND_STATE_OPEN {
		live = "/tasks/" + id + "/events"
	}
	return "round", frame{Title: "Round " + strconv.FormatUint(n, 10) + " of " + d.Task.GetName(), Nav: "overview", Live: live, Data: d}, nil
}

type poolData struct {
	*poolView
	NoPool bool
}

func (h *Handler) poolPage(r *http.Request, v *viewer) (string, frame, error) {
	p, err := h.poolView(v.ctx(r))
	if err != nil {
		if poolAbsent(err) {
			return "pool", frame{Title: "Compute pool", Nav: "pool", Data: poolData{NoPool: true}}, nil
		}
		return "", frame{}, err
	}
	return "pool", frame{Title: "Compute pool", Nav: "pool", Live: "/events", Data: poolData{poolView: p}}, nil
}

type jobData struct {
	Job       *pb.PoolJob
	State     string
	Islands   []*pb.PoolJob
	Model     *pb.Model
	CanCancel bool
	Done      bool
}

func (h *Handler) jobPage(r *http.Request, v *viewer) (string, frame, error) {
	ctx := v.ctx(r)
	id := r.PathValue("id")
	j, err := h.pool().GetJob(ctx, &pb.GetJobRequest{JobId: id})
	if err != nil {
		return "", frame{}, err
	}
	d := jobData{Job: j.GetJob(), State: enum(j.GetJob().GetState(), "POOL_JOB_STATE_")}
	st := d.Job.GetState()
	d.Done = st != pb.PoolJobState_POOL_JOB_STATE_QUEUED && st != pb.PoolJobState_POOL_JOB_STATE_RUNNING
	d.CanCancel = !d.Done && h.may(v, apiv1.PoolService_CancelJob_FullMethodName)
	if d.Job.GetSpec().GetDiloco() != nil {
		if jobs, err := h.jobs(ctx); err == nil {
			for _, o := range jobs {
				if o.GetParent() == id {
					d.Islands = append(d.Islands, o)
				}
			}
		}
	}
	if ver := d.Job.GetOutputVersion(); ver != "" {
		m, err := apiv1.NewModelServiceClient(h.cfg.API).GetModel(ctx, &pb.GetModelRequest{Version: ver})
		if err == nil {
			d.Model = m.GetModel()
		} else if _, err := h.section(v, err); err != nil && status.Code(err) != codes.NotFound {
			return "", frame{}, err
		}
	}
	live := ""
	if !d.Done {
		live = "/events"
	}
	return "job", frame{Title: "Pool job " + id, Nav: "pool", Live: live, Data: d}, nil
}

func (h *Handler) cancelJob(w http.ResponseWriter, r *http.Request, v *viewer) error {
	id := r.PathValue("id")
	reason := clip(strings.TrimSpace(r.PostFormValue("reason")), maxReasonLen)
	if reason == "" {
		reason = "cancelled from the dashboard"
	}
	if _, err := h.pool().CancelJob(v.ctx(r), &pb.CancelJobRequest{JobId: id, Reason: reason}); err != nil {
		return err
	}
	redirectBack(w, r, "/pool/jobs/"+id)
	return nil
}
