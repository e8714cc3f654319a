// Package authz authenticates gRPC callers by bearer token and authorizes
// them against an identity.Policy.
//
// Two interceptor pairs split the work so that the audit interceptor can
// run between them: Authenticate verifies the "authorization: Bearer <jwt>"
// metadata and puts the Principal in the context (refusing calls without a
// valid token with UNAUTHENTICATED, which are not audited: anyone can make
// them); Authorize then applies the policy (PERMISSION_DENIED), so that a
// refused call by a known operator is recorded under that operator's name.
//
// Besides the policy's public services, AuditService/AddCosignature needs
// no token: a witness's signature authenticates it, checked by the handler.
// Its request is bounded to one checkpoint note.
//
//	grpc.ChainUnaryInterceptor(az.AuthenticateUnary, audit.Unary, az.AuthorizeUnary)
//	grpc.ChainStreamInterceptor(az.AuthenticateStream, audit.Stream, az.AuthorizeStream)
package authz

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
)

// publicMethods are the methods of otherwise token-protected services that
// anyone may call, each with the most bytes its request may hold: the
// request carries its own credential, which the handler checks.
// AddCosignature is authenticated by the witness's signature over a
// checkpoint the log signed, and the server accepts only the witnesses it
// is configured with. A token presented to one is still checked.
var publicMethods = map[string]int{
	// One note and its field header.
	apiv1.AuditService_AddCosignature_FullMethodName: audit.MaxNoteBytes + 16,
}

// public reports whether method may be called without a token.
func (i *Interceptors) public(method string) bool {
	_, ok := publicMethods[method]
	return ok || i.policy.Public(method)
}

// checkSize refuses an oversized request to a public method before any
// handler works on it.
func checkSize(method string, req any) error {
	limit, ok := publicMethods[method]
	if !ok {
		return nil
	}
	m, ok := req.(proto.Message)
	if !ok {
		return status.Error(codes.Internal, "authz: request is not a protocol buffer")
	}
	if n := proto.Size(m); n > limit {
		return status.Errorf(codes.ResourceExhausted, "authz: request of %d bytes, at most %d for %s", n, limit, method)
	}
	return nil
}

// Verifier checks a bearer token; *identity.APIVerifier is one.
type Verifier interface {
	Verify(token string) (identity.Principal, error)
}

// Interceptors authenticate and authorize gRPC calls.
type Interceptors struct {
	verify Verifier
	policy *identity.Policy
}

// New verifies tokens with v and decides with p.
func New(v Verifier, p *identity.Policy) (*Interceptors, error) {
	if v == nil || p == nil {
		return nil, errors.New("authz: nil verifier or policy")
	}
	return &Interceptors{verify: v, policy: p}, nil
}

type principalKey struct{}

// Principal is the verified caller of the call ctx belongs to; false for
// public methods called without a token.
func Principal(ctx context.Context) (identity.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(identity.Principal)
	return p, ok
}

// Operator names the caller for the audit log (api.Identity): the
// principal's subject, or "" when there is none.
func Operator(ctx context.Context) string {
	p, _ := Principal(ctx)
	return p.Subject
}

// authenticate returns ctx with the caller's principal. Public methods
// pass without a token; a token presented to one is still checked, so a
// bad token never goes unnoticed.
func (i *Interceptors) authenticate(ctx context.Context, method string) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		if i.public(method) {
			return ctx, nil
		}
		return nil, status.Error(codes.Unauthenticated, "authz: missing bearer token")
	}
	if len(vals) > 1 {
		return nil, status.Error(codes.Unauthenticated, "authz: more than one authorization header")
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return nil, status.Error(codes.Unauthenticated, "authz: authorization is not a bearer token")
	}
	p, err := i.verify.Verify(strings.TrimSpace(token))
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, "authz: "+reason(err))
	}
	return context.WithValue(ctx, principalKey{}, p), nil
}

// reason says why a token was refused without echoing its contents.
func reason(err error) string {
	for _, e := range []struct {
		err error
		msg string
	}{
		{identity.ErrTokenExpired, "token expired"},
		{identity.ErrUnknownKey, "token signed by an unknown key"},
		{identity.ErrBadSignature, "token signature invalid"},
		{identity.ErrInvalidToken, "token claims invalid"},
	} {
		if errors.Is(err, e.err) {
			return e.msg
		}
	}
	return "malformed token"
}

func (i *Interceptors) authorize(ctx context.Context, method string) error {
	p, ok := Principal(ctx)
	if !ok {
		if i.public(method) {
			return nil
		}
		// Authenticate did not run before this interceptor: fail closed.
		return status.Error(codes.Unauthenticated, "authz: caller not authenticated")
	}
	if _, public := publicMethods[method]; public {
		return nil
	}
	if err := i.policy.Authorize(method, p); err != nil {
		if errors.Is(err, identity.ErrUnknownMethod) {
			return status.Errorf(codes.PermissionDenied, "authz: %s is not in the role table: no token may call it", method)
		}
		// The policy's error names the roles that may call the method.
		return status.Errorf(codes.PermissionDenied, "authz: %v; a token with one of those roles is needed "+
			"(an admin mints one: fleetlearn token mint --role ROLE)", err)
	}
	return nil
}

// AuthenticateUnary is the grpc.UnaryServerInterceptor that verifies the token.
func (i *Interceptors) AuthenticateUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := i.authenticate(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if err := checkSize(info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// AuthenticateStream is the grpc.StreamServerInterceptor that verifies the token.
func (i *Interceptors) AuthenticateStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := i.authenticate(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
}

// AuthorizeUnary is the grpc.UnaryServerInterceptor that applies the policy.
func (i *Interceptors) AuthorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := i.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// AuthorizeStream is the grpc.StreamServerInterceptor that applies the policy.
func (i *Interceptors) AuthorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := i.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// Unary authenticates and authorizes in one interceptor, for servers
// without an audit interceptor to place between the two.
func (i *Interceptors) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return i.AuthenticateUnary(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return i.AuthorizeUnary(ctx, req, info, handler)
	})
}

// Stream authenticates and authorizes in one interceptor.
func (i *Interceptors) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return i.AuthenticateStream(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
		return i.AuthorizeStream(srv, ss, info, handler)
	})
}

// contextStream carries the authenticated context to the handler.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *contextStream) Context() context.Context { return s.ctx }
