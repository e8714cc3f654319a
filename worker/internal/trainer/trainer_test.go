package trainer_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

var (
	mnistOnce           sync.Once
	mnistTrain, heldOut *data.Dataset
	mnistErr            error
)

// mnist returns the first 4000 training images and the first 1000 test
// images, the held-out set; the embedded copy is the fallback, so this
// does not skip.
func mnist(t *testing.T) (tr, te *data.Dataset) {
	t.Helper()
	mnistOnce.Do(func() {
		dir, err := data.MNISTDir()
		if err != nil {
			mnistErr = err
			return
		}
		a, b, err := data.LoadMNIST(dir)
		if err != nil {
			mnistErr = err
			return
		}
		mnistTrain, heldOut = a.Subset(seq(4000)), b.Subset(seq(1000))
	})
	if mnistErr != nil {
		t.Fatal(mnistErr)
	}
	return mnistTrain, heldOut
}

func seq(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

var hyper = sgd.Hyper{Epochs: 1, BatchSize: 32, LearningRate: 0.1, EvalBatchSize: 500}

func openStore(t *testing.T) *checkpoint.Dir {
	t.Helper()
	s, err := checkpoint.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bitsEqual(t *testing.T, what string, a, b *model.Model) {
	t.Helper()
	va, vb := a.Flatten(), b.Flatten()
	if len(va) != len(vb) {
		t.Fatalf("%s: %d parameters, want %d", what, len(va), len(vb))
	}
	for i := range va {
		if math.Float32bits(va[i]) != math.Float32bits(vb[i]) {
			t.Fatalf("%s: parameter %d is %v, want %v", what, i, va[i], vb[i])
		}
	}
}

// chain follows parents from the latest checkpoint and returns the steps.
func chain(t *testing.T, s checkpoint.Store) []int64 {
	t.Helper()
	id, _, err := s.Latest()
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	for !id.IsZero() {
		m, err := s.Manifest(id)
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, m.Step)
		id = m.Parent
	}
	return steps
}

// stopAt returns a context that AfterStep cancels at step m, and the hook.
func stopAt(m int64) (context.Context, func(int64, train.Metrics, *model.Model)) {
	ctx, cancel := context.WithCancel(context.Background())
	return ctx, func(step int64, _ train.Metrics, _ *model.Model) {
		if step == m {
			cancel()
		}
	}
}

func oneRank(t *testing.T, store checkpoint.Store, total int64) trainer.Config {
	tr, _ := mnist(t)
	return trainer.Config{
		Job: "mnist-mlp", Arch: []int{784, 32, 10}, InitSeed: 7,
		Data: tr.Subset(seq(2000)), Hyper: hyper, Seed: 42,
		TotalSteps: total, CheckpointEvery: 20, Store: store,
		Rank: 0, WorldSize: 1,
	}
}

// TestResumeIsBitwise covers one rank: 2 epochs of 63 batches, checkpoints
// every 20 steps, interrupted at step 50 and resumed.
func TestResumeIsBitwise(t *testing.T) {
	const total = 126
	full := openStore(t)
	want, err := trainer.Run(context.Background(), oneRank(t, full, total))
	if err != nil {
		t.Fatal(err)
	}
	if want.Step != total || want.Checkpoint.IsZero() || !want.ResumedFrom.IsZero() {
		t.Fatalf("uninterrupted run: %+v", want)
	}
	init, _ := train.InitMLP([]int{784, 32, 10}, 7)
	if want.Digest == init.HashHex() || want.Digest != want.Model.HashHex() {
		t.Fatalf("digest %s: untrained or not the model's", want.Digest)
	}
	wantChain := []int64{126, 120, 100, 80, 60, 40, 20}
	if got := chain(t, full); !slices64Equal(got, wantChain) {
		t.Fatalf("checkpoint chain %v, want %v", got, wantChain)
	}
	if s := want.Saves; s.Saves != int64(len(wantChain)) || s.Stall < s.MaxStall || s.MaxStall <= 0 {
		t.Fatalf("saver stats %+v, want %d saves, the stall summed over them", s, len(wantChain))
	}

	// A crash at step 50 loses the 10 steps since the checkpoint at 40.
	cut := openStore(t)
	cfg := oneRank(t, cut, total)
	ctx, hook := stopAt(50)
	cfg.AfterStep = hook
	part, err := trainer.Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	if part.Step != 50 {
		t.Fatalf("interrupted at step %d, want 50", part.Step)
	}
	latest, err := checkpoint.LoadLatest(cut)
	if err != nil {
		t.Fatal(err)
	}
	if latest.Step != 40 || latest.ID != part.Checkpoint {
		t.Fatalf("latest checkpoint step %d id %s, Result.Checkpoint %s; want step 40", latest.Step, latest.ID, part.Checkpoint)
	}
	if latest.Cursor.Epoch != 0 || latest.Cursor.Offset != 40*32 {
		t.Fatalf("cursor %+v, want epoch 0 offset %d", latest.Cursor, 40*32)
	}

	got, err := trainer.Run(context.Background(), oneRank(t, cut, total))
	if err != nil {
		t.Fatal(err)
	}
	if got.ResumedFrom != latest.ID || got.Step != total {
		t.Fatalf("resumed from %s to step %d, want %s to %d", got.ResumedFrom, got.Step, latest.ID, total)
	}
	bitsEqual(t, "resumed vs uninterrupted", got.Model, want.Model)
	// Same content and same parents: the very same checkpoint ids.
	if got.Checkpoint != want.Checkpoint {
		t.Fatalf("final checkpoint %s, uninterrupted %s", got.Checkpoint, want.Checkpoint)
	}
	if got := chain(t, cut); !slices64Equal(got, wantChain) {
		t.Fatalf("resumed chain %v, want %v", got, wantChain)
	}

	// Resuming a finished run does nothing and reports where it ended.
	again, err := trainer.Run(context.Background(), oneRank(t, cut, total))
	if err != nil || again.Step != total || again.Checkpoint != want.Checkpoint || again.Digest != want.Digest {
		t.Fatalf("rerun of a finished job: %+v, %v", again, err)
	}
}

// TestResumeAfterShortRun stops by TotalSteps rather than by a crash: the
// last checkpoint is then mid-epoch at step 50, off the interval.
func TestResumeAfterShortRun(t *testing.T) {
	full, err := trainer.Run(context.Background(), oneRank(t, openStore(t), 126))
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	first, err := trainer.Run(context.Background(), oneRank(t, s, 50))
	if err != nil || first.Step != 50 {
		t.Fatalf("short run: step %d, %v", first.Step, err)
	}
	got, err := trainer.Run(context.Background(), oneRank(t, s, 126))
	if err != nil {
		t.Fatal(err)
	}
	if got.ResumedFrom != first.Checkpoint {
		t.Fatalf("resumed from %s, want %s", got.ResumedFrom, first.Checkpoint)
	}
	bitsEqual(t, "resumed after short run", got.Model, full.Model)
	if want := []int64{126, 120, 100, 80, 60, 50, 40, 20}; !slices64Equal(chain(t, s), want) {
		t.Fatalf("chain %v, want %v", chain(t, s), want)
	}
}

func slices64Equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// recorder wraps a Syncer and keeps what it returned per step.
type recorder struct {
	trainer.Syncer
	mu   *sync.Mutex
	seen map[int64][][]float32 // step → what each call sent, then what it got
	rank int
}

func (r recorder) Average(ctx context.Context, step int64, params []float32, w float64) ([]float32, error) {
	avg, err := r.Syncer.Average(ctx, step, params, w)
	if err == nil {
		r.mu.Lock()
		r.seen[step] = append(r.seen[step], params, avg)
		r.mu.Unlock()
	}
	return avg, err
}

type twoRanks struct {
	stores [2]*checkpoint.Dir
	// hashes[r][step] is rank r's parameter hash after step (and its sync).
	hashes [2]map[int64][32]byte
	seen   map[int64][][]float32
}

// runTwo runs both ranks in goroutines with a fresh LocalSync; stop > 0
// makes each rank cancel its own context after that step.
func runTwo(t *testing.T, tr *twoRanks, total, stop int64) ([2]trainer.Result, [2]error) {
	t.Helper()
	full, _ := mnist(t)
	ls, err := trainer.NewLocalSync(2)
	if err != nil {
		t.Fatal(err)
	}
	var (
		res  [2]trainer.Result
		errs [2]error
		wg   sync.WaitGroup
		mu   sync.Mutex
	)
	if tr.seen == nil {
		tr.seen = map[int64][][]float32{}
	}
	for r := range 2 {
		if tr.hashes[r] == nil {
			tr.hashes[r] = map[int64][32]byte{}
		}
		shard, err := trainer.Shard(full, r, 2)
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
			Job: "mnist-pool", Arch: []int{784, 32, 10}, InitSeed: 7,
			Data: shard, Hyper: hyper, Seed: 42,
			TotalSteps: total, CheckpointEvery: 20, Store: tr.stores[r],
			Rank: r, WorldSize: 2, Sync: recorder{m, &mu, tr.seen, r}, SyncEvery: 5,
			AfterStep: func(step int64, _ train.Metrics, p *model.Model) {
				tr.hashes[r][step] = p.Hash()
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

// TestTwoRanksTrainOneModel runs two ranks on halves of 4000 MNIST images
// for two epochs of their shards (126 steps), averaging every 5 steps.
func TestTwoRanksTrainOneModel(t *testing.T) {
	const total = 126
	_, te := mnist(t)
	var full twoRanks
	full.stores = [2]*checkpoint.Dir{openStore(t), openStore(t)}
	res, errs := runTwo(t, &full, total, 0)
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
	for step := int64(1); step <= total; step++ {
		same := full.hashes[0][step] == full.hashes[1][step]
		if synced := step%5 == 0 || step == total; synced != same {
			t.Fatalf("step %d: ranks agree %v, synced %v", step, same, synced)
		}
	}
	// The average really mixes: what each rank sent differs from what came back.
	for step, calls := range full.seen {
		if len(calls) != 4 {
			t.Fatalf("step %d: %d calls recorded", step, len(calls)/2)
		}
		sent0, got0, sent1, got1 := calls[0], calls[1], calls[2], calls[3]
		if floats.SameBits(sent0, sent1) || floats.SameBits(sent0, got0) || !floats.SameBits(got0, got1) {
			t.Fatalf("step %d: the ranks did not average", step)
		}
	}
	bitsEqual(t, "rank 1 vs rank 0", res[1].Model, res[0].Model)
	// Checkpoints of one step hold the same parameters on both ranks.
	for _, step := range []int64{20, 60, 126} {
		a, b := loadStep(t, full.stores[0], step), loadStep(t, full.stores[1], step)
		bitsEqual(t, "checkpoints of one step", a.Params, b.Params)
	}

	init, _ := train.InitMLP([]int{784, 32, 10}, 7)
	before, err := train.Evaluate(init, te, 500)
	if err != nil {
		t.Fatal(err)
	}
	after, err := train.Evaluate(res[0].Model, te, 500)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held-out accuracy %.3f before, %.3f after", before.Accuracy, after.Accuracy)
	if after.Accuracy < 0.80 || after.Accuracy < before.Accuracy+0.5 {
		t.Fatalf("held-out accuracy %.3f (from %.3f), want ≥ 0.80", after.Accuracy, before.Accuracy)
	}

	// Interrupt both ranks at step 50, resume both with a new LocalSync.
	var cut twoRanks
	cut.stores = [2]*checkpoint.Dir{openStore(t), openStore(t)}
	part, errs := runTwo(t, &cut, total, 50)
	for r := range 2 {
		if !errors.Is(errs[r], context.Canceled) || part[r].Step != 50 {
			t.Fatalf("rank %d interrupted at step %d: %v", r, part[r].Step, errs[r])
		}
		if ck := loadLatest(t, cut.stores[r]); ck.Step != 40 {
			t.Fatalf("rank %d: latest checkpoint at step %d, want 40", r, ck.Step)
		}
	}
	got, errs := runTwo(t, &cut, total, 0)
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

func loadLatest(t *testing.T, s checkpoint.Store) *checkpoint.Checkpoint {
	t.Helper()
	ck, err := checkpoint.LoadLatest(s)
	if err != nil {
		t.Fatal(err)
	}
	return ck
}

func loadStep(t *testing.T, s checkpoint.Store, step int64) *checkpoint.Checkpoint {
	t.Helper()
	ids, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if m, err := s.Manifest(id); err == nil && m.Step == step {
			ck, err := checkpoint.Load(s, id)
			if err != nil {
				t.Fatal(err)
			}
			return ck
		}
	}
	t.Fatalf("no checkpoint at step %d", step)
	return nil
}
