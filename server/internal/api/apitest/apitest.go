// Package apitest provides Backend, an in-memory backend.Backend for tests
// of the gRPC API and of its clients. It keeps everything in maps, validates
// just enough to exercise every error the API maps, and lets a test inject
// failures and drive WatchTask streams.
package apitest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// DefaultPageSize is the page size Backend uses when a request leaves it 0.
const DefaultPageSize = 50

// Backend is an in-memory backend.Backend. The zero value is not usable;
// call New. All methods are safe for concurrent use.
type Backend struct {
	now func() time.Time

	mu       sync.Mutex
	fail     error
	lastPage backend.Page
	created  *pb.Task // last CreateTask argument, as received
	warnings []string // what CreateTask warns of

	tasks    []*pb.Task // in creation order
	rounds   map[string][]*pb.RoundSummary
	models   []*pb.Model
	data     map[string][]byte // by model version
	modules  []*pb.Module
	watchers map[string][]*watcher
	changed  chan struct{} // closed and replaced whenever watchers change
}

type watcher struct {
	ctx context.Context
	ch  chan *pb.WatchTaskResponse
}

// Option configures New.
type Option func(*Backend)

// WithClock sets the clock used for timestamps; the default is a fixed
// instant, so that output is reproducible.
func WithClock(now func() time.Time) Option {
	return func(b *Backend) { b.now = now }
}

// Epoch is the instant the default clock always reports.
var Epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// New returns an empty Backend.
func New(opts ...Option) *Backend {
	b := &Backend{
		now:      func() time.Time { return Epoch },
		rounds:   map[string][]*pb.RoundSummary{},
		data:     map[string][]byte{},
		watchers: map[string][]*watcher{},
		changed:  make(chan struct{}),
	}
	for _, o := range opts {
		o(b)
	}
	return b
}

var _ backend.Backend = (*Backend)(nil)

// FailWith makes every Backend method return err until FailWith(nil).
func (b *Backend) FailWith(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail = err
}

// LastPage returns the Page of the latest List call.
func (b *Backend) LastPage() backend.Page {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastPage
}

// WarnOnCreate makes CreateTask return warnings with every task it creates.
func (b *Backend) WarnOnCreate(warnings ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.warnings = slices.Clone(warnings)
}

// LastCreated returns the task the latest CreateTask call received.
func (b *Backend) LastCreated() *pb.Task {
	b.mu.Lock()
	defer b.mu.Unlock()
	return proto.CloneOf(b.created)
}

// AddModel stores a model version as if it had been imported, computing its
// digest and size from data.
func (b *Backend) AddModel(name, version string, data []byte) *pb.Model {
	sum := sha256.Sum256(data)
	m := &pb.Model{
		Ref: &pb.ModelRef{Sha256: hex.EncodeToString(sum[:]), Version: version,
			SizeBytes: uint64(len(data))},
		Name: name, Source: pb.ModelSource_MODEL_SOURCE_IMPORTED,
		CreateTime: timestamppb.New(b.now()),
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.models = append(b.models, m)
	b.data[version] = slices.Clone(data)
	return proto.CloneOf(m)
}

// AddModule stores a module as if it had been registered.
func (b *Backend) AddModule(name string, code []byte) *pb.Module {
	sum := sha256.Sum256(code)
	m := &pb.Module{
		Ref: &pb.ModuleRef{Sha256: hex.EncodeToString(sum[:]), AbiVersion: 1,
			SizeBytes: uint64(len(code)), Name: name},
		CreateTime: timestamppb.New(b.now()),
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.modules = append(b.modules, m)
	return proto.CloneOf(m)
}

// AddRound records a round summary for its task.
func (b *Backend) AddRound(r *pb.RoundSummary) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rounds[r.GetTaskId()] = append(b.rounds[r.GetTaskId()], proto.CloneOf(r))
}

// SetTaskState moves a task to state; a terminal state ends its watches,
// and PAUSED sends them the task first, as the server does.
func (b *Backend) SetTaskState(id string, state pb.TaskState, reason string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.task(id)
	if t == nil {
		return fmt.Errorf("task %q: %w", id, backend.ErrNotFound)
	}
	t.State, t.StateReason, t.UpdateTime = state, reason, timestamppb.New(b.now())
	if state == pb.TaskState_TASK_STATE_PAUSED {
		for _, w := range b.watchers[id] {
			select {
			case w.ch <- &pb.WatchTaskResponse{Task: proto.CloneOf(t)}:
			case <-w.ctx.Done():
			}
		}
	}
	if terminal(state) || state == pb.TaskState_TASK_STATE_PAUSED {
		b.closeWatchers(id)
	}
	return nil
}

// Publish delivers ev to every current watcher of its task, waiting for
// each to take it or go away. It also advances the task's current round.
func (b *Backend) Publish(ev *pb.RoundEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.task(ev.GetTaskId()); t != nil {
		t.CurrentRound = max(t.CurrentRound, ev.GetRound())
		if t.State == pb.TaskState_TASK_STATE_PENDING {
			t.State = pb.TaskState_TASK_STATE_RUNNING
		}
	}
	for _, w := range b.watchers[ev.GetTaskId()] {
		select {
		case w.ch <- &pb.WatchTaskResponse{Event: proto.CloneOf(ev)}:
		case <-w.ctx.Done():
		}
	}
}

// Watchers returns the number of open watches on a task.
func (b *Backend) Watchers(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.watchers[id])
}

// WaitWatchers blocks until a task has exactly n open watches or ctx ends.
func (b *Backend) WaitWatchers(ctx context.Context, id string, n int) error {
	for {
		b.mu.Lock()
		got, changed := len(b.watchers[id]), b.changed
		b.mu.Unlock()
		if got == n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d watchers of %q (have %d): %w", n, id, got, ctx.Err())
		}
	}
}

func terminal(s pb.TaskState) bool {
	return s == pb.TaskState_TASK_STATE_COMPLETED || s == pb.TaskState_TASK_STATE_STOPPED ||
		s == pb.TaskState_TASK_STATE_FAILED
}

// notify wakes WaitWatchers; b.mu must be held.
func (b *Backend) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// closeWatchers ends every watch of a task; b.mu must be held.
func (b *Backend) closeWatchers(id string) {
	for _, w := range b.watchers[id] {
		close(w.ch)
	}
	delete(b.watchers, id)
	b.notify()
}

func (b *Backend) task(id string) *pb.Task {
	for _, t := range b.tasks {
		if t.Id == id {
			return t
		}
	}
	return nil
}

func (b *Backend) model(version string) *pb.Model {
	for _, m := range b.models {
		if m.GetRef().GetVersion() == version {
			return m
		}
	}
	return nil
}

func (b *Backend) module(sha string) *pb.Module {
	for _, m := range b.modules {
		if m.GetRef().GetSha256() == sha {
			return m
		}
	}
	return nil
}

// paginate returns one page of items, newest (last) first.
func paginate[T proto.Message](items []T, p backend.Page, keep func(T) bool) ([]T, string, error) {
	var sel []T
	for i := len(items) - 1; i >= 0; i-- {
		if keep(items[i]) {
			sel = append(sel, items[i])
		}
	}
	start := 0
	if p.Token != "" {
		n, err := strconv.Atoi(p.Token)
		if err != nil || n < 0 || n > len(sel) {
			return nil, "", fmt.Errorf("page token %q: %w", p.Token, backend.ErrInvalid)
		}
		start = n
	}
	size := p.Size
	if size == 0 {
		size = DefaultPageSize
	}
	end := min(start+size, len(sel))
	out := make([]T, 0, end-start)
	for _, it := range sel[start:end] {
		out = append(out, proto.CloneOf(it))
	}
	next := ""
	if end < len(sel) {
		next = strconv.Itoa(end)
	}
	return out, next, nil
}

// begin takes the lock, unless it fails with the injected failure or the
// context's error.
func (b *Backend) begin(ctx context.Context) error {
	b.mu.Lock()
	err := b.fail
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		b.mu.Unlock()
	}
	return err
}

// CreateTask implements backend.Backend.
func (b *Backend) CreateTask(ctx context.Context, t *pb.Task) (*pb.Task, []string, error) {
	if err := b.begin(ctx); err != nil {
		return nil, nil, err
	}
	defer b.mu.Unlock()
	b.created = proto.CloneOf(t)
	if t.GetCohortTarget() == 0 || t.GetRoundsTotal() == 0 {
		return nil, nil, fmt.Errorf("task %q: cohort_target and rounds_total must be positive: %w", t.GetName(), backend.ErrInvalid)
	}
	m := b.model(t.GetModel().GetVersion())
	if m == nil {
		return nil, nil, fmt.Errorf("model %q: %w", t.GetModel().GetVersion(), backend.ErrNotFound)
	}
	mod := b.module(t.GetModule().GetSha256())
	if mod == nil {
		return nil, nil, fmt.Errorf("module %s: %w", t.GetModule().GetSha256(), backend.ErrNotFound)
	}
	out := proto.CloneOf(t)
	out.Id = fmt.Sprintf("task-%d", len(b.tasks)+1)
	out.State = pb.TaskState_TASK_STATE_PENDING
	out.Model = proto.CloneOf(m.Ref)
	out.Module = proto.CloneOf(mod.Ref)
	out.CurrentModel = proto.CloneOf(m.Ref)
	out.CreateTime = timestamppb.New(b.now())
	out.UpdateTime = out.CreateTime
	b.tasks = append(b.tasks, out)
	return proto.CloneOf(out), slices.Clone(b.warnings), nil
}

// GetTask implements backend.Backend.
func (b *Backend) GetTask(ctx context.Context, id string) (*pb.Task, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	t := b.task(id)
	if t == nil {
		return nil, fmt.Errorf("task %q: %w", id, backend.ErrNotFound)
	}
	return proto.CloneOf(t), nil
}

// ListTasks implements backend.Backend.
func (b *Backend) ListTasks(ctx context.Context, state pb.TaskState, p backend.Page) ([]*pb.Task, string, error) {
	if err := b.begin(ctx); err != nil {
		return nil, "", err
	}
	defer b.mu.Unlock()
	b.lastPage = p
	return paginate(b.tasks, p, func(t *pb.Task) bool {
		return state == pb.TaskState_TASK_STATE_UNSPECIFIED || t.State == state
	})
}

// StopTask implements backend.Backend.
func (b *Backend) StopTask(ctx context.Context, id, reason string) (*pb.Task, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	t := b.task(id)
	if t == nil {
		return nil, fmt.Errorf("task %q: %w", id, backend.ErrNotFound)
	}
	if terminal(t.State) {
		return nil, fmt.Errorf("task %q is already %s: %w", id, t.State, backend.ErrPrecondition)
	}
	t.State, t.StateReason, t.UpdateTime = pb.TaskState_TASK_STATE_STOPPED, reason, timestamppb.New(b.now())
	b.closeWatchers(id)
	return proto.CloneOf(t), nil
}

// ResumeTask implements backend.Backend.
func (b *Backend) ResumeTask(ctx context.Context, id string) (*pb.Task, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	t := b.task(id)
	if t == nil {
		return nil, fmt.Errorf("task %q: %w", id, backend.ErrNotFound)
	}
	if t.State != pb.TaskState_TASK_STATE_PAUSED {
		return nil, fmt.Errorf("task %q is %s, not paused: %w", id, t.State, backend.ErrPrecondition)
	}
	t.State, t.StateReason, t.UpdateTime = pb.TaskState_TASK_STATE_RUNNING, "", timestamppb.New(b.now())
	return proto.CloneOf(t), nil
}

// WatchTask implements backend.Backend. The channel of a task that has
// already ended is returned closed; that of a paused task holds the task.
func (b *Backend) WatchTask(ctx context.Context, id string) (<-chan *pb.WatchTaskResponse, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	t := b.task(id)
	if t == nil {
		return nil, fmt.Errorf("task %q: %w", id, backend.ErrNotFound)
	}
	w := &watcher{ctx: ctx, ch: make(chan *pb.WatchTaskResponse, 16)}
	if t.State == pb.TaskState_TASK_STATE_PAUSED {
		w.ch <- &pb.WatchTaskResponse{Task: proto.CloneOf(t)}
	}
	if terminal(t.State) || t.State == pb.TaskState_TASK_STATE_PAUSED {
		close(w.ch)
		return w.ch, nil
	}
	b.watchers[id] = append(b.watchers[id], w)
	b.notify()
	go func() {
		<-ctx.Done()
		b.mu.Lock()
		defer b.mu.Unlock()
		ws := b.watchers[id]
		if i := slices.Index(ws, w); i >= 0 {
			b.watchers[id] = slices.Delete(ws, i, i+1)
			close(w.ch)
			b.notify()
		}
	}()
	return w.ch, nil
}

// ListRounds implements backend.Backend.
func (b *Backend) ListRounds(ctx context.Context, taskID string, p backend.Page) ([]*pb.RoundSummary, string, error) {
	if err := b.begin(ctx); err != nil {
		return nil, "", err
	}
	defer b.mu.Unlock()
	b.lastPage = p
	if b.task(taskID) == nil {
		return nil, "", fmt.Errorf("task %q: %w", taskID, backend.ErrNotFound)
	}
	return paginate(b.rounds[taskID], p, func(*pb.RoundSummary) bool { return true })
}

// ImportModel implements backend.Backend. An empty version becomes
// "name@N" for the next free N.
func (b *Backend) ImportModel(ctx context.Context, h *pb.ImportModelHeader, r io.Reader) (*pb.Model, error) {
	// Read before taking the lock: the upload arrives at the client's pace.
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); (h.GetSha256() != "" && h.GetSha256() != got) || (h.GetSizeBytes() != 0 && h.GetSizeBytes() != uint64(len(data))) {
		return nil, fmt.Errorf("model %q: header does not describe the data: %w", h.GetName(), backend.ErrInvalid)
	}
	h = proto.CloneOf(h)
	h.Sha256, h.SizeBytes = hex.EncodeToString(sum[:]), uint64(len(data))
	version := h.GetVersion()
	for n := 1; version == ""; n++ {
		if v := fmt.Sprintf("%s@%d", h.GetName(), n); b.model(v) == nil {
			version = v
		}
	}
	if b.model(version) != nil {
		return nil, fmt.Errorf("model %q: %w", version, backend.ErrExists)
	}
	if p := h.GetParentVersion(); p != "" && b.model(p) == nil {
		return nil, fmt.Errorf("parent model %q: %w", p, backend.ErrNotFound)
	}
	m := &pb.Model{
		Ref: &pb.ModelRef{Sha256: h.GetSha256(), Version: version, SizeBytes: h.GetSizeBytes(),
			ParentVersion: h.GetParentVersion()},
		Name: h.GetName(), Description: h.GetDescription(),
		Source: pb.ModelSource_MODEL_SOURCE_IMPORTED, CreateTime: timestamppb.New(b.now()),
	}
	b.models = append(b.models, m)
	b.data[version] = slices.Clone(data)
	return proto.CloneOf(m), nil
}

// ExportModel implements backend.Backend.
func (b *Backend) ExportModel(ctx context.Context, version string) (*pb.Model, []byte, error) {
	if err := b.begin(ctx); err != nil {
		return nil, nil, err
	}
	defer b.mu.Unlock()
	m := b.model(version)
	if m == nil {
		return nil, nil, fmt.Errorf("model %q: %w", version, backend.ErrNotFound)
	}
	return proto.CloneOf(m), slices.Clone(b.data[version]), nil
}

// GetModel implements backend.Backend.
func (b *Backend) GetModel(ctx context.Context, version string) (*pb.Model, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	m := b.model(version)
	if m == nil {
		return nil, fmt.Errorf("model %q: %w", version, backend.ErrNotFound)
	}
	return proto.CloneOf(m), nil
}

// ListModels implements backend.Backend.
func (b *Backend) ListModels(ctx context.Context, name string, p backend.Page) ([]*pb.Model, string, error) {
	if err := b.begin(ctx); err != nil {
		return nil, "", err
	}
	defer b.mu.Unlock()
	b.lastPage = p
	return paginate(b.models, p, func(m *pb.Model) bool { return name == "" || m.Name == name })
}

// RegisterModule implements backend.Backend.
func (b *Backend) RegisterModule(ctx context.Context, h *pb.RegisterModuleHeader, code []byte) (*pb.Module, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	sum := sha256.Sum256(code)
	sha := hex.EncodeToString(sum[:])
	if h.GetSha256() != sha || h.GetSizeBytes() != uint64(len(code)) {
		return nil, fmt.Errorf("module %q: header does not describe the code: %w", h.GetName(), backend.ErrInvalid)
	}
	if b.module(sha) != nil {
		return nil, fmt.Errorf("module %s: %w", sha, backend.ErrExists)
	}
	m := &pb.Module{
		Ref: &pb.ModuleRef{Sha256: sha, AbiVersion: h.GetAbiVersion(), SizeBytes: uint64(len(code)),
			Name: h.GetName()},
		Signature: slices.Clone(h.GetSignature()), CreateTime: timestamppb.New(b.now()),
	}
	b.modules = append(b.modules, m)
	return proto.CloneOf(m), nil
}

// GetModule implements backend.Backend.
func (b *Backend) GetModule(ctx context.Context, sha string) (*pb.Module, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	m := b.module(sha)
	if m == nil {
		return nil, fmt.Errorf("module %s: %w", sha, backend.ErrNotFound)
	}
	return proto.CloneOf(m), nil
}

// ListModules implements backend.Backend.
func (b *Backend) ListModules(ctx context.Context, name string, p backend.Page) ([]*pb.Module, string, error) {
	if err := b.begin(ctx); err != nil {
		return nil, "", err
	}
	defer b.mu.Unlock()
	b.lastPage = p
	return paginate(b.modules, p, func(m *pb.Module) bool { return name == "" || m.GetRef().GetName() == name })
}
