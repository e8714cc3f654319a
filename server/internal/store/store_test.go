package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/pgtest"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The store's tests are one suite that runs on each backend: eachBackend
// runs fn in a subtest per backend, and open, called from there, opens an
// empty store of the subtest's backend.
var backends = []string{"sqlite", "postgres"}

func eachBackend(t *testing.T, fn func(t *testing.T)) {
	for _, b := range backends {
		t.Run(b, fn)
	}
}

// open returns an empty store of the backend that eachBackend's subtest
// names, and its target (a file or a PostgreSQL URL) for store.Open to
// reopen.
func open(t *testing.T) (*store.Store, string) {
	t.Helper()
	var target string
	switch b := t.Name()[strings.LastIndexByte(t.Name(), '/')+1:]; b {
	case "sqlite":
		target = filepath.Join(t.TempDir(), "s.db")
	case "postgres":
		target = pgtest.Database(t)
	default:
		t.Fatalf("open: called outside eachBackend (subtest %q names no backend)", b)
	}
	s, err := store.Open(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, target
}

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestTasksAndRounds(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, path := open(t)
		for _, id := range []string{"t-b", "t-a", "t-c"} {
			task := &pb.Task{Id: id, Name: "n", State: pb.TaskState_TASK_STATE_RUNNING, Model: &pb.ModelRef{Version: "m0"}, RoundsTotal: 3}
			if err := s.InsertTask(ctx, task, now); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.InsertTask(ctx, &pb.Task{Id: "t-a", Model: &pb.ModelRef{}}, now); err == nil {
			t.Fatal("duplicate task id accepted")
		}
		page, err := s.Tasks(ctx, 0, "t-a", 10)
		if err != nil || len(page) != 2 || page[0].Spec.Id != "t-b" {
			t.Fatalf("tasks after t-a: %v %v", page, err)
		}
		if _, err := s.Task(ctx, "nope"); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("missing task: %v", err)
		}

		r := &store.RoundRow{TaskID: "t-a", Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN, Seed: 9, BaseModel: "m0",
			Open: now, Deadline: now.Add(time.Minute)}
		if err := s.OpenRound(ctx, r, now); err != nil {
			t.Fatal(err)
		}
		p1, fresh, err := s.Assign(ctx, "t-a", 1, "d1", 10, now)
		if err != nil || p1 != 1 || !fresh {
			t.Fatalf("assign d1: %d %v %v", p1, fresh, err)
		}
		p2, _, _ := s.Assign(ctx, "t-a", 1, "d2", 10, now)
		again, fresh, _ := s.Assign(ctx, "t-a", 1, "d1", 10, now)
		if p2 != 2 || again != 1 || fresh {
			t.Fatalf("participants %d, re-assign %d (fresh %v)", p2, again, fresh)
		}
		r.State, r.Close, r.Reported, r.Assigned, r.Model = pb.RoundState_ROUND_STATE_COMMITTED, now.Add(time.Second), 2, 2, "m1"
		r.Metrics = map[string]float64{"train_loss": 0.5}
		m := &store.ModelRow{Version: "m1", Name: "n", Parent: "m0", TaskID: "t-a", Round: 1, Source: pb.ModelSource_MODEL_SOURCE_FEDERATED,
			Tensors: 2, Params: 10, Size: 100, Created: now}
		if err := s.CloseRound(ctx, r, m, []byte{1, 2, 3}, now); err != nil {
			t.Fatal(err)
		}

		// Everything survives a reopen of the file.
		s.Close()
		s2, err := store.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		task, err := s2.Task(ctx, "t-a")
		if err != nil || task.CurrentModel != "m1" || task.CurrentRound != 1 || task.TrainRounds != 1 || string(task.OptState) != "\x01\x02\x03" {
			t.Fatalf("task after commit: %+v %v", task, err)
		}
		got, err := s2.Round(ctx, "t-a", 1)
		if err != nil || got.State != pb.RoundState_ROUND_STATE_COMMITTED || got.Metrics["train_loss"] != 0.5 || got.Model != "m1" {
			t.Fatalf("round: %+v %v", got, err)
		}
		if a, _ := s2.Assignments(ctx, "t-a", 1); len(a) != 0 {
			t.Fatalf("assignments of a closed round kept: %v", a)
		}
		if mr, err := s2.Model(ctx, "m1"); err != nil || mr.Parent != "m0" || mr.Round != 1 {
			t.Fatalf("model: %+v %v", mr, err)
		}
		if err := s2.InsertModel(ctx, m); !errors.Is(err, backend.ErrExists) {
			t.Fatalf("duplicate model: %v", err)
		}
		if err := s2.UpdateRoundMetrics(ctx, "t-a", 1, map[string]float64{"server_accuracy": 0.9}); err != nil {
			t.Fatal(err)
		}
		got, _ = s2.Round(ctx, "t-a", 1)
		if got.Metrics["server_accuracy"] != 0.9 || got.Metrics["train_loss"] != 0.5 {
			t.Fatalf("merged metrics %v", got.Metrics)
		}
	})
}

func TestModelsAndModulesPaging(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		for _, v := range []string{"v1", "v2", "v3"} {
			if err := s.InsertModel(ctx, &store.ModelRow{Version: v, Name: "n", Created: now}); err != nil {
				t.Fatal(err)
			}
		}
		first, cursor, err := s.Models(ctx, "", 0, 2)
		if err != nil || len(first) != 2 || first[0].Version != "v3" || first[1].Version != "v2" {
			t.Fatalf("first page %v %v", first, err)
		}
		rest, _, _ := s.Models(ctx, "", cursor, 2)
		if len(rest) != 1 || rest[0].Version != "v1" {
			t.Fatalf("second page %v", rest)
		}
		mod := &pb.Module{Ref: &pb.ModuleRef{Sha256: "aa", Name: "m", AbiVersion: 1, SizeBytes: 5}}
		if err := s.InsertModule(ctx, mod, now); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertModule(ctx, mod, now); !errors.Is(err, backend.ErrExists) {
			t.Fatalf("duplicate module: %v", err)
		}
		mods, _, err := s.Modules(ctx, "m", 0, 10)
		if err != nil || len(mods) != 1 || mods[0].Ref.SizeBytes != 5 {
			t.Fatalf("modules %v %v", mods, err)
		}
		if err := s.SeeDevice(ctx, "d1", &pb.DeviceAttributes{DeviceClass: "x"}, now); err != nil {
			t.Fatal(err)
		}
		s.SeeDevice(ctx, "d1", nil, now.Add(time.Hour))
		if n, _ := s.DeviceCount(ctx); n != 1 {
			t.Fatalf("devices %d", n)
		}
	})
}
