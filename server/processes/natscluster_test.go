package processes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/conf"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// deployClusterConf is the operator-facing node configuration, relative to
// this package's directory.
const deployClusterConf = "../../deploy/nats/cluster.conf"

// TestNATSClusterNodeLoss: three nats-server processes, each running
// deploy/nats/cluster.conf with the fragment fleetlearn-server writes, form
// a JetStream cluster; the aggregator and three enrolled agents use it. In
// the middle of a round, once a report is stored, the node leading the
// FL_REPORTS stream is killed with SIGKILL. The task still completes, every
// round commits with the report of every device and all of its examples, and
// the reports stream and blob bucket have three replicas.
func TestNATSClusterNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and the Fleetlearn binaries and runs a 3-node NATS cluster as processes")
	}
	serverBin, edgeBin, cli := binaries(t)
	natsBin := buildNATSServer(t)
	c := &cluster{t: t, serverBin: serverBin, edgeBin: edgeBin, cli: cli, dataDir: t.TempDir(), grpcAddr: servertest.FreeAddr(t)}
	t.Setenv("FLEETLEARN_CA", server.CAFile(c.dataDir))
	t.Setenv("FLEETLEARN_TOKEN_FILE", server.AdminTokenPath(c.dataDir))
	keys := t.TempDir()
	c.publisherKey, c.jwks = filepath.Join(keys, "publisher.pem"), filepath.Join(keys, "publishers.jwks")
	if err := os.WriteFile(c.jwks, []byte(runCLI(t, cli, "", "module", "keygen", c.publisherKey)), 0o600); err != nil {
		t.Fatal(err)
	}

	// The operator's step: the fragment, from the aggregator's data
	// directory, with the resolver directory of the hosts.
	fragment := filepath.Join(t.TempDir(), "fleetlearn-auth.conf")
	if out, err := exec.Command(serverBin, "--data-dir", c.dataDir, "--write-nats-config", fragment,
		"--nats-resolver-dir", "/var/lib/nats/jwt").CombinedOutput(); err != nil {
		t.Fatalf("fleetlearn-server --write-nats-config: %v\n%s", err, out)
	}
	checkOpenByDefault(t)
	nodes := startNATSCluster(t, natsBin, fragment)
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = "nats://" + n.client
	}
	natsURL := strings.Join(urls, ",")

	// No --replicas: the default follows the cluster, three replicas here.
	c.server = startLogged(t, "server", serverBin, "-data-dir", c.dataDir, "-nats-url", natsURL,
		"-grpc-addr", c.grpcAddr, "-metrics-addr", "off", "-pace-window", "200ms", "-log-level", "debug",
		"-module-publishers", c.jwks)
	c.dial()
	c.waitGRPC()

	init, _ := train.InitMLP([]int{32, 64, 4}, 1)
	version, module := c.setup(init, wasmtest.MLP)
	// Sizes far apart spread a round's reports out, so that the kill comes
	// between the first and the last; each under the default cap on a
	// report's weight (10 000), and no two subsets with the same sum, so
	// the examples a round counts name the devices it counted.
	sizes := []int{300, 2000, 8000}
	wantExamples := uint64(0)
	for i, n := range sizes {
		wantExamples += uint64(n)
		dir := t.TempDir()
		if err := data.WriteDir(filepath.Join(dir, "dataset"), datatest.Synthetic(n, 32, 4, uint64(i+1)), fmt.Sprintf("dev%d", i)); err != nil {
			t.Fatal(err)
		}
		id, state := fmt.Sprintf("edge-%d", i), filepath.Join(dir, "state")
		c.enroll(id, state)
		// Enrollment hands the device every node, so it can fail over.
		if got := edge.SavedNATSURL(state); got != natsURL {
			t.Fatalf("enrollment gave %s the NATS URL %q, want %q", id, got, natsURL)
		}
		startLogged(t, fmt.Sprintf("edge%d", i), edgeBin, "-data-dir", state, "-dataset", filepath.Join(dir, "dataset"),
			"-device-id", id, "-log-level", "debug")
	}

	nc := servertest.ServiceConn(t, c.dataDir, natsURL)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	blobs := "OBJ_" + wire.BlobBucket
	waitCurrent(t, js, wire.StreamReports)
	waitCurrent(t, js, blobs)
	// Notices of stored reports (the stream republishes their headers),
	// per round: which devices' reports the cluster acknowledged.
	var mu sync.Mutex
	stored := map[uint64]map[string]bool{}
	first := make(chan uint64, 64)
	const killRound, rounds = 2, 4
	sub, err := nc.Subscribe(wire.SubjectStoredPrefix+"fl.report.>", func(m *nats.Msg) {
		tok := strings.Split(strings.TrimPrefix(m.Subject, wire.SubjectStoredPrefix), ".")
		if len(tok) != 5 {
			return
		}
		round, err := strconv.ParseUint(tok[3], 10, 64)
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if stored[round] == nil {
			stored[round] = map[string]bool{}
			first <- round
		}
		stored[round][tok[4]] = true
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	id := createDefaultTask(c, version, module, sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 500},
		rounds, len(sizes))
	guard := time.After(3 * time.Minute)
	for r := uint64(0); r != killRound; {
		select {
		case r = <-first:
		case <-guard:
			t.Fatalf("no report of round %d was stored", killRound)
		}
	}
	reports := streamInfo(t, js, wire.StreamReports)
	leader := reports.Cluster.Leader
	checkReplicas(t, wire.StreamReports, reports, "")
	for _, r := range c.committed(id) {
		if r.Round == killRound {
			t.Fatalf("round %d committed before the kill: the node was not lost mid-round", killRound)
		}
	}
	// The node to lose is the one leading the round's report consumer,
	// through which the aggregator reads the reports: losing it is what
	// must not cost a report. It is the stream's leader too, often.
	what := "the FL_REPORTS leader"
	if cl := roundConsumerLeader(t, js, id, killRound); cl != "" && cl != leader {
		leader, what = cl, "the leader of the round's report consumer"
	} else if cl == leader {
		what = "the FL_REPORTS leader and the round's report consumer's"
	}
	var victim *natsNode
	for _, n := range nodes {
		if n.name == leader {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("node %q is none of the nodes", leader)
	}
	mu.Lock()
	t.Logf("round %d: reports of %v stored; kill -9 %s, %s", killRound, slices.Sorted(maps.Keys(stored[killRound])), leader, what)
	mu.Unlock()
	victim.p.kill9()

	task := c.waitDone(id, 3*time.Minute)
	if task.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v after losing %s: %s", task.State, leader, task.StateReason)
	}
	resp, err := apiv1.NewTaskServiceClient(c.conn).ListRounds(context.Background(), &pb.ListRoundsRequest{TaskId: id, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// A round short of reports is told apart by what the cluster
	// acknowledged: reports NATS lost, or reports it stored that the
	// aggregator did not count. The stream's last sequence counts every
	// report stored, also those purged with their rounds since.
	reports = streamInfo(t, js, wire.StreamReports)
	for _, r := range resp.Rounds {
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED || r.Reported != uint32(len(sizes)) || r.Dropped != 0 {
			mu.Lock()
			devices := slices.Sorted(maps.Keys(stored[r.Round]))
			mu.Unlock()
			t.Errorf("round %d: %v with %d reports, %d dropped (%s %v); the cluster stored the reports of %v; want committed with %d",
				r.Round, r.State, r.Reported, r.Dropped, r.Reason, r.Failures, devices, len(sizes))
		}
	}
	if len(resp.Rounds) != rounds {
		t.Errorf("%d rounds, want %d: a round was abandoned and run again", len(resp.Rounds), rounds)
	}
	if t.Failed() {
		t.Fatalf("FL_REPORTS stored %d reports in all, %d rounds of %d devices would be %d", reports.State.LastSeq,
			len(resp.Rounds), len(sizes), len(resp.Rounds)*len(sizes))
	}
	for _, r := range resp.Rounds {
		c.loadable(r.Model.GetVersion())
	}
	// The audit log's account of each round: every device's report, and
	// all of the examples the devices trained on.
	closed, examples := auditRounds(t, c, id, rounds)
	for r := uint64(1); r <= rounds; r++ {
		if closed[r] != uint64(len(sizes)) || examples[r] != wantExamples {
			t.Fatalf("audit log: round %d closed with %d reports and %d examples, the devices sent %d with %d",
				r, closed[r], examples[r], len(sizes), wantExamples)
		}
	}

	checkReplicas(t, wire.StreamReports, streamInfo(t, js, wire.StreamReports), leader)
	checkReplicas(t, blobs, streamInfo(t, js, blobs), leader)
	obs, err := js.ObjectStore(context.Background(), wire.BlobBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := obs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Replicas() != 3 {
		t.Fatalf("bucket %s has %d replicas, want 3", wire.BlobBucket, st.Replicas())
	}
}

// startLogged is start, and on failure the process's whole log (start
// shows its end only), without nats-server's retries of the lost node's
// route.
func startLogged(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	return logged(t, name, start(t, name, bin, args...))
}

// startLoggedOn is startLogged on a host of a netLab (nil: this one).
func startLoggedOn(t *testing.T, h *labHost, name, bin string, args ...string) *proc {
	t.Helper()
	if h == nil {
		return startLogged(t, name, bin, args...)
	}
	return logged(t, name, startCmd(t, name, h.command(bin, args...)))
}

// logged shows more of p's log than start does when t fails.
func logged(t *testing.T, name string, p *proc) *proc {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b, err := os.ReadFile(p.log)
		if err != nil {
			t.Logf("%s log: %v", name, err)
			return
		}
		var keep []string
		for line := range strings.Lines(string(b)) {
			if !strings.Contains(line, "Error trying to connect to route") {
				keep = append(keep, line)
			}
		}
		t.Logf("--- %s log:\n%s", name, tail(strings.Join(keep, ""), 64<<10))
	})
	return p
}

// createDefaultTask creates a task whose cohort is every one of the
// devices, with the CLI's default selection and report timeouts: a device's
// check-in lost with a node waits out its request timeout (10 s) before it
// is sent again, which cluster.createTask's 10 s selection would not
// survive.
func createDefaultTask(c *cluster, version, module string, hyper sgd.Hyper, rounds, devices int, flags ...string) string {
	c.t.Helper()
	h, _ := json.Marshal(hyper)
	out := runCLI(c.t, c.cli, c.grpcAddr, append([]string{"task", "create", "--name", "nodeloss", "--model", version, "--module", module,
		"--hyper", string(h), "--cohort", fmt.Sprint(devices), "--report-goal", fmt.Sprint(devices), "--over-selection", "1",
		"--rounds", fmt.Sprint(rounds), "-o", "json"}, flags...)...)
	var task struct{ ID string }
	if err := json.Unmarshal([]byte(out), &task); err != nil || task.ID == "" {
		c.t.Fatalf("task create output %q: %v", out, err)
	}
	return task.ID
}

// buildNATSServer builds nats-server from the module version go.mod names.
func buildNATSServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nats-server")
	cmd := exec.Command(filepath.Join(goroot(), "bin", "go"), "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	return bin
}

// checkOpenByDefault: cluster.conf on its own, without the fragment, is
// refused rather than run without authorization.
func checkOpenByDefault(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(deployClusterConf)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cluster.conf")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := natsserver.ProcessConfigFile(path); err == nil || !strings.Contains(err.Error(), "fleetlearn-auth.conf") {
		t.Fatalf("cluster.conf without fleetlearn-auth.conf: %v, want an error naming the fragment", err)
	}
}

type natsNode struct {
	name, client, monitor, dir string
	p                          *proc
	host                       *labHost // nil: this host, on loopback
}

// startNATSCluster starts three nats-server processes on loopback. Each
// node's directory holds copies of cluster.conf and the fragment, and a
// node.conf that includes cluster.conf and then sets what must differ
// between nodes on one host. nats-server's format lets a later key replace
// an earlier one, a block as a whole, so a block keeps cluster.conf's
// other settings by copying them.
//
// On hosts (three, of a netLab) each node runs on its own host, on the
// default ports of the host's address.
func startNATSCluster(t *testing.T, bin, fragment string, hosts ...*labHost) []*natsNode {
	t.Helper()
	deploy, err := os.ReadFile(deployClusterConf)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := os.ReadFile(fragment)
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]*natsNode, 3)
	routes := make([]string, len(nodes))
	for i := range nodes {
		if hosts != nil {
			h := hosts[i]
			nodes[i] = &natsNode{name: fmt.Sprintf("nats-%d", i+1), client: h.addr(4222), monitor: h.addr(8222), dir: t.TempDir(), host: h}
			routes[i] = h.addr(6222)
			continue
		}
		nodes[i] = &natsNode{name: fmt.Sprintf("nats-%d", i+1), client: servertest.FreeAddr(t), monitor: servertest.FreeAddr(t), dir: t.TempDir()}
		routes[i] = servertest.FreeAddr(t)
	}
	for i, n := range nodes {
		if err := os.WriteFile(filepath.Join(n.dir, "cluster.conf"), deploy, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.dir, "fleetlearn-auth.conf"), auth, 0o600); err != nil {
			t.Fatal(err)
		}
		base, err := conf.ParseFile(filepath.Join(n.dir, "cluster.conf"))
		if err != nil {
			t.Fatalf("parse cluster.conf: %v", err)
		}
		js, cl, res := block(t, base, "jetstream"), block(t, base, "cluster"), block(t, base, "resolver")
		js["store_dir"] = filepath.Join(n.dir, "jetstream")
		cl["listen"] = routes[i]
		var others []any
		for j, r := range routes {
			if j != i {
				others = append(others, "nats-route://"+r)
			}
		}
		cl["routes"] = others
		res["dir"] = filepath.Join(n.dir, "jwt")
		var b strings.Builder
		fmt.Fprintf(&b, "include ./cluster.conf\n\nserver_name: %q\nlisten: %q\nhttp: %q\n", n.name, n.client, n.monitor)
		for _, k := range []string{"jetstream", "cluster", "resolver"} {
			fmt.Fprintf(&b, "%s: %s\n", k, confValue(t, base[k]))
		}
		nodeConf := filepath.Join(n.dir, "node.conf")
		if err := os.WriteFile(nodeConf, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		checkNodeConf(t, nodeConf, n, base, routes[i])
		n.p = startLoggedOn(t, n.host, n.name, bin, "--config", nodeConf)
	}
	waitMeta(t, nodes)
	for _, n := range nodes {
		// The preloaded accounts land in the node's own resolver directory.
		if jwts, _ := filepath.Glob(filepath.Join(n.dir, "jwt", "*.jwt")); len(jwts) == 0 {
			t.Fatalf("%s wrote no account JWT to its resolver directory", n.name)
		}
	}
	return nodes
}

// block is a copy of the map base holds under key.
func block(t *testing.T, base map[string]any, key string) map[string]any {
	t.Helper()
	m, ok := base[key].(map[string]any)
	if !ok {
		t.Fatalf("cluster.conf with the fragment has no %s block", key)
	}
	cp := make(map[string]any, len(m))
	for k, v := range m {
		cp[k] = v
	}
	base[key] = cp
	return cp
}

// confValue writes v, as conf.ParseFile returns it, in nats-server's format.
func confValue(t *testing.T, v any) string {
	t.Helper()
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case int64, float64, bool:
		return fmt.Sprint(v)
	case []any:
		items := make([]string, len(v))
		for i, e := range v {
			items[i] = confValue(t, e)
		}
		return "[" + strings.Join(items, ", ") + "]"
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		b.WriteString("{\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "  %s: %s\n", k, confValue(t, v[k]))
		}
		b.WriteString("}")
		return b.String()
	}
	t.Fatalf("configuration value %v of type %T", v, v)
	return ""
}

// checkNodeConf reads node.conf as nats-server does: the node's settings
// replaced cluster.conf's, and the rest of cluster.conf and the fragment
// stayed.
func checkNodeConf(t *testing.T, path string, n *natsNode, base map[string]any, route string) {
	t.Helper()
	o, err := natsserver.ProcessConfigFile(path)
	if err != nil {
		b, _ := os.ReadFile(path)
		t.Fatalf("nats-server rejects %s: %v\n%s", n.name, err, b)
	}
	if o.AccountResolver != nil {
		o.AccountResolver.Close()
	}
	js := base["jetstream"].(map[string]any)
	got := fmt.Sprintf("%s %s:%d http %s:%d store %s cluster %s %s:%d routes %d max_payload %d max_file_store %d operators %d",
		o.ServerName, o.Host, o.Port, o.HTTPHost, o.HTTPPort, o.StoreDir, o.Cluster.Name, o.Cluster.Host, o.Cluster.Port,
		len(o.Routes), o.MaxPayload, o.JetStreamMaxStore, len(o.TrustedOperators))
	want := fmt.Sprintf("%s %s http %s store %s cluster fleetlearn %s routes 2 max_payload %d max_file_store %d operators 1",
		n.name, n.client, n.monitor, filepath.Join(n.dir, "jetstream"), route, wire.MaxMessageBytes, js["max_file_store"])
	if got != want {
		t.Fatalf("%s configuration:\n got %s\nwant %s", n.name, got, want)
	}
}

// jsz is a node's JetStream monitoring report.
func jsz(addr string) (*natsserver.JSInfo, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + addr + "/jsz")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var info natsserver.JSInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return nil, fmt.Errorf("jsz %s: %w", addr, err)
	}
	return &info, nil
}

// waitMeta waits until the three nodes agree on a JetStream meta leader
// that sees the other two as current.
func waitMeta(t *testing.T, nodes []*natsNode) {
	t.Helper()
	end := time.Now().Add(2 * time.Minute)
	for {
		state, ok := metaState(nodes)
		if ok {
			t.Logf("JetStream meta cluster: %s", state)
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no JetStream meta cluster of 3 after 2m: %s", state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func metaState(nodes []*natsNode) (string, bool) {
	leaders := map[string]bool{}
	var leaderInfo *natsserver.MetaClusterInfo
	for _, n := range nodes {
		info, err := jsz(n.monitor)
		if err != nil {
			return fmt.Sprintf("%s: %v", n.name, err), false
		}
		if info.Meta == nil || info.Meta.Leader == "" || info.Meta.Size != len(nodes) {
			return fmt.Sprintf("%s: meta %+v", n.name, info.Meta), false
		}
		leaders[info.Meta.Leader] = true
		if info.Meta.Leader == n.name {
			leaderInfo = info.Meta
		}
	}
	if len(leaders) != 1 || leaderInfo == nil {
		return fmt.Sprintf("leaders %v", leaders), false
	}
	current := 0
	for _, p := range leaderInfo.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	state := fmt.Sprintf("leader %s, %d of %d peers current", leaderInfo.Leader, current, len(leaderInfo.Replicas))
	return state, current == len(nodes)-1
}

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		t.Fatalf("stream %s has no cluster information", name)
	}
	return info
}

// checkReplicas: the stream keeps three replicas, led by a node other than
// lost (when set). It returns how many of the followers are current.
func checkReplicas(t *testing.T, name string, info *jetstream.StreamInfo, lost string) int {
	t.Helper()
	peers := []string{info.Cluster.Leader + " (leader)"}
	current := 0
	for _, p := range info.Cluster.Replicas {
		peers = append(peers, fmt.Sprintf("%s (current %v, offline %v)", p.Name, p.Current, p.Offline))
		if p.Current {
			current++
		}
	}
	switch {
	case info.Config.Replicas != 3 || len(info.Cluster.Replicas) != 2:
		t.Fatalf("stream %s: %d replicas configured, peers %v; want 3", name, info.Config.Replicas, peers)
	case info.Cluster.Leader == "" || info.Cluster.Leader == lost:
		t.Fatalf("stream %s: leader %q after losing %s", name, info.Cluster.Leader, lost)
	}
	t.Logf("stream %s: peers %v", name, peers)
	return current
}

// waitCurrent waits until both followers of the stream have caught up: at
// rest, it is held on all three nodes.
func waitCurrent(t *testing.T, js jetstream.JetStream, name string) {
	t.Helper()
	end := time.Now().Add(time.Minute)
	for checkReplicas(t, name, streamInfo(t, js, name), "") != 2 {
		if time.Now().After(end) {
			t.Fatalf("stream %s: followers not current after 1m", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// auditRounds reads the task's round closes and device metrics from the
// audit log: reports and examples per round. The last round's entries may
// land just after the task shows completed.
func auditRounds(t *testing.T, c *cluster, task string, rounds int) (reports, examples map[uint64]uint64) {
	t.Helper()
	end := time.Now().Add(time.Minute)
	for {
		reports, examples = map[uint64]uint64{}, map[uint64]uint64{}
		for _, p := range auditPayloads(t, c, task) {
			switch p := p.(type) {
			case audit.RoundClosed:
				if p.Outcome == audit.RoundCommitted {
					reports[p.Round] = p.Reports
				}
			case audit.ModelEvaluated:
				if p.Dataset == "federated:train" {
					examples[p.Round] = p.Samples
				}
			}
		}
		if len(reports) >= rounds && len(examples) >= rounds || time.Now().After(end) {
			return reports, examples
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// auditPayloads reads the task's entries from the audit log through the
// API, checks each one's signature with the log's entry key, and returns
// their payloads in order.
func auditPayloads(t *testing.T, c *cluster, task string) []audit.Payload {
	t.Helper()
	ac := apiv1.NewAuditServiceClient(c.conn)
	keys, err := ac.GetPublicKeys(context.Background(), &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil {
		t.Fatal(err)
	}
	res, err := ac.QueryEntries(context.Background(), &pb.QueryEntriesRequest{Filter: &pb.AuditFilter{TaskId: task}, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Payload
	for _, e := range res.GetEntries() {
		ev, err := audit.VerifyEntry(audit.Entry{Index: e.GetIndex(), Data: e.GetJws()}, entryKey)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// roundConsumerLeader is the node leading the report consumer of task's
// round (named fl-TASK-rROUND-…), or "" if there is none.
func roundConsumerLeader(t *testing.T, js jetstream.JetStream, task string, round uint64) string {
	t.Helper()
	st, err := js.Stream(context.Background(), wire.StreamReports)
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("fl-%s-r%d-", task, round)
	list := st.ListConsumers(context.Background())
	for info := range list.Info() {
		if strings.HasPrefix(info.Name, prefix) && info.Cluster != nil {
			if info.Config.Replicas != 3 && info.Config.Replicas != 0 {
				t.Errorf("report consumer %s has %d replicas, want the stream's 3", info.Name, info.Config.Replicas)
			}
			return info.Cluster.Leader
		}
	}
	if err := list.Err(); err != nil {
		t.Fatal(err)
	}
	return ""
}
