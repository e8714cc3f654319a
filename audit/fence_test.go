package audit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

// Replicated aggregators share one PostgreSQL database: each has its own
// folder holding a copy of the deploy's keys file, and the last to open
// the log writes it. These tests play the replicas in one process.

const fenceOrigin = "fleetlearn.example.com/audit"

// deployKeys are the keys every replica is given, as a keys file's text.
func deployKeys(t *testing.T, seed byte) []byte {
	t.Helper()
	var s [32]byte
	s[0] = seed
	k, err := audit.GenerateKeys(mrand.NewChaCha8(s))
	if err != nil {
		t.Fatal(err)
	}
	text, err := k.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// replicaClock returns a clock that starts at start and moves one
// millisecond per reading. Replicas' clocks differ.
func replicaClock(start time.Time) func() time.Time {
	var mu sync.Mutex
	now := start
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Millisecond)
		return now
	}
}

var fenceT0 = time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)

// openReplica opens the log in db as a replica whose folder holds keys.
func openReplica(t *testing.T, db string, keys []byte, now func() time.Time, opts ...audit.Option) *audit.Log {
	t.Helper()
	lg, err := openIn(replicaDir(t, keys), db, now, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })
	return lg
}

// replicaDir makes a replica's folder, with a keys file unless keys is nil.
func replicaDir(t *testing.T, keys []byte) string {
	t.Helper()
	dir := t.TempDir()
	if keys != nil {
		if err := os.WriteFile(filepath.Join(dir, audit.KeysFile), keys, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func openIn(dir, db string, now func() time.Time, opts ...audit.Option) (*audit.Log, error) {
	return audit.Open(context.Background(), dir, append([]audit.Option{audit.WithDatabase(db), audit.WithOrigin(fenceOrigin),
		audit.WithClock(now)}, opts...)...)
}

func newOperatorEvent(i int) (audit.Event, error) {
	return audit.NewEvent(audit.Operator(fmt.Sprintf("op-%d", i%3)), audit.OperatorAction{Method: "fleetlearn.api.v1.TaskService/StopTask",
		Resource: fmt.Sprintf("tasks/t-%d", i), Result: audit.ResultOK, Code: "OK"})
}

func operatorEvent(t *testing.T, i int) audit.Event {
	t.Helper()
	ev, err := newOperatorEvent(i)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func appendEvents(t *testing.T, lg *audit.Log, n int) []audit.Entry {
	t.Helper()
	var out []audit.Entry
	for i := range n {
		e, err := lg.Append(context.Background(), operatorEvent(t, i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// rawDB opens the database directly, to look at what the replicas stored.
func rawDB(t *testing.T, url string) *sqldb.DB {
	t.Helper()
	db, err := sqldb.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// rowCounts describes how many rows each table of the log holds.
func rowCounts(t *testing.T, db *sqldb.DB) string {
	t.Helper()
	var e, n, c, s int
	if err := db.QueryRowContext(context.Background(), `SELECT (SELECT count(*) FROM entries), (SELECT count(*) FROM nodes),
		(SELECT count(*) FROM checkpoints), (SELECT count(*) FROM cosignatures)`).Scan(&e, &n, &c, &s); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d entries, %d nodes, %d checkpoints, %d cosignatures", e, n, c, s)
}

// verifyAll exports lg with every proof and checks the export with
// VerifyExport (trusting the checkpoints given) and with the independent
// verifier of interop_test.go; it returns the report.
func verifyAll(t *testing.T, lg *audit.Log, trusted ...[]byte) audit.Report {
	t.Helper()
	var buf bytes.Buffer
	if err := lg.Export(context.Background(), &buf, audit.WithProofs()); err != nil {
		t.Fatal(err)
	}
	var opts []audit.VerifyOption
	for _, n := range trusted {
		opts = append(opts, audit.WithTrustedCheckpoint(n))
	}
	rep, err := audit.VerifyExport(bytes.NewReader(buf.Bytes()), opts...)
	if err != nil {
		t.Fatalf("VerifyExport: %v", err)
	}
	if rep.Trusted != len(trusted) || rep.Uncovered != 0 || rep.Entries != lg.Size() {
		t.Fatalf("report %+v, log of %d entries, %d checkpoints trusted", rep, lg.Size(), len(trusted))
	}
	checked, err := thirdParty(buf.Bytes())
	if err != nil {
		t.Fatalf("independent verification: %v", err)
	}
	if checked != rep.Proofs || rep.Proofs != int(rep.Entries)+rep.Checkpoints-1 {
		t.Fatalf("independent verifier checked %d proofs, VerifyExport %d, for %d entries and %d checkpoints",
			checked, rep.Proofs, rep.Entries, rep.Checkpoints)
	}
	// Times never go back along the log, whatever the replicas' clocks.
	var last time.Time
	for e, err := range lg.Entries(context.Background(), 0, lg.Size()) {
		if err != nil {
			t.Fatal(err)
		}
		ev, err := e.Event()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Time.Before(last) {
			t.Fatalf("entry %d is dated %v, before the entry ahead of it (%v)", e.Index, ev.Time, last)
		}
		last = ev.Time
	}
	return rep
}

// sameEntries checks that lg holds want's entries, byte for byte.
func sameEntries(t *testing.T, lg *audit.Log, want []audit.Entry) {
	t.Helper()
	for _, w := range want {
		got, err := lg.Entry(context.Background(), w.Index)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Data, w.Data) {
			t.Fatalf("entry %d differs from the one acknowledged", w.Index)
		}
	}
}

// TestFencedWriter: writer A appends and checkpoints, writer B opens the
// same database with the same keys and takes over. Every write A tries
// afterwards fails with ErrFenced and stores nothing; B continues the log,
// A's entries (checkpointed or not) included, and the whole log verifies.
func TestFencedWriter(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	db := rawDB(t, url)
	keys := deployKeys(t, 1)
	w, err := audit.GenerateWitnessKey(mrand.NewChaCha8([32]byte{2}), "witness.example/w1")
	if err != nil {
		t.Fatal(err)
	}
	withWitness := audit.WithWitnesses(w.VerifierKey())

	a := openReplica(t, url, keys, replicaClock(fenceT0), withWitness)
	acked := appendEvents(t, a, 10)
	cpA, err := a.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acked = append(acked, appendEvents(t, a, 5)...) // never checkpointed by A

	// B's clock is an hour behind A's.
	clockB := replicaClock(fenceT0.Add(-time.Hour))
	b := openReplica(t, url, keys, clockB, withWitness)
	if b.Size() != 15 {
		t.Fatalf("B opened a log of %d entries, A acknowledged 15", b.Size())
	}
	if latest, err := b.Latest(ctx); err != nil || !bytes.Equal(latest.Note, cpA.Note) {
		t.Fatalf("B's latest checkpoint is not A's: %+v, %v", latest, err)
	}
	sameEntries(t, b, acked)

	before := rowCounts(t, db)
	cosignedA, err := w.Cosign(cpA, fenceT0.Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func() error{
		"append": func() error { _, err := a.Append(ctx, operatorEvent(t, 99)); return err },
		"append batch": func() error {
			_, err := a.AppendBatch(ctx, []audit.Event{operatorEvent(t, 1), operatorEvent(t, 2)})
			return err
		},
		"checkpoint":  func() error { _, err := a.Checkpoint(ctx); return err },
		"cosignature": func() error { _, err := a.AddCosignature(ctx, cosignedA); return err },
	} {
		if err := write(); !errors.Is(err, audit.ErrFenced) {
			t.Errorf("A's %s after B opened: %v, want ErrFenced", name, err)
		}
	}
	// The first refusal came from the database; later ones from A itself.
	if _, err := a.Append(ctx, operatorEvent(t, 100)); !errors.Is(err, audit.ErrFenced) {
		t.Errorf("A's second append: %v", err)
	}
	if after := rowCounts(t, db); after != before {
		t.Fatalf("a fenced writer wrote: %s, then %s", before, after)
	}
	// A still answers for the tree it knew.
	if a.Size() != 15 {
		t.Fatalf("A's size %d", a.Size())
	}
	if e, err := a.Entry(ctx, 14); err != nil || !bytes.Equal(e.Data, acked[14].Data) {
		t.Fatalf("A's read of its last entry: %v", err)
	}
	// Export signs a checkpoint first, which A may no longer do.
	if err := a.Export(ctx, io.Discard); !errors.Is(err, audit.ErrFenced) {
		t.Errorf("A's export: %v, want ErrFenced", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("closing a fenced writer: %v", err)
	}
	if after := rowCounts(t, db); after != before {
		t.Fatalf("a fenced writer's Close wrote: %s, then %s", before, after)
	}

	// B appends on top of A's entries and covers them all.
	acked = append(acked, appendEvents(t, b, 7)...)
	cpB, err := b.Checkpoint(ctx)
	if err != nil || cpB.Size != 22 {
		t.Fatalf("B's checkpoint: %+v, %v", cpB, err)
	}
	if _, err := b.AddCosignature(ctx, cosignedA); err != nil {
		t.Fatalf("B stores a cosignature of A's checkpoint: %v", err)
	}
	sameEntries(t, b, acked)
	rep := verifyAll(t, b, cpA.Note, cpB.Note)
	if rep.Entries != 22 || rep.Checkpoints != 2 || rep.Root != cpB.Root {
		t.Fatalf("report %+v", rep)
	}
	// The auditor's check of the database itself, index included.
	if rep, err := audit.VerifyDataDir(ctx, url, audit.WithTrustedCheckpoint(cpA.Note)); err != nil || !rep.IndexChecked || rep.Entries != 22 {
		t.Fatalf("VerifyDataDir: %+v, %v", rep, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFenceMidBatch: B opens while A is in the middle of committing a
// batch (its transaction holds the epoch's share lock and waits on a
// table lock the test holds). B's epoch waits for A's batch, which
// commits; B then opens a log that includes it, and A is fenced from
// then on: no gap, no fork.
func TestFenceMidBatch(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	db := rawDB(t, url)
	keys := deployKeys(t, 3)
	a := openReplica(t, url, keys, replicaClock(fenceT0))
	acked := appendEvents(t, a, 4)

	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx, "LOCK TABLE nodes IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	type appended struct {
		entries []audit.Entry
		err     error
	}
	aDone := make(chan appended, 1)
	batch := []audit.Event{operatorEvent(t, 4), operatorEvent(t, 5), operatorEvent(t, 6)}
	go func() {
		es, err := a.AppendBatch(ctx, batch)
		aDone <- appended{es, err}
	}()
	// A's batch is stuck on the nodes table, its entries inserted.
	waitFor(t, db, "A's batch waiting on the table lock", 1, "INSERT INTO nodes", aDone)

	type opened struct {
		lg  *audit.Log
		err error
	}
	bDone := make(chan opened, 1)
	dirB := replicaDir(t, keys)
	go func() {
		lg, err := openIn(dirB, url, replicaClock(fenceT0))
		bDone <- opened{lg, err}
	}()
	// B waits to take the epoch until A's batch is done.
	waitFor(t, db, "B's epoch waiting on A's batch", 2, "INSERT INTO writer", bDone)
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}

	got := <-aDone
	if got.err != nil {
		t.Fatalf("A's batch, committed before B took over: %v", got.err)
	}
	acked = append(acked, got.entries...)
	bo := <-bDone
	if bo.err != nil {
		t.Fatal(bo.err)
	}
	b := bo.lg
	defer b.Close()
	if b.Size() != 7 || got.entries[0].Index != 4 {
		t.Fatalf("B opened a log of %d entries after A's batch at %d", b.Size(), got.entries[0].Index)
	}
	sameEntries(t, b, acked)
	if _, err := a.Append(ctx, operatorEvent(t, 7)); !errors.Is(err, audit.ErrFenced) {
		t.Fatalf("A after B opened: %v", err)
	}
	acked = append(acked, appendEvents(t, b, 3)...)
	sameEntries(t, b, acked)
	if rep := verifyAll(t, b); rep.Entries != 10 {
		t.Fatalf("report %+v", rep)
	}
}

// waitFor waits until n sessions of the database wait on a lock, one of
// them in a statement containing stmt. It fails if they wait elsewhere, or
// if done (the waiter's result) comes first.
func waitFor[T any](t *testing.T, db *sqldb.DB, what string, n int, stmt string, done chan T) {
	t.Helper()
	for {
		rows, err := db.QueryContext(context.Background(), `SELECT query FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`)
		if err != nil {
			t.Fatal(err)
		}
		var waiting []string
		for rows.Next() {
			var q string
			if err := rows.Scan(&q); err != nil {
				t.Fatal(err)
			}
			waiting = append(waiting, q)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(waiting) >= n {
			if !slices.ContainsFunc(waiting, func(q string) bool { return strings.Contains(q, stmt) }) {
				t.Fatalf("waiting for %s: the sessions wait elsewhere: %q", what, waiting)
			}
			return
		}
		select {
		case r := <-done:
			t.Fatalf("waiting for %s: it finished first: %+v", what, r)
		case <-time.After(time.Millisecond):
		}
	}
}

// TestFenceUnderLoad: B opens while A appends from several goroutines and
// checkpoints. Every entry A acknowledged is in B's log, at its index and
// with its bytes, and the log holds nothing else A wrote: its entries are
// exactly A's acknowledged ones, every later write of A failed with
// ErrFenced, and each checkpoint A published is consistent with B's log.
func TestFenceUnderLoad(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	keys := deployKeys(t, 4)
	a := openReplica(t, url, keys, replicaClock(fenceT0), audit.WithMaxBatch(16))
	first := appendEvents(t, a, 1) // so that A's first checkpoint is not of the empty tree

	var mu sync.Mutex
	ackedA := map[uint64][]byte{first[0].Index: first[0].Data}
	var published [][]byte
	var errs []error
	record := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				ev, err := newOperatorEvent(g*1000 + i)
				if err != nil {
					record(err)
					return
				}
				es, err := a.AppendBatch(ctx, []audit.Event{ev})
				if err != nil {
					record(err)
					return
				}
				mu.Lock()
				ackedA[es[0].Index] = es[0].Data
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		var last uint64
		for {
			cp, err := a.Checkpoint(ctx)
			if err != nil {
				record(err)
				return
			}
			if cp.Size != last {
				last = cp.Size
				mu.Lock()
				published = append(published, cp.Note)
				mu.Unlock()
			}
			time.Sleep(time.Millisecond) // a ticker's pace, not a deadline
		}
	})
	for {
		mu.Lock()
		n := len(ackedA)
		mu.Unlock()
		if n >= 300 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b := openReplica(t, url, keys, replicaClock(fenceT0))
	wg.Wait()

	for _, err := range errs {
		if !errors.Is(err, audit.ErrFenced) {
			t.Fatalf("A failed with %v, want ErrFenced", err)
		}
	}
	size := b.Size()
	if uint64(len(ackedA)) != size {
		t.Fatalf("A acknowledged %d entries, B opened a log of %d", len(ackedA), size)
	}
	for i, data := range ackedA {
		if i >= size {
			t.Fatalf("A acknowledged entry %d, beyond B's log of %d", i, size)
		}
		e, err := b.Entry(ctx, i)
		if err != nil || !bytes.Equal(e.Data, data) {
			t.Fatalf("entry %d differs from the one A acknowledged: %v", i, err)
		}
	}
	appendEvents(t, b, 5)
	if _, err := b.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	rep := verifyAll(t, b, published...)
	t.Logf("A acknowledged %d entries and published %d checkpoints before B took over; the log verifies with %d entries, %d checkpoints",
		len(ackedA), len(published), rep.Entries, rep.Checkpoints)
}

// A replica that cannot open the log (other keys, another origin, no keys
// file) deposes nobody: the writer goes on writing.
func TestFenceRefusedOpenDeposesNobody(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	keys := deployKeys(t, 5)
	a := openReplica(t, url, keys, replicaClock(fenceT0))
	appendEvents(t, a, 3)
	for name, c := range map[string]struct {
		keys []byte
		opts []audit.Option
		want error
	}{
		"other keys":   {deployKeys(t, 6), nil, audit.ErrKeyMismatch},
		"other origin": {keys, []audit.Option{audit.WithOrigin("elsewhere")}, audit.ErrKeyMismatch},
		"no keys file": {nil, nil, audit.ErrInvalidKeys},
	} {
		dir := replicaDir(t, c.keys)
		lg, err := openIn(dir, url, replicaClock(fenceT0), c.opts...)
		if !errors.Is(err, c.want) {
			if err == nil {
				lg.Close()
			}
			t.Fatalf("%s: %v, want %v", name, err, c.want)
		}
		if _, err := os.Stat(filepath.Join(dir, audit.KeysFile)); c.keys == nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: a keys file was made for a database that holds a log: %v", name, err)
		}
		if _, err := a.Append(ctx, operatorEvent(t, 0)); err != nil {
			t.Fatalf("the writer after a replica's open with %s: %v", name, err)
		}
	}
	if _, err := audit.Open(ctx, t.TempDir(), audit.WithDatabase("/var/lib/audit.db")); !errors.Is(err, audit.ErrInvalidDatabase) {
		t.Fatalf("WithDatabase of a path: %v", err)
	}
	if a.Size() != 6 {
		t.Fatalf("size %d", a.Size())
	}
}

// Replicas starting together on an empty database make one log: both
// opens succeed, the later one writes and the earlier one is fenced.
func TestFenceReplicasStartTogether(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	keys := deployKeys(t, 7)
	logs := make([]*audit.Log, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range logs {
		dir := replicaDir(t, keys)
		wg.Go(func() { logs[i], errs[i] = openIn(dir, url, replicaClock(fenceT0)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		defer logs[i].Close()
	}
	var writer *audit.Log
	for _, lg := range logs {
		_, err := lg.Append(ctx, operatorEvent(t, 0))
		switch {
		case err == nil && writer == nil:
			writer = lg
		case err == nil:
			t.Fatal("both replicas appended")
		case !errors.Is(err, audit.ErrFenced):
			t.Fatal(err)
		}
	}
	if writer == nil {
		t.Fatal("neither replica could append")
	}
	appendEvents(t, writer, 4)
	if rep := verifyAll(t, writer); rep.Entries != 5 {
		t.Fatalf("report %+v", rep)
	}
}
