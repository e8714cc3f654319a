package audit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

// A log kept in PostgreSQL has one writer at a time, like an SQLite one,
// but no folder lock can say which: replicas run on different machines.
// The writer table's epoch says instead. Open increments it (takeEpoch)
// and keeps the new value; every transaction that writes (a batch of
// entries, a checkpoint, a cosignature) first reads the epoch FOR SHARE
// and writes nothing unless it is still the writer's own (checkFence).
//
// The share lock is what makes this a fence rather than a race: a new
// writer's increment waits for every write transaction that already read
// the epoch, so those commit before it and the new writer, which loads
// the tree only after its increment commits, sees them; and every write
// transaction of the old writer that starts later reads the new epoch (or,
// when its snapshot predates the increment, fails to serialize and runs
// again to read it) and fails with ErrFenced. The old writer's entries
// therefore end where the new writer's begin: no gap, no fork, and no
// checkpoint of the old writer's smaller tree after the new writer's.
//
// A fenced Log stays fenced: its sequencer signs nothing more, and every
// later append, checkpoint and cosignature fails with ErrFenced at once,
// since its idea of the tree (size, frontier, latest checkpoint) is
// behind the database's. Its reads still answer for the tree it knew,
// except Export, which signs a checkpoint first and so fails too.
// Close is safe and returns no error for the fence: what the fenced writer
// acknowledged is committed, and the new writer's checkpoints cover it.

// takeEpoch makes this Log the writer: the next epoch is its own.
func (l *Log) takeEpoch(ctx context.Context) error {
	since := unixNano(l.cfg.now())
	err := l.wdb.Tx(ctx, func(tx *sqldb.Tx) error {
		return tx.QueryRowContext(ctx, `INSERT INTO writer(id, epoch, since) VALUES (1, 1, ?)
			ON CONFLICT (id) DO UPDATE SET epoch = writer.epoch + 1, since = excluded.since
			RETURNING epoch`, since).Scan(&l.epoch)
	})
	if err != nil {
		return fmt.Errorf("audit: open: take the writer epoch: %w", err)
	}
	return nil
}

// checkFence fails with ErrFenced, and fences the Log for good, unless
// the writer epoch is still this Log's. It runs first in every write
// transaction; on SQLite, whose writer holds the folder lock, it checks
// nothing.
func (l *Log) checkFence(ctx context.Context, tx *sqldb.Tx) error {
	if l.epoch == 0 {
		return nil
	}
	if l.fenced.Load() {
		return l.errFenced()
	}
	var epoch int64
	err := tx.QueryRowContext(ctx, "SELECT epoch FROM writer WHERE id = 1 FOR SHARE").Scan(&epoch)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		epoch = 0 // gone: no writer may write
	case err != nil:
		return err
	}
	if epoch == l.epoch {
		return nil
	}
	if !l.fenced.Swap(true) {
		l.cfg.logger.Warn("audit log writer fenced: another writer opened the log; this one writes nothing more",
			"epoch", l.epoch, "current_epoch", epoch, "size", l.Size())
	}
	return fmt.Errorf("the log's writer epoch is %d, this writer's %d; close this Log, and open the log again only if this process is to write it: %w",
		epoch, l.epoch, ErrFenced)
}

func (l *Log) errFenced() error {
	return fmt.Errorf("writer epoch %d is no longer the log's; close this Log, and open the log again only if this process is to write it: %w",
		l.epoch, ErrFenced)
}
