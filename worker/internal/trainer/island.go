package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
)

// ErrOuter reports an answer of the outer optimizer that breaks the DiLoCo
// protocol: parameters of the wrong length or not finite, an outer step
// that goes backwards, skips ahead unannounced or passes the run's end, or
// a run declared done before its last outer step.
var ErrOuter = errors.New("trainer: bad outer sync answer")

// OuterState is where the outer loop of a DiLoCo run stands, as the outer
// optimizer tells an island.
type OuterState struct {
	// Step is the outer step Params are for: the number of outer steps
	// taken. The island's next contribution names it.
	Step int64
	// Params are the outer parameters θ_Step, flat (model.Flatten order).
	Params []float32
	// Done says the run has taken its last outer step; Params are final.
	Done bool
	// Late says the contribution was not used: its outer step closed
	// without it, and the island continues from Params.
	Late bool
}

// OuterSyncer is an island's link to the outer optimizer of a DiLoCo run,
// which the pool server holds.
type OuterSyncer interface {
	// Join returns the current outer state without waiting.
	Join(ctx context.Context) (OuterState, error)
	// Contribute sends the island's pseudo-gradient θ_step − θ_local after
	// its inner steps from θ_step, with weight, normally the island's
	// example count, blocks until outer step step closes and returns the
	// state after it.
	Contribute(ctx context.Context, step int64, pseudoGradient []float32, weight float64) (OuterState, error)
}

// IslandConfig describes one island of a DiLoCo run.
type IslandConfig struct {
	// Job names the island in errors.
	Job string
	// Init or Arch and InitSeed give the model's layout; its values come
	// from the outer optimizer.
	Init     *model.Model
	Arch     []int
	InitSeed uint64
	// Data is the island's shard (Shard of the job's data by island).
	Data *data.Dataset
	// Hyper are the inner optimizer's settings; Epochs is ignored, and Mu
	// must be 0.
	Hyper sgd.Hyper
	// Seed drives the example order (sgd.Order).
	Seed uint64
	// InnerSteps is H, the inner steps between outer steps.
	InnerSteps int64
	// OuterSteps is the number of outer steps of the run.
	OuterSteps int64
	Outer      OuterSyncer

	// AfterStep, when set, is called after each inner step with the
	// global inner step (outer step × H + j, counted from 1), the batch's
	// metrics and the island's parameters, a view valid until it returns.
	AfterStep func(step int64, met train.Metrics, params *model.Model)
	// AfterSync, when set, is called with every outer state accepted, the
	// join's included, before the island trains from it; its Params must
	// not be changed. An island stopping at an outer sync cancels its
	// context here: RunIsland checks it before the next inner step.
	AfterSync func(s OuterState)
}

// IslandResult is where an island ended.
type IslandResult struct {
	// Joined is the outer step the island joined at.
	Joined int64
	// Step is the outer step of the last state accepted.
	Step int64
	// InnerSteps counts the inner steps this call ran.
	InnerSteps int64
	// Late counts the contributions the outer optimizer did not use.
	Late int64
	// Model is a copy of the island's parameters when it ended: the
	// final outer parameters when the run is done. Digest is its Hash in
	// hex.
	Model  *model.Model
	Digest string
	// Last are the metrics of the last inner step.
	Last train.Metrics
}

func (c *IslandConfig) validate() error {
	switch {
	case c.Data == nil || c.Data.Len() == 0:
		return fmt.Errorf("%w: no data", ErrConfig)
	case (c.Init == nil) == (len(c.Arch) == 0):
		return fmt.Errorf("%w: give exactly one of Init and Arch", ErrConfig)
	case train.IsLM(c.Init):
		// The outer step would need AdamW's moments per island across
		// rejoins, which an island, keeping no checkpoints, cannot hold.
		return fmt.Errorf("%w: DiLoCo islands train MLPs with SGD; a language model is not supported on islands", ErrConfig)
	case c.Outer == nil:
		return fmt.Errorf("%w: an island needs an OuterSyncer", ErrConfig)
	case c.InnerSteps < 1 || c.InnerSteps > MaxSteps:
		return fmt.Errorf("%w: inner steps %d not in [1, %d]", ErrConfig, c.InnerSteps, int64(MaxSteps))
	case c.OuterSteps < 1 || c.OuterSteps > MaxSteps/c.InnerSteps:
		return fmt.Errorf("%w: %d outer steps of %d inner steps: want 1 to %d steps in all", ErrConfig, c.OuterSteps, c.InnerSteps, int64(MaxSteps))
	case c.Hyper.Mu != 0:
		// The Stepper anchors FedProx at the model it was built from, not
		// at each outer step's parameters; the outer step already pulls
		// the islands together.
		return fmt.Errorf("%w: FedProx (mu %v) is not supported on DiLoCo islands: set mu to 0", ErrConfig, c.Hyper.Mu)
	}
	return nil
}

// RunIsland runs one island of a DiLoCo run: it joins the outer optimizer,
// then, until the run is done, trains InnerSteps steps from the outer
// parameters and contributes its pseudo-gradient for their outer step. The
// data cursor of outer step k is global inner step k·H, so an island that
// rejoins after a restart, or continues after a late contribution, sees
// the batches it would have seen had it never stopped.
//
// It returns nil once the outer optimizer says the run is done. When ctx
// ends it stops before the next inner step, or abandons the outer sync it
// waits on, and returns the context's error with the result so far. Every
// answer is checked (ErrOuter) before the island trains from it.
func RunIsland(ctx context.Context, cfg IslandConfig) (res IslandResult, err error) {
	if err := cfg.validate(); err != nil {
		return IslandResult{}, fmt.Errorf("trainer: run island: %w", err)
	}
	init := cfg.Init
	if init == nil {
		if init, err = train.InitMLP(cfg.Arch, cfg.InitSeed); err != nil {
			return IslandResult{}, fmt.Errorf("trainer: run island: %w: %w", ErrConfig, err)
		}
	}
	st, err := train.NewStepper(init, cfg.Data, cfg.Hyper, cfg.Seed)
	if err != nil {
		return IslandResult{}, fmt.Errorf("trainer: run island: %w: %w", ErrConfig, err)
	}
	perEpoch := int64(st.BatchesPerEpoch())
	if epochs := cfg.OuterSteps * cfg.InnerSteps / perEpoch; epochs > math.MaxInt32 {
		return IslandResult{}, fmt.Errorf("trainer: run island: %w: %d steps are %d epochs of %d batches, limit %d epochs",
			ErrConfig, cfg.OuterSteps*cfg.InnerSteps, epochs, perEpoch, math.MaxInt32)
	}
	layout := st.Model().Layout()
	dim := layout.Size()
	defer func() {
		res.Model = st.Model().Clone()
		res.Digest = res.Model.HashHex()
	}()

	s, err := cfg.Outer.Join(ctx)
	if err != nil {
		return res, fmt.Errorf("trainer: run island: join: %w", err)
	}
	if err := cfg.checkJoin(s, dim); err != nil {
		return res, fmt.Errorf("trainer: run island: join: %w", err)
	}
	res.Joined = s.Step
	weight := float64(cfg.Data.Len())
	for {
		// Owned here: the syncer's slice could be shared with its caller.
		start := slices.Clone(s.Params)
		m, err := layout.Unflatten(start)
		if err == nil {
			err = st.SetModel(m)
		}
		if err != nil {
			return res, fmt.Errorf("trainer: run island: outer step %d: %w: %w", s.Step, ErrOuter, err)
		}
		res.Step = s.Step
		if cfg.AfterSync != nil {
			cfg.AfterSync(s)
		}
		if s.Done {
			return res, nil
		}
		first := s.Step * cfg.InnerSteps
		if err := st.Seek(int(first/perEpoch), int(first%perEpoch)); err != nil {
			return res, fmt.Errorf("trainer: run island: outer step %d: %w", s.Step, err)
		}
		for j := int64(1); j <= cfg.InnerSteps; j++ {
			if err := ctx.Err(); err != nil {
				return res, fmt.Errorf("trainer: run island: outer step %d, inner step %d: %w", s.Step, first+j, err)
			}
			met, err := st.Step()
			res.InnerSteps++
			if err != nil {
				return res, fmt.Errorf("trainer: run island: inner step %d: %w", first+j, err)
			}
			res.Last = met
			if cfg.AfterStep != nil {
				cfg.AfterStep(first+j, met, st.Model())
			}
		}
		pg, err := pseudoGradient(start, st.Model().Flatten())
		if err != nil {
			return res, fmt.Errorf("trainer: run island: outer step %d: %w", s.Step, err)
		}
		next, err := cfg.Outer.Contribute(ctx, s.Step, pg, weight)
		if err != nil {
			return res, fmt.Errorf("trainer: run island: contribute to outer step %d: %w", s.Step, err)
		}
		if err := cfg.checkAnswer(s.Step, next, dim); err != nil {
			return res, fmt.Errorf("trainer: run island: contribute to outer step %d: %w", s.Step, err)
		}
		if next.Late {
			res.Late++
		}
		s = next
	}
}

// pseudoGradient is start − local, each coordinate in float64 and stored
// as float32, as the outer optimizer expects.
func pseudoGradient(start, local []float32) ([]float32, error) {
	pg := make([]float32, len(start))
	for i := range pg {
		d := float32(float64(start[i]) - float64(local[i]))
		if math.IsNaN(float64(d)) || math.IsInf(float64(d), 0) {
			return nil, fmt.Errorf("%w: pseudo-gradient [%d] is %v", train.ErrDiverged, i, d)
		}
		pg[i] = d
	}
	return pg, nil
}

func (c *IslandConfig) checkJoin(s OuterState, dim int) error {
	switch {
	case s.Step < 0 || s.Step > c.OuterSteps:
		return fmt.Errorf("%w: outer step %d not in [0, %d]", ErrOuter, s.Step, c.OuterSteps)
	case s.Late:
		return fmt.Errorf("%w: a join answered as late", ErrOuter)
	}
	return c.checkState(s, dim)
}

// checkAnswer checks the answer to a contribution for outer step k.
func (c *IslandConfig) checkAnswer(k int64, s OuterState, dim int) error {
	switch {
	case s.Step <= k:
		return fmt.Errorf("%w: answered with outer step %d to a contribution for step %d: the outer step must advance", ErrOuter, s.Step, k)
	case s.Step > c.OuterSteps:
		return fmt.Errorf("%w: outer step %d past the run's %d", ErrOuter, s.Step, c.OuterSteps)
	case !s.Late && s.Step != k+1:
		return fmt.Errorf("%w: outer step %d answered with step %d without saying the contribution was late", ErrOuter, k, s.Step)
	}
	return c.checkState(s, dim)
}

func (c *IslandConfig) checkState(s OuterState, dim int) error {
	switch {
	case s.Done != (s.Step == c.OuterSteps):
		return fmt.Errorf("%w: done %t at outer step %d of %d", ErrOuter, s.Done, s.Step, c.OuterSteps)
	case len(s.Params) != dim:
		return fmt.Errorf("%w: %d parameters, the model has %d", ErrOuter, len(s.Params), dim)
	}
	for i, v := range s.Params {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: parameter %d is %v", ErrOuter, i, v)
		}
	}
	return nil
}
