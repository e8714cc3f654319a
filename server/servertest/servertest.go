// Package servertest starts a real aggregator for tests: embedded NATS with
// JetStream and SQLite in a temporary directory, on random loopback ports,
// shut down by t.Cleanup, its API secured as in production (TLS, bearer
// tokens, signed modules). It also offers the few API calls most tests need.
package servertest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/freeport"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
)

// Harness is a running server and an admin's client connection to its
// API, over TLS with the admin token the server minted.
type Harness struct {
	*server.Server
	Dir     string
	Conn    *grpc.ClientConn
	Tasks   apiv1.TaskServiceClient
	Models  apiv1.ModelServiceClient
	Modules apiv1.ModuleServiceClient
	Devices apiv1.DeviceServiceClient
	// Publisher signs the modules RegisterModule uploads; the server
	// trusts its key.
	Publisher *identity.Publisher
}

// Option adjusts the server configuration.
type Option func(*server.Config)

// WithDataDir reuses a data directory, e.g. to restart a server on its state.
func WithDataDir(dir string) Option { return func(c *server.Config) { c.DataDir = dir } }

// WithPace sets the pace-steering window.
func WithPace(d time.Duration) Option { return func(c *server.Config) { c.PaceWindow = d } }

// WithNATSListen fixes the embedded NATS address (to restart on the same one).
func WithNATSListen(addr string) Option { return func(c *server.Config) { c.NATSListen = addr } }

var (
	cacheOnce sync.Once
	cacheDir  string
)

// sharedCache is one WASM compilation cache for every server the tests start
// (in the user cache directory, so it also outlives the process): each module
// is compiled once, not once per test server.
func sharedCache(t testing.TB) string {
	cacheOnce.Do(func() {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cacheDir = filepath.Join(base, "fleetlearn", "servertest-wasm")
		if err := os.MkdirAll(cacheDir, 0o700); err != nil {
			t.Fatal(err)
		}
	})
	return cacheDir
}

// WithConfig changes any part of the configuration.
func WithConfig(f func(*server.Config)) Option { return Option(f) }

// New starts a server that trusts a fresh module publisher key. Set
// FLEETLEARN_TEST_LOG=1 to see its logs.
func New(t testing.TB, opts ...Option) *Harness {
	t.Helper()
	return NewWith(t, nil, opts...)
}

// NewWith is New with server options besides the configuration: a tracer
// provider, a clock.
func NewWith(t testing.TB, serverOpts []server.Option, opts ...Option) *Harness {
	t.Helper()
	pub, jwks := NewPublisher(t)
	cfg := server.Config{DataDir: t.TempDir(), NATSListen: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		MetricsAddr: "127.0.0.1:0", PaceWindow: 200 * time.Millisecond, CacheDir: sharedCache(t),
		ModulePublishersJWKS: jwks}
	for _, o := range opts {
		o(&cfg)
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("FLEETLEARN_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s, err := server.New(cfg, append([]server.Option{server.WithLogger(log)}, serverOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(ctx) })
	h := &Harness{Server: s, Dir: cfg.DataDir, Publisher: pub}
	h.Conn = h.Dial(t, s.AdminToken())
	h.Tasks, h.Models, h.Modules = apiv1.NewTaskServiceClient(h.Conn), apiv1.NewModelServiceClient(h.Conn), apiv1.NewModuleServiceClient(h.Conn)
	h.Devices = apiv1.NewDeviceServiceClient(h.Conn)
	return h
}

// NewPublisher makes a module publisher and the JWK Set that trusts it.
func NewPublisher(t testing.TB) (*identity.Publisher, []byte) {
	t.Helper()
	key, err := identity.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := identity.NewPublisher(key)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := identity.PublicJWKS(key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	return pub, jwks
}

// Dial connects to the server's API over TLS with token ("" for none),
// closed by t.Cleanup.
func (h *Harness) Dial(t testing.TB, token string) *grpc.ClientConn {
	t.Helper()
	conn, err := client.Dial(h.GRPCAddr(), client.WithCA(h.CACertPEM()), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// DialAs connects with a fresh token for subject holding roles.
func (h *Harness) DialAs(t testing.TB, subject string, roles ...identity.Role) *grpc.ClientConn {
	t.Helper()
	tok, err := h.MintToken(subject, roles, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return h.Dial(t, tok)
}

// ImportModel uploads m and returns its version.
func (h *Harness) ImportModel(t testing.TB, name string, m *model.Model) string {
	t.Helper()
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	got, err := client.ImportModel(context.Background(), h.Models, &pb.ImportModelHeader{Name: name,
		SizeBytes: uint64(buf.Len())}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	return got.GetRef().GetVersion()
}

// RegisterModule uploads WASM bytes signed by h.Publisher and returns
// their sha256.
func (h *Harness) RegisterModule(t testing.TB, name string, code []byte) string {
	t.Helper()
	sig, err := h.Publisher.SignModule(name, code)
	if err != nil {
		t.Fatal(err)
	}
	got, err := client.RegisterModule(context.Background(), h.Modules, &pb.RegisterModuleHeader{Name: name,
		SizeBytes: uint64(len(code)), Signature: []byte(sig)}, bytes.NewReader(code))
	if err != nil {
		t.Fatal(err)
	}
	return got.GetRef().GetSha256()
}

// CreateTask creates a task and returns it.
func (h *Harness) CreateTask(t testing.TB, task *pb.Task) *pb.Task {
	t.Helper()
	resp, err := h.Tasks.CreateTask(context.Background(), &pb.CreateTaskRequest{Task: task})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetTask()
}

// WaitTask polls until the task reaches one of the states or the timeout passes.
func (h *Harness) WaitTask(t testing.TB, id string, timeout time.Duration, states ...pb.TaskState) *pb.Task {
	t.Helper()
	end := time.Now().Add(timeout)
	for {
		resp, err := h.Tasks.GetTask(context.Background(), &pb.GetTaskRequest{TaskId: id})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range states {
			if resp.Task.State == s {
				return resp.Task
			}
		}
		if time.Now().After(end) {
			t.Fatalf("task %s is %v after %v, want %v (%s)", id, resp.Task.State, timeout, states, resp.Task.StateReason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Rounds lists all of a task's rounds.
func (h *Harness) Rounds(t testing.TB, id string) []*pb.RoundSummary {
	t.Helper()
	resp, err := h.Tasks.ListRounds(context.Background(), &pb.ListRoundsRequest{TaskId: id, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Rounds
}

// AuditEvents returns the audit log's entries that match f (at most
// 1,000, oldest first), each verified against the log's entry key.
func (h *Harness) AuditEvents(t testing.TB, f *pb.AuditFilter) []audit.Event {
	t.Helper()
	c := apiv1.NewAuditServiceClient(h.Conn)
	keys, err := c.GetPublicKeys(context.Background(), &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.QueryEntries(context.Background(), &pb.QueryEntriesRequest{Filter: f, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Event
	for _, pe := range res.GetEntries() {
		ev, err := audit.VerifyEntry(audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}, entryKey)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// EnrollKeys enrolls devices with the given ids, each with a fresh key,
// through the enrollment service, and returns their private keys: for
// simulated devices (internal/simfleet) that sign reports as agents do.
func (h *Harness) EnrollKeys(t testing.TB, ids []string) map[string]ed25519.PrivateKey {
	t.Helper()
	enroll := apiv1.NewEnrollmentServiceClient(h.Conn)
	out := make(map[string]ed25519.PrivateKey, len(ids))
	for _, id := range ids {
		key, err := identity.GenerateUserKey()
		if err != nil {
			t.Fatal(err)
		}
		tok, err := h.Devices.CreateEnrollmentToken(context.Background(), &pb.CreateEnrollmentTokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := enroll.Enroll(context.Background(), &pb.EnrollRequest{Token: tok.GetToken(), KeyId: key.ID(), DeviceId: id}); err != nil {
			t.Fatalf("enroll %s: %v", id, err)
		}
		out[id] = key.PrivateKey()
	}
	return out
}

// FreeAddr is a loopback address whose port nobody held a moment ago, for
// a server or child process the test starts (see internal/freeport).
// Another process can take it first; the child then fails to listen and
// says so.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return freeport.Addr(t)
}

// ServiceConn connects to url, a NATS server or cluster that trusts the
// server whose data directory is dataDir, as that server's service user:
// what the aggregator itself may see, for tests that look behind it.
func ServiceConn(t testing.TB, dataDir, url string) *nats.Conn {
	t.Helper()
	dir := filepath.Join(dataDir, server.NATSAuthDir)
	auth, err := identity.LoadOrCreateAuthority("fleetlearn", dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := identity.LoadOrCreateUserKey(filepath.Join(dir, "service-user.nk"))
	if err != nil {
		t.Fatal(err)
	}
	jwt, err := auth.ServiceUserJWT("test-observer", key.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.UserJWT(func() (string, error) { return jwt, nil }, key.Sign))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// RunPoolJob runs spec, a one-rank job, through the server's worker API as
// a pool worker would: a worker registers, is leased the rank, commits a
// checkpoint of m at spec's last step and exits having used usage. It
// returns the checkpoint's id and the job as the server then reports it.
func (h *Harness) RunPoolJob(t testing.TB, spec *pb.PoolJobSpec, m *model.Model, usage *pb.PoolUsage) (checkpoint.Digest, *pb.PoolJob) {
	t.Helper()
	ctx := t.Context()
	jobs := apiv1.NewPoolServiceClient(h.Conn)
	wk := apiv1.NewPoolWorkerServiceClient(h.DialAs(t, "pool-host-1", identity.RolePoolWorker))
	reg, err := wk.RegisterWorker(ctx, &pb.RegisterWorkerRequest{Name: "host-1",
		Capacity: &pb.PoolResources{MilliCpu: 4000, MemoryBytes: 8 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	hb, err := wk.Heartbeat(ctx, &pb.HeartbeatRequest{WorkerId: reg.GetWorkerId()})
	if err != nil || len(hb.GetStart()) != 1 {
		t.Fatalf("heartbeat %v %v", hb, err)
	}
	l := hb.GetStart()[0]
	ref := &pb.RankRef{WorkerId: reg.GetWorkerId(), JobId: l.GetJobId(), Attempt: l.GetAttempt(), Rank: l.GetRank()}
	local, err := checkpoint.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id, err := checkpoint.Write(local, &checkpoint.Checkpoint{Job: spec.GetId(), Step: spec.GetTotalSteps(), Params: m}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	man, err := local.Manifest(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range man.Blobs() {
		b, err := local.GetBlob(c.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wk.PutCheckpointBlob(ctx, &pb.PutCheckpointBlobRequest{Ref: ref, Digest: c.Digest.String(), Data: b}); err != nil {
			t.Fatal(err)
		}
	}
	enc, _, err := man.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wk.CommitCheckpoint(ctx, &pb.CommitCheckpointRequest{Ref: ref, Manifest: enc}); err != nil {
		t.Fatal(err)
	}
	if _, err := wk.RankExited(ctx, &pb.RankExitedRequest{WorkerId: ref.WorkerId, JobId: ref.JobId, Attempt: ref.Attempt,
		Completed: true, Usage: usage}); err != nil {
		t.Fatal(err)
	}
	j, err := jobs.GetJob(ctx, &pb.GetJobRequest{JobId: spec.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	return id, j.GetJob()
}
