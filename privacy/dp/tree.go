package dp

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
)

// Tree aggregation for DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta,
// Xu, "Practical and Private (Deep) Learning without Sampling or
// Shuffling", ICML 2021, arXiv:2103.00039): the server releases noisy
// prefix sums of the rounds' aggregates through the binary-tree mechanism,
// so the noise of the rounds is correlated and a device's privacy rests
// on a cap on its participations and a minimum separation between them,
// not on sampling the server could bias. The accounting mirrors
// TF-Privacy's tree_aggregation_accountant.py.

// TreeRestartZCDP returns the ρ-zCDP of DP-FTRL-TreeRestart: tree
// aggregation with noise multiplier z whose tree restarts after each entry
// of stepsPerRestart (steps of 0 are allowed and cost nothing), each device
// contributing at most once between two restarts. A tree over s leaves
// adds a device's contribution to at most ⌊log₂ s⌋ + 1 = ⌈log₂(s+1)⌉ of
// its nodes, the depth of the tree, so each restart is the Gaussian
// mechanism at squared sensitivity depth, depth/(2z²)-zCDP, and the
// restarts compose by summing. It is TF-Privacy's compute_rdp_tree_restart
// (Appendix D.1 of the paper), whose RDP at order α is α·ρ; convert with
// EpsilonFromZCDP.
func TreeRestartZCDP(z float64, stepsPerRestart []int) (rho float64, err error) {
	if err := checkPositive("noise multiplier", z); err != nil {
		return 0, fmt.Errorf("dp: tree restart zcdp: %w", err)
	}
	if len(stepsPerRestart) == 0 {
		return 0, fmt.Errorf("dp: tree restart zcdp: %w: no restarts", ErrInvalid)
	}
	depths := 0
	for i, s := range stepsPerRestart {
		if s < 0 || s > maxSteps {
			return 0, fmt.Errorf("dp: tree restart zcdp: %w: restart %d has %d steps, want 0..%d", ErrInvalid, i, s, maxSteps)
		}
		depths += bits.Len(uint(s))
	}
	return float64(depths) / (2 * z * z), nil
}

// TreeZCDP returns the ρ-zCDP of DP-FTRL-NoTreeRestart: one tree of steps
// leaves with noise multiplier z, in which a device contributes to at most
// maxParticipations leaves, any two of them with at least minSeparation
// leaves in between (TF-Privacy's convention: rounds x < y need
// y − x − 1 ≥ minSeparation, so 0 allows consecutive rounds). The squared
// sensitivity is the worst case, over the participation patterns allowed,
// of Σ over the tree's nodes of (the device's participations under the
// node)², the noise being Gaussian on every node; ρ is that over 2z². It is
// TF-Privacy's compute_zcdp_single_tree (Appendix D.2 of the paper), whose
// _tree_sensitivity_square_sum dynamic program computes this worst case
// exactly; this computes the same program bottom-up, in integers.
//
// The program takes time about k²·(minSeparation+1)·log₂ steps, k being
// the participations that fit: milliseconds for federated schedules (2,000
// rounds, k = 7, 285 apart: under a millisecond; 20,000 rounds, k = 15,
// 1,000 apart: a few). Past about a second of it, or when the sensitivity
// would not fit in 31 bits, TreeZCDP refuses the arguments with ErrInvalid
// rather than run for minutes.
func TreeZCDP(z float64, steps, maxParticipations, minSeparation int) (rho float64, err error) {
	if err := checkPositive("noise multiplier", z); err != nil {
		return 0, fmt.Errorf("dp: tree zcdp: %w", err)
	}
	switch {
	case steps < 1 || steps > maxSteps:
		return 0, fmt.Errorf("dp: tree zcdp: %w: steps %d, want 1..%d", ErrInvalid, steps, maxSteps)
	case maxParticipations < 1:
		return 0, fmt.Errorf("dp: tree zcdp: %w: max participations %d, want ≥ 1", ErrInvalid, maxParticipations)
	case minSeparation < 0:
		return 0, fmt.Errorf("dp: tree zcdp: %w: min separation %d, want ≥ 0", ErrInvalid, minSeparation)
	}
	s, err := maxTreeSensitivitySquared(steps, maxParticipations, minSeparation)
	if err != nil {
		return 0, fmt.Errorf("dp: tree zcdp: %w", err)
	}
	return float64(s) / (2 * z * z), nil
}

const (
	// maxTreeRows bounds the rows of one level of maxTreeSensitivitySquared's
	// program, (k+1)·(minSeparation+1).
	maxTreeRows = 1 << 22
	// maxTreeWork bounds the program's row combinations, Σ over levels of
	// (k+1)²·(minSeparation+1)/2 + (k+1)·(minSeparation+1): at most about a
	// second, at the 8 to 25 ns a combination takes in BenchmarkTreeZCDP.
	maxTreeWork = 1 << 26
	// treeInfeasible marks a value no participation pattern meets. Every
	// feasible value is ≥ 0, so it also loses every comparison.
	treeInfeasible = -1
)

// treeStep is where a row of the program rises: from spill e on, the row
// holds v.
type treeStep struct{ e, v int32 }

// treeLevel is the program for a complete subtree of 2^l leaves. Row
// (n, s) is, as a function of the spill e, TF-Privacy's
// _tree_sensitivity_square_sum(n, minSeparation, s, e, 2^l): the worst
// Σ over the subtree's nodes of (participations under the node)², for n
// participations after the first s leaves whose last one's separation may
// spill e leaves past the subtree (s, e ∈ [0, w−1], w = minSeparation+1).
//
// More spill leaves more room, so a row never falls in e, and it rises at
// only a few spills (under ten in the schedules measured; every value is
// an integer below n²·(l+1)): the rows are stored as their rises, not as
// w values. The same monotonicity, with rows that never rise in s, puts
// the best split between two subtrees at a rise of the left one's row,
// so combining two subtrees costs the product of the rises, not w²:
// TF-Privacy's recursion, exactly, in far less time and memory.
type treeLevel struct {
	w, nmax int
	off     []int32 // row (n, s) is steps[off[n·w+s]:off[n·w+s+1]]
	steps   []treeStep
}

func (t *treeLevel) row(n, s int) []treeStep {
	i := n*t.w + s
	return t.steps[t.off[i]:t.off[i+1]]
}

// start empties t for nmax participations, reusing its storage; rows are
// then appended in order of (n, s) with end.
func (t *treeLevel) start(w, nmax int) {
	t.w, t.nmax = w, nmax
	t.off = append(t.off[:0], 0)
	t.steps = t.steps[:0]
}

func (t *treeLevel) end() { t.off = append(t.off, int32(len(t.steps))) }

// maxTreeSensitivitySquared is TF-Privacy's _max_tree_sensitivity_square_sum
// (tree_aggregation_accountant.py): the worst Σ over the nodes of a tree of
// steps leaves of (participations under the node)², over the patterns of
// 1 … k participations with sep leaves between any two. The tree is
// TF-Privacy's and the online tree mechanism's: the dyadic intervals
// inside [1, steps], that is a complete tree for each set bit of steps,
// largest first. Arguments are valid (steps ≥ 1, k ≥ 1, sep ≥ 0).
func maxTreeSensitivitySquared(steps, k, sep int) (int64, error) {
	depth := bits.Len(uint(steps))
	// With room for one participation only, the worst leaf is one of the
	// largest complete subtree, under depth nodes; sep may then be huge.
	if k == 1 || sep >= steps-1 {
		return int64(depth), nil
	}
	w := sep + 1
	kEff := min(k, (steps+sep)/w) // TF-Privacy's _check_possible_tree_participation
	if kEff == 1 {
		return int64(depth), nil
	}
	nmaxAt := func(size int) int { return min(kEff, (size+sep)/w) }
	work := int64(0)
	for l := range depth {
		n := int64(nmaxAt(1<<l) + 1)
		work += n*n*int64(w)/2 + n*int64(w)
	}
	switch {
	case int64(kEff+1)*int64(w) > maxTreeRows || work > maxTreeWork:
		return 0, fmt.Errorf("%w: %d participations %d steps apart in %d steps: beyond the %d rows and %d combinations the program may take", ErrInvalid, kEff, sep, steps, maxTreeRows, int64(maxTreeWork))
	case int64(kEff)*int64(kEff)*int64(depth) >= math.MaxInt32:
		return 0, fmt.Errorf("%w: %d participations in %d steps: sensitivity beyond 31 bits", ErrInvalid, kEff, steps)
	}

	var prev, cur treeLevel
	// A single leaf holds one participation only when nothing before it is
	// blocked and its whole separation may spill past it.
	cur.start(w, nmaxAt(1))
	for s := 0; s < w; s++ {
		cur.steps = append(cur.steps, treeStep{int32(max(0, s-1)), 0})
		cur.end()
	}
	cur.steps = append(cur.steps, treeStep{int32(sep), 1})
	cur.end()
	for s := 1; s < w; s++ {
		cur.end()
	}

	// rest[n·w+s] is the program for the leaves of the set bits of steps
	// below the current level, with the whole separation allowed to spill
	// (nothing follows them): the remainder subtree of TF-Privacy's
	// recursion, which has no node of its own.
	var rest, next []int32
	restMax := -1
	var rises []treeStep
	for l := 0; ; l++ {
		if steps>>l&1 == 1 {
			nm := nmaxAt(steps & (1<<(l+1) - 1))
			next = next[:0]
			for n := 0; n <= nm; n++ {
				for s := 0; s < w; s++ {
					best := int32(treeInfeasible)
					if restMax < 0 {
						if r := cur.row(n, s); len(r) > 0 {
							best = r[len(r)-1].v // the largest spill, sep
						}
					} else {
						for i := max(0, n-cur.nmax); i <= min(n, restMax); i++ {
							for _, left := range cur.row(n-i, s) {
								if r := rest[i*w+int(left.e)]; r >= 0 {
									best = max(best, left.v+r)
								}
							}
						}
					}
					next = append(next, best)
				}
			}
			rest, next, restMax = next, rest, nm
		}
		if l == depth-1 {
			break
		}
		prev, cur = cur, prev
		size := 2 << l
		cur.start(w, nmaxAt(size))
		for n := 0; n <= cur.nmax; n++ {
			for s := 0; s < w; s++ {
				if s+n*w > size+sep {
					cur.end() // no spill makes room
					continue
				}
				rises = rises[:0]
				for i := max(0, n-prev.nmax); i <= min(n, prev.nmax); i++ {
					for _, left := range prev.row(n-i, s) {
						for _, right := range prev.row(i, int(left.e)) {
							rises = append(rises, treeStep{right.e, left.v + right.v})
						}
					}
				}
				// The row is the upper envelope of the candidates, each
				// non-decreasing: the running maximum of their rises.
				slices.SortFunc(rises, func(a, b treeStep) int { return cmp.Compare(a.e, b.e) })
				top := int32(treeInfeasible)
				for _, r := range rises {
					if r.v > top {
						top = r.v
						v := r.v + int32(n*n)
						if last := len(cur.steps) - 1; last >= int(cur.off[len(cur.off)-1]) && cur.steps[last].e == r.e {
							cur.steps[last].v = v
						} else {
							cur.steps = append(cur.steps, treeStep{r.e, v})
						}
					}
				}
				cur.end()
			}
		}
	}
	best := int64(0)
	for n := 1; n <= restMax; n++ {
		best = max(best, int64(rest[n*w]))
	}
	return best, nil
}

// TreeNoise is the noise of the online binary-tree mechanism (Dwork,
// Naor, Pitassi, Rothblum 2010; Chan, Shi, Song 2011) as DP-FTRL uses it:
// node (l, j) of the tree covers rounds j·2^l + 1 … (j+1)·2^l and carries a
// Gaussian vector of dim values of standard deviation std (z·C), and the
// noise on the prefix sum of rounds 1 … t is the sum of the nodes of t's
// binary decomposition, one per set bit. This is the plain tree
// aggregation, not Honaker's (2015) variance-reduced estimator, matching
// TF-Privacy's TreeResidualSumQuery: the server adds to round t's aggregate
// the increment noise(t) − noise(t−1), so the running sum of the noised
// aggregates carries popcount(t)·std² variance per value. With restarts
// every R rounds, round t is round t − rR of tree r = ⌊(t−1)/R⌋ and the
// increment of a tree's first round is its first node alone: the noise of
// finished trees stays in the model, as with TF-Privacy's RestartQuery.
//
// Node (l, j) of tree r is drawn from DerivedSource(secret, label) with
// label "fleetlearn/dp/tree/<r>/<l>/<j>" in decimal, so the mechanism's
// state is the secret and the round counter: a restarted server that
// restores both continues the identical sequence, and the labels are part
// of that contract. Give each mechanism its own secret of at least 32
// bytes from crypto/rand, keep it as secret as a signing key (it reveals
// all the noise) and keep it apart from the state MarshalBinary writes.
//
// Each call to Next streams the noise of round t's nodes straight into the
// caller's vector, about two nodes per round on average, in O(dim) time
// per node and O(1) extra memory. A TreeNoise is not safe for concurrent
// use.
type TreeNoise struct {
	secret       []byte
	dim          int
	std          float64
	restartEvery int
	round        int
}

// treeLabel is the stable prefix of node labels; see TreeNoise.
const treeLabel = "fleetlearn/dp/tree/"

// maxTreeRounds bounds the rounds a TreeNoise runs, far beyond any
// training run, so round arithmetic stays within 31 bits.
const maxTreeRounds = maxSteps

// NewTreeNoise returns the tree noise of dim-value rounds with per-node
// standard deviation std (the noise multiplier times the clip norm),
// restarting the tree every restartEvery rounds, or never when it is 0,
// keyed by secret (at least 32 bytes, copied), at round 0.
func NewTreeNoise(secret []byte, dim int, std float64, restartEvery int) (*TreeNoise, error) {
	if len(secret) < 32 {
		return nil, fmt.Errorf("dp: tree noise: %w: a secret of %d bytes, want at least 32", ErrInvalid, len(secret))
	}
	t := &TreeNoise{secret: append([]byte(nil), secret...), dim: dim, std: std, restartEvery: restartEvery}
	if err := t.validate(); err != nil {
		return nil, fmt.Errorf("dp: tree noise: %w", err)
	}
	return t, nil
}

func (t *TreeNoise) validate() error {
	switch {
	case t.dim < 1 || t.dim > maxDim:
		return fmt.Errorf("%w: dimension %d, want 1..%d", ErrInvalid, t.dim, maxDim)
	case !(t.std > 0) || math.IsInf(t.std, 0):
		return fmt.Errorf("%w: standard deviation %v, want a finite value > 0", ErrInvalid, t.std)
	case t.restartEvery < 0 || t.restartEvery > maxTreeRounds:
		return fmt.Errorf("%w: restart every %d rounds, want 0..%d", ErrInvalid, t.restartEvery, maxTreeRounds)
	case t.round < 0 || t.round > maxTreeRounds:
		return fmt.Errorf("%w: round %d, want 0..%d", ErrInvalid, t.round, maxTreeRounds)
	}
	return nil
}

// Round returns the number of rounds noised so far; the next call to Next
// noises round Round()+1.
func (t *TreeNoise) Round() int { return t.round }

// Next adds the noise increment of the next round to dst, which must hold
// dim values, and advances the round. On error dst and the round are
// unchanged.
func (t *TreeNoise) Next(dst []float64) error {
	switch {
	case len(t.secret) == 0:
		return fmt.Errorf("dp: tree noise: %w: a TreeNoise not made by NewTreeNoise", ErrInvalid)
	case len(dst) != t.dim:
		return fmt.Errorf("dp: tree noise: %w: %d values, want %d", ErrInvalid, len(dst), t.dim)
	case t.round >= maxTreeRounds:
		return fmt.Errorf("dp: tree noise: %w: past %d rounds", ErrInvalid, maxTreeRounds)
	}
	tree, leaf := 0, t.round+1
	if t.restartEvery > 0 {
		tree, leaf = t.round/t.restartEvery, t.round%t.restartEvery+1
	}
	// leaf = x·2^m + 2^m with x even. Its decomposition ends in the node
	// of level m that this round completes; leaf−1's ends instead in one
	// node on each level below m, the children's chain that node replaces,
	// and the nodes above level m are common to both and cancel.
	m := bits.TrailingZeros(uint(leaf))
	if err := t.addNode(dst, tree, m, leaf>>m-1, t.std); err != nil {
		return err
	}
	for l := 0; l < m; l++ {
		if err := t.addNode(dst, tree, l, (leaf-1)>>l-1, -t.std); err != nil {
			return err
		}
	}
	t.round++
	return nil
}

// addNode adds scale times node (level, index) of tree's standard normal
// vector to dst.
func (t *TreeNoise) addNode(dst []float64, tree, level, index int, scale float64) error {
	label := treeLabel + strconv.Itoa(tree) + "/" + strconv.Itoa(level) + "/" + strconv.Itoa(index)
	src, err := DerivedSource(t.secret, label)
	if err != nil {
		return fmt.Errorf("dp: tree noise: %w", err)
	}
	for i := range dst {
		dst[i] += scale * src.Normal()
	}
	return nil
}

const (
	treeStateMagic   = "fltn"
	treeStateVersion = 1
	treeFingerprint  = 16
	// treeStateLen: magic, version, dim, std, restartEvery, round, fingerprint.
	treeStateLen = len(treeStateMagic) + 1 + 4*8 + treeFingerprint
)

// fingerprint identifies the secret without revealing it: HMAC-SHA-256, a
// PRF apart from DerivedSource's HMAC-SHA-512, under a label no node has.
// A state restored under another secret would not cancel the noise of the
// rounds before the restart, so UnmarshalBinary checks it.
func (t *TreeNoise) fingerprint() []byte {
	mac := hmac.New(sha256.New, t.secret)
	mac.Write([]byte("fleetlearn/dp/tree-state/fingerprint"))
	return mac.Sum(nil)[:treeFingerprint]
}

// MarshalBinary encodes the parameters, the round counter and a
// fingerprint of the secret, but not the secret, which the caller stores
// apart (a leaked state then reveals no noise). The encoding is canonical:
// a state that UnmarshalBinary accepts marshals back to the same bytes.
func (t *TreeNoise) MarshalBinary() ([]byte, error) {
	if len(t.secret) == 0 {
		return nil, fmt.Errorf("dp: tree noise: %w: a TreeNoise not made by NewTreeNoise", ErrInvalid)
	}
	b := make([]byte, 0, treeStateLen)
	b = append(b, treeStateMagic...)
	b = append(b, treeStateVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(t.dim))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(t.std))
	b = binary.BigEndian.AppendUint64(b, uint64(t.restartEvery))
	b = binary.BigEndian.AppendUint64(b, uint64(t.round))
	return append(b, t.fingerprint()...), nil
}

// UnmarshalBinary restores the parameters and the round counter that
// MarshalBinary wrote into t, which NewTreeNoise must have made with the
// same secret (any dimension, deviation and restart period: those are
// replaced). It refuses, with ErrInvalid and t unchanged, bytes that do not
// decode, values out of range and a state written under another secret.
func (t *TreeNoise) UnmarshalBinary(data []byte) error {
	if len(t.secret) == 0 {
		return fmt.Errorf("dp: tree noise: %w: decoding into a TreeNoise not made by NewTreeNoise (the state holds no secret)", ErrInvalid)
	}
	if len(data) != treeStateLen || string(data[:len(treeStateMagic)]) != treeStateMagic {
		return fmt.Errorf("dp: tree noise: %w: not a tree noise state", ErrInvalid)
	}
	p := data[len(treeStateMagic):]
	if p[0] != treeStateVersion {
		return fmt.Errorf("dp: tree noise: %w: state version %d, want %d", ErrInvalid, p[0], treeStateVersion)
	}
	p = p[1:]
	field := func() uint64 {
		v := binary.BigEndian.Uint64(p)
		p = p[8:]
		return v
	}
	dim, std, restart, round := field(), math.Float64frombits(field()), field(), field()
	if dim > maxDim || restart > maxTreeRounds || round > maxTreeRounds {
		return fmt.Errorf("dp: tree noise: %w: dimension %d, restart every %d, round %d out of range", ErrInvalid, dim, restart, round)
	}
	u := TreeNoise{secret: t.secret, dim: int(dim), std: std, restartEvery: int(restart), round: int(round)}
	if err := u.validate(); err != nil {
		return fmt.Errorf("dp: tree noise: %w", err)
	}
	if !hmac.Equal(p, t.fingerprint()) {
		return fmt.Errorf("dp: tree noise: %w: the state was written under another secret", ErrInvalid)
	}
	*t = u
	return nil
}
