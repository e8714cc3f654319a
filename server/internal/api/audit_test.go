package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/api/apitest"
)

var auditT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// auditEnv is the API with an audit log, served on a loopback TCP port and
// recording mutating calls through the interceptor.
type auditEnv struct {
	*env
	lg    *audit.Log
	audit apiv1.AuditServiceClient
	logs  *syncBuffer
}

// newAuditEnv opens a log whose clock moves one second per reading.
func newAuditEnv(t *testing.T, identity api.Identity) *auditEnv {
	t.Helper()
	var mu sync.Mutex
	now := auditT0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); now = now.Add(time.Second); return now }
	lg, err := audit.Open(t.Context(), t.TempDir(), audit.WithOrigin("test.fleetlearn/audit"), audit.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })

	b := apitest.New()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	rec := api.NewAuditInterceptor(lg, identity, logger)
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(rec.Unary), grpc.ChainStreamInterceptor(rec.Stream))
	api.Register(s, b, api.WithAudit(lg), api.WithLogger(logger))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e := &env{b: b, logs: logs, conn: conn, tasks: apiv1.NewTaskServiceClient(conn),
		models: apiv1.NewModelServiceClient(conn), modules: apiv1.NewModuleServiceClient(conn)}
	return &auditEnv{env: e, lg: lg, audit: apiv1.NewAuditServiceClient(conn), logs: logs}
}

// record appends events straight to the log, as the server's parts do.
func (e *auditEnv) record(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		var p audit.Payload
		actor := audit.Service("coordinator")
		switch i % 3 {
		case 0:
			p = audit.RoundClosed{Task: fmt.Sprintf("t-%d", i%2), Round: uint64(i/3 + 1), Outcome: audit.RoundCommitted, Reports: 5}
		case 1:
			p = audit.TaskStopped{Task: fmt.Sprintf("t-%d", i%2), State: audit.TaskStoppedBy}
			actor = audit.Operator("alice")
		default:
			p = audit.PoolJob{Job: fmt.Sprintf("job-%d", i), Kind: "pretrain", State: audit.JobRunning}
		}
		if _, err := e.lg.Record(t.Context(), actor, p); err != nil {
			t.Fatal(err)
		}
	}
}

// query pages through all entries matching f with the given page size.
func (e *auditEnv) query(t *testing.T, f *pb.AuditFilter, size int32) []uint64 {
	t.Helper()
	ctx := testContext(t)
	pub := e.lg.PublicKeys()
	var got []uint64
	token := ""
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("paging does not end")
		}
		res, err := e.audit.QueryEntries(ctx, &pb.QueryEntriesRequest{Filter: f, PageSize: size, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if size > 0 && len(res.GetEntries()) > int(size) {
			t.Fatalf("page of %d entries, asked for %d", len(res.GetEntries()), size)
		}
		for _, pe := range res.GetEntries() {
			ent := audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}
			if _, err := audit.VerifyEntry(ent, pub.Entry); err != nil {
				t.Fatalf("entry %d: %v", pe.GetIndex(), err)
			}
			if h := ent.LeafHash(); !bytes.Equal(pe.GetLeafHash(), h[:]) {
				t.Fatalf("entry %d: leaf hash %x, want %x", pe.GetIndex(), pe.GetLeafHash(), h)
			}
			got = append(got, pe.GetIndex())
		}
		if token = res.GetNextPageToken(); token == "" {
			return got
		}
	}
}

func TestAuditQueryEntries(t *testing.T) {
	e := newAuditEnv(t, nil)
	e.record(t, 30)
	seq := func(from, to, step uint64) []uint64 {
		var out []uint64
		for i := from; i < to; i += step {
			out = append(out, i)
		}
		return out
	}
	// Entry i has time auditT0 + (i+1)s.
	at := func(i int) *timestamppb.Timestamp {
		return timestamppb.New(auditT0.Add(time.Duration(i+1) * time.Second))
	}
	for _, tc := range []struct {
		name   string
		filter *pb.AuditFilter
		size   int32
		want   []uint64
	}{
		{"all, default page", nil, 0, seq(0, 30, 1)},
		{"all, pages of 7", &pb.AuditFilter{}, 7, seq(0, 30, 1)},
		{"page size capped", nil, 1 << 30, seq(0, 30, 1)},
		{"type", &pb.AuditFilter{EventType: "pool.job"}, 4, seq(2, 30, 3)},
		{"task", &pb.AuditFilter{TaskId: "t-0"}, 2, []uint64{0, 4, 6, 10, 12, 16, 18, 22, 24, 28}},
		{"task and round", &pb.AuditFilter{TaskId: "t-0", Round: 3}, 0, []uint64{6}},
		{"actor id", &pb.AuditFilter{Actor: "alice"}, 3, seq(1, 30, 3)},
		{"actor kind and id", &pb.AuditFilter{Actor: "operator:alice"}, 0, seq(1, 30, 3)},
		{"wrong actor kind", &pb.AuditFilter{Actor: "service:alice"}, 0, nil},
		{"time range", &pb.AuditFilter{StartTime: at(10), EndTime: at(14)}, 2, seq(10, 14, 1)},
		{"since", &pb.AuditFilter{StartTime: at(27)}, 0, seq(27, 30, 1)},
		{"nothing", &pb.AuditFilter{TaskId: "t-9"}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := e.query(t, tc.filter, tc.size); !slices.Equal(got, tc.want) {
				t.Errorf("entries %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAuditRefusesBadRequests(t *testing.T) {
	e := newAuditEnv(t, nil)
	e.record(t, 5)
	if _, err := e.lg.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	query := func(f *pb.AuditFilter, size int32, token string) error {
		_, err := e.audit.QueryEntries(ctx, &pb.QueryEntriesRequest{Filter: f, PageSize: size, PageToken: token})
		return err
	}
	export := func(start, end uint64) error {
		st, err := e.audit.ExportEntries(ctx, &pb.ExportEntriesRequest{StartIndex: start, EndIndex: end})
		if err != nil {
			return err
		}
		for {
			if _, err := st.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"negative page size", func() error { return query(nil, -1, "") }, codes.InvalidArgument},
		{"bad page token", func() error { return query(nil, 0, "x") }, codes.InvalidArgument},
		{"page token too long", func() error { return query(nil, 0, strings.Repeat("1", 2000)) }, codes.InvalidArgument},
		{"bad event type", func() error { return query(&pb.AuditFilter{EventType: "Round Closed"}, 0, "") }, codes.InvalidArgument},
		{"task with control character", func() error { return query(&pb.AuditFilter{TaskId: "t\n1"}, 0, "") }, codes.InvalidArgument},
		{"task too long", func() error { return query(&pb.AuditFilter{TaskId: strings.Repeat("t", 300)}, 0, "") }, codes.InvalidArgument},
		{"actor kind without id", func() error { return query(&pb.AuditFilter{Actor: "operator:"}, 0, "") }, codes.InvalidArgument},
		{"invalid timestamp", func() error {
			return query(&pb.AuditFilter{StartTime: &timestamppb.Timestamp{Seconds: 1 << 62}}, 0, "")
		}, codes.InvalidArgument},
		{"empty time range", func() error {
			ts := timestamppb.New(auditT0)
			return query(&pb.AuditFilter{StartTime: ts, EndTime: ts}, 0, "")
		}, codes.InvalidArgument},
		{"inclusion index at size", func() error {
			_, err := e.audit.GetInclusionProof(ctx, &pb.GetInclusionProofRequest{LeafIndex: 3, TreeSize: 3})
			return err
		}, codes.InvalidArgument},
		{"inclusion in empty tree", func() error {
			_, err := e.audit.GetInclusionProof(ctx, &pb.GetInclusionProofRequest{})
			return err
		}, codes.InvalidArgument},
		{"inclusion beyond the log", func() error {
			_, err := e.audit.GetInclusionProof(ctx, &pb.GetInclusionProofRequest{LeafIndex: 1, TreeSize: 6})
			return err
		}, codes.OutOfRange},
		{"consistency from zero", func() error {
			_, err := e.audit.GetConsistencyProof(ctx, &pb.GetConsistencyProofRequest{First: 0, Second: 3})
			return err
		}, codes.InvalidArgument},
		{"consistency shrinking", func() error {
			_, err := e.audit.GetConsistencyProof(ctx, &pb.GetConsistencyProofRequest{First: 4, Second: 3})
			return err
		}, codes.InvalidArgument},
		{"consistency beyond the log", func() error {
			_, err := e.audit.GetConsistencyProof(ctx, &pb.GetConsistencyProofRequest{First: 1, Second: 9})
			return err
		}, codes.OutOfRange},
		{"export start after end", func() error { return export(4, 2) }, codes.InvalidArgument},
		{"export start beyond the log", func() error { return export(9, 0) }, codes.InvalidArgument},
		{"export end beyond the log", func() error { return export(0, 6) }, codes.OutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantCode(t, tc.call(), tc.want)
		})
	}
}

func TestAuditCheckpointAndProofs(t *testing.T) {
	e := newAuditEnv(t, nil)
	ctx := testContext(t)
	_, err := e.audit.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	wantCode(t, err, codes.FailedPrecondition)

	keys, err := e.audit.GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pub := e.lg.PublicKeys()
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil || !entryKey.Equal(pub.Entry) {
		t.Fatalf("entry key from JWKS: %v", err)
	}
	if keys.GetOrigin() != "test.fleetlearn/audit" || keys.GetEntryKeyId() != pub.EntryKeyID ||
		keys.GetCheckpointVerifierKey() != pub.VerifierKey {
		t.Fatalf("keys = %v, want %+v", keys, pub)
	}

	checkpoint := func() audit.Checkpoint {
		t.Helper()
		if _, err := e.lg.Checkpoint(t.Context()); err != nil {
			t.Fatal(err)
		}
		res, err := e.audit.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
		if err != nil {
			t.Fatal(err)
		}
		cp, err := audit.ParseCheckpoint(res.GetCheckpoint().GetNote(), keys.GetCheckpointVerifierKey())
		if err != nil {
			t.Fatal(err)
		}
		return cp
	}
	e.record(t, 7)
	cp1 := checkpoint()
	e.record(t, 6)
	cp2 := checkpoint()
	if cp1.Size != 7 || cp2.Size != 13 {
		t.Fatalf("checkpoint sizes %d, %d", cp1.Size, cp2.Size)
	}

	for i := range cp2.Size {
		res, err := e.audit.GetInclusionProof(ctx, &pb.GetInclusionProofRequest{LeafIndex: i, TreeSize: cp2.Size})
		if err != nil {
			t.Fatal(err)
		}
		ent, err := e.lg.Entry(t.Context(), i)
		if err != nil {
			t.Fatal(err)
		}
		leaf := ent.LeafHash()
		p := res.GetProof()
		if p.GetLeafIndex() != i || p.GetTreeSize() != cp2.Size {
			t.Fatalf("proof for %d/%d", p.GetLeafIndex(), p.GetTreeSize())
		}
		if err := audit.VerifyInclusion(i, cp2.Size, leaf[:], p.GetHashes(), cp2.Root[:]); err != nil {
			t.Fatalf("inclusion of %d: %v", i, err)
		}
	}
	res, err := e.audit.GetConsistencyProof(ctx, &pb.GetConsistencyProofRequest{First: cp1.Size, Second: cp2.Size})
	if err != nil {
		t.Fatal(err)
	}
	if err := audit.VerifyConsistency(cp1.Size, cp2.Size, res.GetProof().GetHashes(), cp1.Root[:], cp2.Root[:]); err != nil {
		t.Fatal(err)
	}
	// A proof from the API does not verify against another root.
	if err := audit.VerifyConsistency(cp1.Size, cp2.Size, res.GetProof().GetHashes(), cp2.Root[:], cp2.Root[:]); !errors.Is(err, audit.ErrInvalidProof) {
		t.Fatalf("consistency against the wrong root: %v", err)
	}
}

func TestAuditExportEntries(t *testing.T) {
	e := newAuditEnv(t, nil)
	n := api.ExportChunkEntries*2 + 100
	evs := make([]audit.Event, n)
	for i := range evs {
		ev, err := audit.NewEvent(audit.Service("pool"), audit.PoolJob{Job: fmt.Sprintf("job-%d", i), Kind: "pretrain", State: audit.JobSucceeded})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	if _, err := e.lg.AppendBatch(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	for _, tc := range []struct {
		start, end     uint64
		first, entries int
		messages       int
	}{
		{0, 0, 0, n, 3},
		{10, 20, 10, 10, 1},
		{uint64(n), 0, n, 0, 0},
		{5, uint64(api.ExportChunkEntries + 5), 5, api.ExportChunkEntries, 1},
	} {
		t.Run(fmt.Sprintf("%d-%d", tc.start, tc.end), func(t *testing.T) {
			st, err := e.audit.ExportEntries(ctx, &pb.ExportEntriesRequest{StartIndex: tc.start, EndIndex: tc.end})
			if err != nil {
				t.Fatal(err)
			}
			next, messages := uint64(tc.first), 0
			for {
				res, err := st.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				messages++
				if len(res.GetEntries()) == 0 || len(res.GetEntries()) > api.ExportChunkEntries {
					t.Fatalf("message of %d entries", len(res.GetEntries()))
				}
				for _, pe := range res.GetEntries() {
					if pe.GetIndex() != next {
						t.Fatalf("entry %d where %d is next", pe.GetIndex(), next)
					}
					want, _ := e.lg.Entry(t.Context(), next)
					if !bytes.Equal(pe.GetJws(), want.Data) {
						t.Fatalf("entry %d differs", next)
					}
					next++
				}
			}
			if got := int(next) - tc.first; got != tc.entries || messages != tc.messages {
				t.Errorf("%d entries in %d messages, want %d in %d", got, messages, tc.entries, tc.messages)
			}
		})
	}
}

func TestAuditServiceOnlyWithLog(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	_, err := apiv1.NewAuditServiceClient(e.conn).GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	wantCode(t, err, codes.Unimplemented)
	_, err = healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: apiv1.AuditService_ServiceDesc.ServiceName})
	wantCode(t, err, codes.NotFound)

	a := newAuditEnv(t, nil)
	res, err := healthpb.NewHealthClient(a.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: apiv1.AuditService_ServiceDesc.ServiceName})
	if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of AuditService = %v, %v", res, err)
	}
}

// actions returns the operator actions in the log, with their actors.
func actions(t *testing.T, lg *audit.Log) ([]audit.OperatorAction, []audit.Actor) {
	t.Helper()
	page, err := lg.Query(t.Context(), audit.Filter{Type: audit.TypeOperatorAction}, audit.MaxPageSize, "")
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.OperatorAction
	var actors []audit.Actor
	for _, ent := range page.Entries {
		ev, err := audit.VerifyEntry(ent, lg.PublicKeys().Entry)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p.(audit.OperatorAction))
		actors = append(actors, ev.Actor)
	}
	return out, actors
}

func TestAuditInterceptorRecordsMutatingCalls(t *testing.T) {
	e := newAuditEnv(t, nil)
	ctx := testContext(t)
	task := seed(e.env)
	created, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: task})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetTask().GetId()
	// Reads are not recorded.
	if _, err := e.tasks.GetTask(ctx, &pb.GetTaskRequest{TaskId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.tasks.ListTasks(ctx, &pb.ListTasksRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err = e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: "no-such-task"})
	wantCode(t, err, codes.NotFound)
	data := []byte("safetensors bytes")
	st, err := e.models.ImportModel(ctx)
	imported, err := upload(t, st, err, []*pb.ImportModelRequest{
		{Part: &pb.ImportModelRequest_Header{Header: &pb.ImportModelHeader{Name: "base", SizeBytes: uint64(len(data))}}},
		{Part: &pb.ImportModelRequest_Chunk{Chunk: data}},
	})
	if err != nil {
		t.Fatal(err)
	}
	code := []byte("\x00asm\x01\x00\x00\x00")
	ms, err := e.modules.RegisterModule(ctx)
	_, err = upload(t, ms, err, []*pb.RegisterModuleRequest{
		{Part: &pb.RegisterModuleRequest_Header{Header: &pb.RegisterModuleHeader{Name: "m", SizeBytes: uint64(len(code)) + 1}}},
		{Part: &pb.RegisterModuleRequest_Chunk{Chunk: code}},
	})
	wantCode(t, err, codes.InvalidArgument)

	got, actors := actions(t, e.lg)
	want := []audit.OperatorAction{
		{Method: "fleetlearn.api.v1.TaskService/CreateTask", Resource: "tasks/" + id, Result: audit.ResultOK, Code: "OK",
			Task: id, Model: created.GetTask().GetModel().GetSha256(), Module: task.GetModule().GetSha256()},
		{Method: "fleetlearn.api.v1.TaskService/StopTask", Resource: "tasks/no-such-task", Result: audit.ResultFailed,
			Code: "NOT_FOUND", Task: "no-such-task"},
		{Method: "fleetlearn.api.v1.ModelService/ImportModel", Resource: "models/" + imported.GetModel().GetRef().GetVersion(),
			Result: audit.ResultOK, Code: "OK", Model: imported.GetModel().GetRef().GetSha256()},
		{Method: "fleetlearn.api.v1.ModuleService/RegisterModule", Result: audit.ResultFailed, Code: "INVALID_ARGUMENT"},
	}
	if len(got) != len(want) {
		t.Fatalf("recorded %d actions, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if len(got[i].RequestSHA256) != 64 {
			t.Errorf("action %d: request digest %q", i, got[i].RequestSHA256)
		}
		got[i].RequestSHA256 = ""
		if got[i] != want[i] {
			t.Errorf("action %d = %+v\nwant %+v", i, got[i], want[i])
		}
		if actors[i].Kind != audit.ActorOperator || !strings.HasPrefix(actors[i].ID, "127.0.0.1:") {
			t.Errorf("action %d by %v, want the peer address", i, actors[i])
		}
	}
}

func TestAuditInterceptorIdentityAndFailure(t *testing.T) {
	var mu sync.Mutex
	who := "alice"
	e := newAuditEnv(t, func(context.Context) string { mu.Lock(); defer mu.Unlock(); return who })
	ctx := testContext(t)
	if _, err := e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: "t"}); err == nil {
		t.Fatal("stopped a missing task")
	}
	mu.Lock()
	who = "bad\nid"
	mu.Unlock()
	if _, err := e.tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: strings.Repeat("x", 300)}); err == nil {
		t.Fatal("stopped a missing task")
	}
	got, actors := actions(t, e.lg)
	if len(got) != 2 || actors[0] != audit.Operator("alice") || actors[1] != audit.Operator(api.Anonymous) ||
		got[1].Task != "" || got[1].Resource != "" {
		t.Fatalf("actions %+v by %v", got, actors)
	}

	// A call that took effect but cannot be recorded does not look done.
	task := seed(e.env)
	if err := e.lg.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := e.tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: task})
	wantCode(t, err, codes.Internal)
	if !strings.Contains(err.Error(), "could not be recorded") || !strings.Contains(e.logs.String(), "audit record failed") {
		t.Errorf("err = %v; log: %s", err, e.logs.String())
	}
	// The audit service reports the closed log as unavailable.
	_, err = e.audit.QueryEntries(ctx, &pb.QueryEntriesRequest{})
	wantCode(t, err, codes.Unavailable)
}

// Large entries close a message before it reaches ExportChunkEntries.
func TestAuditExportEntriesChunksByBytes(t *testing.T) {
	e := newAuditEnv(t, nil)
	evs := make([]audit.Event, 300)
	for i := range evs {
		ev, err := audit.NewEvent(audit.Service("pool"), audit.PoolJob{Job: fmt.Sprintf("job-%d", i), Kind: "pretrain",
			State: audit.JobFailed, Detail: strings.Repeat("d", 4000)})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	if _, err := e.lg.AppendBatch(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	st, err := e.audit.ExportEntries(testContext(t), &pb.ExportEntriesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	messages, entries := 0, 0
	for {
		res, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		size := 0
		for _, pe := range res.GetEntries() {
			size += len(pe.GetJws())
		}
		if size > api.ExportChunkBytes {
			t.Fatalf("message of %d entry bytes", size)
		}
		messages++
		entries += len(res.GetEntries())
	}
	if entries != 300 || messages < 2 {
		t.Errorf("%d entries in %d messages", entries, messages)
	}
}
