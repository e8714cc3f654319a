package processes_test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// replicated is the deployment the failover tests break: two aggregator
// replicas sharing a PostgreSQL store and a 3-node NATS cluster, and three
// agents training, all processes. On loopback, or each on a host of a
// netLab.
type replicated struct {
	t       *testing.T
	c       *cluster // its API address is the leader's of the moment
	pg      string
	natsURL string
	hosts   [2]*labHost // the replicas' hosts; nil on loopback
	dirs    [2]string
	grpc    [2]string
	metrics [2]string
}

// newReplicated writes the keys the replicas share, starts the NATS
// cluster (on natsHosts, three of a netLab, or on loopback) and returns
// the deployment with no replica started. hosts places the replicas.
func newReplicated(t *testing.T, pg string, natsHosts []*labHost, hosts [2]*labHost) *replicated {
	t.Helper()
	d := &replicated{t: t, pg: pg, hosts: hosts, dirs: [2]string{t.TempDir(), t.TempDir()}}
	for i, h := range hosts {
		if h == nil {
			d.grpc[i], d.metrics[i] = servertest.FreeAddr(t), servertest.FreeAddr(t)
		} else {
			d.grpc[i], d.metrics[i] = h.addr(7070), h.addr(9464)
		}
	}
	serverBin, edgeBin, cli := binaries(t)
	natsBin := buildNATSServer(t)
	d.c = &cluster{t: t, serverBin: serverBin, edgeBin: edgeBin, cli: cli, dataDir: d.dirs[0], grpcAddr: d.grpc[0]}
	t.Setenv("FLEETLEARN_CA", server.CAFile(d.dirs[0]))
	t.Setenv("FLEETLEARN_TOKEN_FILE", server.AdminTokenPath(d.dirs[0]))
	keys := t.TempDir()
	d.c.publisherKey, d.c.jwks = filepath.Join(keys, "publisher.pem"), filepath.Join(keys, "publishers.jwks")
	if err := os.WriteFile(d.c.jwks, []byte(runCLI(t, cli, "", "module", "keygen", d.c.publisherKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	fragment := filepath.Join(t.TempDir(), "fleetlearn-auth.conf")
	if out, err := exec.Command(serverBin, "--data-dir", d.dirs[0], "--write-nats-config", fragment,
		"--nats-resolver-dir", "/var/lib/nats/jwt").CombinedOutput(); err != nil {
		t.Fatalf("fleetlearn-server --write-nats-config: %v\n%s", err, out)
	}
	nodes := startNATSCluster(t, natsBin, fragment, natsHosts...)
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = "nats://" + n.client
	}
	d.natsURL = strings.Join(urls, ",")
	return d
}

// replica starts replica i (0 or 1) under name, on a 4 s lease ttl. The
// leader shards its rounds' reports, and each replica, standby included,
// runs an aggregation worker: every failure the tests cause also strikes
// the workers and the sums they hold.
func (d *replicated) replica(i int, name string) *proc {
	d.t.Helper()
	return startLoggedOn(d.t, d.hosts[i], name, d.c.serverBin, "-data-dir", d.dirs[i], "-nats-url", d.natsURL, "-store", d.pg,
		"-replica-name", name, "-lease-ttl", "4s", "-grpc-addr", d.grpc[i], "-metrics-addr", d.metrics[i],
		"-shard-aggregation", "-aggregation-workers", "1",
		"-pace-window", "200ms", "-log-level", "debug", "-module-publishers", d.c.jwks)
}

// start starts the first replica, which leads, and the second, with the
// first's shared secrets (a deployment mounts them from one Secret), which
// waits as its standby.
func (d *replicated) start(nameA, nameB string) (a, b *proc) {
	d.t.Helper()
	a = d.replica(0, nameA)
	d.c.dial()
	d.c.waitGRPC()
	copySecrets(d.t, d.dirs[0], d.dirs[1])
	b = d.replica(1, nameB)
	d.awaitStandby(1, nameA)
	return a, b
}

// awaitStandby waits for replica i to say, on /readyz, that leader leads.
func (d *replicated) awaitStandby(i int, leader string) {
	d.t.Helper()
	waitReadyz(d.t, d.metrics[i], func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "standby: replica "+leader+" leads")
	})
}

// awaitLeader waits for replica i to lead and be ready, and points the
// deployment's API client at it.
func (d *replicated) awaitLeader(i int) {
	d.t.Helper()
	waitReadyz(d.t, d.metrics[i], func(code int, _ string) bool { return code == http.StatusOK })
	d.c.grpcAddr, d.c.conn = d.grpc[i], nil
	d.c.dial()
	d.c.waitGRPC()
}

// train starts three agents (on host; nil: this one), creates a task of
// rounds rounds for them (with the CLI's defaults, and flags of task
// create) and returns its id, with a channel of the rounds of the reports
// JetStream stores from then on.
func (d *replicated) train(host *labHost, rounds int, flags ...string) (id string, stored <-chan uint64) {
	d.t.Helper()
	t, c := d.t, d.c
	init, _ := train.InitMLP([]int{32, 64, 4}, 1)
	version, module := c.setup(init, wasmtest.MLP)
	sizes := []int{300, 2000, 8000}
	for i, n := range sizes {
		dir := t.TempDir()
		if err := data.WriteDir(filepath.Join(dir, "dataset"), datatest.Synthetic(n, 32, 4, uint64(i+1)), fmt.Sprintf("dev%d", i)); err != nil {
			t.Fatal(err)
		}
		id, state := fmt.Sprintf("edge-%d", i), filepath.Join(dir, "state")
		c.enroll(id, state)
		startLoggedOn(t, host, fmt.Sprintf("edge%d", i), c.edgeBin, "-data-dir", state, "-dataset", filepath.Join(dir, "dataset"),
			"-device-id", id, "-log-level", "debug")
	}
	stored = storedReports(t, servertest.ServiceConn(t, d.dirs[0], d.natsURL))
	id = createDefaultTask(c, version, module, sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 500},
		rounds, len(sizes), flags...)
	return id, stored
}
