package server_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// startGuard bounds a Start that should end on its own: one that waits
// for NATS instead of refusing it would otherwise hang the test.
const startGuard = 30 * time.Second

// natsAuthKeys are the files a NATS authority directory holds.
var natsAuthKeys = []string{identity.OperatorSeedFile, identity.AccountSeedFile, identity.SystemSeedFile,
	"service-user.nk", "system-user.nk"}

// trustingOptions are the options of a nats-server that trusts the
// authority in dataDir, built from the fragment the server writes, as an
// operator would configure it.
func trustingOptions(t *testing.T, dataDir string) *natsserver.Options {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "fleetlearn-auth.conf")
	if err := server.WriteNATSResolverConfig(context.Background(), dataDir, filepath.Join(t.TempDir(), "jwt"), conf); err != nil {
		t.Fatal(err)
	}
	opts, err := natsserver.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server rejects the fragment: %v", err)
	}
	return externalOptions(t, opts)
}

// externalOptions completes opts as a test's external NATS server: loopback,
// any port, JetStream, payloads as large as the aggregator's.
func externalOptions(t *testing.T, opts *natsserver.Options) *natsserver.Options {
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoSigs, opts.NoLog = "127.0.0.1", -1, true, t.TempDir(), true, true
	opts.MaxPayload = 8 << 20
	return opts
}

func testLogger() *slog.Logger {
	if os.Getenv("FLEETLEARN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// externalConfig is an aggregator on dataDir using the NATS at natsURL, on
// fixed free ports so that a test can tell whether anything listened there.
func externalConfig(t *testing.T, dataDir, natsURL string) server.Config {
	_, jwks := servertest.NewPublisher(t)
	return server.Config{DataDir: dataDir, NATSURL: natsURL, GRPCAddr: servertest.FreeAddr(t), MetricsAddr: servertest.FreeAddr(t),
		PaceWindow: 200 * time.Millisecond, ModulePublishersJWKS: jwks}
}

// startFails starts a server with cfg, wants Start to fail, checks that
// nothing was left serving, and returns Start's error.
func startFails(t *testing.T, cfg server.Config, opts ...server.Option) error {
	t.Helper()
	s, err := server.New(cfg, append([]server.Option{server.WithLogger(testLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startGuard)
	defer cancel()
	err = s.Start(ctx)
	if err == nil {
		s.Shutdown(context.Background())
		t.Fatal("Start succeeded")
	}
	if ctx.Err() != nil {
		t.Fatalf("Start waited out the guard instead of refusing: %v", err)
	}
	t.Logf("Start: %v", err)
	assertNothingServed(t, s, cfg)
	return err
}

// assertNothingServed checks that a server whose Start failed holds none of
// its listeners and that a further Shutdown is harmless.
func assertNothingServed(t *testing.T, s *server.Server, cfg server.Config) {
	t.Helper()
	if a := s.GRPCAddr(); a != "" {
		t.Errorf("a failed Start left gRPC on %s", a)
	}
	if a := s.MetricsAddr(); a != "" {
		t.Errorf("a failed Start left metrics on %s", a)
	}
	for _, addr := range []string{cfg.GRPCAddr, cfg.MetricsAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s is still taken after a failed Start: %v", addr, err)
			continue
		}
		l.Close()
	}
	s.Shutdown(context.Background()) // Start already shut down: must not panic or block
}

// startServer starts a server with cfg and opts and shuts it down with the
// test.
func startServer(t *testing.T, cfg server.Config, opts ...server.Option) *server.Server {
	t.Helper()
	s, err := server.New(cfg, append([]server.Option{server.WithLogger(testLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startGuard)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return s
}

func wantErrContains(t *testing.T, err error, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

// runTrivialRound runs a one-round task with two enrolled agents on h and
// wants it to commit.
func runTrivialRound(t *testing.T, h *servertest.Harness, prefix string) {
	t.Helper()
	task := trivialTask(t, h, 2)
	runAgent(t, h, prefix+"-a")
	runAgent(t, h, prefix+"-b")
	done := h.WaitTask(t, task.Id, 30*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	if rounds := h.Rounds(t, task.Id); len(rounds) == 0 {
		t.Fatal("the completed task lists no rounds")
	}
}

// TestExternalNATSOpen: a NATS server without any authorization would let
// any client use any subject; the aggregator refuses it, says how to fix
// it, and leaves nothing running. With InsecureNATS it is accepted on the
// same data directory, which the failed start released, and rounds run.
func TestExternalNATSOpen(t *testing.T) {
	ns := natstest.Run(t, externalOptions(t, &natsserver.Options{}))
	dataDir := t.TempDir()
	err := startFails(t, externalConfig(t, dataDir, ns.ClientURL()))
	if !errors.Is(err, server.ErrNATSOpen) {
		t.Fatalf("Start against an open NATS: %v, want ErrNATSOpen", err)
	}
	if errors.Is(err, server.ErrNATSUntrusted) {
		t.Errorf("an open NATS is also reported untrusted: %v", err)
	}
	wantErrContains(t, err, ns.ClientURL(), "--write-nats-config", "--insecure-nats", dataDir)

	h := servertest.New(t, servertest.WithDataDir(dataDir), servertest.WithConfig(func(c *server.Config) {
		c.NATSURL, c.InsecureNATS = ns.ClientURL(), true
	}))
	if h.NATSURL() != ns.ClientURL() {
		t.Fatalf("devices are given %q, want the external %q", h.NATSURL(), ns.ClientURL())
	}
	// Devices need no enrollment here: they connect without credentials.
	task := trivialTask(t, h, 2)
	for _, id := range []string{"open-a", "open-b"} {
		runAgentWith(t, h, edge.Config{NATSURL: h.NATSURL(), InsecureNATS: true, DataDir: t.TempDir(), DeviceID: id})
	}
	done := h.WaitTask(t, task.Id, 30*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
}

// TestExternalNATSOwnUsers: a NATS server with its own users. One that
// lets an anonymous client in as a configured user (no_auth_user) is open;
// one that asks for a password, or a token, refuses the aggregator's user
// JWT: the error names the directory whose operator it must trust.
func TestExternalNATSOwnUsers(t *testing.T) {
	users := []*natsserver.User{{Username: "app", Password: "s3cret-pass"}}
	for _, tc := range []struct {
		name string
		opts natsserver.Options
		want error
	}{
		{"no_auth_user", natsserver.Options{Users: users, NoAuthUser: "app"}, server.ErrNATSOpen},
		{"password", natsserver.Options{Users: users}, server.ErrNATSUntrusted},
		{"token", natsserver.Options{Authorization: "s3cret-token"}, server.ErrNATSUntrusted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := natstest.Run(t, externalOptions(t, &tc.opts))
			dataDir := t.TempDir()
			err := startFails(t, externalConfig(t, dataDir, ns.ClientURL()))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Start: %v, want %v", err, tc.want)
			}
			wantErrContains(t, err, ns.ClientURL(), "--write-nats-config")
			if tc.want == server.ErrNATSUntrusted {
				wantErrContains(t, err, filepath.Join(dataDir, server.NATSAuthDir))
			}
		})
	}
}

// TestExternalNATSOtherOperator: a NATS server in operator mode that
// trusts another aggregator's operator refuses this one's service user.
func TestExternalNATSOtherOperator(t *testing.T) {
	ns := natstest.Run(t, trustingOptions(t, t.TempDir()))
	dataDir := t.TempDir()
	err := startFails(t, externalConfig(t, dataDir, ns.ClientURL()))
	if !errors.Is(err, server.ErrNATSUntrusted) {
		t.Fatalf("Start against a NATS trusting another operator: %v, want ErrNATSUntrusted", err)
	}
	wantErrContains(t, err, filepath.Join(dataDir, server.NATSAuthDir), "--write-nats-config")
}

// TestExternalNATSMixedCluster: every server of the list that answers must
// enforce the operator: an open one fails the start after a trusting or an
// unreachable one, and an unreachable one beside a trusting one does not
// delay it. (A server trusting another operator: TestExternalNATSOtherOperator.)
func TestExternalNATSMixedCluster(t *testing.T) {
	dataDir := t.TempDir()
	trusting := natstest.Run(t, trustingOptions(t, dataDir))
	open := natstest.Run(t, externalOptions(t, &natsserver.Options{}))
	dead := "nats://" + servertest.FreeAddr(t)
	for _, tc := range []struct {
		name string
		urls []string
		want error
	}{
		{"trusting then open", []string{trusting.ClientURL(), open.ClientURL()}, server.ErrNATSOpen},
		{"dead then open", []string{dead, open.ClientURL()}, server.ErrNATSOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := startFails(t, externalConfig(t, dataDir, strings.Join(tc.urls, ",")))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Start: %v, want %v", err, tc.want)
			}
			wantErrContains(t, err, tc.urls[1])
		})
	}
	t.Run("dead then trusting", func(t *testing.T) {
		// A fake clock that nobody advances: a start that waited for the
		// dead server would never end (and fail on the guard).
		fake := clock.NewFake(time.Now())
		s := startServer(t, externalConfig(t, dataDir, dead+","+trusting.ClientURL()), server.WithClock(fake))
		if s.GRPCAddr() == "" {
			t.Fatal("no gRPC listener after Start")
		}
	})
}

// waitDeadline waits until fake has a timer due at want, failing if Start
// (errc) returns first.
func waitDeadline(t *testing.T, fake *clock.Fake, want time.Time, errc <-chan error) {
	t.Helper()
	guard := time.NewTimer(startGuard)
	defer guard.Stop()
	for {
		changed := fake.Changed()
		if slices.ContainsFunc(fake.Deadlines(), want.Equal) {
			return
		}
		select {
		case <-changed:
		case err := <-errc:
			t.Fatalf("Start returned %v while it should wait for NATS (timers %v, want one at %v)", err, fake.Deadlines(), want)
		case <-guard.C:
			t.Fatalf("no back-off timer at %v (timers %v)", want, fake.Deadlines())
		}
	}
}

// TestExternalNATSLater: a NATS server that comes up after the aggregator
// (a cluster started alongside it) is waited for with doubling back-off,
// and the start completes once it answers.
func TestExternalNATSLater(t *testing.T) {
	dataDir := t.TempDir()
	opts := trustingOptions(t, dataDir)
	addr := servertest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	var err error
	if opts.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	cfg := externalConfig(t, dataDir, "nats://"+addr)
	start := time.Now()
	fake := clock.NewFake(start)
	s, err := server.New(cfg, server.WithLogger(testLogger()), server.WithClock(fake))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc, started := make(chan error, 1), make(chan struct{})
	go func() { defer close(started); errc <- s.Start(ctx) }()
	// A test that fails while Start waits ends that wait before shutting down.
	t.Cleanup(func() { cancel(); <-started; s.Shutdown(context.Background()) })

	waitDeadline(t, fake, start.Add(time.Second), errc)
	fake.Advance(time.Second)
	waitDeadline(t, fake, start.Add(3*time.Second), errc) // the second wait is twice the first

	natstest.Run(t, opts)
	fake.Advance(2 * time.Second)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Start once NATS is up: %v", err)
		}
	case <-time.After(startGuard):
		t.Fatalf("Start did not complete after NATS came up (timers %v)", fake.Deadlines())
	}
	if s.NATSURL() != cfg.NATSURL || s.GRPCAddr() == "" {
		t.Fatalf("started with NATS URL %q, gRPC %q", s.NATSURL(), s.GRPCAddr())
	}
}

// TestExternalNATSWaitCanceled: a start waiting for a NATS server that
// never comes ends with its context, and leaves nothing running.
func TestExternalNATSWaitCanceled(t *testing.T) {
	dataDir := t.TempDir()
	cfg := externalConfig(t, dataDir, "nats://"+servertest.FreeAddr(t))
	start := time.Now()
	fake := clock.NewFake(start)
	s, err := server.New(cfg, server.WithLogger(testLogger()), server.WithClock(fake))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.Start(ctx) }()
	waitDeadline(t, fake, start.Add(time.Second), errc)
	cancel()
	select {
	case err = <-errc:
	case <-time.After(startGuard):
		t.Fatal("Start did not end with its context")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start: %v, want context.Canceled", err)
	}
	wantErrContains(t, err, cfg.NATSURL)
	assertNothingServed(t, s, cfg)
}

// secretVolume lays out the files of dir as a Kubernetes Secret volume
// with fsGroup does: group-readable files in a timestamped directory,
// reached through the ..data link and one link per key.
func secretVolume(t *testing.T, dir string, names []string) string {
	t.Helper()
	vol := t.TempDir()
	ts := "..2025_01_02_03_04_05.123456789"
	if err := os.Mkdir(filepath.Join(vol, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(vol, ts, name)
		if err := os.WriteFile(p, b, 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o640); err != nil { // past the umask
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	return vol
}

// authFile is one file of a nats-auth directory: its content and mode.
type authFile struct {
	data []byte
	mode fs.FileMode
}

// authorityFiles snapshots a nats-auth directory by file name.
func authorityFiles(t *testing.T, dir string) map[string]authFile {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]authFile{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = authFile{b, fi.Mode()}
	}
	return out
}

// TestNATSAuthFrom: an aggregator on a fresh data directory takes the
// authority from a Secret volume (group-readable, behind links), keeps
// private copies, and works against the NATS that trusts it.
func TestNATSAuthFrom(t *testing.T) {
	src := t.TempDir()
	opts := trustingOptions(t, src)
	ns := natstest.Run(t, opts)
	vol := secretVolume(t, filepath.Join(src, server.NATSAuthDir), natsAuthKeys)

	dataDir := filepath.Join(t.TempDir(), "fresh")
	h := servertest.New(t, servertest.WithDataDir(dataDir), servertest.WithConfig(func(c *server.Config) {
		c.NATSURL, c.NATSAuthFrom = ns.ClientURL(), vol
	}))
	runTrivialRound(t, h, "from")

	dir := filepath.Join(dataDir, server.NATSAuthDir)
	got := authorityFiles(t, dir)
	want := authorityFiles(t, filepath.Join(src, server.NATSAuthDir))
	for _, name := range natsAuthKeys {
		f, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s was not copied into %s", name, dir)
		case !f.mode.IsRegular() || f.mode.Perm() != 0o600:
			t.Errorf("%s has mode %v, want a regular file with 0600", name, f.mode)
		case !bytes.Equal(bytes.TrimSpace(f.data), bytes.TrimSpace(want[name].data)):
			t.Errorf("%s differs from the Secret's", name)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("%s: %v, mode %v: want a private directory", dir, err, fi.Mode())
	}

	// The Secret with only the three account seeds: the aggregator's own
	// user keys are made on the spot, signed by the same account, and the
	// same NATS admits them.
	t.Run("account seeds only", func(t *testing.T) {
		vol := secretVolume(t, filepath.Join(src, server.NATSAuthDir), natsAuthKeys[:3])
		cfg := externalConfig(t, t.TempDir(), ns.ClientURL())
		cfg.NATSAuthFrom = vol
		startServer(t, cfg)
		got := authorityFiles(t, filepath.Join(cfg.DataDir, server.NATSAuthDir))
		if _, ok := got["service-user.nk"]; !ok {
			t.Fatal("no service user key was made")
		}
		if bytes.Equal(got["service-user.nk"].data, want["service-user.nk"].data) {
			t.Fatal("the service user key was not made afresh")
		}
	})
}

// TestNATSAuthFromOtherAuthority: a data directory that already holds
// another authority is not overwritten by the Secret's: Start fails naming
// both files, and the keys in the data directory stay as they were.
func TestNATSAuthFromOtherAuthority(t *testing.T) {
	src := t.TempDir()
	if _, err := server.NATSResolverConfig(context.Background(), src, "/var/lib/nats/jwt"); err != nil {
		t.Fatal(err)
	}
	vol := secretVolume(t, filepath.Join(src, server.NATSAuthDir), natsAuthKeys)
	dataDir := t.TempDir()
	if _, err := server.NATSResolverConfig(context.Background(), dataDir, "/var/lib/nats/jwt"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dataDir, server.NATSAuthDir)
	before := authorityFiles(t, dir)
	ns := natstest.Run(t, trustingOptions(t, src)) // a NATS that would admit the Secret's authority

	cfg := externalConfig(t, dataDir, ns.ClientURL())
	cfg.NATSAuthFrom = vol
	err := startFails(t, cfg)
	wantErrContains(t, err, filepath.Join(dir, identity.OperatorSeedFile), filepath.Join(vol, identity.OperatorSeedFile))
	after := authorityFiles(t, dir)
	if len(after) != len(before) {
		t.Errorf("%s holds %d files after the refused import, %d before", dir, len(after), len(before))
	}
	for name, b := range before {
		if a, ok := after[name]; !ok || !bytes.Equal(a.data, b.data) || a.mode != b.mode {
			t.Errorf("%s changed in the refused import", name)
		}
	}
}

// TestNATSAuthFromIncomplete: a Secret without the FLEET account's seed is
// refused with the missing file and how to write the directory.
func TestNATSAuthFromIncomplete(t *testing.T) {
	src := t.TempDir()
	if _, err := server.NATSResolverConfig(context.Background(), src, "/var/lib/nats/jwt"); err != nil {
		t.Fatal(err)
	}
	names := slices.DeleteFunc(slices.Clone(natsAuthKeys), func(n string) bool { return n == identity.AccountSeedFile })
	vol := secretVolume(t, filepath.Join(src, server.NATSAuthDir), names)
	ns := natstest.Run(t, trustingOptions(t, src))
	dataDir := t.TempDir()
	cfg := externalConfig(t, dataDir, ns.ClientURL())
	cfg.NATSAuthFrom = vol
	err := startFails(t, cfg)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Start: %v, want fs.ErrNotExist", err)
	}
	wantErrContains(t, err, filepath.Join(vol, identity.AccountSeedFile), "--nats-auth-from", "--write-nats-config")
	// Nothing was imported: no half of the Secret's authority for a later
	// start to complete with keys of its own.
	if _, err := os.Stat(filepath.Join(dataDir, server.NATSAuthDir)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after the refused import: %v, want none", server.NATSAuthDir, err)
	}
}

// TestNATSReplicasDefault: on a single JetStream server the default
// replicas (0: follow the cluster) are one, for the reports stream and the
// blob bucket.
func TestNATSReplicasDefault(t *testing.T) {
	dataDir := t.TempDir()
	ns := natstest.Run(t, trustingOptions(t, dataDir))
	s := startServer(t, externalConfig(t, dataDir, ns.ClientURL()))
	_, js := natstest.Connect(t, ns, s.ServiceNATSOptions()...)
	ctx := context.Background()
	for _, name := range []string{wire.StreamReports, "OBJ_" + wire.BlobBucket} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 1 {
			t.Errorf("%s has %d replicas, want 1", name, r)
		}
	}
}

// TestNATSReplicasTooMany: three replicas asked of a single JetStream
// server fail the start with what to set.
func TestNATSReplicasTooMany(t *testing.T) {
	dataDir := t.TempDir()
	ns := natstest.Run(t, trustingOptions(t, dataDir))
	cfg := externalConfig(t, dataDir, ns.ClientURL())
	cfg.Replicas = 3
	err := startFails(t, cfg)
	wantErrContains(t, err, "replicas: 3", "set --replicas to at most the number of JetStream servers")
	if errors.Is(err, server.ErrNATSOpen) || errors.Is(err, server.ErrNATSUntrusted) {
		t.Errorf("a trusting NATS is reported as misconfigured: %v", err)
	}
	// Nothing was created at three replicas (or at all) on the server.
	js, err := jetstream.New(servertest.ServiceConn(t, dataDir, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(context.Background(), wire.StreamReports); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("reports stream after the refused start: %v, want none", err)
	}
}

// TestNATSResolverConfigNewDataDir: the fragment can be written before the
// aggregator ever ran: the data directory and its nats-auth are created,
// and the fragment trusts the operator kept there.
func TestNATSResolverConfigNewDataDir(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "not", "yet")
	conf, err := server.NATSResolverConfig(context.Background(), dataDir, "/var/lib/nats/jwt")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dataDir, server.NATSAuthDir)
	got := authorityFiles(t, dir)
	for _, name := range natsAuthKeys {
		if f, ok := got[name]; !ok || f.mode.Perm() != 0o600 {
			t.Errorf("%s in %s: present %v, mode %v; want 0600", name, dir, ok, f.mode)
		}
	}
	auth, err := identity.LoadOrCreateAuthority("fleetlearn", dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fleetlearn-auth.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := natsserver.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the fragment: %v\n%s", err, conf)
	}
	if len(opts.TrustedOperators) != 1 || opts.TrustedOperators[0].Subject != auth.OperatorPublicKey() {
		t.Fatalf("the fragment trusts %v, want the operator %s of %s", opts.TrustedOperators, auth.OperatorPublicKey(), dir)
	}
	if got := authorityFiles(t, dir); len(got) != len(natsAuthKeys) {
		t.Errorf("reading the authority back changed %s: %d files", dir, len(got))
	}
}
