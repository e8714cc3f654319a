package ui

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/identity"
)

// TestDeniedMessage: a refused call is told in words, with the roles that
// may make it, never by its gRPC path; every method of the services the
// dashboard reads has words of its own.
func TestDeniedMessage(t *testing.T) {
	policy := identity.DefaultPolicy()
	for _, r := range policy.Rules() {
		parts := strings.Split(r.Method, "/") // "", "fleetlearn.api.v1.TaskService", "CreateTask"
		switch svc := parts[1][strings.LastIndex(parts[1], ".")+1:]; svc {
		case "TaskService", "ModelService", "ModuleService", "AuditService", "DeviceService", "PoolService":
			if strings.Contains(callName(r.Method), " service") {
				t.Errorf("%s has no words in callNames: %q", r.Method, callName(r.Method))
			}
		}
	}
	if got, want := callName("/x.v1.FooBarService/DoThing"), "do thing in the foo bar service"; got != want {
		t.Errorf("callName of an unknown method = %q, want %q", got, want)
	}

	h := &Handler{cfg: Config{Policy: policy}}
	const method = "/fleetlearn.api.v1.AuditService/QueryEntries"
	refusal := status.Error(codes.PermissionDenied, "authz: olga may not call "+method)
	err := nameDenied(method, refusal)
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != status.Convert(refusal).Message() {
		t.Fatalf("the named refusal lost its status: %v", err)
	}
	olga := &viewer{Principal: identity.Principal{Subject: "olga", Roles: []identity.Role{identity.RoleOperator}}}
	msg := h.deniedMessage(olga, err)
	want := "reading the audit log's entries needs the admin or auditor role; your token has the operator role " +
		"(an admin mints tokens: fleetlearn token mint --role auditor)"
	if msg != want {
		t.Errorf("deniedMessage = %q\nwant %q", msg, want)
	}
	two := &viewer{Principal: identity.Principal{Roles: []identity.Role{identity.RolePoolWorker, identity.RoleOperator}}}
	if msg := h.deniedMessage(two, err); !strings.Contains(msg, "your token has the operator and pool-worker roles") {
		t.Errorf("two roles: %q", msg)
	}
	// A refusal the dashboard did not name keeps the API's message.
	if msg := h.deniedMessage(olga, refusal); msg != status.Convert(refusal).Message() {
		t.Errorf("unnamed refusal: %q", msg)
	}
	// Other errors pass through unnamed.
	other := status.Error(codes.NotFound, "no such task")
	if nameDenied(method, other) != other {
		t.Error("a NotFound was named as a refusal")
	}
}
