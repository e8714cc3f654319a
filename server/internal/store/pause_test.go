package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// Short rounds count up in a row; any other close resets the count, and
// so do pausing and resuming, which change only the state they expect.
func TestShortRoundsAndPause(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, path := open(t)
		if err := s.InsertTask(ctx, &pb.Task{Id: "t", Name: "n", State: pb.TaskState_TASK_STATE_RUNNING,
			Model: &pb.ModelRef{Version: "m0"}, RoundsTotal: 9}, now); err != nil {
			t.Fatal(err)
		}
		closeRound := func(n uint64, short bool) uint32 {
			t.Helper()
			r := &store.RoundRow{TaskID: "t", Round: n, Kind: pb.RoundKind_ROUND_KIND_TRAIN, BaseModel: "m0", Open: now, Deadline: now}
			if err := s.OpenRound(ctx, r, now); err != nil {
				t.Fatal(err)
			}
			r.State, r.Short = pb.RoundState_ROUND_STATE_ABANDONED, short
			if err := s.CloseRound(ctx, r, nil, nil, now); err != nil {
				t.Fatal(err)
			}
			row, err := s.Task(ctx, "t")
			if err != nil {
				t.Fatal(err)
			}
			return row.ShortRounds
		}
		for i, c := range []struct {
			short bool
			want  uint32
		}{{true, 1}, {true, 2}, {false, 0}, {true, 1}, {true, 2}} {
			if got := closeRound(uint64(i+1), c.short); got != c.want {
				t.Fatalf("round %d (short %v): %d short rounds, want %d", i+1, c.short, got, c.want)
			}
		}

		if err := s.ResumeTask(ctx, "t", now); !errors.Is(err, backend.ErrPrecondition) {
			t.Fatalf("resume a running task: %v", err)
		}
		if err := s.PauseTask(ctx, "t", "too few devices", now); err != nil {
			t.Fatal(err)
		}
		if err := s.PauseTask(ctx, "t", "again", now); !errors.Is(err, backend.ErrPrecondition) {
			t.Fatalf("pause a paused task: %v", err)
		}
		// A paused task stays paused when the store is reopened.
		s.Close()
		s, err := store.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		paused, err := s.Tasks(ctx, pb.TaskState_TASK_STATE_PAUSED, "", 10)
		if err != nil || len(paused) != 1 || paused[0].Reason != "too few devices" || paused[0].ShortRounds != 0 {
			t.Fatalf("paused tasks: %v %v", paused, err)
		}
		if err := s.ResumeTask(ctx, "t", now); err != nil {
			t.Fatal(err)
		}
		row, err := s.Task(ctx, "t")
		if err != nil || row.State != pb.TaskState_TASK_STATE_RUNNING || row.Reason != "" {
			t.Fatalf("resumed: %+v %v", row, err)
		}
		// An operator's stop is not overwritten by a late pause.
		if err := s.SetTaskState(ctx, "t", pb.TaskState_TASK_STATE_STOPPED, "enough", now); err != nil {
			t.Fatal(err)
		}
		err = s.PauseTask(ctx, "t", "late", now)
		if !errors.Is(err, backend.ErrPrecondition) || err.Error() != "task t is stopped, not running: failed precondition" {
			t.Fatalf("pause a stopped task: %v", err)
		}
		if err := s.PauseTask(ctx, "nope", "x", now); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("pause an unknown task: %v", err)
		}
	})
}

// FleetSize counts enrolled devices that are not revoked, and the devices
// not revoked that checked in since the given time.
func TestFleetSize(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		for _, id := range []string{"d-a", "d-b", "d-c"} {
			if err := s.InsertDevice(ctx, &store.DeviceRow{ID: id, KeyID: "U" + id, Fleet: "f", TokenID: "j" + id, Enrolled: now}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.RevokeDevice(ctx, "d-c", "lost", now); err != nil {
			t.Fatal(err)
		}
		recent, old := now.Add(time.Hour), now.Add(-time.Hour)
		for id, at := range map[string]time.Time{"d-a": recent, "d-b": old, "d-c": recent, "stranger": recent} {
			if err := s.SeeDevice(ctx, id, &pb.DeviceAttributes{}, at); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []struct {
			enrolledOnly bool
			seen         int
		}{{true, 1}, {false, 2}} {
			enrolled, seen, err := s.FleetSize(ctx, now, c.enrolledOnly)
			if err != nil || enrolled != 2 || seen != c.seen {
				t.Errorf("enrolled only %v: %d enrolled, %d seen, %v; want 2, %d", c.enrolledOnly, enrolled, seen, err, c.seen)
			}
		}
	})
}
