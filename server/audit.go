package server

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// CheckpointInterval is how often the server signs an audit checkpoint
// while the log grows.
const CheckpointInterval = time.Second

// checkpointTimeout bounds one periodic checkpoint: a database out of
// reach fails it, and the next tick tries again.
const checkpointTimeout = 30 * time.Second

// openAudit opens the audit log in the data directory, creating it and its
// keys on first start.
//
// Replicas (a PostgreSQL store) keep the log in the same database, with
// its keys (audit.KeysFile, one of ReplicaSecrets) in the data directory:
// the leader opens it after taking the lease, which makes it the log's
// writer and fences the writer before it (audit.ErrFenced).
func (s *Server) openAudit(ctx context.Context) error {
	opts := []audit.Option{audit.WithOrigin(s.cfg.AuditOrigin), audit.WithClock(s.o.now),
		audit.WithLogger(s.o.log.With("component", "audit")), audit.WithWitnesses(s.cfg.AuditWitnesses...)}
	if s.cfg.replicated() {
		opts = append(opts, audit.WithDatabase(s.cfg.Store))
	}
	lg, err := audit.Open(ctx, s.cfg.DataDir, opts...)
	if err != nil {
		return fmt.Errorf("server: audit log: %w", err)
	}
	s.audit = lg
	return nil
}

// startCheckpoints signs a checkpoint now and then every
// CheckpointInterval, publishing each new one on
// wire.SubjectAuditCheckpoint, until Shutdown. Like the coordinator's, its
// lifetime is the server's, not Start's ctx: checkpoints that stopped while
// the server kept recording would leave entries no signature covers.
func (s *Server) startCheckpoints(ctx context.Context) {
	// Stopping (closeAudit) cancels ctx, which ends a checkpoint in
	// progress too: one blocked on a database that went silent (a
	// partition) would hold up Shutdown until TCP gave up, many minutes on.
	ctx, s.auditCancel = context.WithCancel(context.WithoutCancel(ctx))
	s.auditDone = make(chan struct{})
	go func() {
		defer close(s.auditDone)
		t := s.o.clock.NewTicker(CheckpointInterval)
		defer t.Stop()
		for {
			cctx, done := context.WithTimeout(ctx, checkpointTimeout)
			s.checkpoint(cctx)
			done()
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
		}
	}()
}

// checkpoint signs a checkpoint if the log grew and publishes it if it was
// not published yet; a failed publish is retried on the next tick. Only
// the checkpoint goroutine calls it, and Shutdown once that has ended.
func (s *Server) checkpoint(ctx context.Context) {
	cp, err := s.audit.Checkpoint(ctx)
	if err != nil {
		s.o.log.ErrorContext(ctx, "audit checkpoint failed", "err", err)
		return
	}
	if bytes.Equal(cp.Note, s.published) {
		return
	}
	if err := s.nc.Publish(wire.SubjectAuditCheckpoint, cp.Note); err != nil {
		s.o.log.WarnContext(ctx, "audit checkpoint not published", "size", cp.Size, "err", err)
		return
	}
	s.published = cp.Note
}

// closeAudit stops the checkpoints, publishes the final one and closes the
// log. It runs after everything that records events has stopped.
func (s *Server) closeAudit(ctx context.Context) error {
	if s.audit == nil {
		return nil
	}
	// A deposed leader's checkpoint would be fenced, and its database may
	// be out of reach (a partition): waiting for it would only hold up the
	// exit its supervisor restarts it from. It skips the server's final
	// checkpoint, and gives the log's own a moment to learn it is fenced.
	deposed := s.deposed.Load()
	if s.auditCancel != nil {
		s.auditCancel()
		<-s.auditDone
		if !deposed {
			s.checkpoint(ctx)
		}
	}
	if deposed {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Second)
		defer cancel()
	}
	return s.audit.CloseContext(ctx)
}

// recordBatch appends events to the audit log in one batch: all are
// recorded or none. It is how the coordinator records a round's close
// together with its model, metrics and privacy cost.
func (s *Server) recordBatch(ctx context.Context, actor audit.Actor, ps ...audit.Payload) error {
	if s.audit == nil {
		return fmt.Errorf("server: audit: %w", audit.ErrClosed)
	}
	evs := make([]audit.Event, len(ps))
	for i, p := range ps {
		ev, err := audit.NewEvent(actor, p)
		if err != nil {
			s.o.log.ErrorContext(ctx, "audit event invalid", "type", p.EventType(), "actor", actor.String(), "err", err)
			return fmt.Errorf("server: audit: %w", err)
		}
		evs[i] = ev
	}
	if _, err := s.audit.AppendBatch(context.WithoutCancel(ctx), evs); err != nil {
		s.o.log.ErrorContext(ctx, "audit record failed", "events", len(evs), "actor", actor.String(), "err", err)
		return fmt.Errorf("server: audit: %w", err)
	}
	return nil
}

// audited reports whether the log records the close of a task's round.
func (s *Server) audited(ctx context.Context, task string, round uint64) (bool, error) {
	if s.audit == nil {
		return false, fmt.Errorf("server: audit: %w", audit.ErrClosed)
	}
	page, err := s.audit.Query(ctx, audit.Filter{Type: audit.TypeRoundClosed, Task: task, Round: round}, 1, "")
	if err != nil {
		return false, fmt.Errorf("server: audit: %w", err)
	}
	return len(page.Entries) > 0, nil
}

// record appends an event to the audit log. Callers of operations that
// change state should fail when it fails: an action the log does not show
// must not look done. The failure is also logged here.
func (s *Server) record(ctx context.Context, actor audit.Actor, p audit.Payload) error {
	if s.audit == nil {
		return fmt.Errorf("server: audit: %w", audit.ErrClosed)
	}
	// The action happened whether or not the caller is still waiting.
	if _, err := s.audit.Record(context.WithoutCancel(ctx), actor, p); err != nil {
		s.o.log.ErrorContext(ctx, "audit record failed", "type", p.EventType(), "actor", actor.String(), "err", err)
		return fmt.Errorf("server: audit: %w", err)
	}
	return nil
}
