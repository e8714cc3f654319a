package data

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"gonum.org/v1/gonum/stat/distuv"
)

// pcgStream is the second PCG word; fixing it keeps a partition a function
// of its seed alone.
const pcgStream = 0x666c6565746c726e // "fleetlrn"

// Dirichlet's alpha must lie in [MinAlpha, MaxAlpha]. Outside it the gamma
// sampler's arithmetic breaks down, and the partitions it would describe are
// already indistinguishable from one class per client (below) or from IID
// (above).
const (
	MinAlpha = 1e-6
	MaxAlpha = 1e6
)

func newSource(seed uint64) *rand.PCG { return rand.NewPCG(seed, pcgStream) }

// PartitionOption configures [Dirichlet].
type PartitionOption func(*partitionConfig)

type partitionConfig struct {
	minSize       int
	maxAttempts   int
	selfBalancing bool
}

func defaultPartitionConfig() partitionConfig {
	return partitionConfig{minSize: 1, maxAttempts: 1000}
}

// WithMinSize sets the fewest examples every client must receive; draws are
// repeated until this holds. The default is 1; 0 allows empty clients.
func WithMinSize(n int) PartitionOption {
	return func(c *partitionConfig) { c.minSize = n }
}

// WithMaxAttempts bounds how many complete draws Dirichlet makes before it
// gives up with [ErrPartition]. The default is 1000.
func WithMaxAttempts(n int) PartitionOption {
	return func(c *partitionConfig) { c.maxAttempts = n }
}

// WithSelfBalancing, when on, stops handing a class's examples to clients
// that already hold at least n/clients examples, as in the reference
// implementations of Hsu et al.; it evens out client sizes while keeping the
// label skew. Off by default.
func WithSelfBalancing(on bool) PartitionOption {
	return func(c *partitionConfig) { c.selfBalancing = on }
}

// IID shuffles the indices [0, n) and splits them across clients as evenly
// as possible: sizes differ by at most one. Each client's indices are
// returned sorted. It needs 1 <= clients <= n.
func IID(n, clients int, seed uint64) ([][]int, error) {
	if clients < 1 || n < clients {
		return nil, fmt.Errorf("data: iid: need 1 <= clients (%d) <= n (%d): %w", clients, n, ErrInvalidArgument)
	}
	perm := rand.New(newSource(seed)).Perm(n)
	parts := make([][]int, clients)
	for c := range parts {
		parts[c] = slices.Clone(perm[c*n/clients : (c+1)*n/clients])
	}
	sortParts(parts)
	return parts, nil
}

// Dirichlet partitions examples with label skew (Hsu et al. 2019): for each
// class it draws client proportions from a symmetric Dirichlet(alpha) and
// splits that class's shuffled examples accordingly. Small alpha gives each
// client few classes; large alpha approaches IID. Alpha must lie in
// [MinAlpha, MaxAlpha]. Whole draws are repeated
// until every client holds at least the minimum size (see [WithMinSize]),
// at most [WithMaxAttempts] times. Each client's indices are returned sorted.
func Dirichlet(labels []uint8, numClasses, clients int, alpha float64, seed uint64, opts ...PartitionOption) ([][]int, error) {
	cfg := defaultPartitionConfig()
	for _, o := range opts {
		o(&cfg)
	}
	n := len(labels)
	switch {
	case numClasses < 1 || numClasses > MaxClasses:
		return nil, fmt.Errorf("data: dirichlet: num_classes %d outside [1, %d]: %w", numClasses, MaxClasses, ErrInvalidArgument)
	case clients < 1:
		return nil, fmt.Errorf("data: dirichlet: clients %d < 1: %w", clients, ErrInvalidArgument)
	case !(alpha >= MinAlpha && alpha <= MaxAlpha):
		return nil, fmt.Errorf("data: dirichlet: alpha %v outside [%g, %g]: %w", alpha, MinAlpha, MaxAlpha, ErrInvalidArgument)
	case cfg.minSize < 0:
		return nil, fmt.Errorf("data: dirichlet: min size %d < 0: %w", cfg.minSize, ErrInvalidArgument)
	case cfg.maxAttempts < 1:
		return nil, fmt.Errorf("data: dirichlet: max attempts %d < 1: %w", cfg.maxAttempts, ErrInvalidArgument)
	case cfg.minSize > 0 && clients > n/cfg.minSize:
		return nil, fmt.Errorf("data: dirichlet: %d examples cannot give %d clients %d each: %w",
			n, clients, cfg.minSize, ErrInvalidArgument)
	}
	if err := checkLabels(labels, numClasses); err != nil {
		return nil, fmt.Errorf("data: dirichlet: %w: %w", err, ErrInvalidArgument)
	}

	byClass := indicesByClass(labels, numClasses)
	src := newSource(seed)
	rng := rand.New(src)
	gamma := distuv.Gamma{Alpha: alpha, Beta: 1, Src: src}
	props := make([]float64, clients)
	fair := float64(n) / float64(clients)

	smallest := 0
	for range cfg.maxAttempts {
		parts := make([][]int, clients)
		for _, idx := range byClass {
			if len(idx) == 0 {
				continue
			}
			idx = slices.Clone(idx)
			rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })

			sum := 0.0
			for c := range props {
				props[c] = gamma.Rand()
				if cfg.selfBalancing && float64(len(parts[c])) >= fair {
					props[c] = 0
				}
				sum += props[c]
			}
			if !(sum > 0) {
				// Every gamma draw underflowed (tiny alpha) or balancing left
				// no one eligible: the Dirichlet's limit is all mass on one
				// client, picked uniformly.
				clear(props)
				props[pickEligible(rng, parts, cfg.selfBalancing, fair)] = 1
				sum = 1
			}

			// Cut points follow cumsum(p)*len, truncated, as the reference
			// implementations do; the last client takes the remainder.
			start, cum := 0, 0.0
			for c := range clients {
				end := len(idx)
				if c < clients-1 {
					cum += props[c] / sum
					end = min(max(int(cum*float64(len(idx))), start), len(idx))
				}
				parts[c] = append(parts[c], idx[start:end]...)
				start = end
			}
		}

		smallest = n
		for _, p := range parts {
			smallest = min(smallest, len(p))
		}
		if smallest >= cfg.minSize {
			sortParts(parts)
			return parts, nil
		}
	}
	return nil, fmt.Errorf("data: dirichlet: no draw in %d attempts gave every client %d examples (alpha %v, %d clients; last smallest %d): %w",
		cfg.maxAttempts, cfg.minSize, alpha, clients, smallest, ErrPartition)
}

// pickEligible picks a client uniformly, among those still under their fair
// share when balancing.
func pickEligible(rng *rand.Rand, parts [][]int, balancing bool, fair float64) int {
	if balancing {
		var eligible []int
		for c, p := range parts {
			if float64(len(p)) < fair {
				eligible = append(eligible, c)
			}
		}
		if len(eligible) > 0 {
			return eligible[rng.IntN(len(eligible))]
		}
	}
	return rng.IntN(len(parts))
}

// Shards partitions examples as in McMahan et al. 2017: sort by label, cut
// the sorted order into clients*shardsPerClient contiguous shards of near
// equal size, and deal each client shardsPerClient shards at random. Each
// client therefore sees only a few labels. Each client's indices are
// returned sorted. It needs at least one example per shard.
func Shards(labels []uint8, clients, shardsPerClient int, seed uint64) ([][]int, error) {
	n := len(labels)
	if clients < 1 || shardsPerClient < 1 {
		return nil, fmt.Errorf("data: shards: clients %d and shards per client %d must be >= 1: %w",
			clients, shardsPerClient, ErrInvalidArgument)
	}
	if shardsPerClient > n/clients {
		return nil, fmt.Errorf("data: shards: %d examples cannot fill %d clients x %d shards: %w",
			n, clients, shardsPerClient, ErrInvalidArgument)
	}
	numShards := clients * shardsPerClient

	// Ties keep index order, so the sorted order is a function of labels alone.
	sorted := make([]int, 0, n)
	for _, idx := range indicesByClass(labels, MaxClasses) {
		sorted = append(sorted, idx...)
	}

	deal := rand.New(newSource(seed)).Perm(numShards)
	parts := make([][]int, clients)
	for c := range parts {
		for _, s := range deal[c*shardsPerClient : (c+1)*shardsPerClient] {
			parts[c] = append(parts[c], sorted[s*n/numShards:(s+1)*n/numShards]...)
		}
	}
	sortParts(parts)
	return parts, nil
}

// Stats returns each client's label histogram: out[c][k] counts the
// examples of class k held by client c.
func Stats(labels []uint8, numClasses int, parts [][]int) ([][]int, error) {
	if numClasses < 1 || numClasses > MaxClasses {
		return nil, fmt.Errorf("data: stats: num_classes %d outside [1, %d]: %w", numClasses, MaxClasses, ErrInvalidArgument)
	}
	out := make([][]int, len(parts))
	for c, p := range parts {
		out[c] = make([]int, numClasses)
		for _, i := range p {
			if i < 0 || i >= len(labels) {
				return nil, fmt.Errorf("data: stats: client %d: index %d out of range [0, %d): %w", c, i, len(labels), ErrInvalidArgument)
			}
			if int(labels[i]) >= numClasses {
				return nil, fmt.Errorf("data: stats: label %d of example %d >= num_classes %d: %w", labels[i], i, numClasses, ErrInvalidArgument)
			}
			out[c][labels[i]]++
		}
	}
	return out, nil
}

func indicesByClass(labels []uint8, numClasses int) [][]int {
	counts := make([]int, numClasses)
	for _, l := range labels {
		counts[l]++
	}
	out := make([][]int, numClasses)
	for k := range out {
		out[k] = make([]int, 0, counts[k])
	}
	for i, l := range labels {
		out[l] = append(out[l], i)
	}
	return out
}

func sortParts(parts [][]int) {
	for _, p := range parts {
		slices.Sort(p)
	}
}
