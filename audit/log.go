package audit

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/audit/internal/note"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/filelock"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

// Log is an append-only, tamper-evident audit log kept in one SQLite file
// or in a PostgreSQL database (WithDatabase). All methods are safe for
// concurrent use.
type Log struct {
	cfg      config
	readOnly bool
	wdb      *sqldb.DB // the one writer connection (SQLite) or the writer's pool; nil when read-only
	rdb      *sqldb.DB // readers
	lock     *os.File  // the folder lock (SQLite); nil when read-only

	// epoch is this writer's fencing token on PostgreSQL (0 on SQLite,
	// where the folder lock keeps other writers out): every write checks,
	// in its transaction, that the writer table still holds it.
	epoch  int64
	fenced atomic.Bool // a write found a newer writer's epoch: nothing more is written

	origin   string
	pub      PublicKeys
	verifier note.Verifier
	kid      string
	signer   entrySigner // zero when read-only
	cpSigner note.Signer // zero when read-only
	pseudo   []byte      // nil when read-only
	// witnesses are those whose cosignatures AddCosignature accepts.
	witnesses []note.CosigVerifier

	closeMu sync.RWMutex // guards closed; held shared while handing work to the sequencer
	closed  bool

	mu       sync.RWMutex     // guards the fields below, written only by the committer
	frontier *merkle.Frontier // nil when read-only
	size     uint64
	lastTS   time.Time

	stmts map[string]*sql.Stmt // prepared inserts on wdb, read-only after Open

	reqs       chan *appendReq
	signed     chan *signedBatch
	reset      atomic.Bool   // a commit failed: the sequencer restarts from size
	writerDone chan struct{} // closed when the committer has finished

	cpMu   sync.Mutex // serializes checkpoint signing and guards latest
	latest *Checkpoint
}

type appendReq struct {
	events []Event
	done   chan appendResult
}

type appendResult struct {
	entries []Entry
	err     error
}

// Open opens the log in folder dir, creating the folder, the database
// (DBFile) and, unless WithKeys is given, a keys file (KeysFile, mode 0600)
// with fresh keys on first use. Opening checks that the keys are the ones
// the log was made with, that no entry row is missing, and that the tree
// matches the latest checkpoint; it refuses a log that fails any of these.
//
// With WithDatabase the log's tables live in that PostgreSQL database
// instead of DBFile, and dir holds only the keys: give every replica the
// same keys file (or WithKeys). Once the keys check out, Open takes the
// next writer epoch and so deposes the log's current writer, whose every
// write from then on fails with ErrFenced; it then loads the tree as the
// deposed writer left it. Open the log only in the process that is to
// write it (the aggregator that leads), not in a standby waiting to.
func Open(ctx context.Context, dir string, opts ...Option) (*Log, error) {
	cfg := newConfig(opts)
	witnesses, err := parseWitnesses(cfg.witnesses)
	if err != nil {
		return nil, err
	}
	if cfg.database != "" && !sqldb.IsPostgresURL(cfg.database) {
		return nil, fmt.Errorf("audit: open: WithDatabase takes a postgres:// URL; leave it out to keep the log in %s in the folder: %w", DBFile, ErrInvalidDatabase)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	l := &Log{cfg: cfg, witnesses: witnesses, reqs: make(chan *appendReq, 256),
		signed: make(chan *signedBatch, 1), writerDone: make(chan struct{})}
	closeAll := func() {
		for _, db := range []*sqldb.DB{l.wdb, l.rdb} {
			if db != nil {
				db.Close()
			}
		}
		if l.lock != nil {
			l.lock.Close()
		}
	}
	target := cfg.database
	var keys Keys
	if target == "" {
		if l.lock, err = filelock.Lock(filepath.Join(dir, LockFile)); errors.Is(err, filelock.ErrLocked) {
			return nil, fmt.Errorf("audit: open: another process has the log open for writing: %w", ErrLocked)
		} else if err != nil {
			return nil, fmt.Errorf("audit: open: %w", err)
		}
		target = filepath.Join(dir, DBFile)
		keys, err = loadKeys(dir, cfg, func() (bool, string, error) {
			_, err := os.Stat(target)
			return err == nil, DBFile + " exists", nil
		})
		if err != nil {
			closeAll()
			return nil, err
		}
		if l.wdb, err = openDB(target, dbWriter, 1); err != nil {
			closeAll()
			return nil, fmt.Errorf("audit: open: %w", err)
		}
	} else {
		if l.wdb, err = openDB(target, dbWriter, pgWriterConns); err != nil {
			return nil, fmt.Errorf("audit: open: %w", err)
		}
		keys, err = loadKeys(dir, cfg, func() (bool, string, error) {
			held, err := holdsLog(ctx, l.wdb)
			return held, "the database holds a log", err
		})
		if err != nil {
			closeAll()
			return nil, err
		}
	}
	l.pseudo = keys.Pseudonym
	if l.rdb, err = openDB(target, dbReader, max(2, runtime.GOMAXPROCS(0))); err != nil {
		closeAll()
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	err = l.init(ctx, keys)
	if err == nil {
		err = l.prepareInserts(ctx)
	}
	if err != nil {
		for _, st := range l.stmts {
			st.Close()
		}
		closeAll()
		return nil, err
	}
	go l.sequencer()
	go l.committer()
	cfg.logger.Info("audit log open", "dir", dir, "store", l.wdb.Dialect().String(), "writer_epoch", l.epoch, "origin", l.origin, "size", l.size)
	return l, nil
}

// OpenReadOnly opens the log in folder dir (or the database file itself)
// without its keys and without changing anything, for an auditor to query
// and export a stopped server's log. It sees the entries present when it was
// opened. It does not refuse a damaged log: export it and let VerifyExport
// say what is wrong. Keep the database's -wal file next to it when copying:
// it holds the most recent entries.
//
// A log kept in PostgreSQL is opened by its URL, as dir or with
// WithDatabase, over read-only sessions; its writers may go on appending,
// and the read-only Log sees the entries present when it was opened (its
// Export exports everything stored at the time, checkpointed or not).
func OpenReadOnly(ctx context.Context, dir string, opts ...Option) (*Log, error) {
	cfg := newConfig(opts)
	path := cfg.database
	if path == "" && sqldb.IsPostgresURL(dir) {
		path = dir
	}
	conns := max(2, runtime.GOMAXPROCS(0))
	var db *sqldb.DB
	var err error
	if path != "" {
		if !sqldb.IsPostgresURL(path) {
			return nil, fmt.Errorf("audit: open read-only: WithDatabase takes a postgres:// URL: %w", ErrInvalidDatabase)
		}
		if db, err = openDB(path, dbReadOnly, conns); err != nil {
			return nil, fmt.Errorf("audit: open read-only: %w", err)
		}
		if held, err := holdsLog(ctx, db); err != nil || !held {
			db.Close()
			if err == nil {
				err = fmt.Errorf("the database holds no audit log; give the URL of the database the aggregators keep it in: %w", ErrNotFound)
			}
			return nil, fmt.Errorf("audit: open read-only: %w", err)
		}
	} else {
		path = dir
		if st, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("audit: open read-only: %w", err)
		} else if st.IsDir() {
			path = filepath.Join(dir, DBFile)
		}
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) && path != dir {
			return nil, fmt.Errorf("audit: open read-only: %s holds no audit log (%s); give the folder the server keeps it in, its --data-dir: %w", dir, DBFile, err)
		} else if err != nil {
			return nil, fmt.Errorf("audit: open read-only: %w", err)
		}
		if db, err = openDB(path, dbReadOnly, conns); err != nil {
			return nil, fmt.Errorf("audit: open read-only: %w", err)
		}
	}
	l := &Log{cfg: cfg, readOnly: true, rdb: db}
	if err := l.loadMeta(ctx, l.rdb); err != nil {
		db.Close()
		return nil, err
	}
	if l.size, err = storedSize(ctx, l.rdb); err != nil {
		db.Close()
		return nil, err
	}
	return l, nil
}

// loadKeys returns WithKeys' keys, those of the keys file, or fresh keys
// written to a new keys file; hasLog says whether the store already holds
// a log (and why it thinks so), which fresh keys could not open.
func loadKeys(dir string, cfg config, hasLog func() (bool, string, error)) (Keys, error) {
	if cfg.keys != nil {
		if err := cfg.keys.check(); err != nil {
			return Keys{}, fmt.Errorf("audit: open: %w", err)
		}
		return *cfg.keys, nil
	}
	keyPath := filepath.Join(dir, KeysFile)
	b, err := os.ReadFile(keyPath)
	if err == nil {
		return ParseKeys(b)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return Keys{}, fmt.Errorf("audit: open: %w", err)
	}
	if held, why, err := hasLog(); err != nil {
		return Keys{}, fmt.Errorf("audit: open: %w", err)
	} else if held {
		return Keys{}, fmt.Errorf("audit: open: %s but %s does not exist; put the keys the log was made with there (every replica needs the same file) or pass WithKeys: %w", why, keyPath, ErrInvalidKeys)
	}
	r := cfg.rand
	if r == nil {
		r = rand.Reader
	}
	keys, err := GenerateKeys(r)
	if err != nil {
		return Keys{}, err
	}
	text, err := keys.MarshalText()
	if err != nil {
		return Keys{}, err
	}
	// WriteNew never replaces keys, whoever wrote them: that would orphan
	// what they signed.
	if err := atomicfile.WriteNew(keyPath, text, 0o600); err != nil {
		return Keys{}, fmt.Errorf("audit: open: write keys: %w", err)
	}
	return keys, nil
}

// init creates or checks the schema and metadata, takes the writer epoch
// (PostgreSQL) and loads the tree state.
func (l *Log) init(ctx context.Context, keys Keys) error {
	if err := createSchema(ctx, l.wdb); err != nil {
		return err
	}
	pg := l.wdb.Dialect() == sqldb.Postgres
	entryPub := keys.Entry.Public().(ed25519.PublicKey)
	origin := l.cfg.origin
	if origin == "" {
		origin = DefaultOrigin
	}
	// Counted and written in one transaction: replicas opening a new
	// database together write the metadata once (the others' transactions
	// fail to serialize, run again and find it).
	err := l.wdb.Tx(ctx, func(tx *sqldb.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM meta").Scan(&n); err != nil || n > 0 {
			return err
		}
		v, err := note.NewVerifier(origin, keys.Checkpoint.Public().(ed25519.PublicKey))
		if err != nil {
			return fmt.Errorf("origin %q: %w", origin, ErrInvalidKeys)
		}
		for k, val := range map[string]any{"format": storeFormat, "origin": origin, "entry_key": []byte(entryPub), "checkpoint_vkey": v.String()} {
			if s, ok := val.(string); ok && pg {
				val = []byte(s) // a BYTEA takes bytes; SQLite keeps these as TEXT, as it always has
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO meta(key, value) VALUES (?, ?)", k, val); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("audit: open: %w", err)
	}
	if err := l.loadMeta(ctx, l.wdb); err != nil {
		return err
	}
	if l.cfg.origin != "" && l.cfg.origin != l.origin {
		return fmt.Errorf("audit: open: log origin is %q, not %q: %w", l.origin, l.cfg.origin, ErrKeyMismatch)
	}
	if !l.pub.Entry.Equal(entryPub) {
		return fmt.Errorf("audit: open: entry key differs from the log's: %w", ErrKeyMismatch)
	}
	cpSigner, err := note.NewSigner(l.origin, keys.Checkpoint)
	if err != nil || cpSigner.String() != l.pub.VerifierKey {
		return fmt.Errorf("audit: open: checkpoint key differs from the log's: %w", ErrKeyMismatch)
	}
	l.cpSigner = cpSigner
	l.signer = entrySigner{priv: keys.Entry, kid: l.kid}

	if pg {
		// Only now, with the keys known to be the log's: a replica given
		// the wrong keys must not depose the writer. The tree is loaded
		// after, so it includes the deposed writer's last batch.
		if err := l.takeEpoch(ctx); err != nil {
			return err
		}
	}
	if l.size, err = storedSize(ctx, l.wdb); err != nil {
		return err
	}
	if l.size > maxLeaves {
		return fmt.Errorf("audit: open: size %d: %w", l.size, ErrCorrupt)
	}
	var count uint64
	if err := l.wdb.QueryRowContext(ctx, "SELECT count(*) FROM entries").Scan(&count); err != nil {
		return fmt.Errorf("audit: open: %w", err)
	}
	if count != l.size {
		return fmt.Errorf("audit: open: %d entry rows for indices 0..%d: rows are missing: %w", count, int64(l.size)-1, ErrCorrupt)
	}
	if l.frontier, err = loadFrontier(ctx, l.wdb, l.size); err != nil {
		return fmt.Errorf("audit: open: %w", err)
	}
	if l.size > 0 {
		var ts int64
		if err := l.wdb.QueryRowContext(ctx, "SELECT ts FROM entries WHERE idx = ?", int64(l.size-1)).Scan(&ts); err != nil {
			return fmt.Errorf("audit: open: %w", err)
		}
		l.lastTS = time.Unix(0, ts).UTC()
	}
	cp, err := l.readLatest(ctx, l.wdb)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("audit: open: %w", err)
	}
	if err == nil {
		if err := l.checkAgainst(ctx, l.wdb, cp, l.size, l.frontier.Root()); err != nil {
			return fmt.Errorf("audit: open: %w", err)
		}
		l.latest = &cp
	}
	return nil
}

func (l *Log) loadMeta(ctx context.Context, q querier) error {
	format, err := readMeta(ctx, q, "format")
	if err != nil {
		return err
	}
	if string(format) != storeFormat {
		return fmt.Errorf("audit: store format %q, want %q: %w", format, storeFormat, ErrCorrupt)
	}
	origin, err := readMeta(ctx, q, "origin")
	if err != nil {
		return err
	}
	pub, err := readMeta(ctx, q, "entry_key")
	if err != nil {
		return err
	}
	vkey, err := readMeta(ctx, q, "checkpoint_vkey")
	if err != nil {
		return err
	}
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("audit: stored entry key of %d bytes: %w", len(pub), ErrCorrupt)
	}
	if l.verifier, err = note.ParseVerifier(string(vkey)); err != nil {
		return fmt.Errorf("audit: stored checkpoint key: %w: %w", ErrCorrupt, err)
	}
	if l.kid, err = keyID(pub); err != nil {
		return err
	}
	l.origin = string(origin)
	l.pub = PublicKeys{Origin: l.origin, Entry: ed25519.PublicKey(pub), EntryKeyID: l.kid, VerifierKey: string(vkey)}
	return nil
}

func loadFrontier(ctx context.Context, q querier, size uint64) (*merkle.Frontier, error) {
	ids := merkle.Cover(0, size)
	nodes, err := readNodes(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	hs := make([]merkle.Hash, len(ids))
	for i, id := range ids {
		hs[i] = nodes[id]
	}
	return merkle.NewFrontier(size, hs)
}

// checkAgainst verifies that the tree of size leaves with root extends
// checkpoint cp, using a consistency proof from the stored subtrees.
func (l *Log) checkAgainst(ctx context.Context, q querier, cp Checkpoint, size uint64, root merkle.Hash) error {
	switch {
	case cp.Size > size:
		return fmt.Errorf("checkpoint of size %d but only %d entries: %w", cp.Size, size, ErrInconsistent)
	case cp.Size == 0:
		if cp.Root != merkle.EmptyRoot {
			return fmt.Errorf("checkpoint of size 0 with a non-empty root: %w", ErrInconsistent)
		}
		return nil
	}
	hs, err := rangeHashes(ctx, q, merkle.ConsistencyRanges(cp.Size, size))
	if err != nil {
		return err
	}
	if err := merkle.VerifyConsistency(cp.Size, size, proofBytes(hs), cp.Root[:], root[:]); err != nil {
		return fmt.Errorf("tree of size %d does not extend checkpoint of size %d: %w: %w", size, cp.Size, ErrInconsistent, err)
	}
	return nil
}

func (l *Log) readLatest(ctx context.Context, q querier) (Checkpoint, error) {
	var note []byte
	var signed int64
	err := q.QueryRowContext(ctx, "SELECT note, signed_at FROM checkpoints ORDER BY seq DESC LIMIT 1").Scan(&note, &signed)
	if errors.Is(err, sql.ErrNoRows) {
		return Checkpoint{}, fmt.Errorf("audit: no checkpoint yet: %w", ErrNotFound)
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	cp, err := openCheckpoint(note, l.verifier)
	if err != nil {
		return Checkpoint{}, err
	}
	if cp.Origin != l.origin {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint for %q in log %q: %w", cp.Origin, l.origin, ErrBadCheckpoint)
	}
	cp.Signed = time.Unix(0, signed).UTC()
	return cp, nil
}

// Close stops accepting appends, waits for those in flight, signs a final
// checkpoint if the log grew since the last one, and closes the database.
// A writer fenced by another (ErrFenced) signs nothing and closes without
// an error for it.
func (l *Log) Close() error { return l.CloseContext(context.Background()) }

// CloseContext is Close with ctx bounding the final checkpoint's reads and
// writes: a writer whose database is out of reach closes when ctx ends,
// reporting the checkpoint it could not sign.
func (l *Log) CloseContext(ctx context.Context) error {
	l.closeMu.Lock()
	if l.closed {
		l.closeMu.Unlock()
		return nil
	}
	l.closed = true
	if !l.readOnly {
		close(l.reqs)
	}
	l.closeMu.Unlock()
	var errs []error
	if !l.readOnly {
		<-l.writerDone
		// A fenced writer has nothing to sign: what it acknowledged is
		// committed, and the writer that deposed it covers it.
		if _, err := l.checkpoint(ctx); err != nil && !errors.Is(err, ErrFenced) {
			errs = append(errs, err)
		}
		l.cpMu.Lock()
		for _, st := range l.stmts {
			st.Close()
		}
		errs = append(errs, l.wdb.Close())
		defer l.cpMu.Unlock()
	}
	errs = append(errs, l.rdb.Close())
	if l.lock != nil {
		errs = append(errs, l.lock.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("audit: close: %w", err)
	}
	return nil
}

func (l *Log) live() error {
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed {
		return ErrClosed
	}
	return nil
}

// Origin is the log's name, the first line of its checkpoints.
func (l *Log) Origin() string { return l.origin }

// PublicKeys returns the keys that verify the log.
func (l *Log) PublicKeys() PublicKeys { return l.pub }

// Size is the number of entries: all acknowledged appends.
func (l *Log) Size() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.size
}

// PseudonymizeDevice returns the pseudonym of a raw device id under this
// log's key, for Device actors and device fields of payloads. It fails on a
// read-only log, which has no key.
func (l *Log) PseudonymizeDevice(deviceID string) (string, error) {
	if l.pseudo == nil {
		return "", fmt.Errorf("audit: pseudonymize: %w", ErrReadOnly)
	}
	return PseudonymizeDevice(l.pseudo, deviceID), nil
}

// Record builds the event for a payload and appends it.
func (l *Log) Record(ctx context.Context, actor Actor, p Payload) (Entry, error) {
	ev, err := NewEvent(actor, p)
	if err != nil {
		return Entry{}, err
	}
	return l.Append(ctx, ev)
}

// Append adds one event and returns its entry once it is durable. Appends
// from concurrent callers are committed together (group commit), so many
// small appends cost about as much as one batch. If ctx ends first the
// event may still be written.
func (l *Log) Append(ctx context.Context, ev Event) (Entry, error) {
	es, err := l.AppendBatch(ctx, []Event{ev})
	if err != nil {
		return Entry{}, err
	}
	return es[0], nil
}

// AppendBatch adds events atomically at consecutive indices and returns
// their entries once they are durable: all are written or none. The log
// stamps them all with the same time, never earlier than the entry before.
// On a log in PostgreSQL whose writer another has deposed, it fails with
// ErrFenced and writes nothing.
func (l *Log) AppendBatch(ctx context.Context, evs []Event) ([]Entry, error) {
	if l.readOnly {
		return nil, fmt.Errorf("audit: append: %w", ErrReadOnly)
	}
	if len(evs) == 0 {
		return nil, nil
	}
	if len(evs) > l.cfg.maxBatch {
		return nil, fmt.Errorf("audit: append: %d events, at most %d at once: %w", len(evs), l.cfg.maxBatch, ErrTooLarge)
	}
	if l.fenced.Load() {
		return nil, fmt.Errorf("audit: append: %w", l.errFenced())
	}
	for i, ev := range evs {
		if err := ev.check(); err != nil {
			return nil, fmt.Errorf("audit: append: event %d: %w", i, err)
		}
	}
	req := &appendReq{events: append([]Event(nil), evs...), done: make(chan appendResult, 1)}
	l.closeMu.RLock()
	if l.closed {
		l.closeMu.RUnlock()
		return nil, fmt.Errorf("audit: append: %w", ErrClosed)
	}
	select {
	case l.reqs <- req:
	case <-ctx.Done():
		l.closeMu.RUnlock()
		return nil, fmt.Errorf("audit: append: %w", ctx.Err())
	}
	l.closeMu.RUnlock()
	select {
	case res := <-req.done:
		return res.entries, res.err
	case <-ctx.Done():
		return nil, fmt.Errorf("audit: append: %w (the events may still be written)", ctx.Err())
	}
}

// Appends run as a two-stage pipeline so that signing the next batch
// overlaps writing and syncing the current one. The sequencer gathers
// queued requests, stamps, indexes and signs them; the committer writes
// each batch in one transaction, extends the tree and acknowledges. A batch
// is committed only at the index the sequencer gave it: if a commit fails,
// the batches signed after it fail too (their indices no longer follow) and
// the sequencer restarts from the committed size.

type signedBatch struct {
	live  []*pending
	first uint64 // index of the first entry
	ts    time.Time
}

// sequencer is the first stage: the only goroutine that assigns indices.
func (l *Log) sequencer() {
	defer close(l.signed)
	next, last := l.size, l.lastTS
	for req := range l.reqs {
		batch := []*appendReq{req}
		n := len(req.events)
	drain:
		for n < l.cfg.maxBatch {
			select {
			case r, ok := <-l.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, r)
				n += len(r.events)
			default:
				break drain
			}
		}
		if l.reset.Swap(false) {
			l.mu.RLock()
			next = l.size
			l.mu.RUnlock()
		}
		if sb := l.prepare(batch, next, &last); sb != nil {
			for _, p := range sb.live {
				next += uint64(len(p.entries))
			}
			l.signed <- sb
		}
	}
}

// prepare stamps, serializes and signs a batch at indices from first.
func (l *Log) prepare(batch []*appendReq, first uint64, last *time.Time) *signedBatch {
	now := l.cfg.now().Round(0).UTC()
	if now.Before(*last) {
		// Entries are in time order whatever the clock does.
		now = *last
	}
	sb := &signedBatch{first: first, ts: now}
	total := 0
	for _, req := range batch {
		p := &pending{req: req}
		var err error
		for _, ev := range req.events {
			ev.Time = now
			var b []byte
			if b, err = ev.marshal(); err != nil { // AppendBatch ran check
				break
			}
			p.events = append(p.events, b)
		}
		if err != nil {
			req.done <- appendResult{err: fmt.Errorf("audit: append: %w", err)}
			continue
		}
		sb.live = append(sb.live, p)
		total += len(p.events)
	}
	if total == 0 {
		return nil
	}
	if l.fenced.Load() {
		l.fail(sb, l.errFenced())
		return nil
	}
	if first+uint64(total) > maxLeaves {
		l.fail(sb, fmt.Errorf("log full: %w", ErrTooLarge))
		return nil
	}
	// Sign in parallel; indices follow queue order.
	type job struct {
		index uint64
		event []byte
		out   *Entry
	}
	jobs := make([]job, 0, total)
	idx := first
	for _, p := range sb.live {
		p.entries = make([]Entry, len(p.events))
		for i, b := range p.events {
			p.entries[i].Index = idx
			jobs = append(jobs, job{index: idx, event: b, out: &p.entries[i]})
			idx++
		}
	}
	errs := make([]error, len(jobs))
	workers := min(runtime.GOMAXPROCS(0), (len(jobs)+31)/32)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(jobs); i += workers {
				jobs[i].out.Data, errs[i] = l.signer.sign(jobs[i].index, jobs[i].event)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		l.fail(sb, err)
		return nil
	}
	*last = now
	return sb
}

func (l *Log) fail(sb *signedBatch, err error) {
	n := 0
	for _, p := range sb.live {
		n += len(p.events)
	}
	l.cfg.logger.Error("audit append failed", "first", sb.first, "entries", n, "err", err)
	for _, p := range sb.live {
		p.req.done <- appendResult{err: fmt.Errorf("audit: append: %w", err)}
	}
}

// committer is the second stage: the only goroutine that writes entries.
func (l *Log) committer() {
	defer close(l.writerDone)
	for sb := range l.signed {
		l.mu.RLock()
		size, f := l.size, l.frontier.Clone()
		l.mu.RUnlock()
		if l.fenced.Load() {
			l.fail(sb, l.errFenced())
			continue
		}
		if sb.first != size {
			l.fail(sb, errors.New("an earlier batch failed to commit"))
			l.reset.Store(true)
			continue
		}
		if err := l.write(sb.live, f, sb.ts); err != nil {
			l.fail(sb, err)
			l.reset.Store(true)
			continue
		}
		l.mu.Lock()
		l.size, l.frontier, l.lastTS = f.Size(), f, sb.ts
		l.mu.Unlock()
		for _, p := range sb.live {
			p.req.done <- appendResult{entries: p.entries}
		}
	}
}

type pending struct {
	req     *appendReq
	events  [][]byte // canonical JSON
	entries []Entry
}

// write stores a batch in one transaction, extending f with its leaves. On
// PostgreSQL the transaction first checks the writer epoch (checkFence).
func (l *Log) write(live []*pending, f *merkle.Frontier, ts time.Time) error {
	ctx := context.Background()
	tsCol := unixNano(ts)
	var entryRows, nodeRows [][]any
	for _, p := range live {
		for i, e := range p.entries {
			ev := p.req.events[i]
			entryRows = append(entryRows, []any{int64(e.Index), e.Data, tsCol, string(ev.Type),
				string(ev.Actor.Kind), ev.Actor.ID, ev.Subject.Task, int64(ev.Subject.Round)})
			f.Append(merkle.LeafHash(e.Data), func(id merkle.NodeID, h merkle.Hash) {
				nodeRows = append(nodeRows, []any{nodeKey(id), h[:]})
			})
		}
	}
	return l.wdb.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := l.checkFence(ctx, tx); err != nil {
			return err
		}
		if err := l.insertRows(ctx, tx, insertTables[0].into, entryRows); err != nil {
			return err
		}
		return l.insertRows(ctx, tx, insertTables[1].into, nodeRows)
	})
}

// insertRows inserts with multi-row statements of 512, 64, 8 and 1 rows,
// which cost far less per row than one statement each; the statements are
// prepared once on the writer connection and reused in every transaction.
// However large a batch, no statement binds more than 512 rows of 8
// columns: far below SQLite's 32,766 and PostgreSQL's 65,535 parameters.
func (l *Log) insertRows(ctx context.Context, tx *sqldb.Tx, into string, rows [][]any) error {
	args := make([]any, 0, 512*len(rows[0]))
	for len(rows) > 0 {
		n := 512
		for n > len(rows) {
			n /= 8
		}
		stmt := l.stmts[fmt.Sprintf("%s/%d", into, n)]
		args = args[:0]
		for _, r := range rows[:n] {
			args = append(args, r...)
		}
		if _, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// insertTables are the tables a batch writes, with their column counts.
var insertTables = []struct {
	into string
	cols int
}{
	{"entries(idx, data, ts, type, actor_kind, actor, task, round)", 8},
	{"nodes(id, hash)", 2},
}

// prepareInserts prepares the multi-row inserts on the writer connection.
// It must run outside any transaction: the SQLite writer has one
// connection.
func (l *Log) prepareInserts(ctx context.Context) error {
	l.stmts = map[string]*sql.Stmt{}
	for _, t := range insertTables {
		tuple := "(?" + strings.Repeat(",?", t.cols-1) + ")"
		for rows := 1; rows <= 512; rows *= 8 {
			st, err := l.wdb.PrepareContext(ctx, "INSERT INTO "+t.into+" VALUES "+tuple+strings.Repeat(","+tuple, rows-1))
			if err != nil {
				return fmt.Errorf("audit: open: %w", err)
			}
			l.stmts[fmt.Sprintf("%s/%d", t.into, rows)] = st
		}
	}
	return nil
}

// RootAt returns the root of the tree of the first size entries.
func (l *Log) RootAt(ctx context.Context, size uint64) ([32]byte, error) {
	if err := l.live(); err != nil {
		return [32]byte{}, fmt.Errorf("audit: root: %w", err)
	}
	if cur := l.Size(); size > cur {
		return [32]byte{}, fmt.Errorf("audit: root of %d entries, log has %d: %w", size, cur, ErrNotFound)
	}
	hs, err := rangeHashes(ctx, l.rdb, []merkle.Range{{Begin: 0, End: size}})
	if err != nil {
		return [32]byte{}, err
	}
	return hs[0], nil
}

// InclusionProof returns the RFC 9162 inclusion proof of entry index in the
// tree of size entries, leaf level first.
func (l *Log) InclusionProof(ctx context.Context, index, size uint64) ([][]byte, error) {
	if err := l.live(); err != nil {
		return nil, fmt.Errorf("audit: inclusion proof: %w", err)
	}
	if cur := l.Size(); size > cur {
		return nil, fmt.Errorf("audit: inclusion proof for size %d, log has %d: %w", size, cur, ErrNotFound)
	}
	if index >= size {
		return nil, fmt.Errorf("audit: inclusion proof of %d in size %d: %w: %w", index, size, ErrInvalidProof, ErrIndexRange)
	}
	hs, err := rangeHashes(ctx, l.rdb, merkle.InclusionRanges(index, size))
	if err != nil {
		return nil, err
	}
	return proofBytes(hs), nil
}

// ConsistencyProof returns the RFC 9162 consistency proof between the trees
// of size1 and size2 entries (1 <= size1 <= size2 <= Size()).
func (l *Log) ConsistencyProof(ctx context.Context, size1, size2 uint64) ([][]byte, error) {
	if err := l.live(); err != nil {
		return nil, fmt.Errorf("audit: consistency proof: %w", err)
	}
	if cur := l.Size(); size2 > cur {
		return nil, fmt.Errorf("audit: consistency proof to size %d, log has %d: %w", size2, cur, ErrNotFound)
	}
	if size1 == 0 || size1 > size2 {
		return nil, fmt.Errorf("audit: consistency proof from %d to %d: %w: %w", size1, size2, ErrInvalidProof, ErrTreeSize)
	}
	hs, err := rangeHashes(ctx, l.rdb, merkle.ConsistencyRanges(size1, size2))
	if err != nil {
		return nil, err
	}
	return proofBytes(hs), nil
}

// Entry returns the entry at index.
func (l *Log) Entry(ctx context.Context, index uint64) (Entry, error) {
	if err := l.live(); err != nil {
		return Entry{}, fmt.Errorf("audit: entry: %w", err)
	}
	if index >= l.Size() {
		return Entry{}, fmt.Errorf("audit: entry %d: %w", index, ErrNotFound)
	}
	var data []byte
	err := l.rdb.QueryRowContext(ctx, "SELECT data FROM entries WHERE idx = ?", int64(index)).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return Entry{}, fmt.Errorf("audit: entry %d missing: %w", index, ErrCorrupt)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("audit: entry %d: %w", index, err)
	}
	return Entry{Index: index, Data: data}, nil
}

// Entries yields the entries with start <= index < end in order; end is
// capped at Size(). A missing row ends the sequence with ErrCorrupt.
func (l *Log) Entries(ctx context.Context, start, end uint64) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		if err := l.live(); err != nil {
			yield(Entry{}, fmt.Errorf("audit: entries: %w", err))
			return
		}
		end = min(end, l.Size())
		const chunk = 1024
		for next := start; next < end; {
			rows, err := l.rdb.QueryContext(ctx, "SELECT idx, data FROM entries WHERE idx >= ? AND idx < ? ORDER BY idx LIMIT ?",
				int64(next), int64(end), chunk)
			if err != nil {
				yield(Entry{}, fmt.Errorf("audit: entries: %w", err))
				return
			}
			var got []Entry
			for rows.Next() {
				var i int64
				var data []byte
				if err := rows.Scan(&i, &data); err != nil {
					rows.Close()
					yield(Entry{}, fmt.Errorf("audit: entries: %w", err))
					return
				}
				got = append(got, Entry{Index: uint64(i), Data: data})
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				yield(Entry{}, fmt.Errorf("audit: entries: %w", err))
				return
			}
			if len(got) == 0 {
				yield(Entry{}, fmt.Errorf("audit: entry %d missing: %w", next, ErrCorrupt))
				return
			}
			for _, e := range got {
				if e.Index != next {
					yield(Entry{}, fmt.Errorf("audit: entry %d missing: %w", next, ErrCorrupt))
					return
				}
				if !yield(e, nil) {
					return
				}
				next++
			}
		}
	}
}

// Latest returns the most recent checkpoint.
func (l *Log) Latest(ctx context.Context) (Checkpoint, error) {
	if err := l.live(); err != nil {
		return Checkpoint{}, fmt.Errorf("audit: latest: %w", err)
	}
	if l.readOnly {
		return l.readLatest(ctx, l.rdb)
	}
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	if l.latest == nil {
		return Checkpoint{}, fmt.Errorf("audit: no checkpoint yet: %w", ErrNotFound)
	}
	return *l.latest, nil
}

// Checkpoint signs and stores a checkpoint of the current tree if the log
// grew since the last one (or none exists yet) and returns the latest
// checkpoint. Call it from a ticker, at least every second while entries
// arrive. Before signing it verifies a consistency proof from the previous
// checkpoint to the new tree and refuses, with ErrInconsistent, to sign a
// tree that does not extend it. A deposed writer signs nothing (ErrFenced).
func (l *Log) Checkpoint(ctx context.Context) (Checkpoint, error) {
	if l.readOnly {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", ErrReadOnly)
	}
	if err := l.live(); err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	return l.checkpoint(ctx)
}

func (l *Log) checkpoint(ctx context.Context) (Checkpoint, error) {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	if l.fenced.Load() {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", l.errFenced())
	}
	l.mu.RLock()
	size, root := l.size, l.frontier.Root()
	l.mu.RUnlock()
	if prev := l.latest; prev != nil {
		if size == prev.Size {
			if root != prev.Root {
				return Checkpoint{}, fmt.Errorf("audit: checkpoint: root of %d entries changed: %w", size, ErrInconsistent)
			}
			return *prev, nil
		}
		if err := l.checkAgainst(ctx, l.rdb, *prev, size, root); err != nil {
			l.cfg.logger.Error("audit checkpoint refused", "size", size, "previous", prev.Size, "err", err)
			return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
		}
	}
	cp := Checkpoint{Origin: l.origin, Size: size, Root: root, Signed: l.cfg.now().Round(0).UTC()}
	// Signed inside the transaction, after the fence: a deposed writer
	// never signs a checkpoint of the tree it knew. (Ed25519 signs the
	// same bytes again if the transaction runs twice.)
	err := l.wdb.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := l.checkFence(ctx, tx); err != nil {
			return err
		}
		msg, err := l.cpSigner.Sign(checkpointText(l.origin, size, root))
		if err != nil {
			return err
		}
		cp.Note = msg
		_, err = tx.ExecContext(ctx, "INSERT INTO checkpoints(size, root, note, signed_at) VALUES (?, ?, ?, ?)",
			int64(size), root[:], msg, unixNano(cp.Signed))
		return err
	})
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w", err)
	}
	l.latest = &cp
	return cp, nil
}

// sqlValue prints a column value with its SQLite storage class.
func sqlValue(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case int64:
		return fmt.Sprint(v)
	case []byte:
		return fmt.Sprintf("the BLOB %q", v)
	case nil:
		return "NULL"
	}
	return fmt.Sprintf("the %T %v", v, v)
}

// VerifyIndex re-derives the query columns of every entry from its bytes
// and reports the first row whose columns disagree, as a *VerifyError
// naming the entry and the column (ErrIndexMismatch, ErrCorrupt): queries
// read the columns, so an edited column could hide an entry from a query
// even though the entry itself is intact. An entry whose bytes do not
// parse is left to VerifyExport, which names it.
func (l *Log) VerifyIndex(ctx context.Context) error {
	if err := l.live(); err != nil {
		return fmt.Errorf("audit: verify index: %w", err)
	}
	size := l.Size()
	rows, err := l.rdb.QueryContext(ctx, "SELECT idx, data, ts, type, actor_kind, actor, task, round FROM entries WHERE idx < ? ORDER BY idx", int64(size))
	if err != nil {
		return fmt.Errorf("audit: verify index: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		// Scanned untyped: a column rewritten as a BLOB or REAL reads back
		// equal as a Go string or number, yet SQLite never matches it
		// against the TEXT or INTEGER a query binds.
		var idx int64
		var data []byte
		var ts, typ, kind, actor, task, round any
		if err := rows.Scan(&idx, &data, &ts, &typ, &kind, &actor, &task, &round); err != nil {
			return fmt.Errorf("audit: verify index: %w", err)
		}
		ev, err := Entry{Index: uint64(idx), Data: data}.Event()
		if err != nil {
			continue
		}
		for _, c := range []struct {
			name      string
			got, want any
		}{
			{"type", typ, string(ev.Type)}, {"actor_kind", kind, string(ev.Actor.Kind)}, {"actor", actor, ev.Actor.ID},
			{"task", task, ev.Subject.Task}, {"round", round, int64(ev.Subject.Round)}, {"ts", ts, unixNano(ev.Time)},
		} {
			if c.got != c.want {
				return &VerifyError{Index: idx, Checkpoint: -1, Err: fmt.Errorf("%w: query index column %s is %s where the signed entry says %s, so queries by it return the wrong entries: %w: %w",
					ErrTampered, c.name, sqlValue(c.got), sqlValue(c.want), ErrIndexMismatch, ErrCorrupt)}
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: verify index: %w", err)
	}
	return nil
}
