package trainer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

// ErrSync reports ranks that disagree about a sync: different steps or
// vector lengths, or a rank contributing twice.
var ErrSync = errors.New("trainer: ranks out of step")

// LocalSync averages parameters across ranks that run in one process, each
// through its own Member. It uses the server's FedAvg collector, fed with
// the ranks' parameters rather than their deltas from a shared start: at
// learning rate 1 the two give the same mean, and parameters need no start
// that every rank would have to agree on after a resume. The ranks are
// added in rank order once all have arrived, so the float64 sums, and hence
// the result, do not depend on which rank is first.
//
// One sync is open at a time: a rank asking for another step while one is
// open fails that sync for every rank with ErrSync, which is what ranks
// resumed from checkpoints of different steps run into. A rank whose
// context ends while it waits leaves its contribution in the open sync, so
// a LocalSync serves one run of the ranks: resume them with a new one.
type LocalSync struct {
	world int

	mu   sync.Mutex
	open *round
}

type round struct {
	step    int64
	params  [][]float32
	weights []float64
	arrived int
	done    chan struct{}
	result  []float32
	err     error
}

// NewLocalSync returns a LocalSync for world ranks.
func NewLocalSync(world int) (*LocalSync, error) {
	if world < 1 {
		return nil, fmt.Errorf("trainer: new local sync: %w: world size %d < 1", ErrConfig, world)
	}
	return &LocalSync{world: world}, nil
}

// Member returns the Syncer for rank.
func (l *LocalSync) Member(rank int) (Syncer, error) {
	if rank < 0 || rank >= l.world {
		return nil, fmt.Errorf("trainer: local sync member: %w: rank %d not in [0, %d)", ErrConfig, rank, l.world)
	}
	return member{l, rank}, nil
}

type member struct {
	l    *LocalSync
	rank int
}

func (m member) Average(ctx context.Context, step int64, params []float32, weight float64) ([]float32, error) {
	r, err := m.l.contribute(m.rank, step, params, weight)
	if err != nil {
		return nil, err
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		select {
		case <-r.done: // finished as ctx ended: the result is good
		default:
			return nil, fmt.Errorf("trainer: average step %d: %w", step, ctx.Err())
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return slices.Clone(r.result), nil
}

func (l *LocalSync) contribute(rank int, step int64, params []float32, weight float64) (*round, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.open
	if r == nil {
		r = &round{step: step, params: make([][]float32, l.world), weights: make([]float64, l.world), done: make(chan struct{})}
		l.open = r
	}
	switch {
	case r.step != step:
		l.fail(r, fmt.Errorf("trainer: average: %w: rank %d at step %d while step %d is open", ErrSync, rank, step, r.step))
		return nil, r.err
	case r.params[rank] != nil:
		l.fail(r, fmt.Errorf("trainer: average step %d: %w: rank %d contributed twice", step, ErrSync, rank))
		return nil, r.err
	}
	r.params[rank] = slices.Clone(params)
	r.weights[rank] = weight
	if r.arrived++; r.arrived == l.world {
		r.result, r.err = mean(r.params, r.weights)
		if r.err != nil {
			r.err = fmt.Errorf("trainer: average step %d: %w", step, r.err)
		}
		l.open = nil
		close(r.done)
	}
	return r, nil
}

// fail ends r for every rank waiting on it; l.mu must be held.
func (l *LocalSync) fail(r *round, err error) {
	r.err = err
	l.open = nil
	close(r.done)
}

func mean(params [][]float32, weights []float64) ([]float32, error) {
	for i, p := range params {
		if len(p) != len(params[0]) {
			return nil, fmt.Errorf("%w: rank %d sent %d values, rank 0 %d", ErrSync, i, len(p), len(params[0]))
		}
	}
	return aggregator.WeightedMean(params, weights)
}
