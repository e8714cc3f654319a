package server_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v (%v), want %v", what, got, err, want)
	}
}

// TestAPISecurity: the real server refuses calls without a token or over
// plaintext, applies the role policy, and names callers in the audit log.
func TestAPISecurity(t *testing.T) {
	h := servertest.New(t)
	ctx := t.Context()
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "secured", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	task := baseTask("secured", version, module, 1)

	_, err := apiv1.NewTaskServiceClient(h.Dial(t, "")).ListTasks(ctx, &pb.ListTasksRequest{})
	wantCode(t, "no token", err, codes.Unauthenticated)

	plain, err := grpc.NewClient(h.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	_, err = apiv1.NewTaskServiceClient(plain).ListTasks(ctx, &pb.ListTasksRequest{})
	wantCode(t, "plaintext", err, codes.Unavailable)

	// A CA that is not the server's: the handshake fails.
	other, err := identity.LoadOrCreateTLS(t.TempDir(), []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	wrongCA, err := client.Dial(h.GRPCAddr(), client.WithCA(other.CAPEM()), client.WithToken(h.AdminToken()))
	if err != nil {
		t.Fatal(err)
	}
	defer wrongCA.Close()
	_, err = apiv1.NewTaskServiceClient(wrongCA).ListTasks(ctx, &pb.ListTasksRequest{})
	wantCode(t, "untrusted server certificate", err, codes.Unavailable)

	auditor := apiv1.NewTaskServiceClient(h.DialAs(t, "audrey", identity.RoleAuditor))
	_, err = auditor.CreateTask(ctx, &pb.CreateTaskRequest{Task: task})
	wantCode(t, "auditor CreateTask", err, codes.PermissionDenied)
	if _, err := auditor.ListTasks(ctx, &pb.ListTasksRequest{}); err != nil {
		t.Errorf("auditor ListTasks: %v", err)
	}
	_, err = apiv1.NewDeviceServiceClient(h.DialAs(t, "audrey", identity.RoleAuditor)).CreateEnrollmentToken(ctx,
		&pb.CreateEnrollmentTokenRequest{})
	wantCode(t, "auditor CreateEnrollmentToken", err, codes.PermissionDenied)

	operator := apiv1.NewTaskServiceClient(h.DialAs(t, "olga", identity.RoleOperator))
	created, err := operator.CreateTask(ctx, &pb.CreateTaskRequest{Task: task})
	if err != nil {
		t.Fatalf("operator CreateTask: %v", err)
	}
	if _, err := operator.StopTask(ctx, &pb.StopTaskRequest{TaskId: created.GetTask().GetId()}); err != nil {
		t.Fatalf("operator StopTask: %v", err)
	}
	_, err = apiv1.NewAuditServiceClient(h.DialAs(t, "olga", identity.RoleOperator)).QueryEntries(ctx, &pb.QueryEntriesRequest{})
	wantCode(t, "operator QueryEntries", err, codes.PermissionDenied)

	// The log names each caller by its token's subject.
	got := map[string]string{}
	for _, ev := range auditEvents(t, h, audit.TypeOperatorAction) {
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		a := p.(audit.OperatorAction)
		got[ev.Actor.ID+" "+a.Method] = a.Result
	}
	for k, want := range map[string]string{
		"admin fleetlearn.api.v1.ModuleService/RegisterModule":         audit.ResultOK,
		"audrey fleetlearn.api.v1.TaskService/CreateTask":              audit.ResultDenied,
		"audrey fleetlearn.api.v1.DeviceService/CreateEnrollmentToken": audit.ResultDenied,
		"olga fleetlearn.api.v1.TaskService/CreateTask":                audit.ResultOK,
		"olga fleetlearn.api.v1.TaskService/StopTask":                  audit.ResultOK,
	} {
		if got[k] != want {
			t.Errorf("audit %s: %q, want %q (log: %v)", k, got[k], want, got)
		}
	}
}

// TestAdminTokenAndCAFiles: the server writes its admin token 0600 and its
// CA certificate where the CLI reads them, keeps the token across restarts
// and replaces one it cannot verify.
func TestAdminTokenAndCAFiles(t *testing.T) {
	dir := t.TempDir()
	h := servertest.New(t, servertest.WithDataDir(dir))
	fi, err := os.Stat(server.AdminTokenPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("admin token mode %v", fi.Mode().Perm())
	}
	tok, err := client.ReadToken(server.AdminTokenPath(dir))
	if err != nil || tok != h.AdminToken() {
		t.Fatalf("admin token file: %v", err)
	}
	ca, err := os.ReadFile(server.CAFile(dir))
	if err != nil || !bytes.Equal(ca, h.CACertPEM()) {
		t.Fatalf("CA file: %v", err)
	}
	conn, err := client.Dial(h.GRPCAddr(), client.WithCA(ca), client.WithToken(tok))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := apiv1.NewTaskServiceClient(conn).ListTasks(t.Context(), &pb.ListTasksRequest{}); err != nil {
		t.Fatalf("with the files: %v", err)
	}
	h.Shutdown(context.Background())

	h2 := servertest.New(t, servertest.WithDataDir(dir))
	if h2.AdminToken() != tok {
		t.Error("admin token replaced on restart")
	}
	h2.Shutdown(context.Background())

	if err := os.WriteFile(server.AdminTokenPath(dir), []byte("not.a.token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h3 := servertest.New(t, servertest.WithDataDir(dir))
	if h3.AdminToken() == tok || h3.AdminToken() == "" {
		t.Error("an unverifiable admin token was kept")
	}
	if _, err := h3.Tasks.ListTasks(t.Context(), &pb.ListTasksRequest{}); err != nil {
		t.Fatalf("new admin token: %v", err)
	}
}

// TestModuleSignatures: RegisterModule accepts only modules signed by a
// trusted publisher over their exact bytes, and hands the signature on.
func TestModuleSignatures(t *testing.T) {
	h := servertest.New(t)
	ctx := t.Context()
	code := wasmtest.Build(t, wasmtest.Softmax)
	untrusted, _ := servertest.NewPublisher(t)
	register := func(name string, sig string) error {
		_, err := client.RegisterModule(ctx, h.Modules, &pb.RegisterModuleHeader{Name: name, Signature: []byte(sig)},
			bytes.NewReader(code))
		return err
	}
	sign := func(p *identity.Publisher, name string, b []byte) string {
		s, err := p.SignModule(name, b)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	other := append(bytes.Clone(code), 0)
	wantCode(t, "unsigned", register("m", ""), codes.InvalidArgument)
	wantCode(t, "garbage signature", register("m", "not-a-jws"), codes.InvalidArgument)
	wantCode(t, "untrusted publisher", register("m", sign(untrusted, "m", code)), codes.PermissionDenied)
	wantCode(t, "signature over other bytes", register("m", sign(h.Publisher, "m", other)), codes.PermissionDenied)
	wantCode(t, "signature for another name", register("other", sign(h.Publisher, "m", code)), codes.InvalidArgument)

	sig := sign(h.Publisher, "m", code)
	if err := register("m", sig); err != nil {
		t.Fatalf("signed module: %v", err)
	}
	res, err := h.Modules.ListModules(ctx, &pb.ListModulesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetModules()) != 1 {
		t.Fatalf("%d modules registered", len(res.GetModules()))
	}
	m := res.GetModules()[0]
	if string(m.GetSignature()) != sig || m.GetKeyId() != h.Publisher.KeyID() {
		t.Errorf("stored signature %q by %q", m.GetSignature(), m.GetKeyId())
	}
	// The task's module ref carries the signature into every round plan.
	init, _ := train.InitMLP([]int{8, 3}, 1)
	created := h.CreateTask(t, baseTask("signed", h.ImportModel(t, "base", init), m.GetRef().GetSha256(), 1))
	if string(created.GetModule().GetSignature()) != sig {
		t.Errorf("task module ref signature %q", created.GetModule().GetSignature())
	}
	if _, err := identity.ParseTrustedPublishers(nil); err == nil {
		t.Fatal("empty publisher set parsed")
	}

	// A server with no trusted publishers refuses every module.
	bare := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.ModulePublishersJWKS = nil }))
	_, err = client.RegisterModule(ctx, bare.Modules, &pb.RegisterModuleHeader{Name: "m", Signature: []byte(sig)},
		bytes.NewReader(code))
	wantCode(t, "no trusted publishers", err, codes.FailedPrecondition)
}

// fakeNATS stands in for the NATS device authority.
type fakeNATS struct {
	issued  []string
	revoked []string
}

func (f *fakeNATS) DeviceUserJWT(device, key string, _ time.Time) (string, error) {
	f.issued = append(f.issued, device+"/"+key)
	return "jwt-for-" + device, nil
}

func (f *fakeNATS) Revoke(_ context.Context, key string) error {
	f.revoked = append(f.revoked, key)
	return nil
}

func newDeviceKey(t *testing.T) string {
	t.Helper()
	k, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.ID()
}

// TestEnrollment: a device enrolls with only the CA and a token; tokens
// are single-use, expire and are scoped to the fleet; revoked keys stay out.
func TestEnrollment(t *testing.T) {
	dir := t.TempDir()
	h := servertest.New(t, servertest.WithDataDir(dir), servertest.WithConfig(func(c *server.Config) { c.Fleet = "lab" }))
	ctx := t.Context()
	device := apiv1.NewEnrollmentServiceClient(h.Dial(t, ""))
	mint := func(req *pb.CreateEnrollmentTokenRequest) string {
		t.Helper()
		res, err := h.Devices.CreateEnrollmentToken(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res.GetToken()
	}

	tok := mint(&pb.CreateEnrollmentTokenRequest{Group: "north", Ttl: durationpb.New(time.Hour)})
	key := newDeviceKey(t)
	res, err := device.Enroll(ctx, &pb.EnrollRequest{Token: tok, KeyId: key,
		Attributes: &pb.DeviceAttributes{DeviceClass: "gateway"}})
	if err != nil {
		t.Fatalf("enroll: %v", err)
	}
	d := res.GetDevice()
	if d.GetId() == "" || d.GetKeyId() != key || d.GetFleet() != "lab" || d.GetGroup() != "north" || res.GetUserJwt() == "" {
		t.Fatalf("enrolled %v, jwt %q", d, res.GetUserJwt())
	}
	if len(res.GetModulePublishersJwks()) == 0 {
		t.Error("no publisher set returned")
	}

	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: tok, KeyId: newDeviceKey(t)})
	wantCode(t, "reused token", err, codes.PermissionDenied)
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: mint(&pb.CreateEnrollmentTokenRequest{}), KeyId: key})
	wantCode(t, "key enrolled twice", err, codes.AlreadyExists)
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: tok[:len(tok)-4] + "AAAA", KeyId: newDeviceKey(t)})
	wantCode(t, "forged token", err, codes.Unauthenticated)
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: "garbage", KeyId: newDeviceKey(t)})
	wantCode(t, "garbage token", err, codes.Unauthenticated)
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: mint(&pb.CreateEnrollmentTokenRequest{}), KeyId: "UNOTAKEY"})
	wantCode(t, "bad key id", err, codes.InvalidArgument)
	_, err = h.Devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{Fleet: "elsewhere"})
	wantCode(t, "token for another fleet", err, codes.InvalidArgument)
	_, err = h.Devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{Ttl: durationpb.New(8 * 24 * time.Hour)})
	wantCode(t, "ttl beyond the maximum", err, codes.InvalidArgument)

	// Tokens signed with the server's key but expired, or for another fleet.
	key2 := readEnrollKey(t, dir)
	past, err := identity.NewEnrollmentIssuer(key2, identity.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }))
	if err != nil {
		t.Fatal(err)
	}
	expired, _, err := past.Mint("lab", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: expired, KeyId: newDeviceKey(t)})
	wantCode(t, "expired token", err, codes.Unauthenticated)
	now, err := identity.NewEnrollmentIssuer(key2)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _, err := now.Mint("elsewhere", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: foreign, KeyId: newDeviceKey(t)})
	wantCode(t, "wrong fleet", err, codes.PermissionDenied)

	// A refusal for the key or the id leaves the token usable.
	tok2 := mint(&pb.CreateEnrollmentTokenRequest{})
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: tok2, KeyId: newDeviceKey(t), DeviceId: d.GetId()})
	wantCode(t, "device id taken", err, codes.AlreadyExists)
	second, err := device.Enroll(ctx, &pb.EnrollRequest{Token: tok2, KeyId: newDeviceKey(t), DeviceId: "edge-7"})
	if err != nil || second.GetDevice().GetId() != "edge-7" {
		t.Fatalf("enroll with a chosen id after a refusal: %v %v", second, err)
	}

	list, err := apiv1.NewDeviceServiceClient(h.DialAs(t, "audrey", identity.RoleAuditor)).ListDevices(ctx,
		&pb.ListDevicesRequest{PageSize: 1})
	if err != nil || len(list.GetDevices()) != 1 || list.GetDevices()[0].GetId() != d.GetId() || list.GetNextPageToken() == "" {
		t.Fatalf("list page 1: %v %v", list, err)
	}
	list, err = h.Devices.ListDevices(ctx, &pb.ListDevicesRequest{PageSize: 1, PageToken: list.GetNextPageToken()})
	if err != nil || len(list.GetDevices()) != 1 || list.GetDevices()[0].GetId() != "edge-7" {
		t.Fatalf("list page 2: %v %v", list, err)
	}

	_, err = apiv1.NewDeviceServiceClient(h.DialAs(t, "audrey", identity.RoleAuditor)).RevokeDevice(ctx,
		&pb.RevokeDeviceRequest{DeviceId: d.GetId()})
	wantCode(t, "auditor revokes", err, codes.PermissionDenied)
	rev, err := h.Devices.RevokeDevice(ctx, &pb.RevokeDeviceRequest{DeviceId: d.GetId(), Reason: "lost"})
	if err != nil || rev.GetDevice().GetRevokeTime() == nil || rev.GetDevice().GetRevokeReason() != "lost" {
		t.Fatalf("revoke: %v %v", rev, err)
	}
	_, err = h.Devices.RevokeDevice(ctx, &pb.RevokeDeviceRequest{DeviceId: d.GetId()})
	wantCode(t, "revoke twice", err, codes.FailedPrecondition)
	_, err = h.Devices.RevokeDevice(ctx, &pb.RevokeDeviceRequest{DeviceId: "nobody"})
	wantCode(t, "revoke unknown", err, codes.NotFound)
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: mint(&pb.CreateEnrollmentTokenRequest{}), KeyId: key})
	wantCode(t, "revoked key re-enrolls", err, codes.PermissionDenied)
	active, err := h.Devices.ListDevices(ctx, &pb.ListDevicesRequest{})
	if err != nil || len(active.GetDevices()) != 1 {
		t.Fatalf("active devices: %v %v", active, err)
	}
	all, err := h.Devices.ListDevices(ctx, &pb.ListDevicesRequest{IncludeRevoked: true})
	if err != nil || len(all.GetDevices()) != 2 {
		t.Fatalf("all devices: %v %v", all, err)
	}

	// The log has both enrollments and the revocation under pseudonyms.
	enrolled, revoked := auditEvents(t, h, audit.TypeDeviceEnrolled), auditEvents(t, h, audit.TypeDeviceRevoked)
	if len(enrolled) != 2 || len(revoked) != 1 {
		t.Fatalf("%d enrollments and %d revocations logged, want 2 and 1", len(enrolled), len(revoked))
	}
	for _, ev := range append(enrolled, revoked...) {
		if bytes.Contains(ev.Payload, []byte(d.GetId())) || ev.Actor.ID == d.GetId() {
			t.Errorf("raw device id in the audit log: %s by %v", ev.Payload, ev.Actor)
		}
	}

	// Restarted, the server still refuses the redeemed token.
	h.Shutdown(context.Background())
	h2 := servertest.New(t, servertest.WithDataDir(dir), servertest.WithConfig(func(c *server.Config) { c.Fleet = "lab" }))
	_, err = apiv1.NewEnrollmentServiceClient(h2.Dial(t, "")).Enroll(ctx, &pb.EnrollRequest{Token: tok2, KeyId: newDeviceKey(t)})
	wantCode(t, "reused token after restart", err, codes.PermissionDenied)
}

// TestEnrollmentOracle: a caller without a genuine enrollment token learns
// nothing of the registry: a forged, expired, foreign-key or garbage token
// gets the same Unauthenticated answer whether the device id or key it names
// is enrolled, revoked or fresh. A genuine token still learns that an id is
// taken, and its holder may then enroll under another.
func TestEnrollmentOracle(t *testing.T) {
	dir := t.TempDir()
	h := servertest.New(t, servertest.WithDataDir(dir), servertest.WithConfig(func(c *server.Config) { c.Fleet = "lab" }))
	ctx := t.Context()
	device := apiv1.NewEnrollmentServiceClient(h.Dial(t, ""))
	mint := func() string {
		t.Helper()
		res, err := h.Devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetToken()
	}
	enrolledKey, revokedKey := newDeviceKey(t), newDeviceKey(t)
	if _, err := device.Enroll(ctx, &pb.EnrollRequest{Token: mint(), KeyId: enrolledKey, DeviceId: "edge-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := device.Enroll(ctx, &pb.EnrollRequest{Token: mint(), KeyId: revokedKey, DeviceId: "edge-2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Devices.RevokeDevice(ctx, &pb.RevokeDeviceRequest{DeviceId: "edge-2", Reason: "lost"}); err != nil {
		t.Fatal(err)
	}

	good := mint()
	parts := strings.Split(good, ".")
	forged := parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2]))
	past, err := identity.NewEnrollmentIssuer(readEnrollKey(t, dir), identity.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }))
	if err != nil {
		t.Fatal(err)
	}
	expired, _, err := past.Mint("lab", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := identity.NewEnrollmentIssuer(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _, err := stranger.Mint("lab", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	fresh := newDeviceKey(t)
	for _, bad := range []struct{ name, tok string }{
		{"forged", forged}, {"expired", expired}, {"another server's key", foreign}, {"garbage", "garbage"},
	} {
		answer := func(what string, req *pb.EnrollRequest) string {
			t.Helper()
			req.Token = bad.tok
			_, err := device.Enroll(ctx, req)
			wantCode(t, bad.name+" token, "+what, err, codes.Unauthenticated)
			return status.Convert(err).Message()
		}
		base := answer("fresh id and key", &pb.EnrollRequest{KeyId: fresh, DeviceId: "edge-new"})
		for what, req := range map[string]*pb.EnrollRequest{
			"enrolled id":  {KeyId: fresh, DeviceId: "edge-1"},
			"revoked id":   {KeyId: fresh, DeviceId: "edge-2"},
			"enrolled key": {KeyId: enrolledKey},
			"revoked key":  {KeyId: revokedKey},
		} {
			if got := answer(what, req); got != base {
				t.Errorf("%s token, %s: answer %q differs from a fresh one's %q", bad.name, what, got, base)
			}
		}
	}

	// Honest work alongside: the genuine token is told the id is taken,
	// stays usable, and enrolls under a fresh id.
	_, err = device.Enroll(ctx, &pb.EnrollRequest{Token: good, KeyId: fresh, DeviceId: "edge-1"})
	wantCode(t, "genuine token, enrolled id", err, codes.AlreadyExists)
	res, err := device.Enroll(ctx, &pb.EnrollRequest{Token: good, KeyId: fresh, DeviceId: "edge-new"})
	if err != nil || res.GetDevice().GetId() != "edge-new" {
		t.Fatalf("genuine token after the refusals: %v %v", res, err)
	}
}

// TestEnrollmentNATSAuthority: with a NATS authority, Enroll returns the
// device's user JWT and RevokeDevice withdraws the key.
func TestEnrollmentNATSAuthority(t *testing.T) {
	h := servertest.New(t)
	f := &fakeNATS{}
	server.SetDeviceAuthority(h.Server, f)
	ctx := t.Context()
	tok, err := h.Devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	key := newDeviceKey(t)
	res, err := apiv1.NewEnrollmentServiceClient(h.Dial(t, "")).Enroll(ctx, &pb.EnrollRequest{Token: tok.GetToken(), KeyId: key})
	if err != nil {
		t.Fatal(err)
	}
	id := res.GetDevice().GetId()
	if res.GetUserJwt() != "jwt-for-"+id || len(f.issued) != 1 || f.issued[0] != id+"/"+key || res.GetNatsUrl() != h.NATSURL() {
		t.Fatalf("jwt %q url %q issued %v", res.GetUserJwt(), res.GetNatsUrl(), f.issued)
	}
	if _, err := h.Devices.RevokeDevice(ctx, &pb.RevokeDeviceRequest{DeviceId: id}); err != nil {
		t.Fatal(err)
	}
	if len(f.revoked) != 1 || f.revoked[0] != key {
		t.Fatalf("revoked %v", f.revoked)
	}
}

func readEnrollKey(t *testing.T, dir string) ed25519.PrivateKey {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, server.KeysDir, server.EnrollKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	k, err := identity.ParseSigningKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// auditEvents are the verified events of type typ in h's log.
func auditEvents(t *testing.T, h *servertest.Harness, typ audit.EventType) []audit.Event {
	t.Helper()
	return h.AuditEvents(t, &pb.AuditFilter{EventType: string(typ)})
}
