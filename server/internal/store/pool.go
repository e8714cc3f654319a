package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/sqldb"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// poolSchema holds the compute pool's job service state. A job is kept as
// its pb.PoolJob (spec, state, reason, restarts, committed step, attempt,
// placement, usage, output version, data digest, times) with the columns
// the service filters on beside it.
const poolSchema = `
CREATE TABLE IF NOT EXISTS pool_jobs (
	seq INTEGER PRIMARY KEY AUTOINCREMENT, -- submission order
	id TEXT NOT NULL UNIQUE,
	state INTEGER NOT NULL,
	job BLOB NOT NULL,  -- pb.PoolJob
	then_task BLOB,     -- pb.Task to create when the job succeeds
	submitted INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_checkpoints ( -- committed checkpoints, per rank
	job_id TEXT NOT NULL,
	rank INTEGER NOT NULL,
	step INTEGER NOT NULL,
	manifest TEXT NOT NULL, -- hex checkpoint id
	PRIMARY KEY (job_id, rank, step)
);
CREATE TABLE IF NOT EXISTS pool_workers (
	id TEXT PRIMARY KEY,
	subject TEXT NOT NULL,  -- token subject of the registering principal
	token_id TEXT NOT NULL, -- and its token id
	worker BLOB NOT NULL    -- pb.PoolWorker
);
CREATE TABLE IF NOT EXISTS pool_logs (
	job_id TEXT NOT NULL,
	seq INTEGER NOT NULL,
	line BLOB NOT NULL, -- pb.PoolLogLine
	PRIMARY KEY (job_id, seq)
);
`

// PoolJobRow is a pool job as stored.
type PoolJobRow struct {
	Seq      int64 // submission order, the ListJobs cursor
	Job      *pb.PoolJob
	ThenTask *pb.Task // nil when none was asked for
}

func marshalOpt(m proto.Message) ([]byte, error) {
	if m == nil {
		return nil, nil
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// InsertPoolJob stores a new job; an id in use is ErrExists.
func (s *Store) InsertPoolJob(ctx context.Context, j *pb.PoolJob, then *pb.Task) error {
	b, err := marshalOpt(j)
	if err != nil {
		return fmt.Errorf("store: insert pool job: %w", err)
	}
	tb, err := marshalOpt(then)
	if err != nil {
		return fmt.Errorf("store: insert pool job: then task: %w", err)
	}
	id := j.GetSpec().GetId()
	res, err := s.exec(ctx, `INSERT INTO pool_jobs (id, state, job, then_task, submitted) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT(id) DO NOTHING`, id, int32(j.GetState()), b, tb, j.GetSubmitTime().AsTime().UnixNano())
	if err != nil {
		return fmt.Errorf("store: insert pool job %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("pool job %s: %w", id, backend.ErrExists)
	}
	return nil
}

// UpdatePoolJob replaces a stored job's state.
func (s *Store) UpdatePoolJob(ctx context.Context, j *pb.PoolJob) error {
	b, err := marshalOpt(j)
	if err != nil {
		return fmt.Errorf("store: update pool job: %w", err)
	}
	id := j.GetSpec().GetId()
	res, err := s.exec(ctx, `UPDATE pool_jobs SET state = ?, job = ? WHERE id = ?`, int32(j.GetState()), b, id)
	if err != nil {
		return fmt.Errorf("store: update pool job %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("pool job %s: %w", id, backend.ErrNotFound)
	}
	return nil
}

func scanPoolJob(sc interface{ Scan(...any) error }) (*PoolJobRow, error) {
	var r PoolJobRow
	var b, tb []byte
	if err := sc.Scan(&r.Seq, &b, &tb); err != nil {
		return nil, err
	}
	r.Job = &pb.PoolJob{}
	if err := proto.Unmarshal(b, r.Job); err != nil {
		return nil, fmt.Errorf("store: pool job %d: %w", r.Seq, err)
	}
	if tb != nil {
		r.ThenTask = &pb.Task{}
		if err := proto.Unmarshal(tb, r.ThenTask); err != nil {
			return nil, fmt.Errorf("store: pool job %d: then task: %w", r.Seq, err)
		}
	}
	return &r, nil
}

// PoolJob loads one job.
func (s *Store) PoolJob(ctx context.Context, id string) (*PoolJobRow, error) {
	r, err := scanPoolJob(s.db.QueryRowContext(ctx, `SELECT seq, job, then_task FROM pool_jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("pool job %q: %w", id, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: pool job: %w", err)
	}
	return r, nil
}

func (s *Store) poolJobs(ctx context.Context, q string, args ...any) ([]*PoolJobRow, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: pool jobs: %w", err)
	}
	defer rows.Close()
	var out []*PoolJobRow
	for rows.Next() {
		r, err := scanPoolJob(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// PoolJobs lists jobs newest first, before the cursor (a seq; 0 starts at
// the newest), in one state or, unspecified, all.
func (s *Store) PoolJobs(ctx context.Context, state pb.PoolJobState, beforeSeq int64, limit int) ([]*PoolJobRow, error) {
	if beforeSeq <= 0 {
		beforeSeq = math.MaxInt64
	}
	return s.poolJobs(ctx, `SELECT seq, job, then_task FROM pool_jobs WHERE seq < ? AND (? = 0 OR state = ?)
		ORDER BY seq DESC LIMIT ?`, beforeSeq, int32(state), int32(state), limit)
}

// ActivePoolJobs lists the queued and running jobs in submission order.
func (s *Store) ActivePoolJobs(ctx context.Context) ([]*PoolJobRow, error) {
	return s.poolJobs(ctx, `SELECT seq, job, then_task FROM pool_jobs WHERE state IN (?, ?) ORDER BY seq`,
		int32(pb.PoolJobState_POOL_JOB_STATE_QUEUED), int32(pb.PoolJobState_POOL_JOB_STATE_RUNNING))
}

// PoolCheckpointRow is one rank's committed checkpoint.
type PoolCheckpointRow struct {
	Rank     uint32
	Step     int64
	Manifest string
}

// PutPoolCheckpoint records that rank of job committed a checkpoint.
func (s *Store) PutPoolCheckpoint(ctx context.Context, job string, rank uint32, step int64, manifest string) error {
	_, err := s.exec(ctx, `INSERT INTO pool_checkpoints (job_id, rank, step, manifest) VALUES (?, ?, ?, ?)
		ON CONFLICT(job_id, rank, step) DO UPDATE SET manifest = excluded.manifest`, job, int64(rank), step, manifest)
	if err != nil {
		return fmt.Errorf("store: pool checkpoint %s/%d@%d: %w", job, rank, step, err)
	}
	return nil
}

// PoolCheckpoints lists a job's committed checkpoints by rank, then step.
func (s *Store) PoolCheckpoints(ctx context.Context, job string) ([]PoolCheckpointRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT rank, step, manifest FROM pool_checkpoints WHERE job_id = ? ORDER BY rank, step`, job)
	if err != nil {
		return nil, fmt.Errorf("store: pool checkpoints: %w", err)
	}
	defer rows.Close()
	var out []PoolCheckpointRow
	for rows.Next() {
		var r PoolCheckpointRow
		var rank int64
		if err := rows.Scan(&rank, &r.Step, &r.Manifest); err != nil {
			return nil, fmt.Errorf("store: pool checkpoints: %w", err)
		}
		r.Rank = uint32(rank)
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeletePoolCheckpoint forgets one committed checkpoint (after GC removed
// its manifest).
func (s *Store) DeletePoolCheckpoint(ctx context.Context, job string, rank uint32, step int64) error {
	if _, err := s.exec(ctx, `DELETE FROM pool_checkpoints WHERE job_id = ? AND rank = ? AND step = ?`,
		job, int64(rank), step); err != nil {
		return fmt.Errorf("store: delete pool checkpoint: %w", err)
	}
	return nil
}

// PoolWorkerRow is a registered worker and the principal it is bound to.
type PoolWorkerRow struct {
	Worker  *pb.PoolWorker
	Subject string
	TokenID string
}

// PutPoolWorker stores or replaces a worker.
func (s *Store) PutPoolWorker(ctx context.Context, w PoolWorkerRow) error {
	b, err := marshalOpt(w.Worker)
	if err != nil {
		return fmt.Errorf("store: pool worker: %w", err)
	}
	_, err = s.exec(ctx, `INSERT INTO pool_workers (id, subject, token_id, worker) VALUES (?, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET worker = excluded.worker`, w.Worker.GetId(), w.Subject, w.TokenID, b)
	if err != nil {
		return fmt.Errorf("store: pool worker %s: %w", w.Worker.GetId(), err)
	}
	return nil
}

// PoolWorkers lists the workers by id.
func (s *Store) PoolWorkers(ctx context.Context) ([]PoolWorkerRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT subject, token_id, worker FROM pool_workers ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("store: pool workers: %w", err)
	}
	defer rows.Close()
	var out []PoolWorkerRow
	for rows.Next() {
		var r PoolWorkerRow
		var b []byte
		if err := rows.Scan(&r.Subject, &r.TokenID, &b); err != nil {
			return nil, fmt.Errorf("store: pool workers: %w", err)
		}
		r.Worker = &pb.PoolWorker{}
		if err := proto.Unmarshal(b, r.Worker); err != nil {
			return nil, fmt.Errorf("store: pool workers: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// AppendPoolLogs adds lines to a job's log, numbering them after the last
// one, and drops all but the newest keep lines. It returns the last seq.
func (s *Store) AppendPoolLogs(ctx context.Context, job string, lines []*pb.PoolLogLine, keep int) (uint64, error) {
	var last uint64
	err := s.Tx(ctx, func(tx *sqldb.Tx) error {
		var max sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT MAX(seq) FROM pool_logs WHERE job_id = ?`, job).Scan(&max); err != nil {
			return fmt.Errorf("store: pool logs: %w", err)
		}
		last = uint64(max.Int64)
		for _, l := range lines {
			last++
			c := proto.CloneOf(l)
			c.Seq = last
			b, err := marshalOpt(c)
			if err != nil {
				return fmt.Errorf("store: pool logs: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO pool_logs (job_id, seq, line) VALUES (?, ?, ?)`, job, int64(last), b); err != nil {
				return fmt.Errorf("store: pool logs: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM pool_logs WHERE job_id = ? AND seq <= ?`, job, int64(last)-int64(keep)); err != nil {
			return fmt.Errorf("store: pool logs: %w", err)
		}
		return nil
	})
	return last, err
}

// PoolLogs returns up to limit kept lines of a job after seq.
func (s *Store) PoolLogs(ctx context.Context, job string, afterSeq uint64, limit int) ([]*pb.PoolLogLine, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT line FROM pool_logs WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
		job, int64(afterSeq), limit)
	if err != nil {
		return nil, fmt.Errorf("store: pool logs: %w", err)
	}
	defer rows.Close()
	var out []*pb.PoolLogLine
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("store: pool logs: %w", err)
		}
		l := &pb.PoolLogLine{}
		if err := proto.Unmarshal(b, l); err != nil {
			return nil, fmt.Errorf("store: pool logs: %w", err)
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// decodeLineage fills m.Lineage from its stored bytes (nil: none).
func decodeLineage(m *ModelRow, b []byte) error {
	if b == nil {
		return nil
	}
	m.Lineage = &pb.PoolLineage{}
	if err := proto.Unmarshal(b, m.Lineage); err != nil {
		return fmt.Errorf("store: model %s: lineage: %w", m.Version, err)
	}
	return nil
}
