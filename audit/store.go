package audit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
)

// Files in a log's folder.
const (
	DBFile   = "audit.db"
	KeysFile = "audit.keys"
	LockFile = "audit.lock" // held by the process that has the log open for writing
)

// storeFormat marks the schema version in the meta table.
const storeFormat = "fleetlearn-audit-store/1"

// The schema. Entries keep the signed bytes verbatim; the other columns are
// copies taken from them at append time for querying only. Nodes hold every
// complete subtree hash, keyed by id = level<<56 | index, so any proof is a
// handful of point reads. Checkpoints keep every signed note. Cosignatures
// keep the newest cosignature of each witness per checkpoint (a checkpoint
// is its size: the log signs one per size): the witness's verifier key and
// key name, the checkpoint's root, the cosignature's time (Unix seconds)
// and its bytes as in the note line (key id, timestamp, signature). The
// table came after the first logs; Open adds it to those.
const schema = `
CREATE TABLE IF NOT EXISTS meta (
	key   TEXT PRIMARY KEY,
	value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
	idx        INTEGER PRIMARY KEY,
	data       BLOB NOT NULL,
	ts         INTEGER NOT NULL,
	type       TEXT NOT NULL,
	actor_kind TEXT NOT NULL,
	actor      TEXT NOT NULL,
	task       TEXT NOT NULL,
	round      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_ts ON entries(ts);
CREATE INDEX IF NOT EXISTS entries_type ON entries(type);
CREATE INDEX IF NOT EXISTS entries_actor ON entries(actor);
CREATE INDEX IF NOT EXISTS entries_task ON entries(task, round);
CREATE TABLE IF NOT EXISTS nodes (
	id   INTEGER PRIMARY KEY,
	hash BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
	seq       INTEGER PRIMARY KEY,
	size      INTEGER NOT NULL,
	root      BLOB NOT NULL,
	note      BLOB NOT NULL,
	signed_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS cosignatures (
	witness TEXT NOT NULL,
	size    INTEGER NOT NULL,
	root    BLOB NOT NULL,
	name    TEXT NOT NULL,
	time    INTEGER NOT NULL,
	sig     BLOB NOT NULL,
	PRIMARY KEY (witness, size)
);
`

// nodeKey packs a subtree id into the nodes table key.
func nodeKey(id merkle.NodeID) int64 { return int64(id.Level)<<56 | int64(id.Index) }

// maxLeaves keeps node keys inside their 56 index bits.
const maxLeaves = 1 << 55

// dsn builds an SQLite URI filename; the path escaping covers the
// characters URI filenames give a meaning to.
func dsn(path string, kind dbKind) string {
	path = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	params := []string{"_pragma=busy_timeout(10000)"}
	switch kind {
	case dbReadOnly:
		params = append(params, "mode=ro", "_pragma=query_only(1)")
	case dbReader:
		params = append(params, "_pragma=query_only(1)")
	case dbWriter:
		// FULL: the WAL is synced at every commit, so an acknowledged
		// append survives power loss as well as a killed process; group
		// commit spreads the sync over a whole batch.
		params = append(params, "_pragma=journal_mode(WAL)", "_pragma=synchronous(FULL)", "_txlock=immediate")
	}
	return "file:" + path + "?" + strings.Join(params, "&")
}

type dbKind int

const (
	dbWriter   dbKind = iota // the log's single writer connection
	dbReader                 // the log's readers, next to a writer
	dbReadOnly               // OpenReadOnly: nothing may change the file
)

func openDB(path string, kind dbKind, conns int) (*sql.DB, error) {
	db, err := sql.Open("sqlite", dsn(path, kind))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxLifetime(0)
	return db, nil
}

// unixNano converts for the ts column, clamping times beyond int64
// nanoseconds (years before 1678 or after 2262).
func unixNano(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readNodes fetches subtree hashes by id in one query.
func readNodes(ctx context.Context, q querier, ids []merkle.NodeID) (map[merkle.NodeID]merkle.Hash, error) {
	out := make(map[merkle.NodeID]merkle.Hash, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	keys := make(map[int64]merkle.NodeID, len(ids))
	args := make([]any, 0, len(ids))
	for _, id := range ids {
		k := nodeKey(id)
		if _, dup := keys[k]; !dup {
			keys[k] = id
			args = append(args, k)
		}
	}
	for start := 0; start < len(args); start += 500 {
		chunk := args[start:min(start+500, len(args))]
		query := "SELECT id, hash FROM nodes WHERE id IN (?" + strings.Repeat(",?", len(chunk)-1) + ")"
		rows, err := q.QueryContext(ctx, query, chunk...)
		if err != nil {
			return nil, fmt.Errorf("audit: read nodes: %w", err)
		}
		for rows.Next() {
			var k int64
			var h []byte
			if err := rows.Scan(&k, &h); err != nil {
				rows.Close()
				return nil, fmt.Errorf("audit: read nodes: %w", err)
			}
			if len(h) != merkle.HashSize {
				rows.Close()
				return nil, fmt.Errorf("audit: node %d holds %d bytes: %w", k, len(h), ErrCorrupt)
			}
			out[keys[k]] = merkle.Hash(h)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("audit: read nodes: %w", err)
		}
	}
	for _, id := range ids {
		if _, ok := out[id]; !ok {
			return nil, fmt.Errorf("audit: subtree (%d, %d) missing: %w", id.Level, id.Index, ErrCorrupt)
		}
	}
	return out, nil
}

// rangeHashes computes the hash of each range from stored subtrees.
func rangeHashes(ctx context.Context, q querier, ranges []merkle.Range) ([]merkle.Hash, error) {
	var ids []merkle.NodeID
	covers := make([][]merkle.NodeID, len(ranges))
	for i, r := range ranges {
		covers[i] = merkle.Cover(r.Begin, r.End)
		ids = append(ids, covers[i]...)
	}
	nodes, err := readNodes(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	out := make([]merkle.Hash, len(ranges))
	var buf []merkle.Hash
	for i, c := range covers {
		buf = buf[:0]
		for _, id := range c {
			buf = append(buf, nodes[id])
		}
		out[i] = merkle.RangeHash(buf)
	}
	return out, nil
}

func proofBytes(hs []merkle.Hash) [][]byte {
	out := make([][]byte, len(hs))
	for i := range hs {
		out[i] = hs[i][:]
	}
	return out
}

func readMeta(ctx context.Context, q querier, key string) ([]byte, error) {
	var v []byte
	err := q.QueryRowContext(ctx, "SELECT value FROM meta WHERE key = ?", key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("audit: meta %s missing: %w", key, ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: meta %s: %w", key, err)
	}
	return v, nil
}

// storedSize is one past the highest index, the log's size if no row is
// missing.
func storedSize(ctx context.Context, q querier) (uint64, error) {
	var max sql.NullInt64
	if err := q.QueryRowContext(ctx, "SELECT max(idx) FROM entries").Scan(&max); err != nil {
		return 0, fmt.Errorf("audit: size: %w", err)
	}
	if !max.Valid {
		return 0, nil
	}
	if max.Int64 < 0 {
		return 0, fmt.Errorf("audit: negative index %d: %w", max.Int64, ErrCorrupt)
	}
	return uint64(max.Int64) + 1, nil
}
