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
//   - from round 2: the leader is partitioned from PostgreSQL, while it still
//     reaches NATS. The database ends its silent session after the lease
//     ttl, the standby leads, and the old leader, whose renewal gets no
//     answer, stops and exits. The partition heals and it is started
//     again, as its supervisor would, and waits as the standby.
//   - next: a NATS node is cut off the network; agents and the leader
//     connected to it notice within a few pings and move to the other
//     two; the round commits (or, if a report came too late, is
//     abandoned and re-run), and the node comes back.
//   - next: the leader is killed with SIGKILL; the restarted replica
//     leads.
//
// Every other round commits exactly once, and the audit log, written by three
// leaderships, verifies against the keys pinned before the first failure.
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
	const rounds = 16
	id, stored := d.train(edges, rounds)

	// The leader loses PostgreSQL, and only PostgreSQL.
	r1 := awaitMidRound(t, c, id, stored, 2)
	heal := hostA.partition(lab.root)
	cut := time.Now()
	t.Logf("round %d: agg-a partitioned from PostgreSQL", r1)
	d.awaitLeader(1)
	t.Logf("from the partition to agg-b leading and ready: %.1f s", time.Since(cut).Seconds())
	midRound(t, c, id, r1, cut)
	// The old leader finds out at its next renewal, and stops its rounds;
	// then the partition heals. (Its exit, for its supervisor to restart
	// it, waits for what it had in flight across the partition.)
	waitLog(t, a, "lost the lease")
	t.Logf("from the partition to agg-a stopping its rounds: %.1f s", time.Since(cut).Seconds())
	heal()
	partitioned := cut

	// A NATS node drops off the network.
	r2 := awaitMidRound(t, c, id, stored, r1+1)
	natsHosts[2].cut()
	cut = time.Now()
	t.Logf("round %d: nats-3 cut off", r2)
	// An agent or the leader connected to the lost node notices within
	// a few pings and moves to another: the round commits, or, if an
	// agent's report came too late for it, is abandoned and re-run.
	r := waitClosed(t, c, id, r2)
	t.Logf("from cutting nats-3 to round %d closed (%v): %.1f s", r2, r.State, time.Since(cut).Seconds())
	natsHosts[2].heal()
	midRound(t, c, id, r2, cut)

	<-a.exited
	if code := a.cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("the deposed leader exited with status %d, want 1 (lost the lease)", code)
	}
	t.Logf("from the partition to agg-a exiting: %.1f s", a.end.Sub(partitioned).Seconds())
	d.replica(0, "agg-a")
	d.awaitStandby(0, "agg-b")

	// The leader is killed.
	r3 := awaitMidRound(t, c, id, stored, r2+1)
	b.kill9()
	killed := time.Now()
	t.Logf("round %d: kill -9 the leader agg-b", r3)
	d.awaitLeader(0)
	t.Logf("from the kill to agg-a leading and ready: %.1f s", time.Since(killed).Seconds())
	next := checkRoundsOnce(t, c, id, rounds, killed, pin, r2)
	midRound(t, c, id, r3, killed)
	t.Logf("from the kill to the next committed round: %.1f s", next.Seconds())
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
