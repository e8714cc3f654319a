package audit

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The tests that exercise the store run on each backend: eachBackend runs
// fn in a subtest per backend, and newStore (through openTest), called
// from there at any depth, makes a store of the subtest's backend. Called
// elsewhere, it makes an SQLite one.
var backends = []string{"sqlite", "postgres"}

func eachBackend(t *testing.T, fn func(t *testing.T)) {
	for _, b := range backends {
		t.Run(b, fn)
	}
}

// onPostgres reports whether t runs under eachBackend's postgres subtest.
func onPostgres(t testing.TB) bool {
	return slices.Contains(strings.Split(t.Name(), "/"), "postgres")
}

// testDatabases maps the folder of a log kept in PostgreSQL to the
// database's URL.
var testDatabases sync.Map

// newStore returns an empty folder for a log and the options that keep
// the log on the subtest's backend: a fresh PostgreSQL database, or none
// for the SQLite file in the folder.
func newStore(t testing.TB) (string, []Option) {
	t.Helper()
	dir := t.TempDir()
	if onPostgres(t) {
		testDatabases.Store(dir, pgtest.Database(t))
	}
	return dir, storeOpts(dir)
}

// storeOpts are the options that open the log in dir again.
func storeOpts(dir string) []Option {
	if url, ok := testDatabases.Load(dir); ok {
		return []Option{WithDatabase(url.(string))}
	}
	return nil
}

// storeTarget names the log in dir for OpenReadOnly and VerifyDataDir: the
// folder, or the URL of its database.
func storeTarget(dir string) string {
	if url, ok := testDatabases.Load(dir); ok {
		return url.(string)
	}
	return dir
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// stepClock returns a clock that starts at t0 and moves one millisecond per
// reading.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func newStepClock() *stepClock { return &stepClock{now: t0} }

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Millisecond)
	return c.now
}

func (c *stepClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func seeded(seed byte) *mrand.ChaCha8 {
	var s [32]byte
	s[0] = seed
	return mrand.NewChaCha8(s)
}

func testKeys(t testing.TB, seed byte) Keys {
	t.Helper()
	k, err := GenerateKeys(seeded(seed))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// openTest opens a fresh log in a temporary folder (and database, see
// newStore) with a step clock.
func openTest(t testing.TB, opts ...Option) (*Log, string, *stepClock) {
	t.Helper()
	dir, store := newStore(t)
	clk := newStepClock()
	lg, err := Open(context.Background(), dir, slices.Concat(store, []Option{WithClock(clk.Now), WithRand(seeded(1)), WithOrigin("test.fleetlearn/audit")}, opts)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })
	return lg, dir, clk
}

const (
	hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	hexB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	hexC = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
)

// sampleEvent makes a varied, valid event for position i.
func sampleEvent(t testing.TB, i int) Event {
	t.Helper()
	task := fmt.Sprintf("t-%d", i%3)
	round := uint64(i%5 + 1)
	var p Payload
	actor := Service("coordinator")
	switch i % 6 {
	case 0:
		p = RoundOpened{Task: task, Round: round, Model: hexA, Module: hexB, CohortSize: 20, Eligibility: "charging, unmetered", SecAggSHA256: hexC}
	case 1:
		p = RoundClosed{Task: task, Round: round, Outcome: RoundCommitted, Reports: 18, Dropouts: 2, AggregationRule: "fedavg"}
	case 2:
		p = ModelCommitted{Task: task, Round: round, Model: hexB, SHA256: hexB, Parent: hexA}
	case 3:
		p = PrivacySpent{Task: task, Round: round, Mechanism: "gaussian", Accountant: "rdp", ClipNorm: 1, NoiseMultiplier: 1.1,
			SamplingRate: 0.01, Delta: 1e-5, Epsilon: 0.12, CumulativeEpsilon: 0.12 * float64(round), EpsilonBudget: 8}
	case 4:
		actor = Operator(fmt.Sprintf("op-%d", (i/6)%2))
		p = OperatorAction{Method: "fleetlearn.v1.TaskService/StopTask", Resource: "tasks/" + task, Result: ResultOK, Code: "OK", Task: task}
	default:
		actor = Device(PseudonymizeDevice([]byte("k"), fmt.Sprint(i)))
		p = DeviceEnrolled{Device: actor.ID, Credential: "ed25519:abcd"}
	}
	ev, err := NewEvent(actor, p)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func appendN(t testing.TB, lg *Log, n int) []Entry {
	t.Helper()
	var out []Entry
	for start := 0; start < n; start += 500 {
		var evs []Event
		for i := start; i < min(n, start+500); i++ {
			evs = append(evs, sampleEvent(t, i))
		}
		es, err := lg.AppendBatch(context.Background(), evs)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, es...)
	}
	return out
}

// refRoots computes the root of every prefix of entries independently of
// the store.
func refRoots(entries []Entry) []merkle.Hash {
	roots := make([]merkle.Hash, len(entries)+1)
	f := &merkle.Frontier{}
	roots[0] = f.Root()
	for i, e := range entries {
		f.Append(merkle.LeafHash(e.Data), func(merkle.NodeID, merkle.Hash) {})
		roots[i+1] = f.Root()
	}
	return roots
}

// rawDB opens the log's database directly, as an attacker with access to
// the file or the database would.
func rawDB(t testing.TB, dir string) *sqldb.DB {
	t.Helper()
	target := filepath.Join(dir, DBFile)
	if url, ok := testDatabases.Load(dir); ok {
		target = url.(string)
	}
	db, err := sqldb.Open(target, "_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t testing.TB, db *sqldb.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func exportBytes(t testing.TB, lg *Log, opts ...ExportOption) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := lg.Export(context.Background(), &buf, opts...); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rawSize counts the entry rows in the log's database.
func rawSize(t testing.TB, dir string) int {
	t.Helper()
	var n int
	if err := rawDB(t, dir).QueryRowContext(context.Background(), "SELECT count(*) FROM entries").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
