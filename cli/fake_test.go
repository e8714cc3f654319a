package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/cli"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// fake is an in-memory aggregator API. It answers like the real API layer
// (status codes, "operation: object: reason" messages) so that the CLI's
// handling of responses is exercised, and records what the CLI sent.
type fake struct {
	mu       sync.Mutex
	pageSize int
	tasks    []*pb.Task
	rounds   map[string][]*pb.RoundSummary
	// later[id], when set, is what ListRounds answers after its first call
	// for the task: the rounds recorded meanwhile.
	later     map[string][]*pb.RoundSummary
	roundsHit map[string]int
	models    []*pb.Model
	data      map[string][]byte
	modules   []*pb.Module

	// Scripted watches: WatchTask sends events[id], then moves the task to
	// final[id] and ends the stream. hang makes it wait for the client.
	events map[string][]*pb.RoundEvent
	final  map[string]pb.TaskState
	hang   bool

	corruptExport bool // send one byte more than announced

	createWarnings []string // CreateTask answers with these

	created      *pb.Task
	importHeader *pb.ImportModelHeader
	importChunks int
	moduleHeader *pb.RegisterModuleHeader
	moduleData   []byte
}

var created = timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))

func newFake() *fake {
	return &fake{pageSize: 2, rounds: map[string][]*pb.RoundSummary{}, data: map[string][]byte{},
		later: map[string][]*pb.RoundSummary{}, roundsHit: map[string]int{},
		events: map[string][]*pb.RoundEvent{}, final: map[string]pb.TaskState{}}
}

// serve starts f on a loopback port and returns its address.
func (f *fake) serve(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	apiv1.RegisterTaskServiceServer(s, &fakeTasks{f: f})
	apiv1.RegisterModelServiceServer(s, &fakeModels{f: f})
	apiv1.RegisterModuleServiceServer(s, &fakeModules{f: f})
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func (f *fake) addTask(t *pb.Task) *pb.Task {
	f.mu.Lock()
	defer f.mu.Unlock()
	t = proto.CloneOf(t)
	t.Id = fmt.Sprintf("task-%d", len(f.tasks)+1)
	if t.State == pb.TaskState_TASK_STATE_UNSPECIFIED {
		t.State = pb.TaskState_TASK_STATE_PENDING
	}
	t.CreateTime, t.UpdateTime = created, created
	f.tasks = append(f.tasks, t)
	return proto.CloneOf(t)
}

// addModel stores data as a version of name. As on the real server, the
// version is the data's sha256.
func (f *fake) addModel(name string, data []byte) *pb.Model {
	f.mu.Lock()
	defer f.mu.Unlock()
	version := digest(data)
	m := &pb.Model{Ref: &pb.ModelRef{Version: version, Sha256: version, SizeBytes: uint64(len(data))},
		Name: name, Source: pb.ModelSource_MODEL_SOURCE_IMPORTED, TensorCount: 2, ParameterCount: 7850, CreateTime: created}
	f.models = append(f.models, m)
	f.data[version] = data
	return m
}

func (f *fake) addModule(name string, code []byte) *pb.Module {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := &pb.Module{Ref: &pb.ModuleRef{Sha256: digest(code), Name: name, AbiVersion: 1, SizeBytes: uint64(len(code))},
		KeyId: "publisher-1", Signature: []byte("sig"), CreateTime: created}
	f.modules = append(f.modules, m)
	return m
}

func (f *fake) task(id string) *pb.Task {
	for _, t := range f.tasks {
		if t.Id == id {
			return t
		}
	}
	return nil
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// page returns one page of items, newest first, with offset tokens.
func page[T proto.Message](f *fake, items []T, token string) ([]T, string, error) {
	items = slices.Clone(items)
	slices.Reverse(items)
	start := 0
	if token != "" {
		n, err := strconv.Atoi(token)
		if err != nil || n > len(items) {
			return nil, "", status.Error(codes.InvalidArgument, "bad page token")
		}
		start = n
	}
	end := min(start+f.pageSize, len(items))
	next := ""
	if end < len(items) {
		next = strconv.Itoa(end)
	}
	return items[start:end], next, nil
}

type fakeTasks struct {
	apiv1.UnimplementedTaskServiceServer
	f *fake
}

func (s *fakeTasks) CreateTask(_ context.Context, req *pb.CreateTaskRequest) (*pb.CreateTaskResponse, error) {
	s.f.mu.Lock()
	s.f.created = proto.CloneOf(req.GetTask())
	warnings := s.f.createWarnings
	s.f.mu.Unlock()
	return &pb.CreateTaskResponse{Task: s.f.addTask(req.GetTask()), Warnings: warnings}, nil
}

func (s *fakeTasks) GetTask(_ context.Context, req *pb.GetTaskRequest) (*pb.GetTaskResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	t := s.f.task(req.GetTaskId())
	if t == nil {
		return nil, status.Errorf(codes.NotFound, "get task: task %q: not found", req.GetTaskId())
	}
	return &pb.GetTaskResponse{Task: proto.CloneOf(t)}, nil
}

func (s *fakeTasks) ListTasks(_ context.Context, req *pb.ListTasksRequest) (*pb.ListTasksResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var sel []*pb.Task
	for _, t := range s.f.tasks {
		if req.GetState() == pb.TaskState_TASK_STATE_UNSPECIFIED || t.State == req.GetState() {
			sel = append(sel, t)
		}
	}
	ts, next, err := page(s.f, sel, req.GetPageToken())
	return &pb.ListTasksResponse{Tasks: ts, NextPageToken: next}, err
}

func (s *fakeTasks) StopTask(_ context.Context, req *pb.StopTaskRequest) (*pb.StopTaskResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	t := s.f.task(req.GetTaskId())
	if t == nil {
		return nil, status.Errorf(codes.NotFound, "stop task: task %q: not found", req.GetTaskId())
	}
	t.State, t.StateReason = pb.TaskState_TASK_STATE_STOPPED, req.GetReason()
	return &pb.StopTaskResponse{Task: proto.CloneOf(t)}, nil
}

func (s *fakeTasks) WatchTask(req *pb.WatchTaskRequest, stream grpc.ServerStreamingServer[pb.WatchTaskResponse]) error {
	s.f.mu.Lock()
	t := s.f.task(req.GetTaskId())
	events, final, hang := s.f.events[req.GetTaskId()], s.f.final[req.GetTaskId()], s.f.hang
	s.f.mu.Unlock()
	if t == nil {
		return status.Errorf(codes.NotFound, "watch task: task %q: not found", req.GetTaskId())
	}
	if hang {
		<-stream.Context().Done()
		return status.FromContextError(stream.Context().Err()).Err()
	}
	for _, ev := range events {
		if err := stream.Send(&pb.WatchTaskResponse{Event: ev}); err != nil {
			return err
		}
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, ev := range events {
		t.CurrentRound = ev.GetRound()
		if m := ev.GetModel(); m != nil {
			t.CurrentModel = m
		}
	}
	t.State = final
	switch final {
	case pb.TaskState_TASK_STATE_FAILED:
		t.StateReason = "privacy budget accountant crashed"
	case pb.TaskState_TASK_STATE_PAUSED:
		// As the server does: the paused task, then the end of the stream.
		t.StateReason = "3 rounds in a row abandoned: 2 of 8 devices took a seat"
		return stream.Send(&pb.WatchTaskResponse{Task: proto.CloneOf(t)})
	}
	return nil
}

func (s *fakeTasks) ListRounds(_ context.Context, req *pb.ListRoundsRequest) (*pb.ListRoundsResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if s.f.task(req.GetTaskId()) == nil {
		return nil, status.Errorf(codes.NotFound, "list rounds: task %q: not found", req.GetTaskId())
	}
	rounds := s.f.rounds[req.GetTaskId()]
	if later, ok := s.f.later[req.GetTaskId()]; ok && req.GetPageToken() == "" {
		if s.f.roundsHit[req.GetTaskId()]++; s.f.roundsHit[req.GetTaskId()] > 1 {
			s.f.rounds[req.GetTaskId()], rounds = later, later
		}
	}
	rs, next, err := page(s.f, rounds, req.GetPageToken())
	return &pb.ListRoundsResponse{Rounds: rs, NextPageToken: next}, err
}

type fakeModels struct {
	apiv1.UnimplementedModelServiceServer
	f *fake
}

func (s *fakeModels) ImportModel(stream grpc.ClientStreamingServer[pb.ImportModelRequest, pb.ImportModelResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	var data []byte
	chunks := 0
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		chunks++
		data = append(data, m.GetChunk()...)
	}
	if uint64(len(data)) != h.GetSizeBytes() || digest(data) != h.GetSha256() {
		return status.Error(codes.InvalidArgument, "import model: sha256 mismatch")
	}
	s.f.mu.Lock()
	s.f.importHeader, s.f.importChunks = h, chunks
	for _, m := range s.f.models {
		if m.GetRef().GetVersion() == digest(data) {
			s.f.mu.Unlock()
			return status.Errorf(codes.AlreadyExists, "import model: model %s: already exists", digest(data))
		}
	}
	s.f.mu.Unlock()
	m := s.f.addModel(h.GetName(), data)
	return stream.SendAndClose(&pb.ImportModelResponse{Model: m})
}

func (s *fakeModels) ExportModel(req *pb.ExportModelRequest, stream grpc.ServerStreamingServer[pb.ExportModelResponse]) error {
	s.f.mu.Lock()
	var m *pb.Model
	for _, x := range s.f.models {
		if x.GetRef().GetVersion() == req.GetVersion() {
			m = x
		}
	}
	data, corrupt := s.f.data[req.GetVersion()], s.f.corruptExport
	s.f.mu.Unlock()
	if m == nil {
		return status.Errorf(codes.NotFound, "export model: model %q: not found", req.GetVersion())
	}
	if err := stream.Send(&pb.ExportModelResponse{Part: &pb.ExportModelResponse_Model{Model: m}}); err != nil {
		return err
	}
	if corrupt {
		data = append(slices.Clone(data), 0)
	}
	for len(data) > 0 {
		n := min(len(data), 1000)
		if err := stream.Send(&pb.ExportModelResponse{Part: &pb.ExportModelResponse_Chunk{Chunk: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (s *fakeModels) GetModel(_ context.Context, req *pb.GetModelRequest) (*pb.GetModelResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, m := range s.f.models {
		if m.GetRef().GetVersion() == req.GetVersion() {
			return &pb.GetModelResponse{Model: m}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "get model: model %q: not found", req.GetVersion())
}

func (s *fakeModels) ListModels(_ context.Context, req *pb.ListModelsRequest) (*pb.ListModelsResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	var sel []*pb.Model
	for _, m := range s.f.models {
		if req.GetName() == "" || m.GetName() == req.GetName() {
			sel = append(sel, m)
		}
	}
	ms, next, err := page(s.f, sel, req.GetPageToken())
	return &pb.ListModelsResponse{Models: ms, NextPageToken: next}, err
}

type fakeModules struct {
	apiv1.UnimplementedModuleServiceServer
	f *fake
}

func (s *fakeModules) RegisterModule(stream grpc.ClientStreamingServer[pb.RegisterModuleRequest, pb.RegisterModuleResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	var code []byte
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		code = append(code, m.GetChunk()...)
	}
	if uint64(len(code)) != h.GetSizeBytes() || digest(code) != h.GetSha256() {
		return status.Error(codes.InvalidArgument, "register module: sha256 mismatch")
	}
	s.f.mu.Lock()
	s.f.moduleHeader, s.f.moduleData = h, code
	s.f.mu.Unlock()
	return stream.SendAndClose(&pb.RegisterModuleResponse{Module: s.f.addModule(h.GetName(), code)})
}

func (s *fakeModules) GetModule(_ context.Context, req *pb.GetModuleRequest) (*pb.GetModuleResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for _, m := range s.f.modules {
		if m.GetRef().GetSha256() == req.GetSha256() {
			return &pb.GetModuleResponse{Module: m}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "get module: module %s: not found", req.GetSha256())
}

func (s *fakeModules) ListModules(_ context.Context, req *pb.ListModulesRequest) (*pb.ListModulesResponse, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	ms, next, err := page(s.f, s.f.modules, req.GetPageToken())
	return &pb.ListModulesResponse{Modules: ms, NextPageToken: next}, err
}

// run executes the CLI against addr, a plaintext fake server, with a
// non-terminal stdout.
func run(t *testing.T, addr string, args ...string) (string, error) {
	t.Helper()
	return runWith(t, []cli.Option{cli.WithTerminal(false)}, addr, args...)
}

// runServer executes the CLI against a real server over TLS, as its admin.
func runServer(t *testing.T, h *servertest.Harness, args ...string) (string, error) {
	t.Helper()
	return runWith(t, []cli.Option{cli.WithTerminal(false)}, "", append([]string{"--server", h.GRPCAddr(),
		"--ca", server.CAFile(h.Dir), "--token-file", server.AdminTokenPath(h.Dir)}, args...)...)
}

func runWith(t *testing.T, opts []cli.Option, addr string, args ...string) (string, error) {
	t.Helper()
	out, _, err := runAll(t, opts, addr, args...)
	return out, err
}

// runErr is run that also returns what the CLI wrote to standard error.
func runErr(t *testing.T, addr string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runAll(t, []cli.Option{cli.WithTerminal(false)}, addr, args...)
}

func runAll(t *testing.T, opts []cli.Option, addr string, args ...string) (string, string, error) {
	t.Helper()
	opts = append([]cli.Option{cli.WithGetenv(func(string) string { return "" })}, opts...)
	root := cli.NewRootCommand(opts...)
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	if addr != "" {
		args = append([]string{"--server", addr, "--insecure"}, args...)
	}
	// --timeout 0 drops the CLI's own per-command deadline: on a loaded
	// machine a real server can take longer than it, and a hang is caught
	// by the test binary's timeout instead. A test of --timeout passes it
	// again after this, and the last one wins.
	root.SetArgs(append([]string{"--timeout", "0"}, args...))
	err := root.ExecuteContext(t.Context())
	return out.String(), errOut.String(), err
}
