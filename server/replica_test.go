package server_test

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/internal/freeport"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	"github.com/fleetlearn/fleetlearn/internal/testwait"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestReplicaConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  server.Config
		want string
	}{
		{server.Config{DataDir: t.TempDir(), Store: "/var/lib/fleetlearn/state.db"}, "give a PostgreSQL URL"},
		{server.Config{DataDir: t.TempDir(), Store: "postgres://fl@db:5432/fl"}, "give NATSURL (--nats-url) too"},
		{server.Config{DataDir: t.TempDir(), Store: "postgres://fl@db:5432/fl", NATSURL: "nats://n:4222", LeaseTTL: time.Millisecond}, "below"},
	} {
		if _, err := server.New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
}

// replica starts a replicated aggregator on the shared store and NATS
// server, with the replicas' shared secrets from secrets; its Start, which
// waits for the lease, runs in the background and reports on the returned
// channel.
func replica(t testing.TB, name, pg, natsURL, secrets string, edit ...func(*server.Config)) (*server.Server, <-chan error) {
	t.Helper()
	cfg := server.Config{DataDir: t.TempDir(), Store: pg, ReplicaName: name, LeaseTTL: 2 * time.Second,
		NATSURL: natsURL, InsecureNATS: true, GRPCAddr: "127.0.0.1:0", MetricsAddr: "off", SecretsFrom: secrets}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	returned := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		started <- s.Start(ctx)
		close(returned)
	}()
	t.Cleanup(func() {
		// A standby is still in Start: it returns once ctx ends, and
		// only then may Shutdown run.
		cancel()
		<-returned
		s.Shutdown(context.Background())
	})
	return s, started
}

// replicaSecrets writes the secrets a test's replicas share.
func replicaSecrets(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := server.WriteReplicaSecrets(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitStarted waits for a replica's Start to return: it leads and serves.
func waitStarted(t testing.TB, name string, started <-chan error) {
	t.Helper()
	if err := <-started; err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// TestStandbyTakesOver: a second replica waits, not ready, while the first
// leads; when the first shuts down it gives the lease up and the second
// takes over at once.
func TestStandbyTakesOver(t *testing.T) {
	pg, ns, secrets := pgtest.Database(t), natstest.Start(t), replicaSecrets(t)
	a, aStarted := replica(t, "agg-a", pg, ns.ClientURL(), secrets)
	waitStarted(t, "agg-a", aStarted)
	if err := a.Ready(context.Background()); err != nil {
		t.Fatalf("the leader is not ready: %v", err)
	}
	b, bStarted := replica(t, "agg-b", pg, ns.ClientURL(), secrets)
	awaitStandby(t, b, "agg-a")
	select {
	case err := <-bStarted:
		t.Fatalf("the standby started while the leader runs: %v", err)
	default:
	}
	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, "agg-b", bStarted)
	if err := b.Ready(context.Background()); err != nil {
		t.Fatalf("the new leader is not ready: %v", err)
	}
}

// TestDeposedLeaderStops: when the database ends the leader's session (as
// it does for one cut off from it), a standby takes the lease, and the old
// leader finds out at its next renewal: it stops running rounds, says so
// on Lost and in its readiness, and every write it still tries is fenced
// (server/internal/store's TestFencedLeader).
func TestDeposedLeaderStops(t *testing.T) {
	pg, ns, secrets := pgtest.Database(t), natstest.Start(t), replicaSecrets(t)
	a, aStarted := replica(t, "agg-a", pg, ns.ClientURL(), secrets)
	waitStarted(t, "agg-a", aStarted)
	_, bStarted := replica(t, "agg-b", pg, ns.ClientURL(), secrets)

	pgtest.EndLockSession(t, pg)
	waitStarted(t, "agg-b", bStarted)
	err := <-a.Lost()
	if err == nil || !strings.Contains(err.Error(), "lost the lease") {
		t.Fatalf("Lost: %v", err)
	}
	if err := a.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "lost the lease") {
		t.Fatalf("the deposed leader's readiness: %v", err)
	}
}

// TestPartitionedLeader: the leader's connections to PostgreSQL go through
// a proxy that stops passing bytes, as a network partition does; neither
// side sees them close. The database ends the leader's silent session
// after the lease's ttl, the standby takes over, and the leader, whose
// renewal gets no answer, stops on its own.
func TestPartitionedLeader(t *testing.T) {
	pg, ns, secrets := pgtest.Database(t), natstest.Start(t), replicaSecrets(t)
	u, err := url.Parse(pg)
	if err != nil {
		t.Fatal(err)
	}
	p := newPartitionProxy(t, u.Host)
	viaProxy := *u
	viaProxy.Host = p.addr
	a, aStarted := replica(t, "agg-a", viaProxy.String(), ns.ClientURL(), secrets)
	waitStarted(t, "agg-a", aStarted)
	_, bStarted := replica(t, "agg-b", pg, ns.ClientURL(), secrets)
	// Runs before the replicas' cleanups: a partitioned leader's shutdown
	// would wait on the database for ever.
	t.Cleanup(p.heal)
	p.partition()
	waitStarted(t, "agg-b", bStarted)
	if err := <-a.Lost(); err == nil || !strings.Contains(err.Error(), "lost the lease") {
		t.Fatalf("Lost: %v", err)
	}
}

// partitionProxy forwards TCP connections to a target until partition,
// after which it keeps every connection open and passes nothing.
type partitionProxy struct {
	addr     string
	cut      chan struct{}
	closeAll func()
	mu       sync.Mutex
	conns    []net.Conn
}

func newPartitionProxy(t *testing.T, target string) *partitionProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partitionProxy{addr: l.Addr().String(), cut: make(chan struct{})}
	p.closeAll = func() {
		l.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	}
	t.Cleanup(p.closeAll)
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go p.pipe(in, out)
			go p.pipe(out, in)
		}
	}()
	return p
}

// pipe copies until the partition, then reads and drops what arrives, so
// the sender sees no error.
func (p *partitionProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-p.cut:
			continue
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *partitionProxy) partition() { close(p.cut) }

// heal ends every proxied connection: the partitioned side sees them
// fail, as after a partition long enough for TCP to give up.
func (p *partitionProxy) heal() { p.closeAll() }

// TestStandbyServesAPI: a standby serves the API by forwarding each call
// to the leader, streams both ways included, with the leader's answers
// and statuses as they are; it refuses bad tokens and methods no role may
// call itself. When the leader goes, the standby's own API takes over the
// same port, and a client's connection carries on to it.
func TestStandbyServesAPI(t *testing.T) {
	pg, ns, secrets := pgtest.Database(t), natstest.Start(t), replicaSecrets(t)
	a, aStarted := replica(t, "agg-a", pg, ns.ClientURL(), secrets)
	waitStarted(t, "agg-a", aStarted)
	b, bStarted := replica(t, "agg-b", pg, ns.ClientURL(), secrets)
	awaitStandby(t, b, "agg-a")
	ctx := context.Background()

	// The replicas share the admin token (ReplicaSecrets).
	conn, err := client.Dial(b.GRPCAddr(), client.WithCA(b.CACertPEM()), client.WithToken(a.AdminToken()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	models := apiv1.NewModelServiceClient(conn)
	// Client streaming, in several messages: a model import.
	rows := 300
	data := make([]float32, rows*1000)
	for i := range data {
		data[i] = float32(i%97) / 97
	}
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{rows, 1000}, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	sent := buf.Bytes()
	imported, err := client.ImportModel(ctx, models, &pb.ImportModelHeader{Name: "via-standby", SizeBytes: uint64(len(sent))},
		bytes.NewReader(sent))
	if err != nil {
		t.Fatalf("import through the standby: %v", err)
	}
	version := imported.GetRef().GetVersion()
	// Server streaming: the export through the standby is the leader's,
	// byte for byte, and holds the imported weights.
	_, viaStandby, err := client.ExportModelBytes(ctx, models, version, 64<<20)
	if err != nil {
		t.Fatalf("export through the standby: %v", err)
	}
	_, direct, err := client.ExportModelBytes(ctx, dialModels(t, a), version, 64<<20)
	if err != nil || !bytes.Equal(viaStandby, direct) {
		t.Fatalf("export from the leader: %d bytes, %v; through the standby: %d", len(direct), err, len(viaStandby))
	}
	back, err := model.ReadSafetensors(bytes.NewReader(viaStandby))
	if err != nil || !slices.Equal(back.Flatten(), data) {
		t.Fatalf("the exported model is not the imported one (%v)", err)
	}
	// The leader's statuses pass through unchanged.
	_, err = apiv1.NewTaskServiceClient(conn).GetTask(ctx, &pb.GetTaskRequest{TaskId: "no-such-task"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetTask of an unknown task through the standby: %v", err)
	}
	// The standby itself refuses a bad token and an unknown method.
	bad, err := client.Dial(b.GRPCAddr(), client.WithCA(b.CACertPEM()), client.WithToken("not-a-token"))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := apiv1.NewModelServiceClient(bad).ListModels(ctx, &pb.ListModelsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a bad token through the standby: %v", err)
	}
	if err := conn.Invoke(ctx, "/fleetlearn.api.v1.Nothing/Nothing", &pb.ListModelsRequest{}, &pb.ListModelsResponse{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("an unknown method through the standby: %v", err)
	}

	// The leader goes; the standby leads and serves the port itself.
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, "agg-b", bStarted)
	guard := testwait.After(t)
	for {
		resp, err := models.ListModels(ctx, &pb.ListModelsRequest{})
		if err == nil {
			if len(resp.GetModels()) != 1 || resp.GetModels()[0].GetRef().GetVersion() != version {
				t.Fatalf("models listed by the new leader: %v", resp.GetModels())
			}
			break
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("ListModels on the new leader's port: %v", err)
		}
		select {
		case <-guard:
			t.Fatalf("the new leader's port still answers: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// awaitStandby waits until s reports that leader leads.
func awaitStandby(t testing.TB, s *server.Server, leader string) {
	t.Helper()
	guard := testwait.After(t)
	for {
		err := s.Ready(context.Background())
		if err != nil && strings.Contains(err.Error(), "standby: replica "+leader+" leads") {
			return
		}
		select {
		case <-guard:
			t.Fatalf("not a standby of %s: %v", leader, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func dialModels(t testing.TB, s *server.Server) apiv1.ModelServiceClient {
	t.Helper()
	conn, err := client.Dial(s.GRPCAddr(), client.WithCA(s.CACertPEM()), client.WithToken(s.AdminToken()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return apiv1.NewModelServiceClient(conn)
}

// TestStandbyRefusesForwardingLoop: a leader whose lease names the
// standby's own address (a wrong --api-advertise) would have the standby
// forward calls to itself without end; the standby refuses a forwarded
// call and says what is wrong.
func TestStandbyRefusesForwardingLoop(t *testing.T) {
	pg, ns, secrets := pgtest.Database(t), natstest.Start(t), replicaSecrets(t)
	standbyAddr := freeport.Addr(t)
	_, aStarted := replica(t, "agg-a", pg, ns.ClientURL(), secrets, func(c *server.Config) { c.APIAdvertise = standbyAddr })
	waitStarted(t, "agg-a", aStarted)
	b, _ := replica(t, "agg-b", pg, ns.ClientURL(), secrets, func(c *server.Config) { c.GRPCAddr = standbyAddr })
	awaitStandby(t, b, "agg-a")
	_, err := dialModels(t, b).ListModels(context.Background(), &pb.ListModelsRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--api-advertise") {
		t.Fatalf("a call forwarded in a circle: %v", err)
	}
}

// BenchmarkAPIThroughStandby: one small unary call (ListModels of one
// model) made to the leader directly and through a standby, which adds a
// hop: its token check and a second TLS connection to the leader.
func BenchmarkAPIThroughStandby(b *testing.B) {
	pg, ns, secrets := pgtest.Database(b), natstest.Start(b), replicaSecrets(b)
	a, aStarted := replica(b, "agg-a", pg, ns.ClientURL(), secrets)
	waitStarted(b, "agg-a", aStarted)
	s, _ := replica(b, "agg-b", pg, ns.ClientURL(), secrets)
	awaitStandby(b, s, "agg-a")
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{4, 4}, Data: make([]float32, 16)})
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		b.Fatal(err)
	}
	leader := dialModels(b, a)
	if _, err := client.ImportModel(context.Background(), leader, &pb.ImportModelHeader{Name: "bench", SizeBytes: uint64(buf.Len())}, &buf); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		c    apiv1.ModelServiceClient
	}{{"leader", leader}, {"standby", dialModels(b, s)}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.c.ListModels(context.Background(), &pb.ListModelsRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
