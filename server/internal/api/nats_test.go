package api_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/api/apitest"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// natsCreds is a credentials backend that records what reached it and
// fails with err.
type natsCreds struct {
	calls int
	last  *pb.IssueCredentialsRequest
	err   error
}

func (n *natsCreds) IssueCredentials(_ context.Context, req *pb.IssueCredentialsRequest) (*pb.IssueCredentialsResponse, error) {
	n.calls++
	n.last = req
	if n.err != nil {
		return nil, n.err
	}
	return &pb.IssueCredentialsResponse{UserJwt: "jwt", Role: req.GetRole()}, nil
}

func userKey(t *testing.T) *identity.UserKey {
	t.Helper()
	k, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestNATSCredentialsRequestsRefused(t *testing.T) {
	n := &natsCreds{}
	e := newEnv(t, api.WithNATSCredentials(n))
	ctx := testContext(t)
	c := apiv1.NewNATSServiceClient(e.conn)
	k := userKey(t)
	observer := pb.NATSRole_NATS_ROLE_OBSERVER
	// Another last character, whatever the random key's is.
	badSum := k.ID()[:55] + map[bool]string{true: "B", false: "A"}[k.ID()[55] == 'A']
	for name, req := range map[string]*pb.IssueCredentialsRequest{
		"no key":                       {Role: observer},
		"seed instead of key":          {PublicKey: string(k.Seed()), Role: observer},
		"account key":                  {PublicKey: "A" + k.ID()[1:], Role: observer},
		"key with a bad checksum":      {PublicKey: badSum, Role: observer},
		"huge key":                     {PublicKey: strings.Repeat("U", 4096), Role: observer},
		"no role":                      {PublicKey: k.ID()},
		"unknown role":                 {PublicKey: k.ID(), Role: pb.NATSRole(99)},
		"negative ttl":                 {PublicKey: k.ID(), Role: observer, Ttl: durationpb.New(-time.Hour)},
		"zero ttl given":               {PublicKey: k.ID(), Role: observer, Ttl: durationpb.New(0)},
		"name with a dot (a subject)":  {PublicKey: k.ID(), Role: observer, Name: "a.b"},
		"name with a wildcard":         {PublicKey: k.ID(), Role: observer, Name: "ops>"},
		"seed instead of key, trimmed": {PublicKey: strings.TrimSpace(" " + string(k.Seed())), Role: observer},
	} {
		_, err := c.IssueCredentials(ctx, req)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), "issue nats credentials: ") {
			t.Errorf("%s: %v", name, err)
		}
		// The seed is the secret the caller keeps: an error never repeats it.
		if err != nil && strings.Contains(err.Error(), string(k.Seed()[2:20])) {
			t.Errorf("%s: the error echoes the seed: %v", name, err)
		}
	}
	if n.calls != 0 {
		t.Errorf("%d refused requests reached the backend", n.calls)
	}
	req := &pb.IssueCredentialsRequest{PublicKey: k.ID(), Role: pb.NATSRole_NATS_ROLE_SYSTEM, Ttl: durationpb.New(time.Hour), Name: "ops-1"}
	res, err := c.IssueCredentials(ctx, req)
	if err != nil || res.GetUserJwt() != "jwt" || n.last.GetName() != "ops-1" || n.last.GetTtl().AsDuration() != time.Hour {
		t.Fatalf("good request: %v, %v (backend saw %v)", res, err, n.last)
	}
}

func TestNATSCredentialsErrorCodes(t *testing.T) {
	n := &natsCreds{}
	e := newEnv(t, api.WithNATSCredentials(n))
	ctx := testContext(t)
	req := &pb.IssueCredentialsRequest{PublicKey: userKey(t).ID(), Role: pb.NATSRole_NATS_ROLE_OPERATOR}
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("nats runs without authorization: %w", backend.ErrPrecondition), codes.FailedPrecondition},
		{fmt.Errorf("ttl too long: %w", backend.ErrInvalid), codes.InvalidArgument},
		{fmt.Errorf("account key unreadable"), codes.Internal},
	} {
		n.err = c.err
		_, err := apiv1.NewNATSServiceClient(e.conn).IssueCredentials(ctx, req)
		if status.Code(err) != c.want {
			t.Errorf("%v: %v, want %v", c.err, err, c.want)
		}
	}
}

func TestNATSServiceOnlyWithCredentials(t *testing.T) {
	e := newEnv(t)
	_, err := apiv1.NewNATSServiceClient(e.conn).IssueCredentials(testContext(t),
		&pb.IssueCredentialsRequest{PublicKey: userKey(t).ID(), Role: pb.NATSRole_NATS_ROLE_OBSERVER})
	wantCode(t, err, codes.Unimplemented)
}

// TestNATSCredentialsAudited: issuing credentials hands out access, so the
// audit interceptor records it, granted or refused, with the role and key.
func TestNATSCredentialsAudited(t *testing.T) {
	lg, err := audit.Open(t.Context(), t.TempDir(), audit.WithOrigin("test.fleetlearn/audit"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })
	rec := api.NewAuditInterceptor(lg, func(context.Context) string { return "alice" }, nil)
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(rec.Unary))
	api.Register(s, apitest.New(), api.WithNATSCredentials(&natsCreds{}))
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
	c := apiv1.NewNATSServiceClient(conn)
	ctx := testContext(t)

	key := userKey(t).ID()
	if _, err := c.IssueCredentials(ctx, &pb.IssueCredentialsRequest{PublicKey: key, Role: pb.NATSRole_NATS_ROLE_OBSERVER}); err != nil {
		t.Fatal(err)
	}
	_, err = c.IssueCredentials(ctx, &pb.IssueCredentialsRequest{PublicKey: "not-a-key", Role: pb.NATSRole(7)})
	wantCode(t, err, codes.InvalidArgument)

	got, actors := actions(t, lg)
	want := []audit.OperatorAction{
		{Method: "fleetlearn.api.v1.NATSService/IssueCredentials", Resource: "nats-credentials/observer/" + key,
			Result: audit.ResultOK, Code: "OK"},
		{Method: "fleetlearn.api.v1.NATSService/IssueCredentials", Resource: "nats-credentials/unknown",
			Result: audit.ResultFailed, Code: "INVALID_ARGUMENT"},
	}
	if len(got) != len(want) {
		t.Fatalf("recorded %d actions, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if len(got[i].RequestSHA256) != 64 {
			t.Errorf("action %d: request digest %q", i, got[i].RequestSHA256)
		}
		got[i].RequestSHA256 = ""
		if got[i] != want[i] || actors[i] != audit.Operator("alice") {
			t.Errorf("action %d = %+v by %v\nwant %+v by alice", i, got[i], actors[i], want[i])
		}
	}
}
