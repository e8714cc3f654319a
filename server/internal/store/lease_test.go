package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

const ttl = 10 * time.Second

func lead(t *testing.T, s *store.Store, holder string) *store.Leadership {
	t.Helper()
	l, err := s.TryLead(context.Background(), "coordinator", holder, holder+".replicas:7070", ttl, now)
	if err != nil {
		t.Fatal(err)
	}
	if l == nil {
		t.Fatalf("%s: the lease is held", holder)
	}
	t.Cleanup(func() { l.Release() })
	return l
}

func TestLeaseEpochs(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		if _, err := s.Lease(ctx, "coordinator"); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("Lease before any leader: %v", err)
		}
		a := lead(t, s, "agg-a")
		if f := a.Fence(); f.Epoch != 1 || f.Holder != "agg-a" || f.Name != "coordinator" {
			t.Fatalf("first fence %+v", f)
		}
		if err := a.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(); err != nil {
			t.Fatalf("second Release: %v", err)
		}
		b := lead(t, s, "agg-b")
		if f := b.Fence(); f.Epoch != 2 || f.Holder != "agg-b" {
			t.Fatalf("second fence %+v", f)
		}
		got, err := s.Lease(ctx, "coordinator")
		if err != nil || got.Epoch != 2 || got.Holder != "agg-b" || !got.Since.Equal(now) || got.Address != "agg-b.replicas:7070" {
			t.Fatalf("Lease = %+v, %v", got, err)
		}
		if _, err := s.TryLead(ctx, "coordinator", "agg-c", "agg-c.replicas:7070", time.Millisecond, now); err == nil {
			t.Fatal("a 1 ms lease accepted")
		}
	})
}

// TestFencedLeader: once another leader has taken the lease, every kind of
// write of the old leader's fenced store fails with ErrFenced and changes
// nothing, while the new leader's writes and plain (API) writes go on.
func TestFencedLeader(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		r := openRound(t, s, "t-1")
		a := lead(t, s, "agg-a")
		old := a.Store()
		if _, _, err := old.Assign(ctx, "t-1", 1, "d-1", 5, now); err != nil {
			t.Fatalf("the leader's own write: %v", err)
		}
		if strings.HasPrefix(target, "postgres") {
			// The database ends the old leader's session, as it does for
			// one that went silent or whose host died; it has not noticed.
			pgtest.EndLockSession(t, target)
		}
		b := waitLead(t, s, "agg-b")
		if b.Fence().Epoch != a.Fence().Epoch+1 {
			t.Fatalf("epochs %d then %d", a.Fence().Epoch, b.Fence().Epoch)
		}
		writes := map[string]func(*store.Store) error{
			"assign": func(s *store.Store) error { _, _, err := s.Assign(ctx, "t-1", 1, "d-2", 5, now); return err },
			"close round": func(s *store.Store) error {
				c := *r
				c.State, c.Close, c.Assigned, c.Reported = pb.RoundState_ROUND_STATE_ABANDONED, now, 1, 0
				return s.CloseRound(ctx, &c, nil, nil, now)
			},
			"task state": func(s *store.Store) error {
				return s.SetTaskState(ctx, "t-1", pb.TaskState_TASK_STATE_PAUSED, "x", now)
			},
			"pending close": func(s *store.Store) error {
				return s.PrepareClose(ctx, &store.PendingClose{Row: r})
			},
		}
		for name, w := range writes {
			if err := w(old); !errors.Is(err, store.ErrFenced) {
				t.Errorf("deposed leader's %s: %v, want ErrFenced", name, err)
			}
		}
		if err := a.Renew(ctx); err == nil {
			t.Error("the deposed leader renewed")
		}
		as, err := s.Assignments(ctx, "t-1", 1)
		if err != nil || len(as) != 1 {
			t.Fatalf("assignments after the fenced writes: %v, %v", as, err)
		}
		if p, err := s.Pending(ctx, "t-1", 1); err != nil || p != nil {
			t.Fatalf("pending close after the fenced write: %+v, %v", p, err)
		}
		if got, err := s.Round(ctx, "t-1", 1); err != nil || got.State != pb.RoundState_ROUND_STATE_OPEN {
			t.Fatalf("round after the fenced close: %+v, %v", got, err)
		}
		for name, w := range writes {
			if err := w(b.Store()); err != nil {
				t.Errorf("new leader's %s: %v", name, err)
			}
		}
		if err := s.InsertTask(ctx, &pb.Task{Id: "t-2", Name: "n", Model: &pb.ModelRef{Version: "m0"}}, now); err != nil {
			t.Errorf("an unfenced (API) write: %v", err)
		}
	})
}

// TestLeaseContested: on PostgreSQL one session leads at a time; the lease
// passes on when the leader releases it, when its process dies (its
// session closes) and when it stays silent past its ttl.
func TestLeaseContested(t *testing.T) {
	ctx := context.Background()
	t.Run("postgres", func(t *testing.T) {
		s, target := open(t)
		a := lead(t, s, "agg-a")
		if l, err := s.TryLead(ctx, "coordinator", "agg-b", "agg-b.replicas:7070", ttl, now); err != nil || l != nil {
			t.Fatalf("second leader while the first holds the lease: %v, %v", l, err)
		}
		if l, err := s.TryLead(ctx, "pool", "agg-b", "agg-b.replicas:7070", ttl, now); err != nil || l == nil {
			t.Fatalf("another lease: %v, %v", l, err)
		} else {
			l.Release()
		}
		a.Release()
		if b := lead(t, s, "agg-b"); b.Fence().Epoch != 2 {
			t.Fatalf("epoch %d after two leaders", b.Fence().Epoch)
		}
		if l, err := s.TryLead(ctx, "coordinator", "agg-c", "agg-c.replicas:7070", ttl, now); err != nil || l != nil {
			t.Fatalf("third leader while the second holds the lease: %v, %v", l, err)
		}
		pgtest.EndLockSession(t, target) // as the database does when a leader's host dies
		d := waitLead(t, s, "agg-d")
		if d.Fence().Epoch != 3 {
			t.Fatalf("epoch %d after three leaders", d.Fence().Epoch)
		}
		d.Release()

		// A silent leader: the database ends its session after the ttl.
		e, err := s.TryLead(ctx, "coordinator", "agg-e", "agg-e.replicas:7070", time.Second, now)
		if err != nil || e == nil {
			t.Fatalf("TryLead: %v, %v", e, err)
		}
		t.Cleanup(func() { e.Release() })
		f := waitLead(t, s, "agg-f")
		if err := e.Renew(ctx); err == nil {
			t.Error("the silent leader renewed after losing its session")
		}
		if f.Fence().Epoch != 5 {
			t.Fatalf("epoch %d after five leaders", f.Fence().Epoch)
		}
	})
}

// waitLead tries to lead until the lease frees: no deadline but the
// test's own, since how soon the database notices depends on the machine.
func waitLead(t *testing.T, s *store.Store, holder string) *store.Leadership {
	t.Helper()
	for {
		l, err := s.TryLead(context.Background(), "coordinator", holder, holder+".replicas:7070", ttl, now)
		if err != nil {
			t.Fatal(err)
		}
		if l != nil {
			t.Cleanup(func() { l.Release() })
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
}
