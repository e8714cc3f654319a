package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/ident"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Identity names the operator a call acts for. An authentication layer
// supplies one that reads the verified principal from ctx.
type Identity func(ctx context.Context) string

// Anonymous is the operator id of a call whose caller cannot be named.
const Anonymous = "anonymous"

// PeerIdentity names the caller by its network address, or Anonymous when
// there is none. The API authenticates no one, so this is the most that can
// honestly be said about who made a call.
func PeerIdentity(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if s := p.Addr.String(); s != "" {
			return s
		}
	}
	return Anonymous
}

// AuditInterceptor records an audit.OperatorAction for every call that
// changes state (CreateTask, StopTask, ResumeTask, ImportModel,
// RegisterModule, CreateEnrollmentToken, RevokeDevice, and
// NATSService.IssueCredentials, which hands out access), with
// its outcome, refused and failed calls included. Reads are not recorded.
//
// A call that took effect but could not be recorded fails with INTERNAL:
// an action the log does not show must not look like a success. The action
// stands; the server log says which one it was.
type AuditInterceptor struct {
	lg       *audit.Log
	identity Identity
	log      *slog.Logger
}

// NewAuditInterceptor records into lg, naming operators with identity
// (PeerIdentity when nil) and logging recording failures to log (nowhere
// when nil).
func NewAuditInterceptor(lg *audit.Log, identity Identity, log *slog.Logger) *AuditInterceptor {
	if identity == nil {
		identity = PeerIdentity
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AuditInterceptor{lg: lg, identity: identity, log: log}
}

// describe fills in what a call acted on from its request (the first
// message of a stream) and its response, either of which may be nil.
type describe func(req, res proto.Message, a *audit.OperatorAction)

// mutating are the methods that change state and what they act on.
var mutating = map[string]describe{
	apiv1.TaskService_CreateTask_FullMethodName: func(req, res proto.Message, a *audit.OperatorAction) {
		in, _ := req.(*pb.CreateTaskRequest)
		out, _ := res.(*pb.CreateTaskResponse)
		if id := auditField(out.GetTask().GetId()); id != "" {
			a.Task, a.Resource = id, "tasks/"+id
		}
		a.Model = firstHex(out.GetTask().GetModel().GetSha256(), in.GetTask().GetModel().GetSha256())
		a.Module = firstHex(out.GetTask().GetModule().GetSha256(), in.GetTask().GetModule().GetSha256())
	},
	apiv1.TaskService_StopTask_FullMethodName: func(req, _ proto.Message, a *audit.OperatorAction) {
		in, _ := req.(*pb.StopTaskRequest)
		if id := auditField(in.GetTaskId()); id != "" {
			a.Task, a.Resource = id, "tasks/"+id
		}
	},
	apiv1.TaskService_ResumeTask_FullMethodName: func(req, _ proto.Message, a *audit.OperatorAction) {
		in, _ := req.(*pb.ResumeTaskRequest)
		if id := auditField(in.GetTaskId()); id != "" {
			a.Task, a.Resource = id, "tasks/"+id
		}
	},
	apiv1.ModelService_ImportModel_FullMethodName: func(req, res proto.Message, a *audit.OperatorAction) {
		in, _ := req.(*pb.ImportModelRequest)
		out, _ := res.(*pb.ImportModelResponse)
		h, ref := in.GetHeader(), out.GetModel().GetRef()
		if v := auditField(firstNonEmpty(ref.GetVersion(), h.GetVersion(), h.GetName())); v != "" {
			a.Resource = "models/" + v
		}
		a.Model = firstHex(ref.GetSha256(), h.GetSha256())
	},
	apiv1.DeviceService_CreateEnrollmentToken_FullMethodName: func(_, res proto.Message, a *audit.OperatorAction) {
		out, _ := res.(*pb.CreateEnrollmentTokenResponse)
		if id := auditField(out.GetTokenId()); id != "" {
			a.Resource = "enrollment-tokens/" + id
		}
	},
	apiv1.DeviceService_RevokeDevice_FullMethodName: func(_, _ proto.Message, a *audit.OperatorAction) {
		// The device id stays out of the log (DeviceRevoked names its
		// pseudonym); the request digest pins it.
		a.Resource = "devices"
	},
	apiv1.NATSService_IssueCredentials_FullMethodName: describeIssueCredentials,
	apiv1.ModuleService_RegisterModule_FullMethodName: func(req, res proto.Message, a *audit.OperatorAction) {
		in, _ := req.(*pb.RegisterModuleRequest)
		out, _ := res.(*pb.RegisterModuleResponse)
		h, ref := in.GetHeader(), out.GetModule().GetRef()
		a.Module = firstHex(ref.GetSha256(), h.GetSha256())
		if a.Module != "" {
			a.Resource = "modules/" + a.Module
		}
	},
	apiv1.PoolService_SubmitJob_FullMethodName: func(req, res proto.Message, a *audit.OperatorAction) {
		in, _ := req.(*pb.SubmitJobRequest)
		out, _ := res.(*pb.SubmitJobResponse)
		if id := auditField(firstNonEmpty(out.GetJob().GetSpec().GetId(), in.GetSpec().GetId())); id != "" {
			a.Resource = "pool-jobs/" + id
		}
	},
	apiv1.PoolService_CancelJob_FullMethodName: func(req, _ proto.Message, a *audit.OperatorAction) {
		in, _ := req.(*pb.CancelJobRequest)
		if id := auditField(in.GetJobId()); id != "" {
			a.Resource = "pool-jobs/" + id
		}
	},
}

// Unary is the grpc.UnaryServerInterceptor.
func (ai *AuditInterceptor) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	desc, ok := mutating[info.FullMethod]
	if !ok {
		return handler(ctx, req)
	}
	res, err := handler(ctx, req)
	in, _ := req.(proto.Message)
	out, _ := res.(proto.Message)
	if rerr := ai.record(ctx, info.FullMethod, desc, in, out, err); rerr != nil && err == nil {
		return nil, rerr
	}
	return res, err
}

// Stream is the grpc.StreamServerInterceptor.
func (ai *AuditInterceptor) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	desc, ok := mutating[info.FullMethod]
	if !ok {
		return handler(srv, ss)
	}
	rs := &recordingStream{ServerStream: ss}
	err := handler(srv, rs)
	if rerr := ai.record(ss.Context(), info.FullMethod, desc, rs.first, rs.sent, err); rerr != nil && err == nil {
		return rerr
	}
	return err
}

// record appends the action. The client may have gone by now; the record
// is written regardless.
func (ai *AuditInterceptor) record(ctx context.Context, method string, desc describe, req, res proto.Message, callErr error) error {
	code := status.Code(callErr)
	a := audit.OperatorAction{Method: strings.TrimPrefix(method, "/"), Result: audit.ResultFailed, Code: codeName(code)}
	switch code {
	case codes.OK:
		a.Result = audit.ResultOK
	case codes.PermissionDenied, codes.Unauthenticated:
		a.Result = audit.ResultDenied
	}
	if req != nil {
		if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(req); err == nil {
			sum := sha256.Sum256(b)
			a.RequestSHA256 = hex.EncodeToString(sum[:])
		}
	}
	desc(req, res, &a)
	operator := auditField(ai.identity(ctx))
	if operator == "" {
		operator = Anonymous
	}
	if _, err := ai.lg.Record(context.WithoutCancel(ctx), audit.Operator(operator), a); err != nil {
		ai.log.ErrorContext(ctx, "audit record failed", "method", a.Method, "operator", operator,
			"resource", a.Resource, "code", a.Code, "err", err)
		return status.Errorf(codes.Internal, "%s: the call completed but could not be recorded in the audit log", a.Method)
	}
	return nil
}

// recordingStream keeps the first message received (an upload's header)
// and the last one sent (the response).
type recordingStream struct {
	grpc.ServerStream
	first proto.Message
	sent  proto.Message
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if pm, ok := m.(proto.Message); ok && err == nil && s.first == nil {
		s.first = proto.Clone(pm)
	}
	return err
}

func (s *recordingStream) SendMsg(m any) error {
	if pm, ok := m.(proto.Message); ok {
		s.sent = pm
	}
	return s.ServerStream.SendMsg(m)
}

// codeName spells a status code as the proto enum does: PERMISSION_DENIED.
func codeName(c codes.Code) string {
	var b strings.Builder
	prevLower := false
	for _, r := range c.String() {
		if unicode.IsUpper(r) && prevLower {
			b.WriteByte('_')
		}
		prevLower = unicode.IsLower(r)
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// auditField returns v if the log accepts it as an identifier, else "":
// a malformed id in a request must not keep the call from being recorded
// (the request digest still pins it).
func auditField(v string) string {
	if len(v) > audit.MaxFieldBytes || !utf8.ValidString(v) || strings.IndexFunc(v, unicode.IsControl) >= 0 {
		return ""
	}
	return v
}

func firstHex(vs ...string) string {
	for _, v := range vs {
		if ident.IsSHA256(v) {
			return v
		}
	}
	return ""
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
