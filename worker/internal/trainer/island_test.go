package trainer_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/worker/internal/trainer"
)

// outerServer is the pool server's outer loop in one process: an outer
// step closes once n islands have contributed for it; its pseudo-gradient
// is the weighted mean of theirs, applied by aggregator.Outer.
type outerServer struct {
	n     int
	steps int64
	outer *aggregator.Outer

	mu    sync.Mutex
	step  int64
	theta []float32
	pgs   [][]float32
	ws    []float64
	round chan struct{} // closed when the open outer step closes
	// got records every contribution: its outer step and pseudo-gradient.
	got []contribution
	// before runs, under mu, before a contribution for step k is taken.
	before func(k int64)
}

type contribution struct {
	step int64
	pg   []float32
}

func newOuterServer(t *testing.T, n int, steps int64, theta []float32, opts ...aggregator.Option) *outerServer {
	t.Helper()
	o, err := aggregator.NewOuter(len(theta), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &outerServer{n: n, steps: steps, outer: o, theta: slices.Clone(theta), round: make(chan struct{})}
}

func (f *outerServer) state() trainer.OuterState {
	return trainer.OuterState{Step: f.step, Params: slices.Clone(f.theta), Done: f.step == f.steps}
}

func (f *outerServer) Join(context.Context) (trainer.OuterState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state(), nil
}

// apply closes the open outer step with pseudo-gradient pg; f.mu is held.
func (f *outerServer) apply(pg []float32) error {
	if err := f.outer.Apply(f.theta, pg); err != nil {
		return err
	}
	f.step++
	f.pgs, f.ws = nil, nil
	close(f.round)
	f.round = make(chan struct{})
	return nil
}

func (f *outerServer) Contribute(ctx context.Context, k int64, pg []float32, w float64) (trainer.OuterState, error) {
	f.mu.Lock()
	if f.before != nil {
		f.before(k)
	}
	f.got = append(f.got, contribution{k, slices.Clone(pg)})
	if k != f.step {
		s := f.state()
		s.Late = true
		f.mu.Unlock()
		return s, nil
	}
	f.pgs, f.ws = append(f.pgs, slices.Clone(pg)), append(f.ws, w)
	round := f.round
	if len(f.pgs) == f.n {
		mean, err := aggregator.WeightedMean(f.pgs, f.ws)
		if err == nil {
			err = f.apply(mean)
		}
		if err != nil {
			f.mu.Unlock()
			return trainer.OuterState{}, err
		}
	}
	f.mu.Unlock()
	select {
	case <-round:
	case <-ctx.Done():
		return trainer.OuterState{}, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state(), nil
}

func islandConfig(t *testing.T, d *data.Dataset, outer trainer.OuterSyncer, h, steps int64) trainer.IslandConfig {
	t.Helper()
	return trainer.IslandConfig{
		Job: "mnist-mlp-i0", Arch: []int{784, 16, 10}, InitSeed: 7,
		Data: d, Hyper: hyper, Seed: 42, InnerSteps: h, OuterSteps: steps, Outer: outer,
	}
}

func initParams(t *testing.T) *model.Model {
	t.Helper()
	m, err := train.InitMLP([]int{784, 16, 10}, 7)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestIslandsAgreeAndLearn runs three islands on shards of one dataset
// against the outer loop with DiLoCo's defaults: they end on the same
// model, which has a lower loss than the start.
func TestIslandsAgreeAndLearn(t *testing.T) {
	tr, te := mnist(t)
	all := tr.Subset(seq(1500))
	init := initParams(t)
	const islands, h, steps = 3, 10, 6
	srv := newOuterServer(t, islands, steps, init.Flatten())
	res := make([]trainer.IslandResult, islands)
	errs := make([]error, islands)
	var wg sync.WaitGroup
	for i := range islands {
		shard, err := trainer.Shard(all, i, islands)
		if err != nil {
			t.Fatal(err)
		}
		cfg := islandConfig(t, shard, srv, h, steps)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = trainer.RunIsland(t.Context(), cfg)
		}()
	}
	wg.Wait()
	for i := range islands {
		if errs[i] != nil {
			t.Fatalf("island %d: %v", i, errs[i])
		}
		r := res[i]
		if r.Step != steps || r.Joined != 0 || r.InnerSteps != h*steps || r.Late != 0 {
			t.Fatalf("island %d ended %+v", i, r)
		}
		if r.Digest != res[0].Digest || r.Digest != r.Model.HashHex() {
			t.Fatalf("island %d ended on %s, island 0 on %s", i, r.Digest, res[0].Digest)
		}
	}
	final, err := init.Layout().Unflatten(srv.theta)
	if err != nil {
		t.Fatal(err)
	}
	bitsEqual(t, "island vs outer parameters", res[0].Model, final)
	before, err := train.Evaluate(init, te, 500)
	if err != nil {
		t.Fatal(err)
	}
	after, err := train.Evaluate(res[0].Model, te, 500)
	if err != nil {
		t.Fatal(err)
	}
	if !(after.Loss < 0.8*before.Loss) {
		t.Fatalf("held-out loss %v after %d outer steps, %v before", after.Loss, steps, before.Loss)
	}
	if len(srv.got) != islands*steps {
		t.Fatalf("%d contributions, want %d", len(srv.got), islands*steps)
	}
}

// TestOneIslandIsSGD: with momentum 0, outer learning rate 1 and H = 1 an
// outer step lands on the island's parameters, so the run is plain SGD,
// bit for bit.
func TestOneIslandIsSGD(t *testing.T) {
	tr, _ := mnist(t)
	d := tr.Subset(seq(600))
	init := initParams(t)
	const steps = 40 // two epochs of 19 batches and two more
	srv := newOuterServer(t, 1, steps, init.Flatten(), aggregator.WithServerLR(1), aggregator.WithMomentum(0))
	cfg := islandConfig(t, d, srv, 1, steps)
	var global []int64
	cfg.AfterStep = func(step int64, _ train.Metrics, _ *model.Model) { global = append(global, step) }
	got, err := trainer.RunIsland(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := train.NewStepper(init, d, hyper, 42)
	if err != nil {
		t.Fatal(err)
	}
	for range steps {
		if _, err := st.Step(); err != nil {
			t.Fatal(err)
		}
	}
	bitsEqual(t, "one island vs SGD", got.Model, st.Model())
	if len(global) != steps || global[0] != 1 || global[steps-1] != steps {
		t.Fatalf("AfterStep saw steps %v, want 1 to %d", global, steps)
	}
}

// TestLateIslandContinues: the outer loop closes steps 1 and 2 without the
// island; its contribution for step 1 is answered late with θ₃, and it
// trains from θ₃ at the data cursor of step 3, as a fresh island joining
// at step 3 would.
func TestLateIslandContinues(t *testing.T) {
	tr, _ := mnist(t)
	d := tr.Subset(seq(300)) // 10 batches per epoch: H = 4 crosses epochs
	init := initParams(t)
	const h, steps = 4, 5
	srv := newOuterServer(t, 1, steps, init.Flatten())
	others := make([]float32, len(srv.theta))
	for i := range others {
		others[i] = float32(i%7-3) * 1e-3
	}
	srv.before = func(k int64) {
		if k == 1 && srv.step == 1 {
			// Two outer steps close with other islands' contributions.
			for range 2 {
				if err := srv.apply(others); err != nil {
					t.Error(err)
				}
			}
		}
	}
	cfg := islandConfig(t, d, srv, h, steps)
	var syncs []trainer.OuterState
	var theta3 []float32
	cfg.AfterSync = func(s trainer.OuterState) {
		syncs = append(syncs, s)
		if s.Step == 3 {
			theta3 = slices.Clone(s.Params)
		}
	}
	res, err := trainer.RunIsland(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Late != 1 || res.Step != steps || res.InnerSteps != 4*h {
		t.Fatalf("result %+v, want one late contribution and 4 rounds of %d steps", res, h)
	}
	var ks []int64
	for _, c := range srv.got {
		ks = append(ks, c.step)
	}
	if !slices.Equal(ks, []int64{0, 1, 3, 4}) {
		t.Fatalf("contributions for outer steps %v, want [0 1 3 4]", ks)
	}
	if !syncs[2].Late || syncs[2].Step != 3 {
		t.Fatalf("third state %+v, want the late answer at step 3", syncs[2])
	}
	// What a fresh island would contribute from θ₃ at global step 3·H.
	m3, err := init.Layout().Unflatten(theta3)
	if err != nil {
		t.Fatal(err)
	}
	st, err := train.NewStepper(m3, d, hyper, 42)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Seek(3*h/10, 3*h%10); err != nil {
		t.Fatal(err)
	}
	for range h {
		if _, err := st.Step(); err != nil {
			t.Fatal(err)
		}
	}
	local := st.Model().Flatten()
	for i, v := range srv.got[2].pg {
		want := float32(float64(theta3[i]) - float64(local[i]))
		if math.Float32bits(v) != math.Float32bits(want) {
			t.Fatalf("pseudo-gradient [%d] after the late answer is %v, want %v", i, v, want)
		}
	}
}

// scripted answers a join and then contributions from a list.
type scripted struct {
	join    trainer.OuterState
	answers []trainer.OuterState
}

func (s *scripted) Join(context.Context) (trainer.OuterState, error) { return s.join, nil }

func (s *scripted) Contribute(context.Context, int64, []float32, float64) (trainer.OuterState, error) {
	if len(s.answers) == 0 {
		return trainer.OuterState{}, errors.New("no more answers")
	}
	a := s.answers[0]
	s.answers = s.answers[1:]
	return a, nil
}

func TestHostileOuterAnswersRefused(t *testing.T) {
	d := tiny()
	m, err := train.InitMLP([]int{2, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	p := m.Flatten()
	nan := slices.Clone(p)
	nan[1] = float32(math.NaN())
	inf := slices.Clone(p)
	inf[0] = float32(math.Inf(-1))
	at := func(step int64) trainer.OuterState { return trainer.OuterState{Step: step, Params: p} }
	const steps = 4
	done := trainer.OuterState{Step: steps, Params: p, Done: true}
	cases := map[string]*scripted{
		"join: short params":        {join: trainer.OuterState{Params: p[:len(p)-1]}},
		"join: long params":         {join: trainer.OuterState{Params: append(slices.Clone(p), 0)}},
		"join: no params":           {join: trainer.OuterState{}},
		"join: NaN":                 {join: trainer.OuterState{Params: nan}},
		"join: Inf":                 {join: trainer.OuterState{Params: inf}},
		"join: negative step":       {join: at(-1)},
		"join: past the end":        {join: trainer.OuterState{Step: steps + 1, Params: p, Done: true}},
		"join: done early":          {join: trainer.OuterState{Step: 2, Params: p, Done: true}},
		"join: end not done":        {join: at(steps)},
		"join: late":                {join: trainer.OuterState{Params: p, Late: true}},
		"answer: same step":         {join: at(1), answers: []trainer.OuterState{at(1)}},
		"answer: backwards":         {join: at(2), answers: []trainer.OuterState{at(1)}},
		"answer: late backwards":    {join: at(2), answers: []trainer.OuterState{{Step: 1, Params: p, Late: true}}},
		"answer: past the end":      {join: at(3), answers: []trainer.OuterState{{Step: steps + 1, Params: p, Done: true}}},
		"answer: skips, not late":   {join: at(0), answers: []trainer.OuterState{at(2)}},
		"answer: done early":        {join: at(0), answers: []trainer.OuterState{{Step: 1, Params: p, Done: true}}},
		"answer: end, not done":     {join: at(3), answers: []trainer.OuterState{at(4)}},
		"answer: short params":      {join: at(0), answers: []trainer.OuterState{{Step: 1, Params: p[:1]}}},
		"answer: NaN":               {join: at(0), answers: []trainer.OuterState{{Step: 1, Params: nan}}},
		"answer: NaN in late":       {join: at(0), answers: []trainer.OuterState{{Step: 3, Params: nan, Late: true}}},
		"answer: NaN in final step": {join: at(3), answers: []trainer.OuterState{{Step: 4, Params: nan, Done: true}}},
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := trainer.IslandConfig{Job: "tiny-i0", Init: m, Data: d, Hyper: tinyConfig(nil).Hyper, Seed: 1, InnerSteps: 2, OuterSteps: steps, Outer: s}
			_, err := trainer.RunIsland(t.Context(), cfg)
			if !errors.Is(err, trainer.ErrOuter) {
				t.Fatalf("RunIsland = %v, want ErrOuter", err)
			}
		})
	}
	// The honest version of a late answer and of a join at the end.
	cfg := trainer.IslandConfig{Job: "tiny-i0", Init: m, Data: d, Hyper: tinyConfig(nil).Hyper, Seed: 1, InnerSteps: 2, OuterSteps: steps,
		Outer: &scripted{join: at(0), answers: []trainer.OuterState{{Step: 3, Params: p, Late: true}, {Step: 4, Params: p, Done: true, Late: true}}}}
	res, err := trainer.RunIsland(t.Context(), cfg)
	if err != nil || res.Late != 2 || res.Step != steps || res.InnerSteps != 4 {
		t.Fatalf("late answers: %+v, %v", res, err)
	}
	cfg.Outer = &scripted{join: done}
	if res, err := trainer.RunIsland(t.Context(), cfg); err != nil || res.Joined != steps || res.InnerSteps != 0 || res.Digest != m.HashHex() {
		t.Fatalf("join of a finished run: %+v, %v", res, err)
	}
}

func TestIslandConfigRefused(t *testing.T) {
	srv := &scripted{}
	good := func() trainer.IslandConfig {
		return trainer.IslandConfig{Job: "tiny-i0", Arch: []int{2, 2}, Data: tiny(), Hyper: tinyConfig(nil).Hyper, Seed: 1, InnerSteps: 2, OuterSteps: 3, Outer: srv}
	}
	cases := map[string]func(*trainer.IslandConfig){
		"no data":            func(c *trainer.IslandConfig) { c.Data = nil },
		"empty data":         func(c *trainer.IslandConfig) { c.Data = &data.Dataset{Dim: 2, NumClasses: 2} },
		"no model":           func(c *trainer.IslandConfig) { c.Arch = nil },
		"two models":         func(c *trainer.IslandConfig) { c.Init, _ = train.InitMLP([]int{2, 2}, 0) },
		"bad arch":           func(c *trainer.IslandConfig) { c.Arch = []int{2, 0, 2} },
		"arch misfits data":  func(c *trainer.IslandConfig) { c.Arch = []int{3, 2} },
		"bad hyper":          func(c *trainer.IslandConfig) { c.Hyper.BatchSize = 0 },
		"fedprox":            func(c *trainer.IslandConfig) { c.Hyper.Mu = 0.1 },
		"no outer syncer":    func(c *trainer.IslandConfig) { c.Outer = nil },
		"zero inner steps":   func(c *trainer.IslandConfig) { c.InnerSteps = 0 },
		"negative inner":     func(c *trainer.IslandConfig) { c.InnerSteps = -1 },
		"huge inner":         func(c *trainer.IslandConfig) { c.InnerSteps = trainer.MaxSteps + 1 },
		"zero outer steps":   func(c *trainer.IslandConfig) { c.OuterSteps = 0 },
		"product overflows":  func(c *trainer.IslandConfig) { c.InnerSteps, c.OuterSteps = 1<<32, 1<<32 },
		"product over limit": func(c *trainer.IslandConfig) { c.InnerSteps, c.OuterSteps = 1<<20, 1<<20+1 },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := good()
			mod(&cfg)
			if _, err := trainer.RunIsland(t.Context(), cfg); !errors.Is(err, trainer.ErrConfig) {
				t.Fatalf("RunIsland = %v, want ErrConfig", err)
			}
		})
	}
}

// blocking never closes an outer step: Contribute says it waits, then
// waits for its context.
type blocking struct {
	p       []float32
	waiting chan struct{}
}

func (b blocking) Join(context.Context) (trainer.OuterState, error) {
	return trainer.OuterState{Params: b.p}, nil
}

func (b blocking) Contribute(ctx context.Context, _ int64, _ []float32, _ float64) (trainer.OuterState, error) {
	close(b.waiting)
	<-ctx.Done()
	return trainer.OuterState{}, ctx.Err()
}

func TestIslandCancellation(t *testing.T) {
	m, err := train.InitMLP([]int{2, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	base := trainer.IslandConfig{Job: "tiny-i0", Init: m, Data: tiny(), Hyper: tinyConfig(nil).Hyper, Seed: 1, InnerSteps: 5, OuterSteps: 3,
		Outer: blocking{m.Flatten(), make(chan struct{})}}

	// Between inner steps: the step the hook cancels at is the last.
	cfg := base
	ctx, hook := stopAt(3)
	cfg.AfterStep = hook
	res, err := trainer.RunIsland(ctx, cfg)
	if !errors.Is(err, context.Canceled) || res.InnerSteps != 3 || res.Model == nil {
		t.Fatalf("cancelled at inner step 3: %+v, %v", res, err)
	}

	// While an outer sync waits.
	cfg = base
	b := blocking{m.Flatten(), make(chan struct{})}
	cfg.Outer = b
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-b.waiting
		cancel()
	}()
	res, err = trainer.RunIsland(ctx, cfg)
	if !errors.Is(err, context.Canceled) || res.InnerSteps != 5 || res.Step != 0 {
		t.Fatalf("cancelled in the outer sync: %+v, %v", res, err)
	}
}
