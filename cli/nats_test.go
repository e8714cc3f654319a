package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/simfleet"
	"github.com/fleetlearn/fleetlearn/internal/testtool"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// natsCreds runs `nats creds` against h as its admin and returns the
// creds file and what the command printed.
func natsCreds(t *testing.T, h *servertest.Harness, role string, args ...string) (string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), role+".creds")
	out, err := runServer(t, h, append([]string{"nats", "creds", "--role", role, "-o", path}, args...)...)
	if err != nil {
		t.Fatalf("nats creds --role %s: %v", role, err)
	}
	return path, out
}

// credsClaims reads a creds file's user JWT and seed.
func credsClaims(t *testing.T, path string) (*natsjwt.UserClaims, *identity.UserKey) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := natsjwt.ParseDecoratedJWT(b)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := natsjwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := natsjwt.ParseDecoratedNKey(b)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	key, err := identity.ParseUserKey(seed)
	if err != nil {
		t.Fatal(err)
	}
	return claims, key
}

// connectWith connects to h's NATS with a creds file.
func connectWith(t *testing.T, h *servertest.Harness, creds string) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.UserCredentials(creds), nats.PermissionErrOnSubscribe(true),
		// Refusals are checked with LastError; the default handler would
		// print each.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}
	if strings.HasPrefix(h.NATSURL(), "tls://") {
		opts = append(opts, nats.RootCAs(server.CAFile(h.Dir)))
	}
	nc, err := nats.Connect(h.NATSURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// connectService connects to h's NATS as the aggregator's own user, which
// may publish anything: the test plays the server's and the devices' part.
func connectService(t *testing.T, h *servertest.Harness) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(h.NATSURL(), h.ServiceNATSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// refusedPublish publishes on subject and reports whether the server
// refused it: it answers a refused publish before the flush's PONG.
func refusedPublish(t *testing.T, nc *nats.Conn, subject string) bool {
	t.Helper()
	if err := nc.Publish(subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	err := nc.LastError()
	return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject)
}

// TestNATSCreds: an admin gets observer credentials whose seed stays in
// the file it wrote; with them a client reads JetStream and subscribes to
// the protocol's subjects, and publishes nothing on them.
func TestNATSCreds(t *testing.T) {
	h := servertest.New(t)
	path, out := natsCreds(t, h, "observer", "--name", "olga-laptop")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("creds file mode %v, want 0600", fi.Mode().Perm())
	}
	claims, key := credsClaims(t, path)
	if claims.Subject != key.ID() || claims.Name != "olga-laptop" {
		t.Errorf("JWT for %s named %q, seed for %s", claims.Subject, claims.Name, key.ID())
	}
	if exp := time.Until(time.Unix(claims.Expires, 0)); exp <= 23*time.Hour || exp > 24*time.Hour {
		t.Errorf("credentials expire in %v, want the default 24h", exp)
	}
	for _, want := range []string{"observer NATS credentials for user " + key.ID(),
		"nats --server " + h.NATSURL() + " --creds " + path + " stream ls", "obj ls fl_blobs", "sub 'fl.>'",
		"fleetlearn nats sub 'fl.>' --nats-url " + h.NATSURL()} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	nc := connectWith(t, h, path)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := js.StreamNames(t.Context())
	var streams []string
	for n := range names.Name() {
		streams = append(streams, n)
	}
	if names.Err() != nil || !strings.Contains(strings.Join(streams, ","), wire.StreamReports) {
		t.Errorf("stream names %v, %v", streams, names.Err())
	}
	if _, err := js.ObjectStore(t.Context(), wire.BlobBucket); err != nil {
		t.Errorf("object store: %v", err)
	}
	if _, err := nc.SubscribeSync("fl.>"); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil || nc.LastError() != nil {
		t.Fatalf("subscribe fl.>: %v, %v", err, nc.LastError())
	}
	for _, subject := range []string{wire.CheckInSubject("d-1"), wire.SubjectAnnounce, wire.ReportSubject("t", 1, "d-1"),
		"$JS.API.STREAM.DELETE." + wire.StreamReports, "$JS.API.STREAM.PURGE." + wire.StreamReports,
		"$JS.API.CONSUMER.DURABLE.CREATE." + wire.StreamReports + ".mine"} {
		if !refusedPublish(t, nc, subject) {
			t.Errorf("observer published on %s (last error %v)", subject, nc.LastError())
		}
	}

	// An operator also manages consumers; a system user asks the servers
	// for reports and nothing else.
	operator, _ := natsCreds(t, h, "operator")
	onc := connectWith(t, h, operator)
	for _, subject := range []string{"$JS.API.CONSUMER.DELETE." + wire.StreamReports + ".stale", "$JS.ACK.x"} {
		if refusedPublish(t, onc, subject) {
			t.Errorf("operator may not publish on %s", subject)
		}
	}
	for _, subject := range []string{wire.SubjectAnnounce, "$JS.API.STREAM.DELETE." + wire.StreamReports,
		"$JS.API.STREAM.MSG.DELETE." + wire.StreamReports, "$O." + wire.BlobBucket + ".M.x"} {
		if !refusedPublish(t, onc, subject) {
			t.Errorf("operator published on %s", subject)
		}
	}
	system, _ := natsCreds(t, h, "system")
	snc := connectWith(t, h, system)
	fleetAccount := claims.Issuer
	if sc, _ := credsClaims(t, system); sc.Issuer == fleetAccount {
		t.Errorf("the system user belongs to the FLEET account %s", fleetAccount)
	}
	for _, subject := range []string{"$SYS.REQ.SERVER.PING", "$SYS.REQ.SERVER.PING.JSZ", "$SYS.REQ.SERVER.NABC.VARZ"} {
		if refusedPublish(t, snc, subject) {
			t.Errorf("system user may not publish on %s", subject)
		}
	}
	for _, subject := range []string{"$SYS.REQ.ACCOUNT." + fleetAccount + ".CLAIMS.UPDATE", "$SYS.REQ.CLAIMS.UPDATE",
		"$SYS.REQ.SERVER.NABC.RELOAD", "$SYS.REQ.SERVER.NABC.KICK", "$SYS.REQ.SERVER.NABC.LDM", "$SYS.REQ.SERVER.PING.PROFILEZ"} {
		if !refusedPublish(t, snc, subject) {
			t.Errorf("system user published on %s", subject)
		}
	}
	if _, err := snc.SubscribeSync("$SYS.REQ.>"); err != nil {
		t.Fatal(err)
	}
	if err := snc.Flush(); err != nil || !errors.Is(snc.LastError(), nats.ErrPermissionViolation) ||
		!strings.Contains(snc.LastError().Error(), "Subscription") {
		t.Errorf("system user subscribed to the servers' requests: %v, %v", err, snc.LastError())
	}

	// The same request in creds - writes them to standard output.
	stdout, err := runServer(t, h, "nats", "creds", "--role", "system", "-o", "-")
	if err != nil || !strings.Contains(stdout, "-----BEGIN NATS USER JWT-----") || !strings.Contains(stdout, "SU") {
		t.Errorf("creds -o -: %v\n%s", err, stdout)
	}
}

// TestNATSCredsAudited: handing out credentials is an operator action in
// the audit log, and only admins may.
func TestNATSCredsAudited(t *testing.T) {
	h := servertest.New(t)
	natsCreds(t, h, "operator")
	res, err := apiv1.NewAuditServiceClient(h.Conn).QueryEntries(t.Context(), &pb.QueryEntriesRequest{
		Filter: &pb.AuditFilter{EventType: "operator.action", Actor: "operator:" + server.AdminSubject}})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range res.GetEntries() {
		parts := bytes.Split(e.GetJws(), []byte("."))
		if len(parts) != 3 {
			t.Fatalf("entry %d is not a compact JWS", e.GetIndex())
		}
		payload, err := base64.RawURLEncoding.DecodeString(string(parts[1]))
		if err != nil {
			t.Fatal(err)
		}
		found = found || bytes.Contains(payload, []byte(`"fleetlearn.api.v1.NATSService/IssueCredentials"`)) &&
			bytes.Contains(payload, []byte(`"nats-credentials/operator/U`)) && bytes.Contains(payload, []byte(`"ok"`))
	}
	if !found {
		t.Errorf("no operator action for IssueCredentials among %d entries", len(res.GetEntries()))
	}

	tok, err := h.MintToken("olga", []identity.Role{identity.RoleOperator}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := apiv1.NewNATSServiceClient(h.Dial(t, tok))
	k, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.IssueCredentials(t.Context(), &pb.IssueCredentialsRequest{PublicKey: k.ID(),
		Role: pb.NATSRole_NATS_ROLE_OBSERVER}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("an API operator issued NATS credentials: %v", err)
	}
}

// TestNATSCredsRefused: bad flags are usage errors before any call; the
// server refuses what only it can judge, saying why.
func TestNATSCredsRefused(t *testing.T) {
	h := servertest.New(t)
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"unknown role": {"--role", "root", "-o", filepath.Join(dir, "a")},
		"no role":      {"-o", filepath.Join(dir, "b")},
		"no file":      {"--role", "observer"},
		"zero ttl":     {"--role", "observer", "-o", filepath.Join(dir, "c"), "--ttl", "0s"},
		"dotted name":  {"--role", "observer", "-o", filepath.Join(dir, "d"), "--name", "a.b"},
	} {
		if _, err := runServer(t, h, append([]string{"nats", "creds"}, args...)...); !errors.Is(err, cli.ErrUsage) {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, err := runServer(t, h, "nats", "creds", "--role", "observer", "-o", filepath.Join(dir, "e"), "--ttl", "800h")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "maximum") {
		t.Errorf("ttl above the maximum: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused requests left files: %v", entries)
	}

	// Server-side checks the CLI cannot bypass.
	k, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	c := apiv1.NewNATSServiceClient(h.Conn)
	for name, req := range map[string]*pb.IssueCredentialsRequest{
		"seed":         {PublicKey: string(k.Seed()), Role: pb.NATSRole_NATS_ROLE_OBSERVER},
		"no role":      {PublicKey: k.ID()},
		"unknown role": {PublicKey: k.ID(), Role: pb.NATSRole(42)},
		"31 days":      {PublicKey: k.ID(), Role: pb.NATSRole_NATS_ROLE_OBSERVER, Ttl: durationpb.New(31 * 24 * time.Hour)},
	} {
		if _, err := c.IssueCredentials(t.Context(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}

	open := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.InsecureNATS = true }))
	_, err = runServer(t, open, "nats", "creds", "--role", "observer", "-o", filepath.Join(dir, "f"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "without authorization") {
		t.Errorf("server without NATS authorization: %v", err)
	}
}

// subLines runs `nats sub` with args in the background and returns its
// lines as they come; the command stops when the test ends.
func subLines(t *testing.T, h *servertest.Harness, args ...string) (<-chan map[string]any, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	root := cli.NewRootCommand(cli.WithGetenv(func(string) string { return "" }), cli.WithTerminal(false))
	root.SetOut(pw)
	root.SetErr(io.Discard)
	root.SetArgs(append([]string{"--ca", server.CAFile(h.Dir), "nats", "sub", "--nats-url", h.NATSURL()}, args...))
	done := make(chan error, 1)
	go func() {
		err := root.ExecuteContext(ctx)
		pw.CloseWithError(io.EOF)
		done <- err
	}()
	lines := make(chan map[string]any)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = map[string]any{"unparsed": sc.Text(), "error": err.Error()}
			}
			lines <- m
		}
	}()
	t.Cleanup(func() {
		cancel()
		pr.Close()
		for range lines {
		}
	})
	return lines, done
}

// TestNATSSub: each message prints as one JSON line, decoded by what its
// subject carries.
func TestNATSSub(t *testing.T) {
	h := servertest.New(t)
	creds, _ := natsCreds(t, h, "observer")
	lines, done := subLines(t, h, "fl.>", "--creds", creds)
	svc := connectService(t, h)

	// Probe until the subscription is in place.
	ready := make(chan struct{})
	go func() {
		for {
			select {
			case <-ready:
				return
			case <-time.After(20 * time.Millisecond):
				svc.Publish("fl.probe", []byte(`{"probe":true}`))
			}
		}
	}()
	subscribed := false
	for l := range lines {
		if subscribed = l["subject"] == "fl.probe"; subscribed {
			break
		}
	}
	close(ready)
	if !subscribed {
		t.Fatalf("nats sub ended: %v", <-done)
	}

	ann, err := proto.Marshal(&pb.RoundAnnouncement{TaskId: "t-sub", Round: 7})
	if err != nil {
		t.Fatal(err)
	}
	stored := nats.NewMsg(wire.SubjectStoredPrefix + wire.ReportSubject("t-sub", 7, "d-1"))
	stored.Header.Set("Nats-Subject", wire.ReportSubject("t-sub", 7, "d-1"))
	for _, m := range []*nats.Msg{
		{Subject: wire.SubjectAnnounce, Data: ann},
		stored,
		{Subject: wire.SubjectAnnounce, Data: []byte{0xff, 0xff, 0xff}},
		{Subject: wire.SubjectAuditCheckpoint, Data: []byte("test.fleetlearn/audit\n3\nabc=\n")},
		{Subject: "fl.other", Data: []byte{0, 1, 2}},
		{Subject: "fl.other.json", Data: []byte(`{"stream":"FL_REPORTS","seq":3}`)},
		{Subject: wire.CheckInSubject("d-1"), Reply: "_INBOX_d-1.x", Data: mustMarshal(t, &pb.CheckIn{DeviceId: "d-1"})},
	} {
		if err := svc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	type want struct{ subject, field, contains string }
	wants := []want{
		{wire.SubjectAnnounce, "type", "fleetlearn.v1.RoundAnnouncement"},
		{wire.SubjectAnnounce, "message", `"task_id":"t-sub"`},
		{stored.Subject, "headers", `"Nats-Subject":["fl.report.t-sub.7.d-1"]`},
		{wire.SubjectAnnounce, "error", "proto"},
		{wire.SubjectAuditCheckpoint, "text", "test.fleetlearn/audit\n3\n"},
		{"fl.other", "data_base64", "AAEC"},
		{"fl.other.json", "json", `"seq":3`},
		{wire.CheckInSubject("d-1"), "message", `"device_id":"d-1"`},
		{wire.CheckInSubject("d-1"), "reply", "_INBOX_d-1.x"},
	}
	seen := make([]bool, len(wants))
	left := len(wants)
	for l := range lines {
		for i, w := range wants {
			if seen[i] || l["subject"] != w.subject {
				continue
			}
			v, _ := json.Marshal(l[w.field])
			if s, ok := l[w.field].(string); ok {
				v = []byte(s)
			}
			if strings.Contains(string(v), w.contains) {
				seen[i] = true
				left--
			}
		}
		if left == 0 {
			break
		}
	}
	for i, w := range wants {
		if !seen[i] {
			t.Errorf("no line on %s with %s containing %q", w.subject, w.field, w.contains)
		}
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNATSSubRefused: without credentials, or where they do not reach,
// sub says what is wrong.
func TestNATSSubRefused(t *testing.T) {
	h := servertest.New(t)
	_, err := run(t, "", "--ca", server.CAFile(h.Dir), "nats", "sub", "fl.>", "--nats-url", h.NATSURL())
	if err == nil || !strings.Contains(err.Error(), "--creds") {
		t.Errorf("no creds: %v", err)
	}
	creds, _ := natsCreds(t, h, "observer")
	_, err = run(t, "", "nats", "sub", "_INBOX_d-1.>", "--nats-url", h.NATSURL(), "--creds", creds)
	if err == nil || !strings.Contains(err.Error(), "may not subscribe") {
		t.Errorf("a device's inbox: %v", err)
	}
	if _, err := run(t, "", "nats", "sub", "fl.>", "--count", "-1"); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("negative count: %v", err)
	}
}

// natsCLI is the official nats CLI at the version cli/testdata/natscli
// pins, built by testtool's build command.
func natsCLI(t *testing.T) string {
	t.Helper()
	return testtool.Find(t, testtool.NATS)
}

// natsRun runs the nats CLI with a home of its own, so that no context of
// the machine's user applies.
func natsRun(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestNATSCLI runs the official nats CLI against a real server with the
// credentials `fleetlearn nats creds` writes: an observer lists streams
// and the blob store and watches a round, and can change nothing; a
// system user reports on the servers.
func TestNATSCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the nats CLI and runs rounds")
	}
	bin := natsCLI(t)
	h := servertest.New(t, servertest.WithPace(20*time.Millisecond),
		servertest.WithConfig(func(c *server.Config) { c.NATSTLS = true }))
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "tiny", m)
	mod := h.RegisterModule(t, "trivial", wasmtest.Trivial())

	observer, out := natsCreds(t, h, "observer")
	// The printed command, verbatim, is what the test runs.
	ca := server.CAFile(h.Dir)
	base := []string{"--server", h.NATSURL(), "--creds", observer, "--tlsca", ca}
	if want := "nats " + strings.Join(base, " ") + " stream ls"; !strings.Contains(out, want) {
		t.Fatalf("creds output lacks %q:\n%s", want, out)
	}
	nats := func(args ...string) (string, error) { return natsRun(t, bin, append(base, args...)...) }
	if out, err := nats("stream", "ls"); err != nil || !strings.Contains(out, wire.StreamReports) {
		t.Errorf("stream ls: %v\n%s", err, out)
	}
	if out, err := nats("obj", "ls"); err != nil || !strings.Contains(out, wire.BlobBucket) {
		t.Errorf("obj ls: %v\n%s", err, out)
	}
	if out, err := nats("obj", "ls", wire.BlobBucket); err != nil || !strings.Contains(out, mod) {
		t.Errorf("obj ls %s: %v\n%s", wire.BlobBucket, err, out)
	}
	got := filepath.Join(t.TempDir(), "module.wasm")
	if out, err := nats("obj", "get", wire.BlobBucket, mod, "-O", got); err != nil {
		t.Errorf("obj get: %v\n%s", err, out)
	} else if b, _ := os.ReadFile(got); !bytes.Equal(b, wasmtest.Trivial()) {
		t.Errorf("obj get wrote %d bytes, not the module's %d", len(b), len(wasmtest.Trivial()))
	}

	// A round: three simulated devices train a task of many rounds until
	// the subscriptions have seen what they wait for.
	task := h.CreateTask(t, &pb.Task{Name: "natscli", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: mod},
		CohortTarget: 3, ReportGoal: 3, OverSelection: 0.01, RoundsTotal: 10000,
		SelectionTimeout: durationpb.New(20 * time.Second), ReportTimeout: durationpb.New(20 * time.Second),
		Aggregation: &pb.AggregationConfig{MaxUpdateNorm: 2}})
	fc := simfleet.Config{NATSURL: h.NATSURL(), NATSOptions: h.ServiceNATSOptions(), Devices: 3,
		Layout: []*pb.TensorSpec{{Name: "w", Shape: []uint64{2, 3}}}, Delta: []float32{0.1, 0.1, 0.1, 0.1, 0.1, 0.1}}
	fc.Keys = h.EnrollKeys(t, fc.DeviceIDs())
	fleet, err := simfleet.Start(fc)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Stop()
	reports, _ := subLines(t, h, "fl.report.>", "--creds", observer, "--count", "1")
	if out, err := nats("sub", wire.SubjectAnnounce, "--count", "1"); err != nil || !strings.Contains(out, wire.SubjectAnnounce) {
		t.Errorf("sub %s: %v\n%s", wire.SubjectAnnounce, err, out)
	}
	if out, err := nats("sub", "fl.>", "--count", "5"); err != nil || strings.Count(out, "Received on") != 5 {
		t.Errorf("sub fl.>: %v\n%s", err, out)
	}
	l := <-reports
	if l["type"] != "fleetlearn.v1.UpdateReport" || !strings.Contains(toJSON(l["message"]), `"task_id":"`+task.GetId()+`"`) {
		t.Errorf("fleetlearn nats sub fl.report.> printed %v", l)
	}
	if _, err := h.Tasks.StopTask(t.Context(), &pb.StopTaskRequest{TaskId: task.GetId()}); err != nil {
		t.Fatal(err)
	}
	fleet.Stop()

	// The observer changes nothing.
	if out, err := nats("pub", wire.CheckInSubject(fc.DeviceIDs()[0]), "hello"); err == nil || !strings.Contains(out, "Permissions Violation") {
		t.Errorf("observer published a check-in: %v\n%s", err, out)
	}
	if out, err := nats("--timeout", "2s", "stream", "rm", wire.StreamReports, "-f"); err == nil || !strings.Contains(out, "Permissions Violation") {
		t.Errorf("observer deleted %s:\n%s", wire.StreamReports, out)
	}
	if out, err := nats("--timeout", "2s", "obj", "rm", wire.BlobBucket, mod, "-f"); err == nil || !strings.Contains(out, "Permissions Violation") {
		t.Errorf("observer deleted a blob:\n%s", out)
	}
	if out, err := nats("stream", "ls"); err != nil || !strings.Contains(out, wire.StreamReports) {
		t.Errorf("stream ls after the refused deletion: %v\n%s", err, out)
	}
	if out, err := nats("obj", "ls", wire.BlobBucket); err != nil || !strings.Contains(out, mod) {
		t.Errorf("obj ls after the refused deletion: %v\n%s", err, out)
	}

	// A system user sees the servers.
	system, out := natsCreds(t, h, "system")
	sys := []string{"--server", h.NATSURL(), "--creds", system, "--tlsca", ca}
	if want := "nats " + strings.Join(sys, " ") + " server list"; !strings.Contains(out, want) {
		t.Errorf("creds output lacks %q:\n%s", want, out)
	}
	if out, err := natsRun(t, bin, append(sys, "server", "list")...); err != nil || !strings.Contains(out, "Server Overview") {
		t.Errorf("server list: %v\n%s", err, out)
	}
	if out, err := natsRun(t, bin, append(sys, "server", "report", "jetstream")...); err != nil || !strings.Contains(out, "Streams") {
		t.Errorf("server report jetstream: %v\n%s", err, out)
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
