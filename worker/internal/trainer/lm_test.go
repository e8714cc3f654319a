package trainer_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

const lmWindow = 16

var (
	goTextOnce sync.Once
	goText     []byte
	goTextErr  error
)

// goWindows returns n next-token windows of real text, the non-test Go
// files of the standard library's strings and bytes packages, from window
// first on.
func goWindows(t *testing.T, first, n int) *data.Dataset {
	t.Helper()
	goTextOnce.Do(func() {
		for _, pkg := range []string{"strings", "bytes"} {
			dir := filepath.Join(runtime.GOROOT(), "src", pkg)
			names, err := filepath.Glob(filepath.Join(dir, "*.go"))
			if err != nil {
				goTextErr = err
				return
			}
			sort.Strings(names)
			for _, name := range names {
				if strings.HasSuffix(name, "_test.go") {
					continue
				}
				b, err := os.ReadFile(name)
				if err != nil {
					goTextErr = err
					return
				}
				goText = append(goText, b...)
			}
		}
	})
	if goTextErr != nil || len(goText) == 0 {
		t.Skipf("no Go source under %s: %v", runtime.GOROOT(), goTextErr)
	}
	d, err := data.NextTokenExamples(goText, lmWindow, lmWindow)
	if err != nil {
		t.Fatal(err)
	}
	if d.Len() < first+n {
		t.Skipf("only %d windows of Go source", d.Len())
	}
	return d.Subset(seqFrom(first, n))
}

func seqFrom(first, n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = first + i
	}
	return idx
}

func tinyLM(t *testing.T) *model.Model {
	t.Helper()
	m, err := train.InitLM(train.LMConfig{Vocab: data.VocabSize, Context: lmWindow, Dim: 16, Layers: 1}, 3)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// lmHyper warms up, so the step count in the optimizer state changes the
// learning rate too and a resume that lost it would show.
func lmHyper() lm.Hyper {
	h := lm.Defaults
	h.BatchSize, h.LearningRate, h.Warmup = 8, 3e-3, 10
	return h
}

func lmRank(t *testing.T, store checkpoint.Store, total int64) trainer.Config {
	return trainer.Config{
		Job: "go-lm", Init: tinyLM(t), Data: goWindows(t, 0, 200), LMHyper: lmHyper(), Seed: 42,
		TotalSteps: total, CheckpointEvery: 20, Store: store, Rank: 0, WorldSize: 1,
	}
}

// TestLMResumeIsBitwise: a language model trains with AdamW, its
// checkpoints hold AdamW's moments and step, and a run interrupted at step
// 37 and resumed from its checkpoint at 20 equals an uninterrupted one,
// parameters and checkpoint ids alike. 60 steps of 25 batches cross two
// epoch boundaries.
func TestLMResumeIsBitwise(t *testing.T) {
	const total = 60
	full := openStore(t)
	want, err := trainer.Run(context.Background(), lmRank(t, full, total))
	if err != nil {
		t.Fatal(err)
	}
	if want.Step != total || want.Digest == tinyLM(t).HashHex() {
		t.Fatalf("uninterrupted run: step %d, digest %s", want.Step, want.Digest)
	}
	ck := loadLatest(t, full)
	if ck.Optimizer == nil {
		t.Fatal("the checkpoint of a language model holds no optimizer state")
	}
	var step *model.Tensor
	for i := range ck.Optimizer.Tensors {
		if ck.Optimizer.Tensors[i].Name == "adamw.step" {
			step = &ck.Optimizer.Tensors[i]
		}
	}
	if step == nil || step.Data[0] != total {
		t.Fatalf("optimizer state step %v, want %d", step, total)
	}

	cut := openStore(t)
	cfg := lmRank(t, cut, total)
	ctx, hook := stopAt(37)
	cfg.AfterStep = hook
	if part, err := trainer.Run(ctx, cfg); !errors.Is(err, context.Canceled) || part.Step != 37 {
		t.Fatalf("interrupted run: step %d, %v", part.Step, err)
	}
	latest := loadLatest(t, cut)
	if latest.Step != 20 || latest.Cursor.Epoch != 0 || latest.Cursor.Offset != 20*8 {
		t.Fatalf("latest checkpoint step %d cursor %+v, want step 20 at epoch 0 offset 160", latest.Step, latest.Cursor)
	}
	got, err := trainer.Run(context.Background(), lmRank(t, cut, total))
	if err != nil {
		t.Fatal(err)
	}
	if got.ResumedFrom != latest.ID {
		t.Fatalf("resumed from %s, want %s", got.ResumedFrom, latest.ID)
	}
	bitsEqual(t, "resumed vs uninterrupted", got.Model, want.Model)
	if got.Checkpoint != want.Checkpoint {
		t.Fatalf("final checkpoint %s, uninterrupted %s", got.Checkpoint, want.Checkpoint)
	}
	if want := []int64{60, 40, 20}; !slices64Equal(chain(t, cut), want) {
		t.Fatalf("chain %v, want %v", chain(t, cut), want)
	}

	// The moments are part of the state: the same checkpoint without them
	// is refused, not resumed approximately.
	bare := openStore(t)
	latest.Optimizer, latest.Parent = nil, checkpoint.Digest{}
	if _, err := checkpoint.Write(bare, latest, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := trainer.Run(context.Background(), lmRank(t, bare, total)); !errors.Is(err, trainer.ErrResume) {
		t.Fatalf("resume without optimizer state: %v, want ErrResume", err)
	}
	// Nor does an MLP run take up a language model's checkpoint.
	mlp := tinyConfig(cut)
	mlp.Job = "go-lm"
	if _, err := trainer.Run(context.Background(), mlp); !errors.Is(err, trainer.ErrResume) {
		t.Fatalf("MLP run over a language model's checkpoint: %v, want ErrResume", err)
	}
}

func TestLMConfigRefused(t *testing.T) {
	cases := map[string]func(*trainer.Config){
		"steps past AdamW's exact count": func(c *trainer.Config) { c.TotalSteps = lm.MaxSteps + 1 },
		"no batch size":                  func(c *trainer.Config) { c.LMHyper.BatchSize = 0 },
		"learning rate above 1":          func(c *trainer.Config) { c.LMHyper.LearningRate = 2 },
		"data of another context":        func(c *trainer.Config) { c.Data = tiny() },
	}
	for name, mutate := range cases {
		store := openStore(t)
		cfg := lmRank(t, store, 20)
		mutate(&cfg)
		if _, err := trainer.Run(context.Background(), cfg); !errors.Is(err, trainer.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	island := trainer.IslandConfig{Job: "go-lm", Init: tinyLM(t), Data: goWindows(t, 0, 200), InnerSteps: 5, OuterSteps: 2,
		Outer: nopOuter{}}
	if _, err := trainer.RunIsland(context.Background(), island); !errors.Is(err, trainer.ErrConfig) {
		t.Errorf("language model on an island: %v, want ErrConfig", err)
	}
}

type nopOuter struct{}

func (nopOuter) Join(context.Context) (trainer.OuterState, error) {
	return trainer.OuterState{}, errors.New("not reached")
}

func (nopOuter) Contribute(context.Context, int64, []float32, float64) (trainer.OuterState, error) {
	return trainer.OuterState{}, errors.New("not reached")
}

// runTwoLM runs two ranks of a language model on halves of 400 windows,
// averaging every 5 steps and checkpointing every 25; stop > 0 cancels
// each rank after that step.
func runTwoLM(t *testing.T, stores [2]*checkpoint.Dir, total, stop int64) ([2]trainer.Result, [2]error) {
	t.Helper()
	all := goWindows(t, 0, 400)
	ls, err := trainer.NewLocalSync(2)
	if err != nil {
		t.Fatal(err)
	}
	var (
		res  [2]trainer.Result
		errs [2]error
		wg   sync.WaitGroup
	)
	for r := range 2 {
		shard, err := trainer.Shard(all, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		m, err := ls.Member(r)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cfg := trainer.Config{
			Job: "go-lm-pool", Init: tinyLM(t), Data: shard, LMHyper: lmHyper(), Seed: 42,
			TotalSteps: total, CheckpointEvery: 25, Store: stores[r],
			Rank: r, WorldSize: 2, Sync: m, SyncEvery: 5,
			AfterStep: func(step int64, _ train.Metrics, _ *model.Model) {
				if step == stop {
					cancel()
				}
			},
		}
		wg.Go(func() { res[r], errs[r] = trainer.Run(ctx, cfg) })
	}
	wg.Wait()
	return res, errs
}

// TestLMTwoRanks: two ranks average their parameters and keep their own
// AdamW moments; the held-out loss drops; interrupted at step 27 and
// resumed from step 25, both ranks end as the uninterrupted run did.
func TestLMTwoRanks(t *testing.T) {
	total := int64(100)
	if testing.Short() {
		total = 50
	}
	stores := [2]*checkpoint.Dir{openStore(t), openStore(t)}
	res, errs := runTwoLM(t, stores, total, 0)
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
	bitsEqual(t, "rank 1 vs rank 0", res[1].Model, res[0].Model)
	a, b := loadStep(t, stores[0], 25), loadStep(t, stores[1], 25)
	bitsEqual(t, "checkpoints of one step", a.Params, b.Params)
	if a.Optimizer == nil || b.Optimizer == nil || floats.SameBits(a.Optimizer.Flatten(), b.Optimizer.Flatten()) {
		t.Fatal("the ranks' checkpoints should hold each rank's own AdamW moments")
	}

	held := goWindows(t, 400, 200)
	before, err := train.EvaluateLM(tinyLM(t), held, nil)
	if err != nil {
		t.Fatal(err)
	}
	after, err := train.EvaluateLM(res[0].Model, held, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held-out loss %.4f before, %.4f after %d steps (ln %d = %.4f)", before.Loss, after.Loss, total, data.VocabSize, math.Log(data.VocabSize))
	if !(after.Loss < before.Loss-0.5) {
		t.Fatalf("held-out loss %.4f from %.4f, want a drop of at least 0.5", after.Loss, before.Loss)
	}

	cut := [2]*checkpoint.Dir{openStore(t), openStore(t)}
	part, errs := runTwoLM(t, cut, total, 27)
	for r := range 2 {
		if !errors.Is(errs[r], context.Canceled) || part[r].Step != 27 {
			t.Fatalf("rank %d interrupted at step %d: %v", r, part[r].Step, errs[r])
		}
	}
	got, errs := runTwoLM(t, cut, total, 0)
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d resumed: %v", r, errs[r])
		}
		bitsEqual(t, "resumed rank vs uninterrupted", got[r].Model, res[r].Model)
		if got[r].Checkpoint != res[r].Checkpoint {
			t.Fatalf("rank %d: final checkpoint %s, uninterrupted %s", r, got[r].Checkpoint, res[r].Checkpoint)
		}
	}
}
