package identity_test

import (
	"crypto/ed25519"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
)

func TestAPITokens(t *testing.T) {
	clk := newClock()
	iss, err := identity.NewAPIIssuer(signingKey(t, "api"), identity.WithClock(clk.Now), identity.WithRand(newDetRand("api")))
	if err != nil {
		t.Fatal(err)
	}
	v, err := identity.NewAPIVerifier([]ed25519.PublicKey{iss.PublicKey()}, identity.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	tok, minted, err := iss.Mint("alice@example.org", []identity.Role{identity.RolePoolWorker, identity.RoleAuditor, identity.RoleAuditor}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, err := v.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if p.Subject != "alice@example.org" || !slices.Equal(p.Roles, []identity.Role{identity.RoleAuditor, identity.RolePoolWorker}) ||
		p.TokenID != minted.TokenID || !p.Expires.Equal(minted.Expires) || !p.Has(identity.RoleAuditor) || p.Has(identity.RoleAdmin) {
		t.Fatalf("principal %+v, minted %+v", p, minted)
	}
	clk.Add(time.Hour + identity.DefaultLeeway + time.Second)
	if _, err := v.Verify(tok); !errors.Is(err, identity.ErrTokenExpired) {
		t.Fatalf("expired: %v", err)
	}
}

func TestAPITokenBadInput(t *testing.T) {
	iss, err := identity.NewAPIIssuer(signingKey(t, "api"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		subject string
		roles   []identity.Role
		ttl     time.Duration
	}{
		{"", []identity.Role{identity.RoleAdmin}, time.Hour},
		{"a\nb", []identity.Role{identity.RoleAdmin}, time.Hour},
		{strings.Repeat("a", identity.MaxSubjectBytes+1), []identity.Role{identity.RoleAdmin}, time.Hour},
		{"\xff", []identity.Role{identity.RoleAdmin}, time.Hour},
		{"alice", nil, time.Hour},
		{"alice", []identity.Role{"root"}, time.Hour},
		{"alice", []identity.Role{identity.RoleAdmin}, 0},
		{"alice", []identity.Role{identity.RoleAdmin}, identity.DefaultAPIMaxTTL + time.Second},
	} {
		if _, _, err := iss.Mint(c.subject, c.roles, c.ttl); err == nil {
			t.Errorf("Mint(%q, %v, %v) accepted", c.subject, c.roles, c.ttl)
		}
	}
	if _, err := identity.ParseRole("superuser"); !errors.Is(err, identity.ErrUnknownRole) {
		t.Errorf("ParseRole: %v", err)
	}
	if r, err := identity.ParseRole("pool-worker"); err != nil || r != identity.RolePoolWorker {
		t.Errorf("ParseRole(pool-worker) = %v, %v", r, err)
	}
	if _, err := identity.NewAPIVerifier(nil); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("no keys: %v", err)
	}
}

func TestAPITokenNotEnrollment(t *testing.T) {
	key := signingKey(t, "shared")
	enr, _ := identity.NewEnrollmentIssuer(key)
	v, _ := identity.NewAPIVerifier([]ed25519.PublicKey{key.Public().(ed25519.PublicKey)})
	tok, _, err := enr.Mint("fleet-a", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok); !errors.Is(err, identity.ErrMalformedToken) {
		t.Fatalf("enrollment token as API token: %v", err)
	}
}

func TestPolicy(t *testing.T) {
	p := identity.DefaultPolicy()
	who := func(roles ...identity.Role) identity.Principal { return identity.Principal{Subject: "x", Roles: roles} }
	for _, c := range []struct {
		method string
		p      identity.Principal
		want   error
	}{
		{"/fleetlearn.api.v1.TaskService/CreateTask", who(identity.RoleOperator), nil},
		{"/fleetlearn.api.v1.TaskService/CreateTask", who(identity.RoleAuditor), identity.ErrPermissionDenied},
		{"/fleetlearn.api.v1.TaskService/CreateTask", who(), identity.ErrPermissionDenied},
		{"/fleetlearn.api.v1.AuditService/QueryEntries", who(identity.RoleOperator), identity.ErrPermissionDenied},
		{"/fleetlearn.api.v1.ModelService/ImportModel", who(identity.RolePoolWorker), identity.ErrPermissionDenied},
		{"/fleetlearn.api.v1.ModelService/ImportModel", who(identity.RoleOperator), nil},
		{"/fleetlearn.api.v1.ModelService/ExportModel", who(identity.RolePoolWorker), nil},
		{"/fleetlearn.api.v1.TaskService/DeleteEverything", who(identity.RoleAdmin), identity.ErrUnknownMethod},
		{"/fleetlearn.api.v1.TaskService/", who(identity.RoleAdmin), identity.ErrUnknownMethod},
		{"garbage", who(identity.RoleAdmin), identity.ErrUnknownMethod},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", who(identity.RoleAuditor), nil},
		{"/grpc.health.v1.Health/Check", who(), nil},
		{"/fleetlearn.api.v1.EnrollmentService/Enroll", who(), nil},
		{"/fleetlearn.api.v1.DeviceService/CreateEnrollmentToken", who(identity.RoleOperator), nil},
		{"/fleetlearn.api.v1.DeviceService/RevokeDevice", who(identity.RoleAuditor), identity.ErrPermissionDenied},
		{"/fleetlearn.api.v1.DeviceService/ListDevices", who(identity.RoleAuditor), nil},
		{"/fleetlearn.api.v1.DeviceService/ListDevices", who(identity.RolePoolWorker), identity.ErrPermissionDenied},
	} {
		if err := p.Authorize(c.method, c.p); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("Authorize(%s, %v) = %v, want %v", c.method, c.p.Roles, err, c.want)
		}
	}
	if !p.Public("/grpc.health.v1.Health/Watch") || p.Public("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo") ||
		p.Public("/fleetlearn.api.v1.TaskService/GetTask") || p.Public("/grpc.health.v1.Health") ||
		!p.Public("/fleetlearn.api.v1.EnrollmentService/Enroll") || p.Public("/fleetlearn.api.v1.DeviceService/ListDevices") {
		t.Error("Public is wrong")
	}
	// Admin is allowed every listed method.
	for _, r := range p.Rules() {
		if err := p.Authorize(r.Method, who(identity.RoleAdmin)); err != nil {
			t.Errorf("admin %s: %v", r.Method, err)
		}
	}
}

func TestNewPolicyRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		rules          []identity.Rule
		public, authed []string
	}{
		"bad method":     {rules: []identity.Rule{{Method: "Task/Create", Roles: []identity.Role{identity.RoleAdmin}}}},
		"duplicate":      {rules: []identity.Rule{{"/a.S/M", []identity.Role{identity.RoleAdmin}}, {"/a.S/M", []identity.Role{identity.RoleAdmin}}}},
		"no roles":       {rules: []identity.Rule{{"/a.S/M", nil}}},
		"unknown role":   {rules: []identity.Rule{{"/a.S/M", []identity.Role{"root"}}}},
		"rule in public": {rules: []identity.Rule{{"/a.S/M", []identity.Role{identity.RoleAdmin}}}, public: []string{"a.S"}},
		"both":           {public: []string{"a.S"}, authed: []string{"a.S"}},
	} {
		if _, err := identity.NewPolicy(c.rules, c.public, c.authed); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
