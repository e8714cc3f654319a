package processes_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestMultiHostFailures runs a replicated deployment across hosts that
// are network namespaces on one bridge (netLab): PostgreSQL on the root
// host, three NATS nodes, two aggregator replicas and the agents each on
// hosts of their own, talking over real interfaces. In the middle of a
// round each time (a report of it stored, the round open; rounds go on
// meanwhile, so each break takes the next round that is open):
//
//   - the leader is partitioned from PostgreSQL, while it still reaches
//     NATS. The database ends its silent session after the lease ttl, the
//     standby leads, and the old leader, whose renewal gets no answer,
//     stops and exits. The partition heals and it is started again, as
//     its supervisor would, and waits as the standby.
//   - the leader is killed with SIGKILL; the restarted replica leads.
//   - a NATS node is cut off the network. Agents and the leader connected
//     to it notice within a few pings or a stuck write and move to the
//     other two. Rounds from then on may be abandoned (a report that came
//     after the deadline, its device then sitting a round out) and run
//     again.
//
// Every round closes exactly once, and the task commits all its rounds;
// the audit log, written under three leaderships, verifies against the
// keys pinned before the first failure.
func TestMultiHostFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("makes network namespaces and runs PostgreSQL, a 3-node NATS cluster, two aggregators and agents across them")
	}
	lab := newNetLab(t)
	pgServer := pgtest.Start(t, lab.root.ip, lab.subnet+".0/24")
	pg, err := url.Parse(pgServer.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	pg.Host = net.JoinHostPort(lab.root.ip, pg.Port())
	natsHosts := []*labHost{lab.host("nats-1"), lab.host("nats-2"), lab.host("nats-3")}
	hostA, hostB, edges := lab.host("agg-a"), lab.host("agg-b"), lab.host("edges")

	d := newReplicated(t, pg.String(), natsHosts, [2]*labHost{hostA, hostB})
	c := d.c
	a, b := d.start("agg-a", "agg-b")
	pin := filepath.Join(t.TempDir(), "audit.pin")
	runCLI(t, c.cli, c.grpcAddr, "audit", "keys", "-o", pin)
	const rounds = 30
	// A round whose devices lost their NATS node is abandoned at its
	// deadline rather than held for two minutes.
	id, stored := d.train(edges, rounds, "--report-timeout", "45s")

	// The leader loses PostgreSQL, and only PostgreSQL.
	r1 := awaitMidRound(t, c, id, stored, 2)
	heal := hostA.partition(lab.root)
	cut := time.Now()
	t.Logf("round %d: agg-a partitioned from PostgreSQL", r1)
	d.awaitLeader(1)
	t.Logf("from the partition to agg-b leading and ready: %.1f s", time.Since(cut).Seconds())
	// The old leader finds out at its next renewal and stops its rounds;
	// then the partition heals, and the old leader, once it has exited,
	// is started again as the standby.
	waitLog(t, a, "lost the lease")
	t.Logf("from the partition to agg-a stopping its rounds: %.1f s", time.Since(cut).Seconds())
	heal()
	<-a.exited
	if code := a.cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("the deposed leader exited with status %d, want 1 (lost the lease)", code)
	}
	t.Logf("from the partition to agg-a exiting: %.1f s", a.end.Sub(cut).Seconds())
	d.replica(0, "agg-a")
	d.awaitStandby(0, "agg-b")
	t.Logf("the partition struck round %d", struck(t, c, id, r1, cut))

	// The leader is killed.
	r2 := awaitMidRound(t, c, id, stored, r1+1)
	b.kill9()
	killed := time.Now()
	t.Logf("round %d: kill -9 the leader agg-b", r2)
	d.awaitLeader(0)
	t.Logf("from the kill to agg-a leading and ready: %.1f s", time.Since(killed).Seconds())
	r2 = struck(t, c, id, r2, killed)
	if r := waitClosed(t, c, id, r2); r.State != pb.RoundState_ROUND_STATE_COMMITTED {
		t.Fatalf("round %d, whose leader was killed: %v (%s)", r2, r.State, r.Reason)
	}
	t.Logf("from the kill to round %d committed: %.1f s", r2, time.Since(killed).Seconds())

	// A NATS node drops off the network.
	r3 := awaitMidRound(t, c, id, stored, r2+1)
	natsHosts[2].cut()
	cut = time.Now()
	t.Logf("round %d: nats-3 cut off", r3)
	r3 = struck(t, c, id, r3, cut)
	r := waitClosed(t, c, id, r3)
	t.Logf("from cutting nats-3 to round %d closed (%v): %.1f s", r3, r.State, time.Since(cut).Seconds())
	natsHosts[2].heal()
	checkRoundsOnce(t, c, id, rounds, cut, pin, func(round uint64) bool { return round >= r3 })
}

// waitClosed waits for round of task id to close, and returns it.
func waitClosed(t *testing.T, c *cluster, id string, round uint64) *pb.RoundSummary {
	t.Helper()
	guard := time.After(4 * time.Minute)
	for {
		resp, err := apiv1.NewTaskServiceClient(c.conn).ListRounds(context.Background(), &pb.ListRoundsRequest{TaskId: id, PageSize: 1000})
		if err == nil {
			for _, r := range resp.Rounds {
				if r.Round == round && r.State != pb.RoundState_ROUND_STATE_OPEN {
					return r
				}
			}
		}
		select {
		case <-guard:
			t.Fatalf("round %d of task %s still open after 4m (%v)", round, id, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitLog waits until p's log holds text.
func waitLog(t *testing.T, p *proc, text string) {
	t.Helper()
	guard := time.After(2 * time.Minute)
	for {
		if b, err := os.ReadFile(p.log); err == nil && strings.Contains(string(b), text) {
			return
		}
		select {
		case <-guard:
			t.Fatalf("%q not in %s after 2m", text, p.log)
		case <-p.exited:
			if b, _ := os.ReadFile(p.log); !strings.Contains(string(b), text) {
				t.Fatalf("the process exited without logging %q", text)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
