package identity

import (
	"fmt"
	"slices"
	"strings"
)

// Rule allows Roles to call Method, a gRPC full method name
// ("/fleetlearn.api.v1.TaskService/CreateTask").
type Rule struct {
	Method string
	Roles  []Role
}

// Policy decides which roles may call which gRPC methods. Methods it does
// not list are denied to everyone, admins included, so a new RPC stays
// closed until someone decides who may call it.
type Policy struct {
	rules  map[string][]Role
	public map[string]bool // services callable without a token
	authed map[string]bool // services any authenticated caller may use
}

// Service names the policy treats as a whole.
const (
	// HealthService answers load balancers and orchestrators, which hold no
	// token; it tells nothing but serving status.
	HealthService = "grpc.health.v1.Health"
	// ReflectionService describes the API. The schema is public, but the
	// server only describes itself to authenticated callers, to give
	// unauthenticated scanners nothing to enumerate.
	ReflectionService      = "grpc.reflection.v1.ServerReflection"
	ReflectionAlphaService = "grpc.reflection.v1alpha.ServerReflection"
	// EnrollmentService admits devices, which hold no API token: the
	// enrollment token in the request is the credential, checked by the
	// service itself.
	EnrollmentService = "fleetlearn.api.v1.EnrollmentService"
)

const (
	svcTask   = "/fleetlearn.api.v1.TaskService/"
	svcModel  = "/fleetlearn.api.v1.ModelService/"
	svcModule = "/fleetlearn.api.v1.ModuleService/"
	svcAudit  = "/fleetlearn.api.v1.AuditService/"
	svcDevice = "/fleetlearn.api.v1.DeviceService/"
	svcNATS   = "/fleetlearn.api.v1.NATSService/"
	svcPool   = "/fleetlearn.api.v1.PoolService/"
	svcWorker = "/fleetlearn.api.v1.PoolWorkerService/"
)

// DefaultPolicy is Fleetlearn's role table:
//
//   - admin: every method; alone NATS credentials for tools
//     (NATSService).
//   - operator: tasks, models, modules and devices (enrollment tokens,
//     revocation), read and write; audit checkpoints, proofs and public
//     keys (what any witness sees), not the entries themselves.
//   - auditor: the whole audit log; task, round, model, module and device
//     views; no writes and no model weights (ExportModel).
//   - pool-worker: PoolWorkerService (register, heartbeat, the ranks it
//     is leased: their checkpoints, averages and logs) and reading models
//     (GetModel, ListModels, ExportModel), not importing them.
//   - operators submit and cancel pool jobs and read their logs; auditors
//     see jobs and workers, not logs (a script's output may hold data).
//
// Health checks and enrollment need no token; reflection needs any valid
// token.
func DefaultPolicy() *Policy {
	a, o, au, pw := RoleAdmin, RoleOperator, RoleAuditor, RolePoolWorker
	rules := []Rule{
		{svcTask + "CreateTask", []Role{a, o}},
		{svcTask + "GetTask", []Role{a, o, au}},
		{svcTask + "ListTasks", []Role{a, o, au}},
		{svcTask + "StopTask", []Role{a, o}},
		{svcTask + "ResumeTask", []Role{a, o}},
		{svcTask + "WatchTask", []Role{a, o, au}},
		{svcTask + "ListRounds", []Role{a, o, au}},

		// Pool jobs' models are stored by the server (the job's then-model),
		// never imported by a worker; a job script can read its worker's
		// token, so the token must not be able to add models.
		{svcModel + "ImportModel", []Role{a, o}},
		{svcModel + "ExportModel", []Role{a, o, pw}},
		{svcModel + "GetModel", []Role{a, o, au, pw}},
		{svcModel + "ListModels", []Role{a, o, au, pw}},

		{svcModule + "RegisterModule", []Role{a, o}},
		{svcModule + "GetModule", []Role{a, o, au}},
		{svcModule + "ListModules", []Role{a, o, au}},

		{svcAudit + "QueryEntries", []Role{a, au}},
		{svcAudit + "ExportEntries", []Role{a, au}},
		{svcAudit + "GetCheckpoint", []Role{a, o, au}},
		{svcAudit + "GetInclusionProof", []Role{a, o, au}},
		{svcAudit + "GetConsistencyProof", []Role{a, o, au}},
		{svcAudit + "GetPublicKeys", []Role{a, o, au}},

		{svcDevice + "CreateEnrollmentToken", []Role{a, o}},
		{svcDevice + "ListDevices", []Role{a, o, au}},
		{svcDevice + "RevokeDevice", []Role{a, o}},

		{svcPool + "SubmitJob", []Role{a, o}},
		{svcPool + "CancelJob", []Role{a, o}},
		{svcPool + "GetJob", []Role{a, o, au}},
		{svcPool + "ListJobs", []Role{a, o, au}},
		{svcPool + "WatchJob", []Role{a, o, au}},
		{svcPool + "JobLogs", []Role{a, o}},
		{svcPool + "ListWorkers", []Role{a, o, au}},

		{svcWorker + "RegisterWorker", []Role{a, pw}},
		{svcWorker + "Heartbeat", []Role{a, pw}},
		{svcWorker + "RankExited", []Role{a, pw}},
		{svcWorker + "PutCheckpointBlob", []Role{a, pw}},
		{svcWorker + "HasCheckpointBlob", []Role{a, pw}},
		{svcWorker + "GetCheckpointBlob", []Role{a, pw}},
		{svcWorker + "CommitCheckpoint", []Role{a, pw}},
		{svcWorker + "GetRankCheckpoint", []Role{a, pw}},
		{svcWorker + "ListRankCheckpoints", []Role{a, pw}},
		{svcWorker + "Average", []Role{a, pw}},
		{svcWorker + "OuterSync", []Role{a, pw}},
		{svcWorker + "AppendLogs", []Role{a, pw}},

		// NATS credentials reach past the API's roles (the system account,
		// every device's messages): only admins hand them out.
		{svcNATS + "IssueCredentials", []Role{a}},
	}
	p, err := NewPolicy(rules, []string{HealthService, EnrollmentService}, []string{ReflectionService, ReflectionAlphaService})
	if err != nil {
		panic(err) // the table above is a constant
	}
	return p
}

// NewPolicy builds a policy from rules, the services anyone may call
// (public) and the services any authenticated caller may call (authed).
func NewPolicy(rules []Rule, public, authed []string) (*Policy, error) {
	const op = "identity: policy"
	p := &Policy{rules: map[string][]Role{}, public: map[string]bool{}, authed: map[string]bool{}}
	for _, r := range rules {
		svc, _, ok := splitMethod(r.Method)
		if !ok {
			return nil, fmt.Errorf("%s: %w: method %q is not /package.Service/Method", op, ErrBadInput, r.Method)
		}
		if _, dup := p.rules[r.Method]; dup {
			return nil, fmt.Errorf("%s: %w: method %s listed twice", op, ErrBadInput, r.Method)
		}
		if slices.Contains(public, svc) || slices.Contains(authed, svc) {
			return nil, fmt.Errorf("%s: %w: method %s belongs to an open service", op, ErrBadInput, r.Method)
		}
		rs, err := normalizeRoles(r.Roles)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", op, r.Method, err)
		}
		p.rules[r.Method] = rs
	}
	for _, s := range public {
		p.public[s] = true
	}
	for _, s := range authed {
		if p.public[s] {
			return nil, fmt.Errorf("%s: %w: service %s is both public and authenticated", op, ErrBadInput, s)
		}
		p.authed[s] = true
	}
	return p, nil
}

// splitMethod splits "/pkg.Service/Method".
func splitMethod(m string) (svc, name string, ok bool) {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return "", "", false
	}
	svc, name, ok = strings.Cut(rest, "/")
	if !ok || svc == "" || name == "" || strings.Contains(name, "/") {
		return "", "", false
	}
	return svc, name, true
}

// Public reports whether method may be called without a token.
func (p *Policy) Public(method string) bool {
	svc, _, ok := splitMethod(method)
	return ok && p.public[svc]
}

// Authorize returns nil when principal may call method, an error wrapping
// ErrPermissionDenied when its roles do not allow it, or ErrUnknownMethod
// when the policy does not list the method.
func (p *Policy) Authorize(method string, principal Principal) error {
	svc, _, ok := splitMethod(method)
	if ok && (p.public[svc] || p.authed[svc]) {
		return nil
	}
	allowed, ok := p.rules[method]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownMethod, method)
	}
	for _, r := range principal.Roles {
		if slices.Contains(allowed, r) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s may not call %s (allowed: %s)", ErrPermissionDenied, principal.Subject, method, joinRoles(allowed))
}

// Rules lists the policy's method rules sorted by method.
func (p *Policy) Rules() []Rule {
	out := make([]Rule, 0, len(p.rules))
	for m, rs := range p.rules {
		out = append(out, Rule{Method: m, Roles: slices.Clone(rs)})
	}
	slices.SortFunc(out, func(a, b Rule) int { return strings.Compare(a.Method, b.Method) })
	return out
}

func joinRoles(rs []Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}
