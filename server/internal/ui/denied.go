package ui

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/identity"
)

// deniedCall is an API call the viewer's roles may not make, with the
// method it called: the API's own message names the method by its gRPC
// path, which means nothing to a viewer.
type deniedCall struct {
	method string
	st     *status.Status
}

func (e *deniedCall) Error() string { return e.st.Err().Error() }

// GRPCStatus keeps status.FromError and status.Code working on it.
func (e *deniedCall) GRPCStatus() *status.Status { return e.st }

// namedCalls marks the refusals of the API it wraps with the method that
// was refused.
type namedCalls struct{ grpc.ClientConnInterface }

func nameDenied(method string, err error) error {
	if s, ok := status.FromError(err); ok && s.Code() == codes.PermissionDenied {
		return &deniedCall{method: method, st: s}
	}
	return err
}

func (c namedCalls) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return nameDenied(method, c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...))
}

func (c namedCalls) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
	if err != nil {
		return nil, nameDenied(method, err)
	}
	return namedStream{s, method}, nil
}

// namedStream marks a refusal that arrives with a stream's first message.
type namedStream struct {
	grpc.ClientStream
	method string
}

func (s namedStream) RecvMsg(m any) error { return nameDenied(s.method, s.ClientStream.RecvMsg(m)) }

// what the dashboard's API calls do, as a viewer would say it.
var callNames = map[string]string{
	"TaskService/CreateTask":              "creating tasks",
	"TaskService/GetTask":                 "reading tasks",
	"TaskService/ListTasks":               "listing tasks",
	"TaskService/StopTask":                "stopping tasks",
	"TaskService/ResumeTask":              "resuming tasks",
	"TaskService/WatchTask":               "following tasks live",
	"TaskService/ListRounds":              "reading a task's rounds",
	"ModelService/GetModel":               "reading model versions",
	"ModelService/ListModels":             "listing model versions",
	"ModelService/ImportModel":            "importing model versions",
	"ModelService/ExportModel":            "downloading model weights",
	"ModuleService/RegisterModule":        "registering update modules",
	"ModuleService/GetModule":             "reading update modules",
	"ModuleService/ListModules":           "listing update modules",
	"AuditService/QueryEntries":           "reading the audit log's entries",
	"AuditService/ExportEntries":          "exporting the audit log's entries",
	"AuditService/GetCheckpoint":          "reading the audit log's checkpoints",
	"AuditService/GetInclusionProof":      "checking that an entry is in the audit log",
	"AuditService/GetConsistencyProof":    "checking that the audit log only grew",
	"AuditService/GetPublicKeys":          "reading the audit log's public keys",
	"AuditService/AddCosignature":         "cosigning the audit log's checkpoints",
	"DeviceService/CreateEnrollmentToken": "minting enrollment tokens",
	"DeviceService/ListDevices":           "listing the fleet's devices",
	"DeviceService/RevokeDevice":          "revoking devices",
	"PoolService/SubmitJob":               "submitting compute pool jobs",
	"PoolService/CancelJob":               "cancelling compute pool jobs",
	"PoolService/GetJob":                  "reading compute pool jobs",
	"PoolService/ListJobs":                "listing compute pool jobs",
	"PoolService/WatchJob":                "following compute pool jobs live",
	"PoolService/JobLogs":                 "reading compute pool jobs' logs",
	"PoolService/ListWorkers":             "listing compute pool workers",
}

// callName says what method does: from callNames, or else from its name
// ("/fleetlearn.api.v1.AuditService/QueryEntries" is "query entries in the
// audit service").
func callName(method string) string {
	rest := strings.TrimPrefix(method, "/")
	if i := strings.LastIndex(rest, "."); i >= 0 {
		rest = rest[i+1:]
	}
	if n, ok := callNames[rest]; ok {
		return n
	}
	svc, name, ok := strings.Cut(rest, "/")
	if !ok {
		return "this"
	}
	return words(name) + " in the " + words(strings.TrimSuffix(svc, "Service")) + " service"
}

// words splits a Go identifier into lower-case words: "QueryEntries" is
// "query entries".
func words(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// deniedMessage says, for a refusal of the viewer's call, what their roles
// may not do and which roles may. A refusal the dashboard cannot name
// (none of its calls) keeps the API's message.
func (h *Handler) deniedMessage(v *viewer, err error) string {
	var d *deniedCall
	if !errors.As(err, &d) {
		if s, ok := status.FromError(err); ok {
			return s.Message()
		}
		return err.Error()
	}
	var allowed []identity.Role
	for _, r := range h.cfg.Policy.Rules() {
		if r.Method == d.method {
			allowed = r.Roles
		}
	}
	what := callName(d.method)
	yours := "no role"
	if v != nil && len(v.Roles) > 0 {
		yours = "the " + roleList(v.Roles, "and") + " role"
		if len(v.Roles) > 1 {
			yours += "s"
		}
	}
	if len(allowed) == 0 {
		return fmt.Sprintf("%s is open to no role on this server; your token has %s", what, yours)
	}
	need := "the " + roleList(allowed, "or") + " role"
	return fmt.Sprintf("%s needs %s; your token has %s (an admin mints tokens: fleetlearn token mint --role %s)",
		what, need, yours, preferred(allowed))
}

// preferred is the role to ask for: the least powerful one that may.
func preferred(allowed []identity.Role) identity.Role {
	for _, r := range allowed {
		if r != identity.RoleAdmin {
			return r
		}
	}
	return allowed[0]
}

// roleList joins roles as a sentence does: "admin, auditor or operator".
func roleList(rs []identity.Role, conj string) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	slices.Sort(s)
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " " + conj + " " + s[len(s)-1]
}
