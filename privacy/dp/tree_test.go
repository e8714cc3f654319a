package dp_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/seeds"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// TestTreeRestartZCDPFigures: TF-Privacy's test_compute_eps_tree
// (tree_aggregation_accountant_test.py), the StackOverflow setting of
// Kairouz et al. 2021: one tree of 1,600 steps at δ = 1e-6 and Opacus's
// orders stays below ε 19.74 at noise 1.13 and below ε 2.04 at noise 8.83.
// At 1.13 the conversion gives 18.7096 (a tree of depth 11).
func TestTreeRestartZCDPFigures(t *testing.T) {
	for _, c := range []struct {
		z, below float64
	}{{1.13, 19.74}, {8.83, 2.04}} {
		rho, err := dp.TreeRestartZCDP(c.z, []int{1600})
		if err != nil {
			t.Fatal(err)
		}
		if want := 11 / (2 * c.z * c.z); math.Abs(rho-want) > 1e-15*want {
			t.Errorf("z %v: ρ = %v, want 11/(2z²) = %v", c.z, rho, want)
		}
		eps, _, err := dp.EpsilonFromZCDP(rho, 1e-6, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !(eps < c.below) {
			t.Errorf("z %v: ε = %v, TF-Privacy's bound %v", c.z, eps, c.below)
		}
		if c.z == 1.13 && math.Abs(eps-18.7096)/18.7096 > 1e-3 {
			t.Errorf("z 1.13: ε = %v, want 18.7096", eps)
		}
	}
}

// TestTreeRestartZCDPComposes: TF-Privacy's test_compose_tree_rdp: the
// restarts of one call compose as the sum of one call per restart, for its
// step lists at noise 0.1; and test_compute_eps_tree_decreasing: ε falls
// as the noise grows, for z = 0.1, 0.6, … 9.6.
func TestTreeRestartZCDPComposes(t *testing.T) {
	for _, steps := range [][]int{{400, 400, 400, 400}, {800, 800}, {10, 400, 400, 400, 390}} {
		all, err := dp.TreeRestartZCDP(0.1, steps)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, s := range steps {
			one, err := dp.TreeRestartZCDP(0.1, []int{s})
			if err != nil {
				t.Fatal(err)
			}
			sum += one
		}
		if math.Abs(all-sum) > 1e-12*sum {
			t.Errorf("%v: ρ %v, sum of restarts %v", steps, all, sum)
		}
		prev := math.Inf(1)
		for x := 1; x < 100; x += 5 {
			rho, err := dp.TreeRestartZCDP(0.1*float64(x), steps)
			if err != nil {
				t.Fatal(err)
			}
			eps, _, err := dp.EpsilonFromZCDP(rho, 1e-6, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !(eps < prev) {
				t.Errorf("%v: ε %v at z %v, not below %v", steps, eps, 0.1*float64(x), prev)
			}
			prev = eps
		}
	}
}

// TestTreeRestartZCDPWithoutTree: TF-Privacy's test_no_tree_no_sampling:
// restarting after every step leaves trees of one node, so T restarts are
// T rounds of the plain Gaussian mechanism (the package's RDP at q = 1),
// for T = 100 at noise 0.1 and T = 1000 at noise 0.01.
func TestTreeRestartZCDPWithoutTree(t *testing.T) {
	orders := dp.OrdersOpacus()
	for _, c := range []struct {
		steps int
		z     float64
	}{{100, 0.1}, {1000, 0.01}} {
		ones := make([]int, c.steps)
		for i := range ones {
			ones[i] = 1
		}
		rho, err := dp.TreeRestartZCDP(c.z, ones)
		if err != nil {
			t.Fatal(err)
		}
		curve, err := dp.RDPCurve(1, c.z, c.steps, orders)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range orders {
			if math.Abs(a*rho-curve[i]) > 1e-12*curve[i] {
				t.Fatalf("T %d, z %v, α %v: tree RDP %v, Gaussian %v", c.steps, c.z, a, a*rho, curve[i])
			}
		}
	}
	// Steps of 0 are restarts that saw no round.
	a, _ := dp.TreeRestartZCDP(2, []int{0, 5, 0})
	b, _ := dp.TreeRestartZCDP(2, []int{5})
	if a != b {
		t.Errorf("empty restarts cost: %v vs %v", a, b)
	}
}

// treeSens returns TreeZCDP's squared sensitivity: at z = 1, ρ is half
// of it, exactly in floating point.
func treeSens(t *testing.T, steps, k, b int) int {
	t.Helper()
	rho, err := dp.TreeZCDP(1, steps, k, b)
	if err != nil {
		t.Fatalf("T %d, k %d, b %d: %v", steps, k, b, err)
	}
	return int(2 * rho)
}

// TestTreeZCDPFigures: the figures of TF-Privacy's tests of
// _max_tree_sensitivity_square_sum (tree_aggregation_accountant_test.py).
func TestTreeZCDPFigures(t *testing.T) {
	// test_max_tree_sensitivity_square_sum_toy, (k, b, T) → value; the last
	// is the paper's example where the worst case beats the greedy one.
	for _, c := range [][4]int{{1, 7, 8, 4}, {3, 3, 9, 11}, {3, 2, 7, 9}, {8, 2, 24, 88}} {
		if got := treeSens(t, c[2], c[0], c[1]); got != c[3] {
			t.Errorf("k %d, b %d, T %d: %d, want %d", c[0], c[1], c[2], got, c[3])
		}
	}
	for _, steps := range []int{3, 8, 11, 19} {
		// test_max_tree_sensitivity_square_sum_every_step: a device in every
		// round fills every node; a complete tree of 2^d leaves has 2^(d−l)
		// nodes of 2^l leaves, Σ_l 2^(d−l)·4^l = 2^d·(2^(d+1) − 1).
		want := 0
		for d := range bits.Len(uint(steps)) {
			if steps>>d&1 == 1 {
				want += 1 << d * (1<<(d+1) - 1)
			}
		}
		if got := treeSens(t, steps, steps, 0); got != want {
			t.Errorf("every step of %d: %d, want %d", steps, got, want)
		}
		// _every_step_part2: two participations go to adjacent leaves of the
		// largest subtree, sharing all its nodes but the leaves.
		if got, want := treeSens(t, steps, 2, 0), 2+4*(bits.Len(uint(steps))-1); got != want {
			t.Errorf("two in %d: %d, want %d", steps, got, want)
		}
	}
	// _every_step_part: more participations allowed than steps change
	// nothing.
	for _, k := range []int{11, 19, 200} {
		if got := treeSens(t, 8, k, 0); got != 120 {
			t.Errorf("k %d in 8 steps: %d, want 120", k, got)
		}
	}
}

// treeSensitivitySquared is the worst Σ over the tree's nodes (the dyadic
// intervals inside [1, steps]) of (participations under the node)², by
// enumerating every pattern of 1 … k participations with at least b rounds
// between any two.
func treeSensitivitySquared(steps, k, b int) int {
	type node struct{ lo, hi int }
	var nodes []node
	for size := 1; size <= steps; size *= 2 {
		for lo := 1; lo+size-1 <= steps; lo += size {
			nodes = append(nodes, node{lo, lo + size - 1})
		}
	}
	best := 0
	var pos []int
	var walk func(first int)
	walk = func(first int) {
		if len(pos) > 0 {
			sum := 0
			for _, n := range nodes {
				c := 0
				for _, p := range pos {
					if n.lo <= p && p <= n.hi {
						c++
					}
				}
				sum += c * c
			}
			best = max(best, sum)
		}
		if len(pos) == k {
			return
		}
		for p := first; p <= steps; p++ {
			pos = append(pos, p)
			walk(p + b + 1)
			pos = pos[:len(pos)-1]
		}
	}
	walk(1)
	return best
}

// TestTreeZCDPBruteForce: TF-Privacy's program is the exact worst case,
// equal to enumeration for every T ≤ 12, separation and cap.
func TestTreeZCDPBruteForce(t *testing.T) {
	for steps := 1; steps <= 12; steps++ {
		for b := 0; b <= steps+1; b++ {
			for k := 1; k <= steps+1; k++ {
				if got, want := treeSens(t, steps, k, b), treeSensitivitySquared(steps, k, b); got != want {
					t.Errorf("T %d, k %d, b %d: %d, brute force %d", steps, k, b, got, want)
				}
			}
		}
	}
}

// tfTree is a line-by-line port of TF-Privacy's recursion,
// _tree_sensitivity_square_sum and _max_tree_sensitivity_square_sum, with
// its memo, to check the bottom-up program against beyond brute force.
type tfTree struct {
	sep  int
	memo map[[4]int]float64
}

func (f *tfTree) possible(n, start, end, steps int) bool {
	return start+(f.sep+1)*n <= steps+end
}

func (f *tfTree) sum(n, start, end, size int) float64 {
	key := [4]int{n, start, end, size}
	if v, ok := f.memo[key]; ok {
		return v
	}
	var v float64
	switch {
	case !f.possible(n, start, end, size):
		v = math.Inf(-1)
	case n == 0:
		v = 0
	case n == 1 && size == 1:
		v = 1
	default:
		p := bits.Len(uint(size)) - 1
		if size == 1<<p {
			v = float64(n * n)
			p--
		}
		best := math.Inf(-1)
		for i := 0; i <= n; i++ {
			for j := 0; j <= f.sep; j++ {
				left := f.sum(n-i, start, j, 1<<p)
				if math.IsInf(left, -1) {
					continue
				}
				best = max(best, left+f.sum(i, j, end, size-1<<p))
			}
		}
		v += best
	}
	f.memo[key] = v
	return v
}

func (f *tfTree) max(k, steps int) float64 {
	for !f.possible(k, 0, f.sep, steps) {
		k--
	}
	best := math.Inf(-1)
	for n := 1; n <= k; n++ {
		best = max(best, f.sum(n, 0, f.sep, steps))
	}
	return best
}

// TestTreeZCDPMatchesTFPrivacy: the bottom-up program equals TF-Privacy's
// recursion on every T ≤ 80 with b ≤ 7, k ≤ 6, and on larger trees.
func TestTreeZCDPMatchesTFPrivacy(t *testing.T) {
	for b := 0; b <= 7; b++ {
		f := &tfTree{sep: b, memo: map[[4]int]float64{}}
		for steps := 1; steps <= 80; steps++ {
			for k := 1; k <= 6; k++ {
				if got, want := treeSens(t, steps, k, b), f.max(k, steps); float64(got) != want {
					t.Errorf("T %d, k %d, b %d: %d, TF-Privacy %v", steps, k, b, got, want)
				}
			}
		}
	}
	// Trees where the best split between two subtrees is not at the left
	// one's first feasible point (TF-Privacy's own code gives the same
	// values: 269, 250, 484, 598), then random larger trees.
	cases := [][3]int{{108, 16, 6}, {220, 15, 14}, {256, 14, 14}, {257, 16, 12}}
	r := rand.New(rand.NewPCG(1, 2))
	for range 12 {
		cases = append(cases, [3]int{100 + r.IntN(400), 2 + r.IntN(5), 8 + r.IntN(20)})
	}
	for _, c := range cases {
		steps, k, b := c[0], c[1], c[2]
		f := &tfTree{sep: b, memo: map[[4]int]float64{}}
		if got, want := treeSens(t, steps, k, b), f.max(k, steps); float64(got) != want {
			t.Errorf("T %d, k %d, b %d: %d, TF-Privacy %v", steps, k, b, got, want)
		}
	}
}

// TestTreeZCDPScale: a federated schedule (2,000 rounds, a device at most
// 7 times, 285 rounds apart) lies between k times one participation's
// cost and k² times it; programs past the limits are refused instead of
// run.
func TestTreeZCDPScale(t *testing.T) {
	got := treeSens(t, 2000, 7, 285)
	if depth := bits.Len(2000); got < 7*depth || got > 49*depth {
		t.Errorf("sensitivity² %d outside [%d, %d]", got, 7*depth, 49*depth)
	}
	if one := treeSens(t, 2000, 1, 285); one != bits.Len(2000) {
		t.Errorf("one participation: %d, want the depth %d", one, bits.Len(2000))
	}
	// A separation of the whole run leaves one participation, at any size.
	if got := treeSens(t, 1<<30, 50, 1<<30); got != 31 {
		t.Errorf("one participation in 2^30 steps: %d, want 31", got)
	}
	// A paper-sized one (Kairouz et al.'s CIFAR-10 runs: 100 epochs of 100
	// steps) is quick too.
	if got := treeSens(t, 10000, 100, 99); got < 100*bits.Len(10000) {
		t.Errorf("100 epochs: sensitivity² %d below 100 participations' depth", got)
	}
	for _, c := range [][3]int{{1 << 20, 1 << 20, 0}, {1 << 30, 2, 1 << 28}} {
		if _, err := dp.TreeZCDP(1, c[0], c[1], c[2]); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("T %d, k %d, b %d: %v, want a refusal", c[0], c[1], c[2], err)
		}
	}
}

func TestTreeAccountingInvalid(t *testing.T) {
	for _, z := range []float64{math.NaN(), -1, 0, math.Inf(1)} {
		if _, err := dp.TreeRestartZCDP(z, []int{10}); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("restart, z %v: %v", z, err)
		}
		if _, err := dp.TreeZCDP(z, 10, 2, 1); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("single tree, z %v: %v", z, err)
		}
	}
	for _, steps := range [][]int{nil, {}, {3, -1}, {1<<30 + 1}} {
		if _, err := dp.TreeRestartZCDP(1, steps); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("restart steps %v: %v", steps, err)
		}
	}
	for _, c := range [][3]int{{0, 1, 0}, {-3, 1, 0}, {1<<30 + 1, 1, 0}, {10, 0, 0}, {10, -1, 0}, {10, 1, -1}} {
		_, err := dp.TreeZCDP(1, c[0], c[1], c[2])
		if !errors.Is(err, dp.ErrInvalid) || !strings.HasPrefix(err.Error(), "dp: tree zcdp: ") {
			t.Errorf("single tree %v: %v", c, err)
		}
	}
}

// treeSecret is a fixed noise secret; testdata/tree's states carry its
// fingerprint.
func treeSecret() []byte {
	s := make([]byte, 32)
	for i := range s {
		s[i] = byte(i)
	}
	return s
}

func treeNew(t testing.TB, secret []byte, dim int, std float64, restart int) *dp.TreeNoise {
	t.Helper()
	tn, err := dp.NewTreeNoise(secret, dim, std, restart)
	if err != nil {
		t.Fatal(err)
	}
	return tn
}

// treeNodeNoise regenerates a node's noise from its documented label.
func treeNodeNoise(t *testing.T, secret []byte, tree, level, index, dim int, std float64) []float64 {
	t.Helper()
	src, err := dp.DerivedSource(secret, fmt.Sprintf("fleetlearn/dp/tree/%d/%d/%d", tree, level, index))
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float64, dim)
	for i := range v {
		v[i] = std * src.Normal()
	}
	return v
}

// treePrefixNoise is the noise on the prefix sum of rounds 1 … rounds: every
// finished tree's noise on all its rounds, and the current tree's on its
// rounds so far, each the sum of the dyadic blocks that tile the rounds
// from the left, largest first.
func treePrefixNoise(t *testing.T, secret []byte, dim int, std float64, restart, rounds int) []float64 {
	t.Helper()
	sum := make([]float64, dim)
	tile := func(tree, n int) {
		done := 0
		for l := bits.Len(uint(n)) - 1; l >= 0; l-- {
			if n-done >= 1<<l {
				for i, x := range treeNodeNoise(t, secret, tree, l, done>>l, dim, std) {
					sum[i] += x
				}
				done += 1 << l
			}
		}
	}
	if restart == 0 {
		tile(0, rounds)
		return sum
	}
	for tree := range rounds / restart {
		tile(tree, restart)
	}
	tile(rounds/restart, rounds%restart)
	return sum
}

// TestTreeNoiseDecomposition: the increments add up, round after round, to
// the noise of the nodes of the round's binary decomposition, with and
// without restarts.
func TestTreeNoiseDecomposition(t *testing.T) {
	secret := treeSecret()
	const dim, std = 17, 1.5
	for _, restart := range []int{0, 1, 7, 8} {
		tn := treeNew(t, secret, dim, std, restart)
		sum := make([]float64, dim)
		for round := 1; round <= 40; round++ {
			if err := tn.Next(sum); err != nil {
				t.Fatal(err)
			}
			if tn.Round() != round {
				t.Fatalf("Round() = %d after %d rounds", tn.Round(), round)
			}
			want := treePrefixNoise(t, secret, dim, std, restart, round)
			for i := range sum {
				if math.Abs(sum[i]-want[i]) > 1e-12*(1+math.Abs(want[i]))*float64(round) {
					t.Fatalf("restart %d, round %d, [%d]: increments add to %v, nodes to %v", restart, round, i, sum[i], want[i])
				}
			}
		}
	}
}

// treeIncrements returns rounds increments of tn, each into a zeroed vector.
func treeIncrements(t *testing.T, tn *dp.TreeNoise, dim, rounds int) [][]float64 {
	t.Helper()
	out := make([][]float64, rounds)
	for r := range out {
		out[r] = make([]float64, dim)
		if err := tn.Next(out[r]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestTreeNoiseResume: a server that stops after any round and resumes
// from the marshalled state and its secret noises the following rounds
// bit for bit as one that never stopped.
func TestTreeNoiseResume(t *testing.T) {
	secret := treeSecret()
	const dim, std, restart, rounds = 33, 0.7, 6, 25
	want := treeIncrements(t, treeNew(t, secret, dim, std, restart), dim, rounds)
	for _, stop := range []int{0, 1, 5, 6, 13, 24} {
		first := treeNew(t, secret, dim, std, restart)
		got := treeIncrements(t, first, dim, stop)
		state, err := first.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		// Parameters come from the state, whatever the constructor had.
		resumed := treeNew(t, secret, 1, 1, 0)
		if err := resumed.UnmarshalBinary(state); err != nil {
			t.Fatal(err)
		}
		if resumed.Round() != stop {
			t.Fatalf("resumed at round %d, want %d", resumed.Round(), stop)
		}
		got = append(got, treeIncrements(t, resumed, dim, rounds-stop)...)
		for r := range want {
			for i := range want[r] {
				if math.Float64bits(got[r][i]) != math.Float64bits(want[r][i]) {
					t.Fatalf("stopped after %d: round %d [%d]: %v, uninterrupted %v", stop, r+1, i, got[r][i], want[r][i])
				}
			}
		}
	}
	// Another secret cannot resume the state: its noise would not cancel.
	other := treeSecret()
	other[0] ^= 1
	state, _ := treeNew(t, secret, dim, std, restart).MarshalBinary()
	if err := treeNew(t, other, dim, std, restart).UnmarshalBinary(state); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("state resumed under another secret: %v", err)
	}
}

// TestTreeNoiseVariance: the noise on the prefix sum of t rounds has
// variance popcount(t)·σ² per value (each finished tree adding its own),
// checked on 200,000 values to 6 standard errors. The secret is fixed, so
// the outcome is too: the test cannot flake.
func TestTreeNoiseVariance(t *testing.T) {
	const dim, std = 200000, 0.8
	for _, c := range []struct{ restart, rounds int }{{0, 16}, {5, 12}} {
		tn := treeNew(t, treeSecret(), dim, std, c.restart)
		sum := make([]float64, dim)
		for round := 1; round <= c.rounds; round++ {
			if err := tn.Next(sum); err != nil {
				t.Fatal(err)
			}
			nodes := bits.OnesCount(uint(round))
			if c.restart > 0 {
				nodes = round/c.restart*bits.OnesCount(uint(c.restart)) + bits.OnesCount(uint(round%c.restart))
			}
			want := float64(nodes) * std * std
			// The mean is known to be 0, so Σx²/n has standard error
			// σ_t²·√(2/n) for Gaussian values.
			ss := 0.0
			for _, x := range sum {
				ss += x * x
			}
			got, se := ss/dim, want*math.Sqrt(2.0/dim)
			if math.Abs(got-want) > 6*se {
				t.Errorf("restart %d, round %d: variance %v, want %v ± %v", c.restart, round, got, want, 6*se)
			}
		}
	}
}

func TestTreeNoiseInvalid(t *testing.T) {
	secret := treeSecret()
	for _, c := range []struct {
		secret  []byte
		dim     int
		std     float64
		restart int
	}{
		{secret[:31], 4, 1, 0},
		{nil, 4, 1, 0},
		{secret, 0, 1, 0},
		{secret, -1, 1, 0},
		{secret, 1<<26 + 1, 1, 0},
		{secret, 4, math.NaN(), 0},
		{secret, 4, -1, 0},
		{secret, 4, 0, 0},
		{secret, 4, math.Inf(1), 0},
		{secret, 4, 1, -1},
	} {
		_, err := dp.NewTreeNoise(c.secret, c.dim, c.std, c.restart)
		if !errors.Is(err, dp.ErrInvalid) || !strings.HasPrefix(err.Error(), "dp: tree noise: ") {
			t.Errorf("secret of %d bytes, dim %d, std %v, restart %d: %v", len(c.secret), c.dim, c.std, c.restart, err)
		}
	}
	tn := treeNew(t, secret, 4, 1, 0)
	dst := []float64{1, 2, 3}
	if err := tn.Next(dst); !errors.Is(err, dp.ErrInvalid) || tn.Round() != 0 || dst[0] != 1 {
		t.Errorf("a short vector: %v, round %d, %v", err, tn.Round(), dst)
	}
	var zero dp.TreeNoise
	if err := zero.Next(make([]float64, 4)); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("a zero TreeNoise noised: %v", err)
	}
	if _, err := zero.MarshalBinary(); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("a zero TreeNoise marshalled: %v", err)
	}
	state, _ := tn.MarshalBinary()
	if err := zero.UnmarshalBinary(state); !errors.Is(err, dp.ErrInvalid) {
		t.Errorf("a state decoded without a secret: %v", err)
	}
	// The secret is copied: changing the caller's slice changes nothing.
	a, b := make([]float64, 4), make([]float64, 4)
	mine := treeSecret()
	tx := treeNew(t, mine, 4, 1, 0)
	mine[0] ^= 0xff
	_ = tx.Next(a)
	_ = treeNew(t, secret, 4, 1, 0).Next(b)
	if a[0] != b[0] {
		t.Error("the TreeNoise follows the caller's secret slice")
	}
}

// treeSeeds reads testdata/tree: states under treeSecret, named valid-*
// when they decode and bad-* when they must not.
func treeSeeds(t testing.TB) map[string][]byte {
	t.Helper()
	return seeds.Read(t, "tree", "*.bin")
}

// TestTreeNoiseSeeds: the stored states decode (or are refused) as their
// names say, and the valid ones re-encode to the same bytes.
func TestTreeNoiseSeeds(t *testing.T) {
	for name, data := range treeSeeds(t) {
		tn := treeNew(t, treeSecret(), 1, 1, 0)
		err := tn.UnmarshalBinary(data)
		switch {
		case strings.HasPrefix(name, "valid-"):
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if again, _ := tn.MarshalBinary(); !bytes.Equal(again, data) {
				t.Errorf("%s: re-encoded as %x", name, again)
			}
		case !errors.Is(err, dp.ErrInvalid):
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// A stored state decodes only into a valid state, canonically, and a
// refused one leaves the receiver as it was.
func FuzzTreeNoiseUnmarshal(f *testing.F) {
	for _, data := range treeSeeds(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tn := treeNew(t, treeSecret(), 3, 0.5, 4)
		before, _ := tn.MarshalBinary()
		if err := tn.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, dp.ErrInvalid) {
				t.Fatalf("refused without ErrInvalid: %v", err)
			}
			if after, _ := tn.MarshalBinary(); !bytes.Equal(after, before) {
				t.Fatalf("a refused state changed the receiver to %x", after)
			}
			return
		}
		again, err := tn.MarshalBinary()
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("accepted %x, re-encoded %x (%v)", data, again, err)
		}
		if err := tn.Next(nil); !errors.Is(err, dp.ErrInvalid) {
			t.Fatalf("an empty vector noised: %v", err)
		}
	})
}

// DP-FTRL accounting: TF-Privacy's StackOverflow figure, one tree of 1,600
// rounds at noise 1.13, and a federated schedule without restarts, 2,000
// rounds with each device in at most 7 of them, 285 rounds apart, at noise
// 10, both at δ = 1e-6.
func ExampleTreeZCDP() {
	rho, _ := dp.TreeRestartZCDP(1.13, []int{1600})
	eps, _, _ := dp.EpsilonFromZCDP(rho, 1e-6, nil)
	fmt.Printf("restart: ρ = %.4f, ε = %.2f\n", rho, eps)
	rho, _ = dp.TreeZCDP(10, 2000, 7, 285)
	eps, _, _ = dp.EpsilonFromZCDP(rho, 1e-6, nil)
	fmt.Printf("single tree: ρ = %.4f, ε = %.2f\n", rho, eps)
	// Output:
	// restart: ρ = 4.3073, ε = 18.71
	// single tree: ρ = 0.4550, ε = 4.95
}

// A server adds each round's increment to the round's sum of clipped
// updates, and after a restart resumes from the stored state and the
// secret it keeps elsewhere.
func ExampleTreeNoise() {
	secret := make([]byte, 32) // in production from crypto/rand, stored apart from the state
	const dim, clip, z = 3, 1.0, 1.1
	tn, _ := dp.NewTreeNoise(secret, dim, z*clip, 0)
	for range 5 {
		sum := make([]float64, dim) // the round's sum of clipped updates
		_ = tn.Next(sum)
	}
	state, _ := tn.MarshalBinary()

	resumed, _ := dp.NewTreeNoise(secret, dim, z*clip, 0)
	_ = resumed.UnmarshalBinary(state)
	a, b := make([]float64, dim), make([]float64, dim)
	_ = tn.Next(a)
	_ = resumed.Next(b)
	fmt.Println(resumed.Round(), a[0] == b[0] && a[1] == b[1] && a[2] == b[2])
	// Output: 6 true
}

// The single-tree program on schedules (rounds, cap, separation) from a
// small federated run to the largest table TreeZCDP accepts; and one
// round of tree noise on 100,000 values.
func BenchmarkTreeZCDP(b *testing.B) {
	for _, c := range [][3]int{{2000, 7, 285}, {10000, 100, 99}, {3000, 10, 300}, {8000, 2, 4000}, {20000, 15, 1000}, {1 << 16, 1 << 12, 0}} {
		b.Run(fmt.Sprintf("T%d-k%d-b%d", c[0], c[1], c[2]), func(b *testing.B) {
			for b.Loop() {
				if _, err := dp.TreeZCDP(1, c[0], c[1], c[2]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
