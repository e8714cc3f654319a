package trainer_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

// tiny is a learnable 2-class problem small enough for config tests.
func tiny() *data.Dataset {
	d := &data.Dataset{Dim: 2, NumClasses: 2}
	for i := range 40 {
		x := float32(i%10) / 10
		d.Features = append(d.Features, x, 1-x)
		d.Labels = append(d.Labels, uint8(i%10/5))
	}
	return d
}

func tinyConfig(store checkpoint.Store) trainer.Config {
	return trainer.Config{
		Job: "tiny", Arch: []int{2, 2}, Data: tiny(),
		Hyper: sgd.Hyper{Epochs: 1, BatchSize: 8, LearningRate: 0.1, EvalBatchSize: 8},
		Seed:  1, TotalSteps: 12, CheckpointEvery: 4, Store: store, WorldSize: 1,
	}
}

func TestHostileConfigRefused(t *testing.T) {
	store := openStore(t)
	ls, _ := trainer.NewLocalSync(2)
	member, _ := ls.Member(0)
	multi := func(c *trainer.Config) { c.WorldSize, c.Sync, c.SyncEvery, c.CheckpointEvery = 2, member, 2, 4 }
	cases := map[string]func(*trainer.Config){
		"zero steps":            func(c *trainer.Config) { c.TotalSteps = 0 },
		"negative steps":        func(c *trainer.Config) { c.TotalSteps = -5 },
		"huge steps":            func(c *trainer.Config) { c.TotalSteps = trainer.MaxSteps + 1 },
		"zero interval":         func(c *trainer.Config) { c.CheckpointEvery = 0 },
		"negative interval":     func(c *trainer.Config) { c.CheckpointEvery = -1 },
		"world size 0":          func(c *trainer.Config) { c.WorldSize = 0 },
		"negative rank":         func(c *trainer.Config) { c.Rank = -1 },
		"rank = world size":     func(c *trainer.Config) { c.Rank = 1 },
		"rank > world size":     func(c *trainer.Config) { multi(c); c.Rank = 3 },
		"no data":               func(c *trainer.Config) { c.Data = nil },
		"empty data":            func(c *trainer.Config) { c.Data = &data.Dataset{Dim: 2, NumClasses: 2} },
		"no store":              func(c *trainer.Config) { c.Store = nil },
		"no model":              func(c *trainer.Config) { c.Arch = nil },
		"two models":            func(c *trainer.Config) { c.Init, _ = train.InitMLP([]int{2, 2}, 0) },
		"bad arch":              func(c *trainer.Config) { c.Arch = []int{2, 0, 2} },
		"arch misfits data":     func(c *trainer.Config) { c.Arch = []int{3, 2} },
		"bad hyper":             func(c *trainer.Config) { c.Hyper.BatchSize = 0 },
		"sync with one rank":    func(c *trainer.Config) { c.Sync = member },
		"interval, one rank":    func(c *trainer.Config) { c.SyncEvery = 2 },
		"no syncer":             func(c *trainer.Config) { multi(c); c.Sync = nil },
		"zero sync interval":    func(c *trainer.Config) { multi(c); c.SyncEvery = 0 },
		"checkpoint off sync":   func(c *trainer.Config) { multi(c); c.SyncEvery = 3 },
		"checkpoint below sync": func(c *trainer.Config) { multi(c); c.SyncEvery = 8 },
	}
	for name, mutate := range cases {
		cfg := tinyConfig(store)
		mutate(&cfg)
		if _, err := trainer.Run(context.Background(), cfg); !errors.Is(err, trainer.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	if ids, _ := store.List(); len(ids) != 0 {
		t.Fatalf("refused configs wrote %d checkpoints", len(ids))
	}
	if _, err := trainer.NewLocalSync(0); !errors.Is(err, trainer.ErrConfig) {
		t.Errorf("NewLocalSync(0): %v", err)
	}
	if _, err := ls.Member(2); !errors.Is(err, trainer.ErrConfig) {
		t.Errorf("Member(2) of 2: %v", err)
	}
	for _, c := range [][2]int{{0, 0}, {-1, 2}, {2, 2}} {
		if _, err := trainer.Shard(tiny(), c[0], c[1]); !errors.Is(err, trainer.ErrConfig) {
			t.Errorf("Shard(rank %d of %d): %v", c[0], c[1], err)
		}
	}
	if _, err := trainer.Shard(tiny(), 0, 41); !errors.Is(err, trainer.ErrConfig) {
		t.Errorf("more ranks than examples: %v", err)
	}
}

func TestShardRoundRobin(t *testing.T) {
	d := tiny()
	seen := 0
	for r := range 3 {
		s, err := trainer.Shard(d, r, 3)
		if err != nil {
			t.Fatal(err)
		}
		for j := range s.Len() {
			i := r + 3*j
			if s.Labels[j] != d.Labels[i] || s.Features[2*j] != d.Features[2*i] {
				t.Fatalf("rank %d example %d is not example %d", r, j, i)
			}
		}
		seen += s.Len()
	}
	if seen != d.Len() {
		t.Fatalf("shards hold %d examples, want %d", seen, d.Len())
	}
}

// TestResumeRefusesOtherRuns: a store written by one run is not taken up by
// a run it does not belong to.
func TestResumeRefusesOtherRuns(t *testing.T) {
	store := openStore(t)
	if _, err := trainer.Run(context.Background(), tinyConfig(store)); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*trainer.Config){
		"other job":        func(c *trainer.Config) { c.Job = "other" },
		"other seed":       func(c *trainer.Config) { c.Seed = 2 },
		"fewer steps":      func(c *trainer.Config) { c.TotalSteps = 11 },
		"other batch size": func(c *trainer.Config) { c.Hyper.BatchSize = 7 },
		"other model":      func(c *trainer.Config) { c.Arch = []int{2, 3, 2} },
		"other rank": func(c *trainer.Config) {
			ls, _ := trainer.NewLocalSync(2)
			m, _ := ls.Member(1)
			c.Rank, c.WorldSize, c.Sync, c.SyncEvery = 1, 2, m, 4
		},
	}
	for name, mutate := range cases {
		cfg := tinyConfig(store)
		mutate(&cfg)
		if _, err := trainer.Run(context.Background(), cfg); !errors.Is(err, trainer.ErrResume) {
			t.Errorf("%s: %v, want ErrResume", name, err)
		}
	}
}

// TestLocalSyncOutOfStep: ranks at different steps fail the sync instead
// of waiting for each other for ever.
func TestLocalSyncOutOfStep(t *testing.T) {
	ls, _ := trainer.NewLocalSync(2)
	a, _ := ls.Member(0)
	b, _ := ls.Member(1)
	var wg sync.WaitGroup
	var errA error
	wg.Go(func() { _, errA = a.Average(context.Background(), 10, []float32{1, 2}, 1) })
	// Whichever opens its step first, the other fails it for both.
	_, errB := b.Average(context.Background(), 20, []float32{3, 4}, 1)
	wg.Wait()
	if !errors.Is(errA, trainer.ErrSync) || !errors.Is(errB, trainer.ErrSync) {
		t.Fatalf("errors %v and %v, want ErrSync", errA, errB)
	}

	// In step, the weighted mean, the same for both.
	var got [2][]float32
	var errs [2]error
	wg.Go(func() { got[0], errs[0] = a.Average(context.Background(), 30, []float32{1, 10}, 1) })
	got[1], errs[1] = b.Average(context.Background(), 30, []float32{4, 40}, 2)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	for r := range 2 {
		if got[r][0] != 3 || got[r][1] != 30 {
			t.Fatalf("rank %d got %v, want [3 30]", r, got[r])
		}
	}
	got[0][0] = 99 // each rank owns its copy
	if got[1][0] != 3 {
		t.Fatal("ranks share the result slice")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Average(ctx, 40, []float32{1, 2}, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
}

// A checkpoint of a command job (files, no parameters) in a trainer's store
// is refused, not loaded as an empty model.
func TestResumeRefusesFilesOnlyCheckpoint(t *testing.T) {
	store, err := checkpoint.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Write(store, &checkpoint.Checkpoint{Job: "j", Step: 4,
		Files: []checkpoint.File{{Name: "model.safetensors", Data: []byte("x")}}}, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	cfg := tinyConfig(store)
	cfg.Job = "j"
	if _, err := trainer.Run(context.Background(), cfg); !errors.Is(err, trainer.ErrResume) {
		t.Fatalf("run over a files-only checkpoint: %v, want ErrResume", err)
	}
}
