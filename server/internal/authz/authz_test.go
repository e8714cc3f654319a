package authz_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/authz"
)

// apiPackage prefixes the services' full names; slicing it off a name of
// another package garbles it, which the table comparison catches.
const apiPackage = "fleetlearn.api.v1."

// services are the Fleetlearn gRPC services the policy must cover.
var services = []*grpc.ServiceDesc{&apiv1.TaskService_ServiceDesc, &apiv1.ModelService_ServiceDesc,
	&apiv1.ModuleService_ServiceDesc, &apiv1.AuditService_ServiceDesc, &apiv1.DeviceService_ServiceDesc,
	&apiv1.NATSService_ServiceDesc, &apiv1.PoolService_ServiceDesc, &apiv1.PoolWorkerService_ServiceDesc}

// allowed is the documented role table (docs/SECURITY.md), written out
// independently of identity.DefaultPolicy so that the test checks it.
var allowed = map[string][]identity.Role{
	"TaskService/CreateTask": {"admin", "operator"},
	"TaskService/GetTask":    {"admin", "operator", "auditor"},
	"TaskService/ListTasks":  {"admin", "operator", "auditor"},
	"TaskService/StopTask":   {"admin", "operator"},
	"TaskService/ResumeTask": {"admin", "operator"},
	"TaskService/WatchTask":  {"admin", "operator", "auditor"},
	"TaskService/ListRounds": {"admin", "operator", "auditor"},

	"ModelService/ImportModel": {"admin", "operator"}, // not pool-worker: a job script can read its worker's token
	"ModelService/ExportModel": {"admin", "operator", "pool-worker"},
	"ModelService/GetModel":    {"admin", "operator", "auditor", "pool-worker"},
	"ModelService/ListModels":  {"admin", "operator", "auditor", "pool-worker"},

	"ModuleService/RegisterModule": {"admin", "operator"},
	"ModuleService/GetModule":      {"admin", "operator", "auditor"},
	"ModuleService/ListModules":    {"admin", "operator", "auditor"},

	"AuditService/QueryEntries":        {"admin", "auditor"},
	"AuditService/ExportEntries":       {"admin", "auditor"},
	"AuditService/GetCheckpoint":       {"admin", "operator", "auditor"},
	"AuditService/GetInclusionProof":   {"admin", "operator", "auditor"},
	"AuditService/GetConsistencyProof": {"admin", "operator", "auditor"},
	"AuditService/GetPublicKeys":       {"admin", "operator", "auditor"},
	"AuditService/AddCosignature":      {"admin", "operator", "auditor", "pool-worker"}, // and anyone: public

	"DeviceService/CreateEnrollmentToken": {"admin", "operator"},
	"DeviceService/ListDevices":           {"admin", "operator", "auditor"},
	"DeviceService/RevokeDevice":          {"admin", "operator"},

	"NATSService/IssueCredentials": {"admin"},

	"PoolService/SubmitJob":   {"admin", "operator"},
	"PoolService/CancelJob":   {"admin", "operator"},
	"PoolService/GetJob":      {"admin", "operator", "auditor"},
	"PoolService/ListJobs":    {"admin", "operator", "auditor"},
	"PoolService/WatchJob":    {"admin", "operator", "auditor"},
	"PoolService/JobLogs":     {"admin", "operator"},
	"PoolService/ListWorkers": {"admin", "operator", "auditor"},

	"PoolWorkerService/RegisterWorker":      {"admin", "pool-worker"},
	"PoolWorkerService/Heartbeat":           {"admin", "pool-worker"},
	"PoolWorkerService/RankExited":          {"admin", "pool-worker"},
	"PoolWorkerService/PutCheckpointBlob":   {"admin", "pool-worker"},
	"PoolWorkerService/HasCheckpointBlob":   {"admin", "pool-worker"},
	"PoolWorkerService/GetCheckpointBlob":   {"admin", "pool-worker"},
	"PoolWorkerService/CommitCheckpoint":    {"admin", "pool-worker"},
	"PoolWorkerService/GetRankCheckpoint":   {"admin", "pool-worker"},
	"PoolWorkerService/ListRankCheckpoints": {"admin", "pool-worker"},
	"PoolWorkerService/Average":             {"admin", "pool-worker"},
	"PoolWorkerService/OuterSync":           {"admin", "pool-worker"},
	"PoolWorkerService/AppendLogs":          {"admin", "pool-worker"},
}

// public are the methods of those services that need no token (their
// request carries its own credential); any valid token is accepted too.
var public = []string{"AuditService/AddCosignature"}

type method struct {
	full                    string
	short                   string
	clientStream, srvStream bool
}

func allMethods() []method {
	var ms []method
	for _, sd := range services {
		short := sd.ServiceName[len(apiPackage):]
		for _, m := range sd.Methods {
			ms = append(ms, method{full: "/" + sd.ServiceName + "/" + m.MethodName, short: short + "/" + m.MethodName})
		}
		for _, s := range sd.Streams {
			ms = append(ms, method{full: "/" + sd.ServiceName + "/" + s.StreamName, short: short + "/" + s.StreamName,
				clientStream: s.ClientStreams, srvStream: s.ServerStreams})
		}
	}
	return ms
}

// handled records which methods reached their handler.
type handled struct {
	mu   sync.Mutex
	seen []string
	who  []string
}

func (h *handled) add(ctx context.Context, m string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, m)
	p, ok := authz.Principal(ctx)
	if !ok {
		h.who = append(h.who, "")
		return
	}
	h.who = append(h.who, p.Subject)
}

func (h *handled) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.seen
	h.seen = nil
	return s
}

// stand-ins registers every method of sd with a handler that succeeds with
// an empty message, so a call's status says only what the interceptors
// decided. The real generated descriptors give the method names and kinds.
func standIn(sd *grpc.ServiceDesc, h *handled) *grpc.ServiceDesc {
	out := &grpc.ServiceDesc{ServiceName: sd.ServiceName, HandlerType: (*any)(nil), Metadata: sd.Metadata}
	for _, m := range sd.Methods {
		full := "/" + sd.ServiceName + "/" + m.MethodName
		out.Methods = append(out.Methods, grpc.MethodDesc{MethodName: m.MethodName,
			Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				in := new(emptypb.Empty)
				if err := dec(in); err != nil {
					return nil, err
				}
				handler := func(ctx context.Context, _ any) (any, error) {
					h.add(ctx, full)
					return &emptypb.Empty{}, nil
				}
				if ic == nil {
					return handler(ctx, in)
				}
				return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: full}, handler)
			}})
	}
	for _, s := range sd.Streams {
		full := "/" + sd.ServiceName + "/" + s.StreamName
		out.Streams = append(out.Streams, grpc.StreamDesc{StreamName: s.StreamName, ServerStreams: s.ServerStreams, ClientStreams: s.ClientStreams,
			Handler: func(_ any, ss grpc.ServerStream) error {
				if err := ss.RecvMsg(new(emptypb.Empty)); err != nil && err != io.EOF {
					return err
				}
				h.add(ss.Context(), full)
				return ss.SendMsg(&emptypb.Empty{})
			}})
	}
	return out
}

type env struct {
	conn    *grpc.ClientConn
	h       *handled
	admin   *identity.APIIssuer
	rogue   *identity.APIIssuer
	expired *identity.APIIssuer
}

func newVerifier(t *testing.T, keys ...ed25519.PublicKey) *identity.APIVerifier {
	t.Helper()
	v, err := identity.NewAPIVerifier(keys)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func newIssuer(t *testing.T, opts ...identity.Option) *identity.APIIssuer {
	t.Helper()
	key, err := identity.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := identity.NewAPIIssuer(key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// start runs a real gRPC server on 127.0.0.1:0 with the four services,
// health and reflection, behind the interceptors that chain builds.
func start(t *testing.T, chain func(*authz.Interceptors) []grpc.ServerOption) *env {
	t.Helper()
	e := &env{h: &handled{}, admin: newIssuer(t), rogue: newIssuer(t)}
	// Expired: minted an hour and a minute ago for an hour, by the trusted key.
	key, err := identity.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	past := func() time.Time { return time.Now().Add(-61 * time.Minute) }
	if e.expired, err = identity.NewAPIIssuer(key, identity.WithClock(past)); err != nil {
		t.Fatal(err)
	}
	az, err := authz.New(newVerifier(t, e.admin.PublicKey(), e.expired.PublicKey()), identity.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(chain(az)...)
	for _, sd := range services {
		srv.RegisterService(standIn(sd, e.h), struct{}{})
	}
	srv.RegisterService(standIn(&apiv1.EnrollmentService_ServiceDesc, e.h), struct{}{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	if e.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.conn.Close() })
	return e
}

func combined(az *authz.Interceptors) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.UnaryInterceptor(az.Unary), grpc.StreamInterceptor(az.Stream)}
}

func mint(t *testing.T, iss *identity.APIIssuer, subject string, roles ...identity.Role) string {
	t.Helper()
	tok, _, err := iss.Mint(subject, roles, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// call invokes m with authorization (none when empty) and returns its code.
func (e *env) call(ctx context.Context, m method, authorization string) codes.Code {
	if authorization != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", authorization)
	}
	if !m.clientStream && !m.srvStream {
		return status.Code(e.conn.Invoke(ctx, m.full, &emptypb.Empty{}, &emptypb.Empty{}))
	}
	st, err := e.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: m.clientStream, ServerStreams: m.srvStream}, m.full)
	if err != nil {
		return status.Code(err)
	}
	if err := st.SendMsg(&emptypb.Empty{}); err != nil && err != io.EOF {
		return status.Code(err)
	}
	if err := st.CloseSend(); err != nil {
		return status.Code(err)
	}
	if err := st.RecvMsg(&emptypb.Empty{}); err != nil {
		return status.Code(err)
	}
	return codes.OK
}

func TestTableMatchesServicesAndPolicy(t *testing.T) {
	var fromDescs []string
	for _, m := range allMethods() {
		fromDescs = append(fromDescs, m.short)
	}
	var fromTable []string
	for m := range allowed {
		fromTable = append(fromTable, m)
	}
	// The public methods are authz's own, not the policy's.
	fromPolicy := slices.Clone(public)
	for _, r := range identity.DefaultPolicy().Rules() {
		fromPolicy = append(fromPolicy, r.Method[len("/"+apiPackage):])
	}
	slices.Sort(fromDescs)
	slices.Sort(fromTable)
	slices.Sort(fromPolicy)
	if !slices.Equal(fromDescs, fromTable) || !slices.Equal(fromDescs, fromPolicy) {
		t.Fatalf("methods differ:\nservices %v\ntable    %v\npolicy   %v", fromDescs, fromTable, fromPolicy)
	}
}

// TestAuthorizationMatrix calls every method as every kind of caller and
// checks exactly the allowed calls reach their handler.
func TestAuthorizationMatrix(t *testing.T) {
	e := start(t, combined)
	ctx := t.Context()
	type caller struct {
		name string
		auth string
		role identity.Role // "" for callers without a valid token
		want codes.Code    // the code when not allowed
	}
	callers := []caller{
		{"admin", "Bearer " + mint(t, e.admin, "alice", identity.RoleAdmin), identity.RoleAdmin, codes.PermissionDenied},
		{"operator", "Bearer " + mint(t, e.admin, "olga", identity.RoleOperator), identity.RoleOperator, codes.PermissionDenied},
		{"auditor", "Bearer " + mint(t, e.admin, "audrey", identity.RoleAuditor), identity.RoleAuditor, codes.PermissionDenied},
		{"pool-worker", "Bearer " + mint(t, e.admin, "pool-7", identity.RolePoolWorker), identity.RolePoolWorker, codes.PermissionDenied},
		{"no token", "", "", codes.Unauthenticated},
		{"expired token", "Bearer " + mint(t, e.expired, "alice", identity.RoleAdmin), "", codes.Unauthenticated},
		{"unknown key", "Bearer " + mint(t, e.rogue, "alice", identity.RoleAdmin), "", codes.Unauthenticated},
		{"not bearer", "Basic YWxpY2U6c2VjcmV0", "", codes.Unauthenticated},
		{"garbage token", "Bearer not.a.jwt", "", codes.Unauthenticated},
	}
	for _, m := range allMethods() {
		for _, c := range callers {
			ok := c.role != "" && slices.Contains(allowed[m.short], c.role) || c.name == "no token" && slices.Contains(public, m.short)
			want := codes.OK
			if !ok {
				want = c.want
			}
			if got := e.call(ctx, m, c.auth); got != want {
				t.Errorf("%s as %s: %v, want %v", m.short, c.name, got, want)
			}
			reached := e.h.take()
			if ok != (len(reached) == 1 && reached[0] == m.full) {
				t.Errorf("%s as %s: handler reached %v, allowed %v", m.short, c.name, reached, ok)
			}
		}
	}
}

func TestSeveralRoles(t *testing.T) {
	e := start(t, combined)
	tok := "Bearer " + mint(t, e.admin, "ava", identity.RoleAuditor, identity.RolePoolWorker)
	for _, m := range allMethods() {
		want := codes.PermissionDenied
		if slices.Contains(allowed[m.short], identity.RoleAuditor) || slices.Contains(allowed[m.short], identity.RolePoolWorker) {
			want = codes.OK
		}
		if got := e.call(t.Context(), m, tok); got != want {
			t.Errorf("%s: %v, want %v", m.short, got, want)
		}
	}
}

// TestEnrollmentIsPublic: devices enroll with no API token (the
// enrollment token in the request is checked by the service), but a bad
// API token is still refused.
func TestEnrollmentIsPublic(t *testing.T) {
	e := start(t, combined)
	m := method{full: apiv1.EnrollmentService_Enroll_FullMethodName, short: "EnrollmentService/Enroll"}
	if got := e.call(t.Context(), m, ""); got != codes.OK {
		t.Fatalf("enroll without a token: %v", got)
	}
	e.h.mu.Lock()
	who := e.h.who[len(e.h.who)-1]
	e.h.mu.Unlock()
	if reached := e.h.take(); len(reached) != 1 || who != "" {
		t.Fatalf("handler reached %v as %q", reached, who)
	}
	if got := e.call(t.Context(), m, "Bearer "+mint(t, e.rogue, "x", identity.RoleAdmin)); got != codes.Unauthenticated {
		t.Fatalf("enroll with a bad token: %v", got)
	}
	if reached := e.h.take(); len(reached) != 0 {
		t.Fatalf("handler reached %v", reached)
	}
}

// TestAddCosignatureIsPublic: a witness hands in cosignatures with no API
// token (its signature is checked by the service), a bad token is still
// refused, and the request is bounded to one note.
func TestAddCosignatureIsPublic(t *testing.T) {
	e := start(t, combined)
	ctx := t.Context()
	m := method{full: apiv1.AuditService_AddCosignature_FullMethodName, short: "AuditService/AddCosignature"}
	if got := e.call(ctx, m, ""); got != codes.OK {
		t.Fatalf("without a token: %v", got)
	}
	if reached := e.h.take(); len(reached) != 1 {
		t.Fatalf("handler reached %v", reached)
	}
	if got := e.call(ctx, m, "Bearer "+mint(t, e.rogue, "x", identity.RoleAdmin)); got != codes.Unauthenticated {
		t.Fatalf("with a bad token: %v", got)
	}
	// Its neighbours are not public.
	if got := e.call(ctx, method{full: apiv1.AuditService_GetCheckpoint_FullMethodName}, ""); got != codes.Unauthenticated {
		t.Fatalf("GetCheckpoint without a token: %v", got)
	}
	call := func(n int) codes.Code {
		req := &pb.AddCosignatureRequest{Note: make([]byte, n)}
		return status.Code(e.conn.Invoke(ctx, m.full, req, &emptypb.Empty{}))
	}
	if got := call(audit.MaxNoteBytes); got != codes.OK {
		t.Fatalf("a note of the largest size: %v", got)
	}
	e.h.take()
	if got := call(audit.MaxNoteBytes + 64); got != codes.ResourceExhausted {
		t.Fatalf("an oversized note: %v", got)
	}
	if reached := e.h.take(); len(reached) != 0 {
		t.Fatalf("an oversized request reached %v", reached)
	}
}

func TestHealthAndReflection(t *testing.T) {
	e := start(t, combined)
	ctx := t.Context()
	hc := healthpb.NewHealthClient(e.conn)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health without a token: %v", err)
	}
	// A bad token is refused even where none is needed.
	bad := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+mint(t, e.rogue, "x", identity.RoleAdmin))
	if _, err := hc.Check(bad, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("health with a bad token: %v", err)
	}
	list := func(ctx context.Context) error {
		st, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx)
		if err != nil {
			return err
		}
		// A refused stream ends the Send side with io.EOF; Recv has the status.
		if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return err
		}
		res, err := st.Recv()
		if err != nil {
			return err
		}
		if n := len(res.GetListServicesResponse().GetService()); n < len(services) {
			return fmt.Errorf("reflection lists %d services", n)
		}
		return st.CloseSend()
	}
	if err := list(ctx); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("reflection without a token: %v", err)
	}
	for _, r := range identity.Roles() {
		auth := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+mint(t, e.admin, "r", r))
		if err := list(auth); err != nil {
			t.Fatalf("reflection as %s: %v", r, err)
		}
	}
}

// TestAuditBetween places an audit-like interceptor between Authenticate
// and Authorize: it sees the principal of a refused call, and never sees a
// call without a valid token.
func TestAuditBetween(t *testing.T) {
	var mu sync.Mutex
	var audited []string
	record := func(ctx context.Context, m string, err error) {
		mu.Lock()
		defer mu.Unlock()
		audited = append(audited, fmt.Sprintf("%s %s %v", authz.Operator(ctx), m, status.Code(err)))
	}
	e := start(t, func(az *authz.Interceptors) []grpc.ServerOption {
		return []grpc.ServerOption{
			grpc.ChainUnaryInterceptor(az.AuthenticateUnary, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				res, err := h(ctx, req)
				record(ctx, info.FullMethod, err)
				return res, err
			}, az.AuthorizeUnary),
			grpc.ChainStreamInterceptor(az.AuthenticateStream, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				err := h(srv, ss)
				record(ss.Context(), info.FullMethod, err)
				return err
			}, az.AuthorizeStream),
		}
	})
	ctx := t.Context()
	create := method{full: apiv1.TaskService_CreateTask_FullMethodName}
	imp := method{full: apiv1.ModelService_ImportModel_FullMethodName, clientStream: true}
	for _, c := range []struct {
		m    method
		auth string
		want codes.Code
	}{
		{create, "Bearer " + mint(t, e.admin, "audrey", identity.RoleAuditor), codes.PermissionDenied},
		{imp, "Bearer " + mint(t, e.admin, "audrey", identity.RoleAuditor), codes.PermissionDenied},
		{create, "Bearer " + mint(t, e.admin, "olga", identity.RoleOperator), codes.OK},
		{imp, "Bearer " + mint(t, e.admin, "pool-7", identity.RolePoolWorker), codes.PermissionDenied},
		{imp, "Bearer " + mint(t, e.admin, "otto", identity.RoleOperator), codes.OK},
		{create, "", codes.Unauthenticated},
		{imp, "Bearer " + mint(t, e.rogue, "mallory", identity.RoleAdmin), codes.Unauthenticated},
	} {
		if got := e.call(ctx, c.m, c.auth); got != c.want {
			t.Errorf("%s: %v, want %v", c.m.full, got, c.want)
		}
	}
	want := []string{
		"audrey " + create.full + " PermissionDenied",
		"audrey " + imp.full + " PermissionDenied",
		"olga " + create.full + " OK",
		"pool-7 " + imp.full + " PermissionDenied",
		"otto " + imp.full + " OK",
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(audited, want) {
		t.Fatalf("audited %q\nwant    %q", audited, want)
	}
	// The handler sees the principal too.
	if e.h.who[0] != "olga" || e.h.who[1] != "otto" {
		t.Fatalf("handlers saw %q", e.h.who)
	}
}

// Authorize alone, without Authenticate before it, fails closed.
func TestAuthorizeAloneFailsClosed(t *testing.T) {
	e := start(t, func(az *authz.Interceptors) []grpc.ServerOption {
		return []grpc.ServerOption{grpc.UnaryInterceptor(az.AuthorizeUnary), grpc.StreamInterceptor(az.AuthorizeStream)}
	})
	tok := "Bearer " + mint(t, e.admin, "alice", identity.RoleAdmin)
	for _, m := range allMethods() {
		want := codes.Unauthenticated
		if slices.Contains(public, m.short) {
			want = codes.OK // as if called without a token, which it may be
		}
		if got := e.call(t.Context(), m, tok); got != want {
			t.Errorf("%s: %v, want %v", m.short, got, want)
		}
	}
	if _, err := healthpb.NewHealthClient(e.conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health: %v", err)
	}
}

func TestNewRefusesNil(t *testing.T) {
	if _, err := authz.New(nil, identity.DefaultPolicy()); err == nil {
		t.Fatal("nil verifier accepted")
	}
	if _, err := authz.New(newVerifier(t, make(ed25519.PublicKey, ed25519.PublicKeySize)), nil); err == nil {
		t.Fatal("nil policy accepted")
	}
}
