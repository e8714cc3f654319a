// Package store is the aggregator's durable state, in SQLite (modernc, pure
// Go, WAL; the embedded default) or PostgreSQL (replicated deployments): tasks, rounds, cohort assignments, model versions, modules, devices and
// server optimizer state. Blobs (model and module bytes) are not here; they live
// in the JetStream object store.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/sqldb"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// Store wraps the database. Methods are safe for concurrent use.
type Store struct {
	db *sqldb.DB
	// hot are the statements every check-in runs, prepared once: the
	// driver otherwise compiles a query each time it runs (a third of what
	// a seat cost the store, profiled with 100 agents).
	hot hotStatements
	// fence, when set, is the leadership this store writes for (see
	// Leadership.Store): every write checks it in its transaction.
	fence *Fence
}

type hotStatements struct {
	assign, assigned, device *sql.Stmt
}

func (h *hotStatements) prepare(ctx context.Context, db *sqldb.DB) error {
	for _, p := range []struct {
		to **sql.Stmt
		q  string
	}{
		{&h.assign, `INSERT INTO assignments (task_id, round, device_id, participant, examples, assigned_at)
			VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(participant), 0) + 1 FROM assignments WHERE task_id = ?1 AND round = ?2), ?4, ?5)
			ON CONFLICT (task_id, round, device_id) DO NOTHING RETURNING participant`},
		{&h.assigned, `SELECT participant FROM assignments WHERE task_id = ? AND round = ? AND device_id = ?`},
		{&h.device, `SELECT ` + selectDevice + ` FROM enrolled_devices WHERE id = ?`},
	} {
		st, err := db.PrepareContext(ctx, p.q)
		if err != nil {
			h.close()
			return fmt.Errorf("store: prepare: %w", err)
		}
		*p.to = st
	}
	return nil
}

func (h *hotStatements) close() {
	for _, st := range []*sql.Stmt{h.assign, h.assigned, h.device} {
		if st != nil {
			st.Close()
		}
	}
}

const schema = `
CREATE TABLE IF NOT EXISTS tasks (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	state INTEGER NOT NULL,
	spec BLOB NOT NULL,            -- pb.Task as created (configuration)
	current_round INTEGER NOT NULL DEFAULT 0,
	current_model TEXT NOT NULL,
	train_rounds INTEGER NOT NULL DEFAULT 0,
	state_reason TEXT NOT NULL DEFAULT '',
	opt_state BLOB,                -- server optimizer state (aggregator)
	created INTEGER NOT NULL,
	updated INTEGER NOT NULL,
	short_rounds INTEGER NOT NULL DEFAULT 0, -- rounds in a row abandoned for want of devices
	base_metrics BLOB -- JSON object: the base model on the server's evaluation set; NULL until measured
);
CREATE TABLE IF NOT EXISTS rounds (
	task_id TEXT NOT NULL,
	round INTEGER NOT NULL,
	kind INTEGER NOT NULL,
	state INTEGER NOT NULL,
	seed INTEGER NOT NULL,
	base_model TEXT NOT NULL,
	open_time INTEGER NOT NULL,
	deadline INTEGER NOT NULL,
	close_time INTEGER NOT NULL DEFAULT 0,
	assigned INTEGER NOT NULL DEFAULT 0,
	reported INTEGER NOT NULL DEFAULT 0,
	dropped INTEGER NOT NULL DEFAULT 0,
	metrics BLOB,
	model TEXT NOT NULL DEFAULT '',
	reason TEXT NOT NULL DEFAULT '',
	epsilon REAL NOT NULL DEFAULT 0, -- the task's cumulative DP epsilon after this round
	failures BLOB,                   -- JSON object: device id -> why it did not contribute
	PRIMARY KEY (task_id, round)
);
CREATE TABLE IF NOT EXISTS pending_closes ( -- a round's close between its audit record and its commit
	task_id TEXT NOT NULL,
	round INTEGER NOT NULL,
	body BLOB NOT NULL, -- JSON: the round row, the new model row, the optimizer state
	PRIMARY KEY (task_id, round)
);
CREATE TABLE IF NOT EXISTS participations ( -- rounds each device contributed to, for DP caps
	task_id TEXT NOT NULL,
	device_id TEXT NOT NULL,
	rounds INTEGER NOT NULL,
	PRIMARY KEY (task_id, device_id)
);
CREATE TABLE IF NOT EXISTS assignments (
	task_id TEXT NOT NULL,
	round INTEGER NOT NULL,
	device_id TEXT NOT NULL,
	participant INTEGER NOT NULL,
	examples INTEGER NOT NULL DEFAULT 0, -- examples_available at check-in: the most a report may claim
	assigned_at INTEGER NOT NULL,
	PRIMARY KEY (task_id, round, device_id)
);
CREATE TABLE IF NOT EXISTS models (
	version TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	description TEXT NOT NULL DEFAULT '',
	parent TEXT NOT NULL DEFAULT '',
	task_id TEXT NOT NULL DEFAULT '',
	round INTEGER NOT NULL DEFAULT 0,
	source INTEGER NOT NULL,
	tensors INTEGER NOT NULL,
	params INTEGER NOT NULL,
	size INTEGER NOT NULL,
	created INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS modules (
	sha256 TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	abi INTEGER NOT NULL,
	size INTEGER NOT NULL,
	signature BLOB,
	key_id TEXT NOT NULL DEFAULT '',
	created INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
	id TEXT PRIMARY KEY,
	attrs BLOB,
	first_seen INTEGER NOT NULL,
	last_seen INTEGER NOT NULL
);
`

// migrations add columns after a table first shipped; a database that has
// them already answers "duplicate column" (SQLite) or skips them (PostgreSQL,
// where sqldb.DDL makes each ADD COLUMN IF NOT EXISTS).
var migrations = []string{
	`ALTER TABLE rounds ADD COLUMN epsilon REAL NOT NULL DEFAULT 0`,
	`ALTER TABLE rounds ADD COLUMN failures BLOB`,
	`ALTER TABLE tasks ADD COLUMN short_rounds INTEGER NOT NULL DEFAULT 0`,
	`ALTER TABLE tasks ADD COLUMN base_metrics BLOB`,
	`ALTER TABLE models ADD COLUMN lineage BLOB`, // pb.PoolLineage of a pool-trained version
	// The training step (the task's train_rounds after it) of the last
	// committed training round a device contributed to, for DP's minimum
	// separation; 0 for none.
	`ALTER TABLE participations ADD COLUMN last_step INTEGER NOT NULL DEFAULT 0`,
	// The secret correlated DP noise is derived from, and the noise
	// stream's state after the last committed training round.
	`ALTER TABLE tasks ADD COLUMN dp_secret BLOB`,
	`ALTER TABLE tasks ADD COLUMN noise_state BLOB`,
	// Adaptive clipping's bound for the next training round; 0 before the
	// first commit (the task's dp.clip_norm).
	`ALTER TABLE tasks ADD COLUMN clip_norm REAL NOT NULL DEFAULT 0`,
}

// indexes came after their tables. A participant number is unique in its
// round: with several writers (PostgreSQL), two seats taken at once may
// count the same cohort, and the index makes the later one try again.
const indexes = `
CREATE UNIQUE INDEX IF NOT EXISTS assignments_participant ON assignments (task_id, round, participant);
`

// pgRowids give PostgreSQL, which has no implicit rowid, the insertion
// order that SQLite's rowid gives the tables listed by page.
const pgRowids = `
ALTER TABLE enrolled_devices ADD COLUMN IF NOT EXISTS rowid BIGINT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE models ADD COLUMN IF NOT EXISTS rowid BIGINT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE modules ADD COLUMN IF NOT EXISTS rowid BIGINT GENERATED ALWAYS AS IDENTITY;
`

// pgSchemaLock is the advisory lock (an arbitrary constant) under which an
// aggregator creates or migrates the schema on PostgreSQL, so that
// replicas starting together do not race on the catalog.
const pgSchemaLock = 0x466c656574 // "Fleet"

// MinPostgresVersion is the oldest PostgreSQL the store runs on
// (server_version_num): 14, whose idle_session_timeout ends a silent
// leader's session and so its lease.
const MinPostgresVersion = 140000

// MaxPostgresConns bounds one aggregator's connections to PostgreSQL.
const MaxPostgresConns = 16

// Open opens the store at target: the path of an SQLite file, created if
// needed, or a PostgreSQL URL (postgres://user@host:port/db, see
// sqldb.IsPostgresURL) of an existing database, whose tables are created on
// first use.
func Open(ctx context.Context, target string) (*Store, error) {
	db, err := sqldb.Open(target, "_pragma=journal_mode(WAL)", "_pragma=busy_timeout(10000)", "_pragma=synchronous(NORMAL)", "_pragma=foreign_keys(ON)")
	if err != nil {
		return nil, fmt.Errorf("store: open: %w", err)
	}
	if db.Dialect() == sqldb.SQLite {
		// One writer at a time is SQLite's model; a single connection also
		// keeps transactions from tripping over each other with SQLITE_BUSY.
		db.SetMaxOpenConns(1)
	} else {
		db.SetMaxOpenConns(MaxPostgresConns)
		db.SetMaxIdleConns(MaxPostgresConns)
	}
	if err := createSchema(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{db: db}
	if err := s.hot.prepare(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func createSchema(ctx context.Context, db *sqldb.DB) error {
	d := db.Dialect()
	if d == sqldb.SQLite {
		return migrate(ctx, d, db)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: connect to PostgreSQL: %w; check that the server in the store URL runs and admits its user and database (the password comes from PGPASSWORD or PGPASSFILE)", err)
	}
	defer conn.Close()
	var version int
	if err := conn.QueryRowContext(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return fmt.Errorf("store: connect: %w", err)
	}
	if version < MinPostgresVersion {
		return fmt.Errorf("store: PostgreSQL %d.%d is too old: leases need idle_session_timeout, from PostgreSQL 14 on; upgrade the database",
			version/10000, version%10000)
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: schema: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(pgSchemaLock)); err != nil {
		return fmt.Errorf("store: schema lock: %w", err)
	}
	if err := migrate(ctx, d, tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, pgRowids); err != nil {
		return fmt.Errorf("store: schema: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: schema: %w", err)
	}
	return nil
}

func migrate(ctx context.Context, d sqldb.Dialect, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}) error {
	if _, err := db.ExecContext(ctx, d.DDL(schema)); err != nil {
		return fmt.Errorf("store: schema: %w", err)
	}
	for _, m := range migrations {
		if _, err := db.ExecContext(ctx, d.DDL(m)); err != nil && !strings.Contains(err.Error(), "duplicate column") {
			return fmt.Errorf("store: migrate: %w", err)
		}
	}
	for _, ddl := range []string{poolSchema, deviceSchema, leaseSchema, indexes} {
		if _, err := db.ExecContext(ctx, d.DDL(ddl)); err != nil {
			return fmt.Errorf("store: schema: %w", err)
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.hot.close()
	return s.db.Close()
}

func ts(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromTS(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// Tx runs fn in a transaction. On PostgreSQL fn may run more than once
// (see sqldb.DB.Tx): it must do nothing but database work.
func (s *Store) Tx(ctx context.Context, fn func(*sqldb.Tx) error) error {
	if s.fence == nil {
		return s.db.Tx(ctx, fn)
	}
	return s.db.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := s.checkFence(ctx, tx, s.fence); err != nil {
			return err
		}
		return fn(tx)
	})
}

// ---- tasks

// TaskRow is a task's configuration plus its mutable progress.
type TaskRow struct {
	Spec         *pb.Task // configuration as created
	State        pb.TaskState
	Reason       string
	CurrentRound uint64
	CurrentModel string
	TrainRounds  uint32 // committed training rounds
	// ShortRounds counts the latest rounds in a row that were abandoned for
	// want of devices (RoundRow.Short); any other close resets it, and so
	// does ResumeTask.
	ShortRounds uint32
	// BaseMetrics is the base model measured on the server's evaluation
	// set before round 1 (SetBaseMetrics): nil until then, empty when the
	// evaluation ran but no metric passed the checks.
	BaseMetrics map[string]float64
	OptState    []byte
	Created     time.Time
	Updated     time.Time
}

// Proto renders the row as the API's Task.
func (r *TaskRow) Proto() *pb.Task {
	t := proto.Clone(r.Spec).(*pb.Task)
	t.State = r.State
	t.StateReason = r.Reason
	t.CurrentRound = r.CurrentRound
	t.CurrentModel = &pb.ModelRef{Sha256: r.CurrentModel, Version: r.CurrentModel}
	t.BaseMetrics = nil // the column's, never the spec's
	if r.BaseMetrics != nil {
		t.BaseMetrics = &pb.Metrics{Values: maps.Clone(r.BaseMetrics)}
	}
	return t
}

// InsertTask stores a new task.
func (s *Store) InsertTask(ctx context.Context, t *pb.Task, now time.Time) error {
	if t.BaseMetrics != nil { // output only: measured by the coordinator, kept in its own column
		t = proto.CloneOf(t)
		t.BaseMetrics = nil
	}
	spec, err := proto.Marshal(t)
	if err != nil {
		return fmt.Errorf("store: task: %w", err)
	}
	_, err = s.exec(ctx, `INSERT INTO tasks (id, name, state, spec, current_model, created, updated)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, t.Id, t.Name, int32(t.State), spec, t.GetModel().GetVersion(), ts(now), ts(now))
	if err != nil {
		return fmt.Errorf("store: insert task %s: %w", t.Id, err)
	}
	return nil
}

const taskCols = `spec, state, state_reason, current_round, current_model, train_rounds, short_rounds, opt_state, created, updated, base_metrics`

func scanTask(sc interface{ Scan(...any) error }) (*TaskRow, error) {
	var (
		r        TaskRow
		spec     []byte
		state    int32
		cur      int64
		tr, sr   int64
		cr, upd  int64
		optState []byte
		base     []byte
	)
	if err := sc.Scan(&spec, &state, &r.Reason, &cur, &r.CurrentModel, &tr, &sr, &optState, &cr, &upd, &base); err != nil {
		return nil, err
	}
	if base != nil {
		if err := json.Unmarshal(base, &r.BaseMetrics); err != nil {
			return nil, fmt.Errorf("store: task base metrics: %w", err)
		}
		if r.BaseMetrics == nil {
			r.BaseMetrics = map[string]float64{}
		}
	}
	r.Spec = &pb.Task{}
	if err := proto.Unmarshal(spec, r.Spec); err != nil {
		return nil, fmt.Errorf("store: task spec: %w", err)
	}
	r.State, r.CurrentRound, r.TrainRounds, r.ShortRounds, r.OptState = pb.TaskState(state), uint64(cur), uint32(tr), uint32(sr), optState
	r.Created, r.Updated = fromTS(cr), fromTS(upd)
	r.Spec.CreateTime, r.Spec.UpdateTime = tsProto(r.Created), tsProto(r.Updated)
	return &r, nil
}

// Task loads one task.
func (s *Store) Task(ctx context.Context, id string) (*TaskRow, error) {
	r, err := scanTask(s.db.QueryRowContext(ctx, `SELECT `+taskCols+` FROM tasks WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("task %q: %w", id, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: task %s: %w", id, err)
	}
	return r, nil
}

// Tasks lists tasks by id after the cursor, optionally filtered by state.
func (s *Store) Tasks(ctx context.Context, state pb.TaskState, after string, limit int) ([]*TaskRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+taskCols+` FROM tasks
		WHERE id > ? AND (? = 0 OR state = ?) ORDER BY id LIMIT ?`, after, int32(state), int32(state), limit)
	if err != nil {
		return nil, fmt.Errorf("store: tasks: %w", err)
	}
	defer rows.Close()
	var out []*TaskRow
	for rows.Next() {
		r, err := scanTask(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// SetTaskState changes a task's state.
func (s *Store) SetTaskState(ctx context.Context, id string, st pb.TaskState, reason string, now time.Time) error {
	res, err := s.exec(ctx, `UPDATE tasks SET state = ?, state_reason = ?, updated = ? WHERE id = ?`,
		int32(st), reason, ts(now), id)
	if err != nil {
		return fmt.Errorf("store: task state: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("task %q: %w", id, backend.ErrNotFound)
	}
	return nil
}

// SetBaseMetrics stores what the base model measured on the server's
// evaluation set. The first measurement stays: a task that has one already
// is left as it is (nil), so that a retried write changes nothing.
func (s *Store) SetBaseMetrics(ctx context.Context, id string, m map[string]float64, now time.Time) error {
	if m == nil {
		m = map[string]float64{} // measured, with nothing that passed the checks
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("store: task %s base metrics: %w", id, err)
	}
	res, err := s.exec(ctx, `UPDATE tasks SET base_metrics = ?, updated = ? WHERE id = ? AND base_metrics IS NULL`,
		b, ts(now), id)
	if err != nil {
		return fmt.Errorf("store: task %s base metrics: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		_, err := s.Task(ctx, id) // not found, or measured already
		return err
	}
	return nil
}

// PauseTask moves a running task to PAUSED with reason. A task in any
// other state (stopped meanwhile) is left alone: ErrPrecondition.
func (s *Store) PauseTask(ctx context.Context, id, reason string, now time.Time) error {
	return s.swapTaskState(ctx, id, pb.TaskState_TASK_STATE_RUNNING, pb.TaskState_TASK_STATE_PAUSED, reason, now)
}

// ResumeTask moves a paused task back to RUNNING, clearing its reason and
// its count of short rounds: the resumed task gets a fresh run of rounds
// before it can pause again. A task that is not paused is ErrPrecondition.
func (s *Store) ResumeTask(ctx context.Context, id string, now time.Time) error {
	return s.swapTaskState(ctx, id, pb.TaskState_TASK_STATE_PAUSED, pb.TaskState_TASK_STATE_RUNNING, "", now)
}

// swapTaskState changes a task's state from from to to in one statement, so
// that a concurrent change (an operator's stop) is never overwritten.
func (s *Store) swapTaskState(ctx context.Context, id string, from, to pb.TaskState, reason string, now time.Time) error {
	res, err := s.exec(ctx, `UPDATE tasks SET state = ?, state_reason = ?, short_rounds = 0, updated = ?
		WHERE id = ? AND state = ?`, int32(to), reason, ts(now), id, int32(from))
	if err != nil {
		return fmt.Errorf("store: task state: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	r, err := s.Task(ctx, id)
	if err != nil {
		return err
	}
	return fmt.Errorf("task %s is %s, not %s: %w", id, StateName(r.State), StateName(from), backend.ErrPrecondition)
}

// StateName is a task state as operators and the audit log write it:
// "running", "paused".
func StateName(st pb.TaskState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "TASK_STATE_"))
}

// ---- rounds

// RoundRow is one round of a task.
type RoundRow struct {
	TaskID    string
	Round     uint64
	Kind      pb.RoundKind
	State     pb.RoundState
	Seed      uint64
	BaseModel string
	Open      time.Time
	Deadline  time.Time
	Close     time.Time
	Assigned  uint32
	Reported  uint32
	Dropped   uint32
	Metrics   map[string]float64
	Model     string
	Reason    string
	// Epsilon is the task's cumulative DP epsilon after the round (0 without DP).
	Epsilon float64
	// Failures says, by device, why members of the cohort did not
	// contribute. CloseRound keeps only devices of the round's cohort and
	// shortens each reason to wire.MaxFailureReason bytes of UTF-8.
	Failures map[string]string
	// Participants are the devices whose updates a committed round counted;
	// CloseRound adds one to each one's participations. Not stored in the row.
	Participants []string
	// Short marks a round abandoned for want of devices: fewer took a seat
	// than it needed. CloseRound counts it in the task's ShortRounds (and
	// resets them for any other close). Not stored in the row.
	Short bool
	// NoiseState is, for a committed training round with correlated DP
	// noise, the noise stream's state after it: CloseRound stores it as the
	// task's, with the new model. Not stored in the row.
	NoiseState []byte
	// ClipNorm is, for a committed training round with adaptive clipping,
	// the clip bound of the task's next training round: CloseRound stores
	// it as the task's (Store.ClipNorm), with the new model. Not stored in
	// the row.
	ClipNorm float64
}

// Proto renders the row for the API.
func (r *RoundRow) Proto() *pb.RoundSummary {
	s := &pb.RoundSummary{TaskId: r.TaskID, Round: r.Round, Kind: r.Kind, State: r.State,
		OpenTime: tsProto(r.Open), CloseTime: tsProto(r.Close), Assigned: r.Assigned, Reported: r.Reported,
		Dropped: r.Dropped, Reason: r.Reason, Metrics: &pb.Metrics{Values: r.Metrics}, EpsilonSpent: r.Epsilon}
	if r.Model != "" {
		s.Model = &pb.ModelRef{Sha256: r.Model, Version: r.Model, ParentVersion: r.BaseModel}
	}
	for _, d := range slices.Sorted(maps.Keys(r.Failures)) {
		s.Failures = append(s.Failures, &pb.DeviceFailure{DeviceId: d, Reason: r.Failures[d]})
	}
	return s
}

// OpenRound inserts a round in state OPEN and records it as the task's current round.
func (s *Store) OpenRound(ctx context.Context, r *RoundRow, now time.Time) error {
	return s.Tx(ctx, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO rounds (task_id, round, kind, state, seed, base_model, open_time, deadline)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, r.TaskID, int64(r.Round), int32(r.Kind), int32(pb.RoundState_ROUND_STATE_OPEN),
			int64(r.Seed), r.BaseModel, ts(r.Open), ts(r.Deadline)); err != nil {
			return fmt.Errorf("store: open round %s/%d: %w", r.TaskID, r.Round, err)
		}
		_, err := tx.ExecContext(ctx, `UPDATE tasks SET current_round = ?, updated = ? WHERE id = ?`, int64(r.Round), ts(now), r.TaskID)
		return err
	})
}

const roundCols = `task_id, round, kind, state, seed, base_model, open_time, deadline, close_time, assigned, reported, dropped, metrics, model, reason, epsilon, failures`

func scanRound(sc interface{ Scan(...any) error }) (*RoundRow, error) {
	var (
		r                      RoundRow
		round, seed            int64
		kind, state            int32
		open, dl, cl           int64
		assigned, rep, dropped int64
		metrics, failures      []byte
	)
	if err := sc.Scan(&r.TaskID, &round, &kind, &state, &seed, &r.BaseModel, &open, &dl, &cl, &assigned, &rep, &dropped,
		&metrics, &r.Model, &r.Reason, &r.Epsilon, &failures); err != nil {
		return nil, err
	}
	r.Round, r.Kind, r.State, r.Seed = uint64(round), pb.RoundKind(kind), pb.RoundState(state), uint64(seed)
	r.Open, r.Deadline, r.Close = fromTS(open), fromTS(dl), fromTS(cl)
	r.Assigned, r.Reported, r.Dropped = uint32(assigned), uint32(rep), uint32(dropped)
	if len(metrics) > 0 {
		var m pb.Metrics
		if err := proto.Unmarshal(metrics, &m); err != nil {
			return nil, fmt.Errorf("store: round metrics: %w", err)
		}
		r.Metrics = m.Values
	}
	if len(failures) > 0 {
		if err := json.Unmarshal(failures, &r.Failures); err != nil {
			return nil, fmt.Errorf("store: round failures: %w", err)
		}
	}
	return &r, nil
}

// Round loads one round.
func (s *Store) Round(ctx context.Context, task string, round uint64) (*RoundRow, error) {
	r, err := scanRound(s.db.QueryRowContext(ctx, `SELECT `+roundCols+` FROM rounds WHERE task_id = ? AND round = ?`, task, int64(round)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("round %s/%d: %w", task, round, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: round: %w", err)
	}
	return r, nil
}

// Rounds lists a task's rounds in order after the given round number.
func (s *Store) Rounds(ctx context.Context, task string, after uint64, limit int) ([]*RoundRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+roundCols+` FROM rounds WHERE task_id = ? AND round > ? ORDER BY round LIMIT ?`,
		task, int64(after), limit)
	if err != nil {
		return nil, fmt.Errorf("store: rounds: %w", err)
	}
	defer rows.Close()
	var out []*RoundRow
	for rows.Next() {
		r, err := scanRound(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func marshalMetrics(m map[string]float64) []byte {
	b, _ := proto.Marshal(&pb.Metrics{Values: m})
	return b
}

// CloseRound records a round's outcome. For a committed training round, model
// (the new version) and the task's progress are written in the same
// transaction, together with the model row and the optimizer state, so a crash
// leaves either the old or the new state, never half of each.
func (s *Store) CloseRound(ctx context.Context, r *RoundRow, newModel *ModelRow, optState []byte, now time.Time) error {
	return s.Tx(ctx, func(tx *sqldb.Tx) error {
		if newModel != nil {
			if err := insertModel(ctx, tx, newModel); err != nil {
				return err
			}
		}
		failures, err := cohortFailures(ctx, tx, r)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE rounds SET state = ?, close_time = ?, assigned = ?, reported = ?, dropped = ?,
			metrics = ?, model = ?, reason = ?, epsilon = ?, failures = ? WHERE task_id = ? AND round = ? AND state = ?`,
			int32(r.State), ts(r.Close), r.Assigned, r.Reported, r.Dropped, marshalMetrics(r.Metrics), r.Model, r.Reason,
			r.Epsilon, failures, r.TaskID, int64(r.Round), int32(pb.RoundState_ROUND_STATE_OPEN))
		if err != nil {
			return fmt.Errorf("store: close round: %w", err)
		}
		// A round closes once: a second close (a retry after a commit that
		// did succeed) must not count its participants or progress twice.
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("store: close round %s/%d: %w", r.TaskID, r.Round, ErrRoundClosed)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM pending_closes WHERE task_id = ? AND round = ?`, r.TaskID, int64(r.Round)); err != nil {
			return fmt.Errorf("store: close round: %w", err)
		}
		for _, d := range r.Participants {
			if _, err := tx.ExecContext(ctx, `INSERT INTO participations (task_id, device_id, rounds) VALUES (?, ?, 1)
				ON CONFLICT (task_id, device_id) DO UPDATE SET rounds = participations.rounds + 1`, r.TaskID, d); err != nil {
				return fmt.Errorf("store: participation: %w", err)
			}
			// A training commit is the task's next step: train_rounds
			// counts it below, in this transaction.
			if newModel != nil {
				if _, err := tx.ExecContext(ctx, `UPDATE participations SET last_step = (SELECT train_rounds + 1 FROM tasks WHERE id = ?)
					WHERE task_id = ? AND device_id = ?`, r.TaskID, r.TaskID, d); err != nil {
					return fmt.Errorf("store: participation: %w", err)
				}
			}
		}
		if newModel != nil {
			_, err = tx.ExecContext(ctx, `UPDATE tasks SET current_model = ?, train_rounds = train_rounds + 1, opt_state = ?, updated = ?
				WHERE id = ?`, newModel.Version, optState, ts(now), r.TaskID)
			if err != nil {
				return fmt.Errorf("store: task progress: %w", err)
			}
			if r.NoiseState != nil {
				if _, err := tx.ExecContext(ctx, `UPDATE tasks SET noise_state = ? WHERE id = ?`, r.NoiseState, r.TaskID); err != nil {
					return fmt.Errorf("store: task noise state: %w", err)
				}
			}
			if r.ClipNorm > 0 {
				if _, err := tx.ExecContext(ctx, `UPDATE tasks SET clip_norm = ? WHERE id = ?`, r.ClipNorm, r.TaskID); err != nil {
					return fmt.Errorf("store: task clip norm: %w", err)
				}
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tasks SET short_rounds = CASE WHEN ? THEN short_rounds + 1 ELSE 0 END WHERE id = ?`,
			r.Short, r.TaskID); err != nil {
			return fmt.Errorf("store: task short rounds: %w", err)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM assignments WHERE task_id = ? AND round = ?`, r.TaskID, int64(r.Round))
		return err
	})
}

// PendingClose is a round's close as prepared before its audit record: if
// the server stops between recording the close and committing it, the
// restarted coordinator finishes the commit from here (the log says it
// happened) or drops it (the log does not).
type PendingClose struct {
	Row      *RoundRow
	Model    *ModelRow // the new model of a committed training round, else nil
	OptState []byte
}

// PrepareClose stores p for its round, replacing an earlier one.
func (s *Store) PrepareClose(ctx context.Context, p *PendingClose) error {
	body, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("store: prepare close: %w", err)
	}
	_, err = s.exec(ctx, `INSERT INTO pending_closes (task_id, round, body) VALUES (?, ?, ?)
		ON CONFLICT (task_id, round) DO UPDATE SET body = excluded.body`, p.Row.TaskID, int64(p.Row.Round), body)
	if err != nil {
		return fmt.Errorf("store: prepare close %s/%d: %w", p.Row.TaskID, p.Row.Round, err)
	}
	return nil
}

// Pending returns the round's prepared close, or nil.
func (s *Store) Pending(ctx context.Context, task string, round uint64) (*PendingClose, error) {
	var body []byte
	err := s.db.QueryRowContext(ctx, `SELECT body FROM pending_closes WHERE task_id = ? AND round = ?`, task, int64(round)).Scan(&body)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: pending close %s/%d: %w", task, round, err)
	}
	var p PendingClose
	if err := json.Unmarshal(body, &p); err != nil || p.Row == nil {
		return nil, fmt.Errorf("store: pending close %s/%d: undecodable (%v)", task, round, err)
	}
	return &p, nil
}

// DropPending forgets a round's prepared close.
func (s *Store) DropPending(ctx context.Context, task string, round uint64) error {
	if _, err := s.exec(ctx, `DELETE FROM pending_closes WHERE task_id = ? AND round = ?`, task, int64(round)); err != nil {
		return fmt.Errorf("store: drop pending close %s/%d: %w", task, round, err)
	}
	return nil
}

// cohortFailures encodes the failures of r's cohort, which the round's
// assignments name (CloseRound deletes them after this): one entry per
// assigned device at most, whatever the caller passed, each reason made
// valid UTF-8 and cut to wire.MaxFailureReason bytes, since reasons come from
// devices and end up in API responses, tables and logs. nil when none remain.
func cohortFailures(ctx context.Context, tx *sqldb.Tx, r *RoundRow) ([]byte, error) {
	if len(r.Failures) == 0 {
		return nil, nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT device_id FROM assignments WHERE task_id = ? AND round = ?`, r.TaskID, int64(r.Round))
	if err != nil {
		return nil, fmt.Errorf("store: round failures: %w", err)
	}
	defer rows.Close()
	kept := map[string]string{}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, fmt.Errorf("store: round failures: %w", err)
		}
		if reason, ok := r.Failures[d]; ok {
			kept[d] = wire.FailureReason(reason)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: round failures: %w", err)
	}
	if len(kept) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return nil, fmt.Errorf("store: round failures: %w", err)
	}
	return b, nil
}

// DPSecret returns the task's secret for correlated DP noise, storing
// fresh as it if the task has none yet: the first caller's is kept, so
// every replica and every restart derives the same noise.
func (s *Store) DPSecret(ctx context.Context, task string, fresh []byte) ([]byte, error) {
	if _, err := s.exec(ctx, `UPDATE tasks SET dp_secret = ? WHERE id = ? AND dp_secret IS NULL`, fresh, task); err != nil {
		return nil, fmt.Errorf("store: dp secret: %w", err)
	}
	var secret []byte
	if err := s.db.QueryRowContext(ctx, `SELECT dp_secret FROM tasks WHERE id = ?`, task).Scan(&secret); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("store: dp secret: task %q: %w", task, backend.ErrNotFound)
		}
		return nil, fmt.Errorf("store: dp secret: %w", err)
	}
	return secret, nil
}

// NoiseState returns the state of the task's correlated DP noise after its
// last committed training round (nil before the first).
func (s *Store) NoiseState(ctx context.Context, task string) ([]byte, error) {
	var state []byte
	if err := s.db.QueryRowContext(ctx, `SELECT noise_state FROM tasks WHERE id = ?`, task).Scan(&state); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("store: noise state: task %q: %w", task, backend.ErrNotFound)
		}
		return nil, fmt.Errorf("store: noise state: %w", err)
	}
	return state, nil
}

// ClipNorm returns the clip bound adaptive clipping set for the task's
// next training round; 0 before its first committed training round.
func (s *Store) ClipNorm(ctx context.Context, task string) (float64, error) {
	var c float64
	if err := s.db.QueryRowContext(ctx, `SELECT clip_norm FROM tasks WHERE id = ?`, task).Scan(&c); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("store: clip norm: task %q: %w", task, backend.ErrNotFound)
		}
		return 0, fmt.Errorf("store: clip norm: %w", err)
	}
	return c, nil
}

// Participation is what a task's committed rounds hold of one device.
type Participation struct {
	Rounds int // committed rounds it contributed to
	// LastStep is the training step (the task's TrainRounds once that round
	// committed) of the last training round it contributed to; 0 for none.
	LastStep uint64
}

// Participations returns each device's participation in the task's
// committed rounds.
func (s *Store) Participations(ctx context.Context, task string) (map[string]Participation, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT device_id, rounds, last_step FROM participations WHERE task_id = ?`, task)
	if err != nil {
		return nil, fmt.Errorf("store: participations: %w", err)
	}
	defer rows.Close()
	out := map[string]Participation{}
	for rows.Next() {
		var d string
		var p Participation
		var step int64
		if err := rows.Scan(&d, &p.Rounds, &step); err != nil {
			return nil, err
		}
		p.LastStep = uint64(step)
		out[d] = p
	}
	return out, rows.Err()
}

// UpdateRoundMetrics merges metrics into a closed round (server-side evaluation
// arrives after the commit). The read and the write are one transaction:
// merges into the same round at once each keep the others' metrics.
func (s *Store) UpdateRoundMetrics(ctx context.Context, task string, round uint64, m map[string]float64) error {
	return s.Tx(ctx, func(tx *sqldb.Tx) error {
		var b []byte
		err := tx.QueryRowContext(ctx, `SELECT metrics FROM rounds WHERE task_id = ? AND round = ?`, task, int64(round)).Scan(&b)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("round %s/%d: %w", task, round, backend.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("store: round %s/%d metrics: %w", task, round, err)
		}
		var old pb.Metrics
		if err := proto.Unmarshal(b, &old); err != nil {
			return fmt.Errorf("store: round %s/%d metrics: %w", task, round, err)
		}
		merged := old.Values
		if merged == nil {
			merged = map[string]float64{}
		}
		maps.Copy(merged, m)
		if _, err := tx.ExecContext(ctx, `UPDATE rounds SET metrics = ? WHERE task_id = ? AND round = ?`,
			marshalMetrics(merged), task, int64(round)); err != nil {
			return fmt.Errorf("store: round %s/%d metrics: %w", task, round, err)
		}
		return nil
	})
}

// ---- assignments

// Assignment is a device's place in a round's cohort.
type Assignment struct {
	Participant uint32 // 1-based, stable for the round
	Examples    uint64 // examples the device said it has; its report may not claim more
}

// Assign records a device in a round's cohort; it returns the device's
// participant number (1-based) and whether it was newly assigned.
func (s *Store) Assign(ctx context.Context, task string, round uint64, device string, examples uint64, now time.Time) (uint32, bool, error) {
	var participant int64
	args := []any{task, int64(round), device, int64(min(examples, 1<<62)), ts(now)}
	err := s.assign(ctx, args, &participant)
	// Another writer took the same number at the same time; counting again
	// sees its seat. Each retry follows a seat that committed, so a cohort
	// of n needs fewer than n.
	for tries := 0; sqldb.IsUniqueViolation(err) && tries < maxAssignRetries; tries++ {
		err = s.assign(ctx, args, &participant)
	}
	if err == nil {
		return uint32(participant), true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, false, fmt.Errorf("store: assign: %w", err)
	}
	// Assigned already (a resumed round): nothing was inserted.
	if err := s.hot.assigned.QueryRowContext(ctx, task, int64(round), device).Scan(&participant); err != nil {
		return 0, false, fmt.Errorf("store: assignment: %w", err)
	}
	return uint32(participant), false, nil
}

// assign runs the prepared seat insert once: sql.ErrNoRows when the device
// has its seat already.
func (s *Store) assign(ctx context.Context, args []any, participant *int64) error {
	if s.fence == nil {
		return s.hot.assign.QueryRowContext(ctx, args...).Scan(participant)
	}
	return s.Tx(ctx, func(tx *sqldb.Tx) error {
		return tx.StmtContext(ctx, s.hot.assign).QueryRowContext(ctx, args...).Scan(participant)
	})
}

// maxAssignRetries bounds Assign's recounts when writers collide.
const maxAssignRetries = 64

// Assignments returns a round's cohort by device id.
func (s *Store) Assignments(ctx context.Context, task string, round uint64) (map[string]Assignment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT device_id, participant, examples FROM assignments WHERE task_id = ? AND round = ?`,
		task, int64(round))
	if err != nil {
		return nil, fmt.Errorf("store: assignments: %w", err)
	}
	defer rows.Close()
	out := map[string]Assignment{}
	for rows.Next() {
		var d string
		var p, n int64
		if err := rows.Scan(&d, &p, &n); err != nil {
			return nil, err
		}
		out[d] = Assignment{Participant: uint32(p), Examples: uint64(n)}
	}
	return out, rows.Err()
}

// ---- models

// ModelRow is a model version's metadata; its bytes are a blob named Version.
type ModelRow struct {
	Version     string // sha256 of the safetensors bytes
	Name        string
	Description string
	Parent      string
	TaskID      string
	Round       uint64
	Source      pb.ModelSource
	Tensors     int
	Params      int
	Size        int64
	Created     time.Time
	Lineage     *pb.PoolLineage // how a pool job made it; nil otherwise
}

// Proto renders the row for the API.
func (m *ModelRow) Proto() *pb.Model {
	return &pb.Model{
		Ref:  &pb.ModelRef{Sha256: m.Version, Version: m.Version, SizeBytes: uint64(m.Size), ParentVersion: m.Parent},
		Name: m.Name, Description: m.Description, Source: m.Source, TaskId: m.TaskID, Round: m.Round,
		TensorCount: uint32(m.Tensors), ParameterCount: uint64(m.Params), CreateTime: tsProto(m.Created),
		Lineage: m.Lineage,
	}
}

func insertModel(ctx context.Context, tx *sqldb.Tx, m *ModelRow) error {
	var lin []byte
	if m.Lineage != nil {
		var err error
		if lin, err = proto.Marshal(m.Lineage); err != nil {
			return fmt.Errorf("store: insert model %s: lineage: %w", m.Version, err)
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO models (version, name, description, parent, task_id, round, source, tensors, params, size, created, lineage)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(version) DO NOTHING`,
		m.Version, m.Name, m.Description, m.Parent, m.TaskID, int64(m.Round), int32(m.Source), m.Tensors, m.Params, m.Size, ts(m.Created), lin)
	if err != nil {
		return fmt.Errorf("store: insert model %s: %w", m.Version, err)
	}
	return nil
}

// InsertModel stores an imported model version; an existing version is
// ErrExists. The check is in the insert's transaction, so that of imports
// of one version at once, one stores it and the others hear it exists.
func (s *Store) InsertModel(ctx context.Context, m *ModelRow) error {
	return s.Tx(ctx, func(tx *sqldb.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM models WHERE version = ?`, m.Version).Scan(&one)
		if err == nil {
			return fmt.Errorf("model %s: %w", m.Version, backend.ErrExists)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("store: insert model %s: %w", m.Version, err)
		}
		return insertModel(ctx, tx, m)
	})
}

const modelCols = `version, name, description, parent, task_id, round, source, tensors, params, size, created, lineage`

func scanModel(sc interface{ Scan(...any) error }) (*ModelRow, error) {
	var m ModelRow
	var round, created int64
	var source int32
	var lin []byte
	if err := sc.Scan(&m.Version, &m.Name, &m.Description, &m.Parent, &m.TaskID, &round, &source, &m.Tensors, &m.Params, &m.Size, &created, &lin); err != nil {
		return nil, err
	}
	m.Round, m.Source, m.Created = uint64(round), pb.ModelSource(source), fromTS(created)
	return &m, decodeLineage(&m, lin)
}

// Model loads a model version's metadata.
func (s *Store) Model(ctx context.Context, version string) (*ModelRow, error) {
	m, err := scanModel(s.db.QueryRowContext(ctx, `SELECT `+modelCols+` FROM models WHERE version = ?`, version))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("model %q: %w", version, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: model: %w", err)
	}
	return m, nil
}

// Models lists model versions newest first, before the cursor (a row id; 0 starts at the newest).
func (s *Store) Models(ctx context.Context, name string, beforeRowID int64, limit int) ([]*ModelRow, int64, error) {
	if beforeRowID <= 0 {
		beforeRowID = math.MaxInt64
	}
	rows, err := s.db.QueryContext(ctx, `SELECT rowid, `+modelCols+` FROM models WHERE rowid < ? AND (? = '' OR name = ?)
		ORDER BY rowid DESC LIMIT ?`, beforeRowID, name, name, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("store: models: %w", err)
	}
	defer rows.Close()
	var out []*ModelRow
	var last int64
	for rows.Next() {
		var m ModelRow
		var round, created int64
		var source int32
		var lin []byte
		if err := rows.Scan(&last, &m.Version, &m.Name, &m.Description, &m.Parent, &m.TaskID, &round, &source, &m.Tensors, &m.Params, &m.Size, &created, &lin); err != nil {
			return nil, 0, err
		}
		m.Round, m.Source, m.Created = uint64(round), pb.ModelSource(source), fromTS(created)
		if err := decodeLineage(&m, lin); err != nil {
			return nil, 0, err
		}
		out = append(out, &m)
	}
	return out, last, rows.Err()
}

// ---- modules

// InsertModule stores a module's metadata; registering the same bytes twice is ErrExists.
func (s *Store) InsertModule(ctx context.Context, m *pb.Module, now time.Time) error {
	_, err := s.exec(ctx, `INSERT INTO modules (sha256, name, abi, size, signature, key_id, created) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		m.Ref.Sha256, m.Ref.Name, m.Ref.AbiVersion, int64(m.Ref.SizeBytes), m.Signature, m.KeyId, ts(now))
	if err != nil {
		if _, gerr := s.Module(ctx, m.Ref.Sha256); gerr == nil {
			return fmt.Errorf("module %s: %w", m.Ref.Sha256, backend.ErrExists)
		}
		return fmt.Errorf("store: insert module: %w", err)
	}
	return nil
}

func scanModule(sc interface{ Scan(...any) error }) (*pb.Module, error) {
	m := &pb.Module{Ref: &pb.ModuleRef{}}
	var abi, size, created int64
	if err := sc.Scan(&m.Ref.Sha256, &m.Ref.Name, &abi, &size, &m.Signature, &m.KeyId, &created); err != nil {
		return nil, err
	}
	m.Ref.AbiVersion, m.Ref.SizeBytes, m.CreateTime = uint32(abi), uint64(size), tsProto(fromTS(created))
	m.Ref.Signature = m.Signature // tasks copy the ref into their round plans, for devices to verify
	return m, nil
}

// Module loads a module's metadata.
func (s *Store) Module(ctx context.Context, sha string) (*pb.Module, error) {
	m, err := scanModule(s.db.QueryRowContext(ctx, `SELECT sha256, name, abi, size, signature, key_id, created FROM modules WHERE sha256 = ?`, sha))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("module %q: %w", sha, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: module: %w", err)
	}
	return m, nil
}

// Modules lists modules newest first, before the cursor (a row id; 0 starts at the newest).
func (s *Store) Modules(ctx context.Context, name string, beforeRowID int64, limit int) ([]*pb.Module, int64, error) {
	if beforeRowID <= 0 {
		beforeRowID = math.MaxInt64
	}
	rows, err := s.db.QueryContext(ctx, `SELECT rowid, sha256, name, abi, size, signature, key_id, created FROM modules
		WHERE rowid < ? AND (? = '' OR name = ?) ORDER BY rowid DESC LIMIT ?`, beforeRowID, name, name, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("store: modules: %w", err)
	}
	defer rows.Close()
	var out []*pb.Module
	var last int64
	for rows.Next() {
		m := &pb.Module{Ref: &pb.ModuleRef{}}
		var abi, size, created int64
		if err := rows.Scan(&last, &m.Ref.Sha256, &m.Ref.Name, &abi, &size, &m.Signature, &m.KeyId, &created); err != nil {
			return nil, 0, err
		}
		m.Ref.AbiVersion, m.Ref.SizeBytes, m.CreateTime = uint32(abi), uint64(size), tsProto(fromTS(created))
		out = append(out, m)
	}
	return out, last, rows.Err()
}

// ---- devices

// SeeDevice records a device's check-in.
func (s *Store) SeeDevice(ctx context.Context, id string, attrs *pb.DeviceAttributes, now time.Time) error {
	b, _ := proto.Marshal(attrs)
	_, err := s.exec(ctx, `INSERT INTO devices (id, attrs, first_seen, last_seen) VALUES (?, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET attrs = excluded.attrs, last_seen = excluded.last_seen`, id, b, ts(now), ts(now))
	if err != nil {
		return fmt.Errorf("store: device: %w", err)
	}
	return nil
}

// DeviceCount is the number of devices ever seen.
func (s *Store) DeviceCount(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM devices`).Scan(&n)
	return n, err
}

// Ping reads the schema, so that a database whose file went away or whose
// disk fails answers with an error rather than from the pool's memory.
func (s *Store) Ping(ctx context.Context) error {
	q := "SELECT count(*) FROM sqlite_master"
	if s.db.Dialect() == sqldb.Postgres {
		q = "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
	}
	var n int
	if err := s.db.QueryRowContext(ctx, q).Scan(&n); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}
