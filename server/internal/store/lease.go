package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/sqldb"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// leaseSchema holds one row per led thing ("coordinator": every task's
// rounds and the pool's jobs). Its epoch is the fencing token: each new
// leader increments it, and every write a leader makes through its fenced
// store checks, in the write's own transaction, that the epoch is still its
// own. A deposed leader that has not noticed yet therefore cannot commit.
const leaseSchema = `
CREATE TABLE IF NOT EXISTS leases (
	name TEXT PRIMARY KEY,
	epoch INTEGER NOT NULL,
	holder TEXT NOT NULL, -- who leads, as the leader names itself
	since INTEGER NOT NULL,
	address TEXT NOT NULL DEFAULT '' -- where the leader serves the API, for standbys to forward to
);
`

// Fence is a leader's fencing token: the lease's epoch when it was taken.
type Fence struct {
	Name   string
	Epoch  int64
	Holder string
	Since  time.Time
	// Address is where the holder serves the API ("host:port"), as it
	// said when it took the lease; "" if it serves none.
	Address string
}

// MinLeaseTTL bounds how fast PostgreSQL may hand a silent leader's lease
// on: below it, a leader's ordinary pauses would cost it the lease.
const MinLeaseTTL = time.Second

// Leadership is this process's lead of a lease, until Release or until
// Renew fails.
//
// On PostgreSQL it is a session advisory lock on a connection of its own:
// the lock ends with the session, so a killed leader's lease frees as soon
// as the database sees its connection close, and a leader cut off from the
// database loses its session, and the lock, after ttl without a Renew
// (idle_session_timeout). Whoever takes the lock next increments the
// epoch. On SQLite, whose file has one writer process, leading is never
// contested; the epoch still counts the leaders.
type Leadership struct {
	s     *Store
	fence Fence
	conn  *sql.Conn // PostgreSQL: the session that holds the lock
}

// TryLead takes the lease name for holder, which serves the API at
// address, if no other session holds it, and returns (nil, nil) if one
// does. ttl is how long the database keeps a silent leader's lease
// (PostgreSQL): the leader must Renew more often.
func (s *Store) TryLead(ctx context.Context, name, holder, address string, ttl time.Duration, now time.Time) (*Leadership, error) {
	if ttl < MinLeaseTTL {
		return nil, fmt.Errorf("store: lease %s: ttl %v is below %v", name, ttl, MinLeaseTTL)
	}
	l := &Leadership{s: s}
	if s.db.Dialect() == sqldb.Postgres {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("store: lease %s: %w", name, err)
		}
		// Set before the lock: a session that goes silent while holding it
		// is ended by the database, which frees the lock.
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET idle_session_timeout = %d", ttl.Milliseconds())); err != nil {
			returnConn(conn)
			return nil, fmt.Errorf("store: lease %s: %w", name, err)
		}
		var got bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", lockKey(name)).Scan(&got); err != nil {
			returnConn(conn)
			return nil, fmt.Errorf("store: lease %s: %w", name, err)
		}
		if !got {
			returnConn(conn)
			return nil, nil
		}
		l.conn = conn
	}
	err := s.db.Tx(ctx, func(tx *sqldb.Tx) error {
		var epoch int64
		err := tx.QueryRowContext(ctx, `INSERT INTO leases (name, epoch, holder, since, address) VALUES (?, 1, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET epoch = leases.epoch + 1, holder = excluded.holder, since = excluded.since,
			address = excluded.address
			RETURNING epoch`, name, holder, ts(now), address).Scan(&epoch)
		if err != nil {
			return err
		}
		l.fence = Fence{Name: name, Epoch: epoch, Holder: holder, Since: now.UTC(), Address: address}
		return nil
	})
	if err != nil {
		l.Release()
		return nil, fmt.Errorf("store: lease %s: %w", name, err)
	}
	return l, nil
}

// lockKey is the advisory lock's key for a lease name.
func lockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("fleetlearn lease " + name))
	return int64(h.Sum64() >> 1) // non-negative: pg_locks shows it as two unsigned halves
}

// Fence is the leadership's fencing token.
func (l *Leadership) Fence() Fence { return l.fence }

// Store is the store as this leader writes it: each write first checks,
// in its transaction, that the lease's epoch is still this leadership's,
// and fails with ErrFenced otherwise. Reads are unchanged.
func (l *Leadership) Store() *Store {
	f := l.fence
	return &Store{db: l.s.db, hot: l.s.hot, fence: &f}
}

// Renew shows the database that the leader is alive and checks that it
// still holds the lease. An error means the leadership is over (or cannot
// be known): stop acting as leader, Release, and try to lead again.
func (l *Leadership) Renew(ctx context.Context) error {
	if l.conn != nil {
		var held bool
		// The lock is this session's if pg_locks lists it as granted to it.
		err := l.conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
			AND pid = pg_backend_pid() AND granted AND ((classid::bigint << 32) | objid::bigint) = $1)`, lockKey(l.fence.Name)).Scan(&held)
		if err != nil {
			return fmt.Errorf("store: renew lease %s: %w", l.fence.Name, err)
		}
		if !held {
			return fmt.Errorf("store: lease %s: the session lost its lock: %w", l.fence.Name, ErrFenced)
		}
	}
	return l.s.checkFence(ctx, l.s.db, &l.fence)
}

// Release gives the lease up. It is safe to call more than once.
func (l *Leadership) Release() error {
	if l.conn == nil {
		return nil
	}
	err := returnConn(l.conn)
	l.conn = nil
	return err
}

// returnConn hands a lease's connection back to the pool as any other:
// without its locks (the lease passes on at once, though the pool keeps
// the session) and without the lease's idle timeout. A connection the
// database already ended fails these and the pool drops it.
func returnConn(conn *sql.Conn) error {
	ctx := context.Background()
	conn.ExecContext(ctx, "SELECT pg_advisory_unlock_all()")
	conn.ExecContext(ctx, "RESET idle_session_timeout")
	return conn.Close()
}

// Lease returns the lease's current holder and epoch; ErrNotFound
// wrapped if nobody ever led it.
func (s *Store) Lease(ctx context.Context, name string) (Fence, error) {
	var f Fence
	var since int64
	err := s.db.QueryRowContext(ctx, `SELECT epoch, holder, since, address FROM leases WHERE name = ?`, name).Scan(&f.Epoch, &f.Holder, &since, &f.Address)
	if errors.Is(err, sql.ErrNoRows) {
		return Fence{}, fmt.Errorf("lease %s: %w", name, backend.ErrNotFound)
	}
	if err != nil {
		return Fence{}, fmt.Errorf("store: lease %s: %w", name, err)
	}
	f.Name, f.Since = name, fromTS(since)
	return f, nil
}

type querier interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

// checkFence fails with ErrFenced unless the lease's epoch is f's. On
// PostgreSQL, inside a transaction, FOR SHARE holds the row until commit:
// a new leader's increment waits for this write, and every later write of
// the old leader sees the new epoch.
func (s *Store) checkFence(ctx context.Context, q querier, f *Fence) error {
	query := `SELECT epoch FROM leases WHERE name = ?`
	if s.db.Dialect() == sqldb.Postgres {
		query += ` FOR SHARE`
	}
	var epoch int64
	err := q.QueryRowContext(ctx, query, f.Name).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: lease %s is gone: %w", f.Name, ErrFenced)
	}
	if err != nil {
		return fmt.Errorf("store: lease %s: %w", f.Name, err)
	}
	if epoch != f.Epoch {
		return fmt.Errorf("store: lease %s is at epoch %d, this leader's is %d: %w", f.Name, epoch, f.Epoch, ErrFenced)
	}
	return nil
}

// exec runs a write: as it is, or, for a fenced store, in a transaction
// that checks the fence first.
func (s *Store) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if s.fence == nil {
		return s.db.ExecContext(ctx, q, args...)
	}
	var res sql.Result
	err := s.Tx(ctx, func(tx *sqldb.Tx) error {
		var err error
		res, err = tx.ExecContext(ctx, q, args...)
		return err
	})
	return res, err
}
