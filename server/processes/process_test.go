// Package processes_test runs the release binaries as separate processes
// against each other: the server, edge agents, pool workers and the CLI,
// a NATS cluster that loses a node, a server killed mid-round. These tests
// build the binaries and take minutes, so they live apart from the server's
// in-process tests, each package well inside go test's default timeout.
package processes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/cmd/cmdtest"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// binaries returns the server, the edge agent and the CLI, with the pool
// agent beside them (workerBin): the test binary standing in for each
// program (cmd/cmdtest), the same code as cmd/'s mains.
func binaries(t testing.TB) (serverBin, edgeBin, cliBin string) {
	t.Helper()
	dir := cmdtest.Dir(t)
	return filepath.Join(dir, "fleetlearn-server"), filepath.Join(dir, "fleetlearn-edge"), filepath.Join(dir, "fleetlearn")
}

// TestMain lets the test binary run as the programs binaries links, and
// stops the PostgreSQL server that the replicated aggregators' tests start.
func TestMain(m *testing.M) {
	cmdtest.Main()
	os.Exit(pgtest.Main(m))
}

// workerBin is the fleetlearn-worker that binaries built next to serverBin.
func workerBin(serverBin string) string {
	return filepath.Join(filepath.Dir(serverBin), "fleetlearn-worker")
}

func goroot() string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "/usr/local/go"
	}
	return strings.TrimSpace(string(out))
}

// proc is a child process whose output goes to a log file shown on failure.
type proc struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed once the process has exited and been waited for
	end    time.Time     // when it was seen to exit; read after exited closes
}

func start(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	return startCmd(t, name, exec.Command(bin, args...))
}

// startCmd starts cmd, its output in a log that a failed test shows the
// end of, and stops it when t ends.
func startCmd(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		p.end = time.Now()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s log (tail):\n%s", name, tail(string(b), 3000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// stop sends SIGTERM and waits; kill -9 after 10 s.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

func (p *proc) kill9() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func runCLI(t testing.TB, cli, server string, args ...string) string {
	t.Helper()
	// Only stdout is returned: warnings go to stderr and would break callers that parse -o json.
	var stderr strings.Builder
	cmd := exec.Command(cli, append([]string{"--server", server}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fleetlearn %v: %v\n%s%s", args, err, out, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

type cluster struct {
	t                       testing.TB
	serverBin, edgeBin, cli string
	dataDir, grpcAddr, nats string
	publisherKey, jwks      string // module publisher key and the JWK Set the server trusts
	server                  *proc
	conn                    *grpc.ClientConn
}

func (c *cluster) startServer() {
	c.server = start(c.t, "server", c.serverBin, "-data-dir", c.dataDir, "-nats-listen", c.nats,
		"-grpc-addr", c.grpcAddr, "-metrics-addr", "off", "-pace-window", "200ms", "-log-level", "debug",
		"-module-publishers", c.jwks)
	if c.conn == nil {
		c.dial()
	}
	c.waitGRPC()
}

// dial connects as the admin once the server has written its CA
// certificate and admin token.
func (c *cluster) dial() {
	end := time.Now().Add(30 * time.Second)
	for {
		ca, err := os.ReadFile(server.CAFile(c.dataDir))
		tok, terr := client.ReadToken(server.AdminTokenPath(c.dataDir))
		if err == nil && terr == nil {
			conn, err := client.Dial(c.grpcAddr, client.WithCA(ca), client.WithToken(tok))
			if err != nil {
				c.t.Fatal(err)
			}
			c.t.Cleanup(func() { conn.Close() })
			c.conn = conn
			return
		}
		if time.Now().After(end) {
			c.t.Fatalf("server wrote no CA certificate and admin token: %v, %v", err, terr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) waitGRPC() {
	end := time.Now().Add(30 * time.Second)
	for time.Now().Before(end) {
		_, err := apiv1.NewTaskServiceClient(c.conn).ListTasks(context.Background(), &pb.ListTasksRequest{})
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatal("server did not come up")
}

func newCluster(t *testing.T) *cluster {
	if testing.Short() {
		t.Skip("builds and runs separate processes")
	}
	s, e, cli := binaries(t)
	c := &cluster{t: t, serverBin: s, edgeBin: e, cli: cli, dataDir: t.TempDir(), grpcAddr: servertest.FreeAddr(t), nats: servertest.FreeAddr(t)}
	// The CLI finds the server's CA and admin token through the environment.
	t.Setenv("FLEETLEARN_CA", server.CAFile(c.dataDir))
	t.Setenv("FLEETLEARN_TOKEN_FILE", server.AdminTokenPath(c.dataDir))
	keys := t.TempDir()
	c.publisherKey, c.jwks = filepath.Join(keys, "publisher.pem"), filepath.Join(keys, "publishers.jwks")
	if err := os.WriteFile(c.jwks, []byte(runCLI(t, cli, "", "module", "keygen", c.publisherKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startServer()
	return c
}

// setup registers a module and imports a model through the CLI and returns them.
func (c *cluster) setup(m *model.Model, pkg string) (version, module string) {
	dir := c.t.TempDir()
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		c.t.Fatal(err)
	}
	modelPath, modPath := filepath.Join(dir, "base.safetensors"), filepath.Join(dir, "module.wasm")
	os.WriteFile(modelPath, buf.Bytes(), 0o600)
	os.WriteFile(modPath, wasmtest.Build(c.t, pkg), 0o600)
	module = runCLI(c.t, c.cli, c.grpcAddr, "module", "register", modPath, "--name", "module", "--signing-key", c.publisherKey)
	version = runCLI(c.t, c.cli, c.grpcAddr, "model", "import", modelPath, "--name", "base")
	return version, module
}

func (c *cluster) startEdges(sets []*data.Dataset) {
	for i, d := range sets {
		dir := c.t.TempDir()
		if err := data.WriteDir(filepath.Join(dir, "dataset"), d, fmt.Sprintf("dev%d", i)); err != nil {
			c.t.Fatal(err)
		}
		id := fmt.Sprintf("edge-%d", i)
		c.enroll(id, filepath.Join(dir, "state"))
		start(c.t, fmt.Sprintf("edge%d", i), c.edgeBin, "-nats-url", "nats://"+c.nats, "-data-dir", filepath.Join(dir, "state"),
			"-dataset", filepath.Join(dir, "dataset"), "-device-id", id)
	}
}

// enroll enrolls a device the way an operator would: a token from the CLI,
// then the agent's enroll command with the server's CA.
func (c *cluster) enroll(id, dataDir string) {
	c.t.Helper()
	tok, err := exec.Command(c.cli, "--server", c.grpcAddr, "device", "token", "--ttl", "10m").Output()
	if err != nil {
		c.t.Fatalf("fleetlearn device token: %v", err)
	}
	out, err := exec.Command(c.edgeBin, "enroll", "--api", c.grpcAddr, "--ca", server.CAFile(c.dataDir),
		"--token", strings.TrimSpace(string(tok)), "--data-dir", dataDir, "--device-id", id).CombinedOutput()
	if err != nil {
		c.t.Fatalf("fleetlearn-edge enroll: %v\n%s", err, out)
	}
}

// observer connects to the server's NATS as the aggregator's service user,
// with the keys in its data directory, to watch traffic.
func (c *cluster) observer(opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	dir := filepath.Join(c.dataDir, server.NATSAuthDir)
	auth, err := identity.LoadOrCreateAuthority("fleetlearn", dir)
	if err != nil {
		c.t.Fatal(err)
	}
	key, err := identity.LoadOrCreateUserKey(filepath.Join(dir, "service-user.nk"))
	if err != nil {
		c.t.Fatal(err)
	}
	jwt, err := auth.ServiceUserJWT("test-observer", key.ID(), time.Time{})
	if err != nil {
		c.t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+c.nats, append(opts, nats.UserJWT(func() (string, error) { return jwt, nil }, key.Sign))...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

func (c *cluster) createTask(version, module string, hyper sgd.Hyper, rounds, cohort, goal int) string {
	h, _ := json.Marshal(hyper)
	out := runCLI(c.t, c.cli, c.grpcAddr, "task", "create", "--name", "proc", "--model", version, "--module", module,
		"--hyper", string(h), "--cohort", fmt.Sprint(cohort), "--report-goal", fmt.Sprint(goal), "--over-selection", "1",
		"--rounds", fmt.Sprint(rounds), "--selection-timeout", "10s", "--report-timeout", "30s", "-o", "json")
	var task struct{ ID string }
	if err := json.Unmarshal([]byte(out), &task); err != nil || task.ID == "" {
		c.t.Fatalf("task create output %q: %v", out, err)
	}
	return task.ID
}

func (c *cluster) waitDone(id string, timeout time.Duration) *pb.Task {
	end := time.Now().Add(timeout)
	for {
		resp, err := apiv1.NewTaskServiceClient(c.conn).GetTask(context.Background(), &pb.GetTaskRequest{TaskId: id})
		if err == nil && resp.Task.State != pb.TaskState_TASK_STATE_RUNNING {
			return resp.Task
		}
		if time.Now().After(end) {
			c.t.Fatalf("task %s not done after %v (last: %v, %v)", id, timeout, resp.GetTask().GetState(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) committed(id string) []*pb.RoundSummary {
	resp, err := apiv1.NewTaskServiceClient(c.conn).ListRounds(context.Background(), &pb.ListRoundsRequest{TaskId: id, PageSize: 1000})
	if err != nil {
		c.t.Fatal(err)
	}
	var out []*pb.RoundSummary
	for _, r := range resp.Rounds {
		if r.State == pb.RoundState_ROUND_STATE_COMMITTED {
			out = append(out, r)
		}
	}
	return out
}

// loadable exports a version through the API and decodes it.
func (c *cluster) loadable(version string) {
	_, b, err := client.ExportModelBytes(context.Background(), apiv1.NewModelServiceClient(c.conn), version, 0)
	if err != nil {
		c.t.Fatalf("export %s: %v", version, err)
	}
	if _, err := model.DecodeSafetensors(b); err != nil {
		c.t.Fatalf("model %s does not load: %v", version, err)
	}
}

// TestProcesses: the server binary, three edge binaries with their own data
// directories, a task created through the CLI; three rounds commit.
func TestProcesses(t *testing.T) {
	c := newCluster(t)
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version, module := c.setup(init, wasmtest.Softmax)
	c.startEdges([]*data.Dataset{datatest.Synthetic(300, 8, 3, 1), datatest.Synthetic(300, 8, 3, 2), datatest.Synthetic(300, 8, 3, 3)})
	id := c.createTask(version, module, sgd.Hyper{Epochs: 1, BatchSize: 16, LearningRate: 0.5, EvalBatchSize: 100}, 3, 3, 3)
	task := c.waitDone(id, 90*time.Second)
	if task.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", task.State, task.StateReason)
	}
	rounds := c.committed(id)
	if len(rounds) != 3 {
		t.Fatalf("%d rounds committed, want 3", len(rounds))
	}
	for _, r := range rounds {
		if r.Reported != 3 {
			t.Fatalf("round %d: %d reports, want 3", r.Round, r.Reported)
		}
		c.loadable(r.Model.GetVersion())
	}
	out := runCLI(t, c.cli, c.grpcAddr, "task", "rounds", id)
	if strings.Count(out, "committed") < 3 {
		t.Fatalf("task rounds output:\n%s", out)
	}
}

// TestServerCrash: kill -9 the server while a round's reports are arriving,
// restart it on the same state; the round completes (reports come back from
// the JetStream stream and from agents retrying), and every committed model
// version is still there and loadable.
func TestServerCrash(t *testing.T) {
	c := newCluster(t)
	init, _ := train.InitMLP([]int{32, 128, 4}, 1)
	version, module := c.setup(init, wasmtest.MLP)
	// Different data sizes spread the reports of a round over a second or two.
	c.startEdges([]*data.Dataset{datatest.Synthetic(200, 32, 4, 1), datatest.Synthetic(3000, 32, 4, 2), datatest.Synthetic(20000, 32, 4, 3)})
	id := c.createTask(version, module, sgd.Hyper{Epochs: 2, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 500}, 5, 3, 2)

	// Watch reports arrive for round 3, and kill the server at the first one.
	nc := c.observer(nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	seen := make(chan string, 16)
	sub, err := nc.Subscribe("fl.report."+id+".3.*", func(m *nats.Msg) { seen <- m.Subject })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case subj := <-seen:
		t.Logf("report arriving on %s: kill -9", subj)
	case <-time.After(90 * time.Second):
		t.Fatal("no report for round 3 arrived")
	}
	before := c.committed(id)
	c.server.kill9()
	if len(before) < 2 {
		t.Fatalf("only %d rounds committed before the crash", len(before))
	}
	time.Sleep(500 * time.Millisecond)
	c.startServer()

	task := c.waitDone(id, 120*time.Second)
	if task.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v after restart: %s", task.State, task.StateReason)
	}
	after := c.committed(id)
	if len(after) != 5 {
		t.Fatalf("%d rounds committed, want 5", len(after))
	}
	versions := map[string]bool{}
	for _, r := range after {
		versions[r.Model.GetVersion()] = true
		c.loadable(r.Model.GetVersion())
	}
	for _, r := range before {
		if !versions[r.Model.GetVersion()] {
			t.Fatalf("version %s committed before the crash is gone", r.Model.GetVersion())
		}
	}
	var r3 *pb.RoundSummary
	for _, r := range after {
		if r.Round == 3 {
			r3 = r
		}
	}
	if r3 == nil {
		t.Logf("round 3 was abandoned and re-run; rounds: %v", after)
	} else if r3.Reported < 2 {
		t.Fatalf("round 3 committed with %d reports", r3.Reported)
	}
}
