package store_test

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"path/filepath"
	"testing"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// The base model's measure is kept once: the first stays, an evaluation
// with no metric left reads back as measured, and the API's Task shows the
// column, never a value sent with the task.
func TestBaseMetrics(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		for _, id := range []string{"t-a", "t-b"} {
			if err := s.InsertTask(ctx, &pb.Task{Id: id, Name: "n", State: pb.TaskState_TASK_STATE_RUNNING,
				Model: &pb.ModelRef{Version: "m0"}, BaseMetrics: &pb.Metrics{Values: map[string]float64{"server_accuracy": 1}}}, now); err != nil {
				t.Fatal(err)
			}
		}
		row, err := s.Task(ctx, "t-a")
		if err != nil || row.BaseMetrics != nil || row.Proto().BaseMetrics != nil {
			t.Fatalf("a new task has base metrics %v (%v), on the API %v", row.BaseMetrics, err, row.Proto().GetBaseMetrics())
		}
		first := map[string]float64{"server_accuracy": 0.125, "server_loss": 2.5}
		if err := s.SetBaseMetrics(ctx, "t-a", first, now); err != nil {
			t.Fatal(err)
		}
		if err := s.SetBaseMetrics(ctx, "t-a", map[string]float64{"server_accuracy": 0.9}, now); err != nil {
			t.Fatal(err)
		}
		if err := s.SetBaseMetrics(ctx, "t-b", nil, now); err != nil {
			t.Fatal(err)
		}
		rows, err := s.Tasks(ctx, 0, "", 10)
		if err != nil || len(rows) != 2 {
			t.Fatalf("tasks: %v %v", rows, err)
		}
		if a := rows[0]; !maps.Equal(a.BaseMetrics, first) || !maps.Equal(a.Proto().GetBaseMetrics().GetValues(), first) {
			t.Errorf("t-a base metrics %v, on the API %v; want the first %v", a.BaseMetrics, a.Proto().GetBaseMetrics(), first)
		}
		if b := rows[1]; b.BaseMetrics == nil || len(b.BaseMetrics) != 0 || b.Proto().BaseMetrics == nil ||
			len(b.Proto().BaseMetrics.Values) != 0 {
			t.Errorf("t-b base metrics %v, on the API %v; want measured with none", b.BaseMetrics, b.Proto().GetBaseMetrics())
		}
		if err := s.SetBaseMetrics(ctx, "t-none", first, now); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("base metrics of a missing task: %v", err)
		}
	})
}

// TestMigrateBaseMetrics opens a database written before tasks had base
// metrics: its tasks read back unmeasured, and can be measured.
func TestMigrateBaseMetrics(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE tasks (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL,
	state INTEGER NOT NULL,
	spec BLOB NOT NULL,
	current_round INTEGER NOT NULL DEFAULT 0,
	current_model TEXT NOT NULL,
	train_rounds INTEGER NOT NULL DEFAULT 0,
	state_reason TEXT NOT NULL DEFAULT '',
	opt_state BLOB,
	created INTEGER NOT NULL,
	updated INTEGER NOT NULL
);
INSERT INTO tasks (id, name, state, spec, current_model, created, updated) VALUES ('t-old', 'n', 2, x'', 'm0', 1, 1);`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, err := s.Task(ctx, "t-old")
	if err != nil || old.BaseMetrics != nil || old.CurrentModel != "m0" {
		t.Fatalf("old task: %+v %v", old, err)
	}
	if err := s.SetBaseMetrics(ctx, "t-old", map[string]float64{"server_loss": 1}, now); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Task(ctx, "t-old"); err != nil || got.BaseMetrics["server_loss"] != 1 {
		t.Fatalf("measured old task: %+v %v", got, err)
	}
}
