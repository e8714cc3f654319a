package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
)

func TestAuditRecord(t *testing.T) {
	s, err := New(Config{DataDir: t.TempDir(), NATSListen: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "off",
		AuditOrigin: "test.fleetlearn/audit"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// Checkpoints outlive the context Start was given.
	startCtx, startDone := context.WithCancel(ctx)
	if err := s.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	startDone()
	defer s.Shutdown(ctx)

	// A caller that has gone away still gets its event recorded.
	gone, stop := context.WithCancel(ctx)
	stop()
	if err := s.record(gone, audit.Operator("alice"), audit.TaskStopped{Task: "t-1", State: audit.TaskStoppedBy}); err != nil {
		t.Fatal(err)
	}
	if err := s.record(ctx, audit.Operator("alice"), audit.TaskStopped{Task: "t-1", State: "paused"}); !errors.Is(err, audit.ErrInvalidEvent) {
		t.Fatalf("invalid event: %v", err)
	}
	page, err := s.audit.Query(ctx, audit.Filter{Task: "t-1"}, 0, "")
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("entries about t-1: %d, %v", len(page.Entries), err)
	}
	if s.audit.Origin() != "test.fleetlearn/audit" {
		t.Errorf("origin %q", s.audit.Origin())
	}
	for {
		cp, err := s.audit.Latest(ctx)
		if err == nil && cp.Size == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no checkpoint covers the entry: %+v, %v", cp, err)
		case <-time.After(50 * time.Millisecond):
		}
	}

	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.record(ctx, audit.Operator("alice"), audit.TaskStopped{Task: "t-1", State: audit.TaskStoppedBy}); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("record after Shutdown: %v", err)
	}
}

// A second server on the same data directory cannot open the log for
// writing, and Start fails cleanly.
func TestAuditLogLocked(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, NATSListen: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", MetricsAddr: "off"}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	lg, err := audit.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lg.Close()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); !errors.Is(err, audit.ErrLocked) {
		t.Fatalf("Start with the log locked: %v", err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown after a failed Start: %v", err)
	}
}
