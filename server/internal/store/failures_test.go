package store_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// openRound stores a task with one open round whose cohort is devices.
func openRound(t *testing.T, s *store.Store, task string, devices ...string) *store.RoundRow {
	t.Helper()
	ctx := context.Background()
	if err := s.InsertTask(ctx, &pb.Task{Id: task, Name: "n", Model: &pb.ModelRef{Version: "m0"}}, now); err != nil {
		t.Fatal(err)
	}
	r := &store.RoundRow{TaskID: task, Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN, BaseModel: "m0", Open: now, Deadline: now.Add(time.Minute)}
	if err := s.OpenRound(ctx, r, now); err != nil {
		t.Fatal(err)
	}
	for _, d := range devices {
		if _, _, err := s.Assign(ctx, task, 1, d, 10, now); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func TestRoundFailures(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, path := open(t)
		r := openRound(t, s, "t-f", "d-3", "d-1", "d-2")
		long := strings.Repeat("x", wire.MaxFailureReason-1) + "é" // the limit falls inside the last character
		r.State, r.Close, r.Assigned, r.Reported, r.Dropped = pb.RoundState_ROUND_STATE_ABANDONED, now.Add(time.Minute), 3, 0, 3
		r.Failures = map[string]string{
			"d-3":      "train: wasm: memory limit exceeded",
			"d-1":      long,
			"d-2":      "bad \xff bytes",
			"stranger": "not in the cohort: must not be kept",
		}
		if err := s.CloseRound(ctx, r, nil, nil, now); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"d-3": "train: wasm: memory limit exceeded",
			"d-1": strings.Repeat("x", wire.MaxFailureReason-1),
			"d-2": "bad \uFFFD bytes",
		}
		check := func(s *store.Store) {
			t.Helper()
			got, err := s.Round(ctx, "t-f", 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Failures) != len(want) {
				t.Fatalf("failures %q, want %q", got.Failures, want)
			}
			for d, reason := range want {
				if got.Failures[d] != reason {
					t.Errorf("failure of %s = %q, want %q", d, got.Failures[d], reason)
				}
			}
			list, err := s.Rounds(ctx, "t-f", 0, 10)
			if err != nil || len(list) != 1 || len(list[0].Failures) != len(want) {
				t.Fatalf("Rounds = %v, %v", list, err)
			}
			// The API sees them sorted by device, each reason within the wire bound.
			fs := got.Proto().GetFailures()
			var devices []string
			for _, f := range fs {
				devices = append(devices, f.GetDeviceId())
				if len(f.GetReason()) > wire.MaxFailureReason || !utf8.ValidString(f.GetReason()) || f.GetReason() != want[f.GetDeviceId()] {
					t.Errorf("summary failure %s: reason %q", f.GetDeviceId(), f.GetReason())
				}
			}
			if strings.Join(devices, ",") != "d-1,d-2,d-3" {
				t.Errorf("summary failures by device %v, want d-1,d-2,d-3", devices)
			}
		}
		check(s)
		s.Close()
		s2, err := store.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		check(s2)
		// Merging server-side metrics later leaves the failures alone.
		if err := s2.UpdateRoundMetrics(ctx, "t-f", 1, map[string]float64{"server_accuracy": 0.5}); err != nil {
			t.Fatal(err)
		}
		check(s2)
	})
}

func TestRoundWithoutFailures(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		r := openRound(t, s, "t-ok", "d-1")
		r.State, r.Close, r.Assigned, r.Reported = pb.RoundState_ROUND_STATE_COMMITTED, now.Add(time.Second), 1, 1
		r.Failures = map[string]string{"d-9": "not in the cohort"}
		if err := s.CloseRound(ctx, r, nil, nil, now); err != nil {
			t.Fatal(err)
		}
		got, err := s.Round(ctx, "t-ok", 1)
		if err != nil || got.Failures != nil || len(got.Proto().GetFailures()) != 0 {
			t.Fatalf("round %+v, %v; want no failures", got, err)
		}
	})
}

// TestMigrateFailures opens a database written before rounds had failures
// (or epsilon): its rows read back without any, and new rounds store them.
func TestMigrateFailures(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE rounds (
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
	PRIMARY KEY (task_id, round)
);
INSERT INTO rounds (task_id, round, kind, state, seed, base_model, open_time, deadline, reported)
	VALUES ('t-old', 1, 1, 3, 7, 'm0', 1, 2, 5);`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, err := s.Round(ctx, "t-old", 1)
	if err != nil || old.Reported != 5 || old.Failures != nil || old.Epsilon != 0 {
		t.Fatalf("old round: %+v %v", old, err)
	}
	r := openRound(t, s, "t-new", "d-1")
	r.State, r.Close, r.Assigned, r.Dropped = pb.RoundState_ROUND_STATE_ABANDONED, now.Add(time.Second), 1, 1
	r.Failures = map[string]string{"d-1": "dataset: no examples"}
	if err := s.CloseRound(ctx, r, nil, nil, now); err != nil {
		t.Fatal(err)
	}
	got, err := s.Round(ctx, "t-new", 1)
	if err != nil || got.Failures["d-1"] != "dataset: no examples" {
		t.Fatalf("new round in a migrated database: %+v %v", got, err)
	}
	// Opening again finds the columns in place.
	s.Close()
	s2, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
}
