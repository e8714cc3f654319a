// Package trainer is the pool agent's built-in trainer: it runs one rank of a
// pool job that trains a Fleetlearn MLP with mini-batch SGD or a language
// model (package model/lm) with AdamW, both from package model/train,
// checkpoints it, resumes it, and, with several ranks, keeps the ranks on
// one model by averaging their parameters. RunIsland runs a DiLoCo island
// of an MLP instead: H inner steps from the server's outer parameters, then
// the pseudo-gradient to the server's outer step (see island.go).
//
// # Resume guarantee
//
// A rank's training state after step s is its parameters, its data cursor
// (epoch, batch) and, for a language model, AdamW's moments and step count:
// the example order of an epoch depends only on the shard size, the seed
// and the epoch (sgd.Order). Run checkpoints exactly that
// (Checkpoint.Params, Optimizer, Cursor, and the seed as RNG) and resumes
// from checkpoint.LoadLatest, so a run interrupted at any step and resumed
// from its store ends with parameters bitwise equal to an uninterrupted run
// with the same configuration, and even with the same checkpoint ids, since
// a checkpoint's id is the digest of its content. What an interruption
// costs is the steps since the last committed checkpoint.
//
// # Sharding
//
// Each rank trains on its own shard; Shard makes them from one dataset by
// giving example i to rank i mod WorldSize, so shard sizes differ by at most
// one and every rank sees every class. Pre-sharded data works as well: Run
// only needs each rank's Dataset.
//
// # Synchronisation
//
// With WorldSize > 1, every SyncEvery steps and after the last step each rank
// calls Syncer.Average with its parameters and its shard size as weight and
// continues from the weighted mean, the one-pool case of DiLoCo's islands
// with plain averaging as the outer step. Checkpoints are then taken only at
// sync points (CheckpointEvery must be a multiple of SyncEvery), right after
// the average, so all ranks' checkpoints of one step hold the same
// parameters and the ranks resume in step. LocalSync implements Syncer for
// ranks in one process; the pool server offers the same interface across
// machines.
//
// Only parameters are averaged. A language model's ranks each keep their
// own AdamW moments, updated from their own gradients and checkpointed in
// their own store: averaging moments would double the sync traffic, and
// the moments of a rank's shard are what its next steps need to scale its
// own gradients, as DiLoCo's workers keep their own inner AdamW state.
// The ranks' checkpoints of one step therefore agree on parameters, not on
// optimizer state.
package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
)

// Sentinel errors; Run's errors wrap one of them, an error of the packages it
// calls, or the context's error.
var (
	// ErrConfig reports a Config that cannot describe a run.
	ErrConfig = errors.New("trainer: invalid config")
	// ErrResume reports a stored checkpoint that does not belong to this
	// run: another job, rank, seed, batch size, model or a later step.
	ErrResume = errors.New("trainer: checkpoint does not fit the run")
)

// MaxSteps bounds TotalSteps, so that a hostile job cannot ask for a run
// whose step count overflows the cursor arithmetic.
const MaxSteps = 1 << 40

// Syncer averages parameters across the ranks of a job.
type Syncer interface {
	// Average contributes this rank's flat parameters (model.Flatten order)
	// after step, with weight, normally the rank's example count, blocks
	// until every rank has contributed for the same step, and returns the
	// weighted mean as a new slice. Every rank gets the same values.
	Average(ctx context.Context, step int64, params []float32, weight float64) ([]float32, error)
}

// Config describes one rank's part of a pool job.
type Config struct {
	// Job names the job in checkpoints; a store holding another job's
	// checkpoints is refused.
	Job string
	// Init is the model training starts from; it must be the same on
	// every rank. When nil, Arch and InitSeed make one with train.InitMLP.
	// A language model (train.IsLM) trains with AdamW (train.LMStepper),
	// any other model with SGD (train.Stepper).
	Init     *model.Model
	Arch     []int
	InitSeed uint64
	// Data is this rank's shard (see Shard).
	Data  *data.Dataset
	Hyper sgd.Hyper // Epochs is ignored: TotalSteps says how long to train
	// LMHyper replaces Hyper when Init is a language model; Epochs and
	// MaxSteps are ignored there too, and every parameter trains.
	LMHyper lm.Hyper
	// Seed drives the example order (sgd.Order).
	Seed uint64
	// TotalSteps is the number of mini-batch steps of the whole run,
	// counting those done before a resume.
	TotalSteps int64
	// CheckpointEvery is the step interval of checkpoints; one is also
	// taken after the last step.
	CheckpointEvery int64
	Store           checkpoint.Store
	// SaverOptions tunes the checkpoint writer (chunk size, GC, snapshot
	// buffers, workers).
	SaverOptions checkpoint.SaverOptions

	Rank, WorldSize int
	// Sync averages the ranks' parameters; nil, and SyncEvery 0, when
	// WorldSize is 1.
	Sync      Syncer
	SyncEvery int64

	// AfterStep, when set, is called after each step (and its sync and
	// checkpoint, if any) with the step number, counted from 1, the
	// batch's metrics and the parameters, a view valid until it returns.
	AfterStep func(step int64, met train.Metrics, params *model.Model)
}

// Result is where a run ended.
type Result struct {
	// Step is the number of steps done, counting those before a resume.
	Step int64
	// ResumedFrom is the checkpoint the run started from, zero for none.
	ResumedFrom checkpoint.Digest
	// Checkpoint is the last checkpoint committed, zero for none.
	Checkpoint checkpoint.Digest
	// Model is a copy of the parameters after Step; Digest its Hash in hex.
	Model  *model.Model
	Digest string
	// Last are the metrics of the last batch stepped by this call.
	Last train.Metrics
	// Saves is what this call's checkpoints cost the training loop: how
	// many it took, how long their Saves blocked it, how many waited for
	// the writes before them.
	Saves checkpoint.SaverStats
}

func (c *Config) validate() error {
	switch {
	case c.Data == nil || c.Data.Len() == 0:
		return fmt.Errorf("%w: no data", ErrConfig)
	case c.Store == nil:
		return fmt.Errorf("%w: no checkpoint store", ErrConfig)
	case (c.Init == nil) == (len(c.Arch) == 0):
		return fmt.Errorf("%w: give exactly one of Init and Arch", ErrConfig)
	case c.TotalSteps < 1 || c.TotalSteps > MaxSteps:
		return fmt.Errorf("%w: total steps %d not in [1, %d]", ErrConfig, c.TotalSteps, int64(MaxSteps))
	case c.CheckpointEvery < 1:
		return fmt.Errorf("%w: checkpoint interval %d < 1", ErrConfig, c.CheckpointEvery)
	case c.WorldSize < 1:
		return fmt.Errorf("%w: world size %d < 1", ErrConfig, c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return fmt.Errorf("%w: rank %d not in [0, %d)", ErrConfig, c.Rank, c.WorldSize)
	}
	if c.WorldSize == 1 {
		if c.Sync != nil || c.SyncEvery != 0 {
			return fmt.Errorf("%w: one rank needs no Sync or SyncEvery", ErrConfig)
		}
		return nil
	}
	switch {
	case c.Sync == nil:
		return fmt.Errorf("%w: %d ranks need a Syncer", ErrConfig, c.WorldSize)
	case c.SyncEvery < 1:
		return fmt.Errorf("%w: sync interval %d < 1", ErrConfig, c.SyncEvery)
	case c.CheckpointEvery%c.SyncEvery != 0:
		// A checkpoint between syncs would hold this rank's own
		// parameters, and ranks resumed from it would no longer agree.
		return fmt.Errorf("%w: checkpoint interval %d is not a multiple of sync interval %d", ErrConfig, c.CheckpointEvery, c.SyncEvery)
	}
	return nil
}

// stepper is what Run needs of a model's trainer: train.Stepper (through
// sgdStepper) and train.LMStepper satisfy it.
type stepper interface {
	Step() (train.Metrics, error)
	Cursor() (epoch, batch int)
	Seek(epoch, batch int) error
	Model() *model.Model
	SetModel(m *model.Model) error
	// OptimizerView returns the optimizer's state to checkpoint beside the
	// parameters, nil when the optimizer keeps none: a view, valid until
	// the next Step, since the Saver copies it.
	OptimizerView() *model.Model
	// SetOptimizerState restores what OptimizerView returned (as a
	// checkpoint keeps it), nil included, and refuses state of another
	// optimizer or model.
	SetOptimizerState(st *model.Model) error
}

// sgdStepper is train.Stepper as a stepper: plain SGD keeps no state
// besides the parameters.
type sgdStepper struct{ *train.Stepper }

func (sgdStepper) OptimizerView() *model.Model { return nil }

func (sgdStepper) SetOptimizerState(st *model.Model) error {
	if st != nil {
		return fmt.Errorf("%d optimizer tensors, but SGD keeps none", len(st.Tensors))
	}
	return nil
}

// newStepper makes the stepper for init and returns it with its batch
// size.
func newStepper(cfg *Config, init *model.Model) (stepper, int, error) {
	if !train.IsLM(init) {
		st, err := train.NewStepper(init, cfg.Data, cfg.Hyper, cfg.Seed)
		return sgdStepper{st}, cfg.Hyper.BatchSize, err
	}
	if cfg.TotalSteps > lm.MaxSteps {
		// AdamW's step count is checkpointed as a float32, exact only
		// this far.
		return nil, 0, fmt.Errorf("a language model trains at most %d steps, not %d", lm.MaxSteps, cfg.TotalSteps)
	}
	st, err := train.NewLMStepper(init, cfg.Data, cfg.LMHyper, cfg.Seed, nil)
	if err != nil {
		return nil, 0, err
	}
	return st, cfg.LMHyper.BatchSize, nil
}

func (c *Config) shardName() string { return fmt.Sprintf("rank %d of %d", c.Rank, c.WorldSize) }

func (c *Config) rng() []byte { return binary.LittleEndian.AppendUint64(nil, c.Seed) }

// Run trains this rank from the latest checkpoint in cfg.Store, or from the
// initial model when there is none, to cfg.TotalSteps. When ctx is done it
// stops before the next step, waits for the checkpoints still being written
// and returns the context's error with the Result so far; it takes no
// extra checkpoint then, as a preempted machine may not live long enough
// to finish one, and a multi-rank job could only take one at a sync point.
func Run(ctx context.Context, cfg Config) (res Result, err error) {
	if err := cfg.validate(); err != nil {
		return Result{}, fmt.Errorf("trainer: run: %w", err)
	}
	init := cfg.Init
	if init == nil {
		if init, err = train.InitMLP(cfg.Arch, cfg.InitSeed); err != nil {
			return Result{}, fmt.Errorf("trainer: run: %w: %w", ErrConfig, err)
		}
	}
	st, bs, err := newStepper(&cfg, init)
	if err != nil {
		return Result{}, fmt.Errorf("trainer: run: %w: %w", ErrConfig, err)
	}
	if res, err = resume(&cfg, st, bs); err != nil {
		return Result{}, err
	}
	saver, err := checkpoint.NewSaver(cfg.Store, cfg.SaverOptions)
	if err != nil {
		return Result{}, fmt.Errorf("trainer: run: %w", err)
	}
	state := func(step int64, parent checkpoint.Digest) *checkpoint.Checkpoint {
		epoch, batch := st.Cursor()
		return &checkpoint.Checkpoint{
			Job:       cfg.Job,
			Step:      step,
			Parent:    parent,
			Params:    st.Model(),
			Optimizer: st.OptimizerView(),
			Cursor:    checkpoint.Cursor{Epoch: int64(epoch), Offset: int64(batch) * int64(bs), Shard: cfg.shardName()},
			RNG:       cfg.rng(),
		}
	}
	// The snapshot buffers are allocated now, not by the first
	// checkpoints, so that none of them stalls training for it.
	if err := saver.Prepare(state(res.Step, res.ResumedFrom)); err != nil {
		return Result{}, fmt.Errorf("trainer: run: %w", err)
	}
	res.Checkpoint = res.ResumedFrom
	defer func() {
		// Wait settles the last save: its id, and any error not yet reported.
		id, werr := saver.Wait()
		if !id.IsZero() {
			res.Checkpoint = id
		}
		if cerr := saver.Close(); werr == nil {
			werr = cerr
		}
		res.Saves = saver.Stats()
		if err == nil && werr != nil {
			err = fmt.Errorf("trainer: run: %w", werr)
		}
		res.Model = st.Model().Clone()
		res.Digest = res.Model.HashHex()
	}()
	parent := res.ResumedFrom
	weight := float64(cfg.Data.Len())
	for res.Step < cfg.TotalSteps {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("trainer: run: step %d: %w", res.Step, err)
		}
		met, err := st.Step()
		if err != nil {
			return res, fmt.Errorf("trainer: run: step %d: %w", res.Step+1, err)
		}
		res.Step++
		res.Last = met
		last := res.Step == cfg.TotalSteps
		if cfg.Sync != nil && (res.Step%cfg.SyncEvery == 0 || last) {
			if err := average(ctx, &cfg, st, res.Step, weight); err != nil {
				return res, err
			}
		}
		if res.Step%cfg.CheckpointEvery == 0 || last {
			// parent is zero after the first save: the Saver links its own.
			if err := saver.Save(state(res.Step, parent)); err != nil {
				return res, fmt.Errorf("trainer: run: checkpoint step %d: %w", res.Step, err)
			}
			parent = checkpoint.Digest{}
		}
		if cfg.AfterStep != nil {
			cfg.AfterStep(res.Step, met, st.Model())
		}
	}
	return res, nil
}

// resume loads the latest checkpoint, if any, into st after checking that it
// was written by this very run.
func resume(cfg *Config, st stepper, batchSize int) (Result, error) {
	ck, err := checkpoint.LoadLatest(cfg.Store)
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return Result{}, nil
	}
	if err != nil {
		return Result{}, fmt.Errorf("trainer: resume: %w", err)
	}
	bs := int64(batchSize)
	switch {
	case ck.Params == nil:
		// A command job's checkpoint holds files, not parameters.
		return Result{}, fmt.Errorf("trainer: resume %s: %w: it holds no parameters", ck.ID, ErrResume)
	case ck.Job != cfg.Job:
		return Result{}, fmt.Errorf("trainer: resume %s: %w: job %q, want %q", ck.ID, ErrResume, ck.Job, cfg.Job)
	case ck.Cursor.Shard != cfg.shardName():
		return Result{}, fmt.Errorf("trainer: resume %s: %w: written by %s, this is %s", ck.ID, ErrResume, ck.Cursor.Shard, cfg.shardName())
	case string(ck.RNG) != string(cfg.rng()):
		return Result{}, fmt.Errorf("trainer: resume %s: %w: another seed", ck.ID, ErrResume)
	case ck.Step > cfg.TotalSteps:
		return Result{}, fmt.Errorf("trainer: resume %s: %w: at step %d, past the run's %d", ck.ID, ErrResume, ck.Step, cfg.TotalSteps)
	case cfg.SyncEvery > 0 && ck.Step%cfg.SyncEvery != 0 && ck.Step != cfg.TotalSteps:
		return Result{}, fmt.Errorf("trainer: resume %s: %w: step %d is not a sync point for interval %d", ck.ID, ErrResume, ck.Step, cfg.SyncEvery)
	case ck.Cursor.Offset%bs != 0:
		return Result{}, fmt.Errorf("trainer: resume %s: %w: offset %d is not a multiple of batch size %d", ck.ID, ErrResume, ck.Cursor.Offset, bs)
	}
	if err := st.SetModel(ck.Params); err != nil {
		return Result{}, fmt.Errorf("trainer: resume %s: %w: %w", ck.ID, ErrResume, err)
	}
	// Without its moments AdamW would restart from zero and the run
	// would no longer equal an uninterrupted one, so a checkpoint without
	// them is refused rather than resumed approximately.
	if err := st.SetOptimizerState(ck.Optimizer); err != nil {
		return Result{}, fmt.Errorf("trainer: resume %s: %w: optimizer state: %w", ck.ID, ErrResume, err)
	}
	if err := st.Seek(int(ck.Cursor.Epoch), int(ck.Cursor.Offset/bs)); err != nil {
		return Result{}, fmt.Errorf("trainer: resume %s: %w: %w", ck.ID, ErrResume, err)
	}
	return Result{Step: ck.Step, ResumedFrom: ck.ID}, nil
}

func average(ctx context.Context, cfg *Config, st stepper, step int64, weight float64) error {
	m := st.Model()
	avg, err := cfg.Sync.Average(ctx, step, m.Flatten(), weight)
	if err != nil {
		return fmt.Errorf("trainer: run: sync step %d: %w", step, err)
	}
	am, err := m.Layout().Unflatten(avg)
	if err != nil {
		return fmt.Errorf("trainer: run: sync step %d: %w", step, err)
	}
	if err := st.SetModel(am); err != nil {
		return fmt.Errorf("trainer: run: sync step %d: %w", step, err)
	}
	return nil
}

// Shard returns rank's part of d for a job of world ranks: the examples i
// with i mod world = rank, in their order in d.
func Shard(d *data.Dataset, rank, world int) (*data.Dataset, error) {
	switch {
	case d == nil:
		return nil, fmt.Errorf("trainer: shard: %w: no data", ErrConfig)
	case world < 1 || rank < 0 || rank >= world:
		return nil, fmt.Errorf("trainer: shard: %w: rank %d of %d", ErrConfig, rank, world)
	case d.Len() < world:
		return nil, fmt.Errorf("trainer: shard: %w: %d examples for %d ranks", ErrConfig, d.Len(), world)
	}
	idx := make([]int, 0, (d.Len()-rank+world-1)/world)
	for i := rank; i < d.Len(); i += world {
		idx = append(idx, i)
	}
	return d.Subset(idx), nil
}
