package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

func taskIDs(rows []*store.TaskRow) []string {
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.Spec.Id)
	}
	return ids
}

// A task's spec reads back as created, its state changes land with their
// time, and tasks page by id within a state.
func TestTaskRows(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		spec := &pb.Task{Id: "t1", Name: "keyboard", State: pb.TaskState_TASK_STATE_RUNNING,
			Model:           &pb.ModelRef{Sha256: "m0", Version: "m0", SizeBytes: 4096},
			Module:          &pb.ModuleRef{Sha256: "aa", AbiVersion: 2, Name: "train", Signature: []byte{9, 8}},
			Hyperparameters: []byte(`{"lr":0.1}`), CohortTarget: 50, OverSelection: 1.3, ReportGoal: 40,
			SelectionTimeout: durationpb.New(time.Minute), ReportTimeout: durationpb.New(10 * time.Minute),
			RoundsTotal: 100, EvalEvery: 5, ServerEvalDataset: "eval.jsonl"}
		for _, c := range []struct {
			id string
			st pb.TaskState
		}{{"t4", pb.TaskState_TASK_STATE_RUNNING}, {"t2", pb.TaskState_TASK_STATE_PENDING}, {"t3", pb.TaskState_TASK_STATE_RUNNING}} {
			if err := s.InsertTask(ctx, &pb.Task{Id: c.id, Name: "n", State: c.st, Model: &pb.ModelRef{Version: "m0"}}, now); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.InsertTask(ctx, spec, now); err != nil {
			t.Fatal(err)
		}
		later := now.Add(time.Hour)
		if err := s.SetTaskState(ctx, "t3", pb.TaskState_TASK_STATE_STOPPED, "operator", later); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTaskState(ctx, "nope", pb.TaskState_TASK_STATE_STOPPED, "", later); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("state of an unknown task: %v", err)
		}

		check := func(s *store.Store) {
			t.Helper()
			row, err := s.Task(ctx, "t1")
			if err != nil {
				t.Fatal(err)
			}
			want := proto.CloneOf(spec)
			want.CreateTime, want.UpdateTime = timestamppb.New(now), timestamppb.New(now)
			if !proto.Equal(row.Spec, want) || row.State != pb.TaskState_TASK_STATE_RUNNING || row.CurrentModel != "m0" ||
				row.CurrentRound != 0 || row.TrainRounds != 0 || row.OptState != nil || !row.Created.Equal(now) || !row.Updated.Equal(now) {
				t.Errorf("t1: %+v, spec %v; want spec %v", row, row.Spec, want)
			}
			api := row.Proto()
			if api.State != pb.TaskState_TASK_STATE_RUNNING || api.GetCurrentModel().GetVersion() != "m0" || api.GetCohortTarget() != 50 {
				t.Errorf("t1 on the API: %v", api)
			}
			t3, err := s.Task(ctx, "t3")
			if err != nil || t3.State != pb.TaskState_TASK_STATE_STOPPED || t3.Reason != "operator" || !t3.Updated.Equal(later) ||
				!t3.Created.Equal(now) || t3.Proto().StateReason != "operator" {
				t.Errorf("t3: %+v, %v", t3, err)
			}
			page, err := s.Tasks(ctx, pb.TaskState_TASK_STATE_RUNNING, "", 1)
			if err != nil || !reflect.DeepEqual(taskIDs(page), []string{"t1"}) {
				t.Fatalf("running, first page: %v, %v", taskIDs(page), err)
			}
			page, err = s.Tasks(ctx, pb.TaskState_TASK_STATE_RUNNING, "t1", 1)
			if err != nil || !reflect.DeepEqual(taskIDs(page), []string{"t4"}) {
				t.Fatalf("running, second page: %v, %v", taskIDs(page), err)
			}
			if page, err = s.Tasks(ctx, pb.TaskState_TASK_STATE_RUNNING, "t4", 1); err != nil || len(page) != 0 {
				t.Fatalf("running, past the last: %v, %v", taskIDs(page), err)
			}
			if page, err = s.Tasks(ctx, 0, "", 10); err != nil || !reflect.DeepEqual(taskIDs(page), []string{"t1", "t2", "t3", "t4"}) {
				t.Fatalf("all: %v, %v", taskIDs(page), err)
			}
		}
		check(s)
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		check(s2)
	})
}

func modelVersions(rows []*store.ModelRow) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.Version)
	}
	return out
}

func checkModel(t *testing.T, got, want *store.ModelRow) {
	t.Helper()
	if !proto.Equal(got.Lineage, want.Lineage) || (got.Lineage == nil) != (want.Lineage == nil) {
		t.Errorf("model %s lineage %v, want %v", want.Version, got.Lineage, want.Lineage)
	}
	g, w := *got, *want
	g.Lineage, w.Lineage = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("model %+v, want %+v", g, w)
	}
}

// Every field of a model version reads back, its pool lineage too, and
// versions page newest first within a name.
func TestModelRows(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		var models []*store.ModelRow
		for i, name := range []string{"a", "b", "a", "a"} {
			m := &store.ModelRow{Version: fmt.Sprintf("v%d", i+1), Name: name, Description: "desc " + name, Parent: fmt.Sprintf("v%d", i),
				TaskID: "t", Round: uint64(i), Source: pb.ModelSource_MODEL_SOURCE_IMPORTED, Tensors: 10 + i, Params: 1 << 40, Size: 1<<33 + int64(i),
				Created: now.Add(time.Duration(i) * time.Second)}
			if i == 2 {
				m.Source = pb.ModelSource_MODEL_SOURCE_POOL
				m.Lineage = &pb.PoolLineage{JobId: "j", SpecDigest: "sd", DataSha256: "ds", Checkpoint: "cp", Steps: 1000,
					Usage: &pb.PoolUsage{CpuSeconds: 3600, GpuSeconds: 7200, PeakMemoryBytes: 1 << 34, EnergyJoules: 5e6, Meter: "nvml", EnergySource: "grid"}}
			}
			if err := s.InsertModel(ctx, m); err != nil {
				t.Fatal(err)
			}
			models = append(models, m)
		}
		if _, err := s.Model(ctx, "nope"); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("unknown model: %v", err)
		}
		check := func(s *store.Store) {
			t.Helper()
			for _, want := range models {
				got, err := s.Model(ctx, want.Version)
				if err != nil {
					t.Fatal(err)
				}
				checkModel(t, got, want)
			}
			page, cursor, err := s.Models(ctx, "a", 0, 2)
			if err != nil || !reflect.DeepEqual(modelVersions(page), []string{"v4", "v3"}) {
				t.Fatalf("a, first page: %v, %v", modelVersions(page), err)
			}
			checkModel(t, page[1], models[2])
			page, cursor, err = s.Models(ctx, "a", cursor, 2)
			if err != nil || !reflect.DeepEqual(modelVersions(page), []string{"v1"}) {
				t.Fatalf("a, second page: %v, %v", modelVersions(page), err)
			}
			if page, _, err = s.Models(ctx, "a", cursor, 2); err != nil || len(page) != 0 {
				t.Fatalf("a, past the oldest: %v, %v", modelVersions(page), err)
			}
			if page, _, err = s.Models(ctx, "b", 0, 10); err != nil || !reflect.DeepEqual(modelVersions(page), []string{"v2"}) {
				t.Fatalf("b: %v, %v", modelVersions(page), err)
			}
			api := models[2].Proto()
			if api.GetRef().GetParentVersion() != "v2" || api.GetLineage().GetSteps() != 1000 || api.GetRef().GetSizeBytes() != 1<<33+2 {
				t.Errorf("model on the API: %v", api)
			}
		}
		check(s)
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		check(s2)
		// A version added after the reopen is the newest.
		if err := s2.InsertModel(ctx, &store.ModelRow{Version: "v5", Name: "a", Created: now}); err != nil {
			t.Fatal(err)
		}
		if page, _, err := s2.Models(ctx, "", 0, 1); err != nil || !reflect.DeepEqual(modelVersions(page), []string{"v5"}) {
			t.Fatalf("newest after reopen: %v, %v", modelVersions(page), err)
		}
	})
}

func moduleNames(mods []*pb.Module) []string {
	var out []string
	for _, m := range mods {
		out = append(out, m.Ref.Sha256)
	}
	return out
}

// A module's metadata reads back whole (its signature also in its ref,
// for round plans), and modules page newest first within a name.
func TestModuleRows(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		var mods []*pb.Module
		for i, name := range []string{"train", "eval", "train", "train"} {
			m := &pb.Module{Ref: &pb.ModuleRef{Sha256: fmt.Sprintf("s%d", i+1), Name: name, AbiVersion: uint32(i + 1), SizeBytes: 1<<32 + uint64(i)},
				Signature: []byte{byte(i), 0xff}, KeyId: "key-" + name}
			if err := s.InsertModule(ctx, m, now.Add(time.Duration(i)*time.Second)); err != nil {
				t.Fatal(err)
			}
			want := proto.CloneOf(m)
			want.Ref.Signature, want.CreateTime = m.Signature, timestamppb.New(now.Add(time.Duration(i)*time.Second))
			mods = append(mods, want)
		}
		if err := s.InsertModule(ctx, &pb.Module{Ref: &pb.ModuleRef{Sha256: "s1", Name: "other"}}, now); !errors.Is(err, backend.ErrExists) {
			t.Errorf("the same bytes registered again: %v", err)
		}
		if _, err := s.Module(ctx, "nope"); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("unknown module: %v", err)
		}
		check := func(s *store.Store) {
			t.Helper()
			for _, want := range mods {
				got, err := s.Module(ctx, want.Ref.Sha256)
				if err != nil || !proto.Equal(got, want) {
					t.Fatalf("module %v, %v; want %v", got, err, want)
				}
			}
			page, cursor, err := s.Modules(ctx, "train", 0, 2)
			if err != nil || !reflect.DeepEqual(moduleNames(page), []string{"s4", "s3"}) {
				t.Fatalf("train, first page: %v, %v", moduleNames(page), err)
			}
			// A listed module carries its signature beside its ref, not in it
			// (only Module's ref goes into round plans).
			listed := proto.CloneOf(mods[3])
			listed.Ref.Signature = nil
			if !proto.Equal(page[0], listed) {
				t.Fatalf("listed module %v, want %v", page[0], listed)
			}
			page, cursor, err = s.Modules(ctx, "train", cursor, 2)
			if err != nil || !reflect.DeepEqual(moduleNames(page), []string{"s1"}) {
				t.Fatalf("train, second page: %v, %v", moduleNames(page), err)
			}
			if page, _, err = s.Modules(ctx, "train", cursor, 2); err != nil || len(page) != 0 {
				t.Fatalf("train, past the oldest: %v, %v", moduleNames(page), err)
			}
			if page, _, err = s.Modules(ctx, "", 0, 10); err != nil || !reflect.DeepEqual(moduleNames(page), []string{"s4", "s3", "s2", "s1"}) {
				t.Fatalf("all: %v, %v", moduleNames(page), err)
			}
		}
		check(s)
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		check(s2)
	})
}
