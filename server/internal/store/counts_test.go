package store_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

func TestCounts(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		if e, seen, r, err := s.DeviceStates(ctx, time.Time{}, false); err != nil || e != 0 || seen != 0 || r != 0 {
			t.Fatalf("empty store: %d enrolled, %d seen, %d revoked, %v", e, seen, r, err)
		}
		if st, err := s.TaskStates(ctx); err != nil || st == nil || len(st) != 0 {
			t.Fatalf("empty store: task states %v (nil %v), %v", st, st == nil, err)
		}
		if n, err := s.DeviceCount(ctx); err != nil || n != 0 {
			t.Fatalf("empty store: %d devices, %v", n, err)
		}

		for _, id := range []string{"d-a", "d-b", "d-c", "d-d"} {
			if err := s.InsertDevice(ctx, &store.DeviceRow{ID: id, KeyID: "U" + id, Fleet: "f", TokenID: "j" + id, Enrolled: now}); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{"d-c", "d-d"} {
			if _, err := s.RevokeDevice(ctx, id, "lost", now); err != nil {
				t.Fatal(err)
			}
		}
		recent, old := now.Add(time.Hour), now.Add(-time.Hour)
		for id, at := range map[string]time.Time{"d-a": recent, "d-b": old, "d-c": recent, "stranger": recent, "other": old} {
			if err := s.SeeDevice(ctx, id, &pb.DeviceAttributes{}, at); err != nil {
				t.Fatal(err)
			}
		}
		// A second sighting is the same device.
		if err := s.SeeDevice(ctx, "d-a", &pb.DeviceAttributes{}, recent.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}

		states := map[string]pb.TaskState{"t1": pb.TaskState_TASK_STATE_RUNNING, "t2": pb.TaskState_TASK_STATE_RUNNING,
			"t3": pb.TaskState_TASK_STATE_RUNNING, "t4": pb.TaskState_TASK_STATE_PENDING, "t5": pb.TaskState_TASK_STATE_RUNNING}
		for id, st := range states {
			if err := s.InsertTask(ctx, &pb.Task{Id: id, Name: "n", State: st, Model: &pb.ModelRef{Version: "m0"}}, now); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PauseTask(ctx, "t2", "few devices", now); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTaskState(ctx, "t3", pb.TaskState_TASK_STATE_COMPLETED, "", now); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTaskState(ctx, "t5", pb.TaskState_TASK_STATE_FAILED, "diverged", now); err != nil {
			t.Fatal(err)
		}

		check := func(s *store.Store) {
			t.Helper()
			for _, c := range []struct {
				enrolledOnly bool
				seen         int
			}{{true, 1}, {false, 2}} { // d-a; and stranger (d-c is revoked, d-b and other are old)
				e, seen, r, err := s.DeviceStates(ctx, now, c.enrolledOnly)
				if err != nil || e != 2 || seen != c.seen || r != 2 {
					t.Errorf("enrolled only %v: %d enrolled, %d seen, %d revoked, %v; want 2, %d, 2", c.enrolledOnly, e, seen, r, err, c.seen)
				}
				fe, fseen, err := s.FleetSize(ctx, now, c.enrolledOnly)
				if err != nil || fe != e || fseen != seen {
					t.Errorf("FleetSize %d, %d disagrees with DeviceStates %d, %d (%v)", fe, fseen, e, seen, err)
				}
			}
			if _, seen, _, err := s.DeviceStates(ctx, old, false); err != nil || seen != 4 {
				t.Errorf("seen since an hour before: %d, %v; want 4", seen, err)
			}
			if n, err := s.DeviceCount(ctx); err != nil || n != 5 {
				t.Errorf("%d devices seen, %v; want 5", n, err)
			}
			want := map[pb.TaskState]int{pb.TaskState_TASK_STATE_RUNNING: 1, pb.TaskState_TASK_STATE_PAUSED: 1,
				pb.TaskState_TASK_STATE_PENDING: 1, pb.TaskState_TASK_STATE_COMPLETED: 1, pb.TaskState_TASK_STATE_FAILED: 1}
			if st, err := s.TaskStates(ctx); err != nil || !maps.Equal(st, want) {
				t.Errorf("task states %v, %v; want %v", st, err, want)
			}
		}
		check(s)
		s.Close()
		if err := s.Ping(ctx); err == nil {
			t.Error("a closed store answers Ping")
		}
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		check(s2)
		if err := s2.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// An enrolled device reads back with what its latest check-in reported:
// its time and attributes, by id, by key and in the list.
func TestDeviceSightings(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		enrolledAttrs := &pb.DeviceAttributes{DeviceClass: "gateway"}
		if err := s.InsertDevice(ctx, &store.DeviceRow{ID: "d-a", KeyID: "UA", Fleet: "f", TokenID: "j", Enrolled: now, Attrs: enrolledAttrs}); err != nil {
			t.Fatal(err)
		}
		get := func() []*store.DeviceRow {
			t.Helper()
			byID, err := s.Device(ctx, "d-a")
			if err != nil {
				t.Fatal(err)
			}
			byKey, err := s.DeviceByKey(ctx, "UA")
			if err != nil {
				t.Fatal(err)
			}
			list, _, err := s.Devices(ctx, true, 0, 10)
			if err != nil || len(list) != 1 {
				t.Fatalf("devices %v, %v", list, err)
			}
			return []*store.DeviceRow{byID, byKey, list[0]}
		}
		for _, d := range get() {
			if !d.LastSeen.IsZero() || !proto.Equal(d.Attrs, enrolledAttrs) || d.Proto().LastSeenTime != nil {
				t.Errorf("before any check-in: last seen %v, attrs %v", d.LastSeen, d.Attrs)
			}
		}
		seen := now.Add(time.Hour)
		checkIn := &pb.DeviceAttributes{DeviceClass: "gateway", ExamplesAvailable: 1234, AgentVersion: "1.4.0"}
		if err := s.SeeDevice(ctx, "d-a", &pb.DeviceAttributes{DeviceClass: "old"}, now); err != nil {
			t.Fatal(err)
		}
		if err := s.SeeDevice(ctx, "d-a", checkIn, seen); err != nil {
			t.Fatal(err)
		}
		for _, d := range get() {
			if !d.LastSeen.Equal(seen) || !proto.Equal(d.Attrs, checkIn) || !d.Proto().GetLastSeenTime().AsTime().Equal(seen) {
				t.Errorf("after check-ins: last seen %v, attrs %v; want %v, %v", d.LastSeen, d.Attrs, seen, checkIn)
			}
		}
	})
}
