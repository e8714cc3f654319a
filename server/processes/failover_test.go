package processes_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server"
)

// TestLeaderFailover: two aggregator replicas share a PostgreSQL store and
// a 3-node NATS cluster; three agents train. In the middle of round 2,
// once a report is stored, the leading replica is killed with SIGKILL. The
// standby takes the lease and finishes the task: every round commits
// exactly once, the audit log — kept in PostgreSQL, continued by the new
// leader under the same keys — records each round closed once and
// verifies offline against the keys pinned before the kill. The time from
// the kill to the next committed round is logged.
func TestLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and the Fleetlearn binaries, runs PostgreSQL, a 3-node NATS cluster and two aggregators as processes")
	}
	d := newReplicated(t, pgtest.Database(t), nil, [2]*labHost{})
	c, cli, grpcB := d.c, d.c.cli, d.grpc[1]
	leader, _ := d.start("agg-a", "agg-b")

	// Any replica serves the API: the standby forwards the CLI's calls to
	// the leader, over TLS to the name the leader advertised.
	pin := filepath.Join(t.TempDir(), "audit.pin")
	runCLI(t, cli, grpcB, "audit", "keys", "-o", pin)

	const killRound, rounds = 2, 4
	id, stored := d.train(nil, rounds)
	if out := runCLI(t, cli, grpcB, "task", "list"); !strings.Contains(out, id) {
		t.Fatalf("fleetlearn task list through the standby does not list task %s:\n%s", id, out)
	}
	if r := awaitMidRound(t, c, id, stored, killRound); r != killRound {
		t.Fatalf("round %d ended before a report of it was seen stored", killRound)
	}
	leader.kill9()
	killed := time.Now()
	t.Logf("round %d: a report stored; kill -9 the leader agg-a", killRound)
	d.awaitLeader(1)
	t.Logf("from the kill to the standby leading and ready: %.1f s", time.Since(killed).Seconds())
	next := checkRoundsOnce(t, c, id, rounds, killed, pin, nil)
	t.Logf("from the kill to the next committed round: %.1f s", next.Seconds())
	// The new leader handed its reports to the workers (its own, and none
	// other is left) and read none itself for want of one.
	byWorker, byLeader := scrapeCounter(t, d.metrics[1], `fleetlearn_shard_reports_total{reader="worker"}`),
		scrapeCounter(t, d.metrics[1], `fleetlearn_shard_reports_total{reader="leader"}`)
	t.Logf("reports the new leader's rounds had read by a worker: %v, by the leader: %v", byWorker, byLeader)
	if byWorker == 0 {
		t.Error("no report of the new leader's rounds went to an aggregation worker")
	}
}

// scrapeCounter reads one series from a replica's /metrics (0 when absent).
func scrapeCounter(t testing.TB, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q", series, line)
			}
			return f
		}
	}
	return 0
}

// copySecrets copies server.ReplicaSecrets from one data directory to
// another.
func copySecrets(t *testing.T, from, to string) {
	t.Helper()
	for _, rel := range server.ReplicaSecrets {
		src := filepath.Join(from, rel)
		err := filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			dst := filepath.Join(to, rel, strings.TrimPrefix(path, src))
			if info.IsDir() {
				return os.MkdirAll(dst, 0o700)
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, b, info.Mode().Perm())
		})
		if err != nil {
			t.Fatalf("copy %s: %v", rel, err)
		}
	}
}

// waitReadyz polls a replica's /readyz until ok accepts its answer.
func waitReadyz(t *testing.T, addr string, ok func(code int, body string) bool) {
	t.Helper()
	var last string
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + server.ReadyzPath)
		if err != nil {
			last = err.Error()
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if ok(resp.StatusCode, string(b)) {
			return
		}
		last = fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	t.Fatalf("%s%s: %s", addr, server.ReadyzPath, last)
}

// checkRoundsOnce waits for task id to complete and checks that each of
// its rounds closed exactly once, committed, by the store and by the audit
// log, whose export verifies against the keys pinned in pin; rounds
// committed is the task's. Rounds mayAbandon accepts (nil: none) may
// instead have been abandoned (once), to be re-run as the next. It returns
// the time from since to the first round that closed after it.
func checkRoundsOnce(t *testing.T, c *cluster, id string, rounds int, since time.Time, pin string, mayAbandon func(round uint64) bool) time.Duration {
	t.Helper()
	task := c.waitDone(id, 4*time.Minute)
	if task.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", task.State, task.StateReason)
	}
	resp, err := apiv1.NewTaskServiceClient(c.conn).ListRounds(context.Background(), &pb.ListRoundsRequest{TaskId: id, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var next time.Duration
	want := map[uint64]string{}
	for _, r := range resp.Rounds {
		switch {
		case r.State == pb.RoundState_ROUND_STATE_COMMITTED:
			want[r.Round] = audit.RoundCommitted
			c.loadable(r.Model.GetVersion())
		case r.State == pb.RoundState_ROUND_STATE_ABANDONED && mayAbandon != nil && mayAbandon(r.Round):
			want[r.Round] = audit.RoundAbandoned
			t.Logf("round %d abandoned (%s), re-run as the next", r.Round, r.Reason)
		default:
			t.Errorf("round %d: %v (%s)", r.Round, r.State, r.Reason)
		}
		if closed := r.GetCloseTime().AsTime(); next == 0 && closed.After(since) {
			next = closed.Sub(since)
		}
	}
	committed := 0
	for _, o := range want {
		if o == audit.RoundCommitted {
			committed++
		}
	}
	if committed != rounds {
		t.Errorf("%d rounds committed, want %d", committed, rounds)
	}
	// The log tells each round's close once, whichever leader closed it,
	// and verifies against the keys pinned before any failover.
	closes := map[uint64]int{}
	for _, p := range auditPayloads(t, c, id) {
		if rc, ok := p.(audit.RoundClosed); ok {
			closes[rc.Round]++
			if rc.Outcome != want[rc.Round] {
				t.Errorf("audit log: round %d closed %v, the store says %v", rc.Round, rc.Outcome, want[rc.Round])
			}
		}
	}
	for r := range want {
		if closes[r] != 1 {
			t.Errorf("audit log: round %d closed %d times, want once", r, closes[r])
		}
	}
	export := filepath.Join(t.TempDir(), "audit.jsonl")
	runCLI(t, c.cli, c.grpcAddr, "audit", "export", "--proofs", "-o", export)
	if out := runCLI(t, c.cli, "", "audit", "verify", export, "--pin", pin); !strings.Contains(out, "(pinned)") {
		t.Errorf("audit verify:\n%s", out)
	}
	return next
}

// storedReports delivers the round of each update report JetStream stores,
// as the stream's stored-message advisories tell it to the service user.
func storedReports(t *testing.T, nc *nats.Conn) <-chan uint64 {
	t.Helper()
	stored := make(chan uint64, 1024)
	sub, err := nc.Subscribe(wire.SubjectStoredPrefix+"fl.report.>", func(m *nats.Msg) {
		tok := strings.Split(strings.TrimPrefix(m.Subject, wire.SubjectStoredPrefix), ".")
		if len(tok) != 5 {
			return
		}
		if r, err := strconv.ParseUint(tok[3], 10, 64); err == nil {
			select {
			case stored <- r:
			default: // nobody waits for this round any more
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return stored
}

// awaitMidRound waits until a report of a round from first on is stored
// while that round is still open: the moment to break something
// mid-round. It returns the round; midRound checks afterwards that the
// round did not close before the break.
func awaitMidRound(t *testing.T, c *cluster, id string, stored <-chan uint64, first uint64) uint64 {
	t.Helper()
	guard := time.After(3 * time.Minute)
	for {
		var r uint64
		select {
		case r = <-stored:
		case <-guard:
			t.Fatalf("no report of round %d or later was stored while its round was open", first)
		}
		if r < first {
			continue
		}
		if !slices.ContainsFunc(c.committed(id), func(s *pb.RoundSummary) bool { return s.Round == r }) {
			return r
		}
		// A report of a round that closed since: keep waiting.
	}
}

// struck returns the round of task id a break at broke struck: round, seen
// open with a report stored just before the break, unless its last report
// came in the instants between and it closed before the break; then the
// next round, which ran under the break. It waits for round to close.
func struck(t *testing.T, c *cluster, id string, round uint64, broke time.Time) uint64 {
	t.Helper()
	if r := waitClosed(t, c, id, round); r.GetCloseTime().AsTime().Before(broke) {
		t.Logf("round %d closed at %v, just before the break at %v: the break struck round %d", round,
			r.GetCloseTime().AsTime(), broke, round+1)
		return round + 1
	}
	return round
}
