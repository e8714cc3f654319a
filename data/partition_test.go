package data

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// synthLabels returns n labels over numClasses classes with unequal class
// frequencies, in random order.
func synthLabels(n, numClasses int, seed uint64) []uint8 {
	r := rand.New(rand.NewPCG(seed, 1))
	labels := make([]uint8, n)
	for i := range labels {
		// Squaring skews frequencies towards low classes.
		u := r.Float64()
		labels[i] = uint8(float64(numClasses) * u * u)
	}
	return labels
}

// checkCover fails unless parts is a disjoint cover of [0, n) with each
// part sorted.
func checkCover(t *testing.T, n int, parts [][]int) {
	t.Helper()
	seen := make([]bool, n)
	total := 0
	for c, p := range parts {
		if !slices.IsSorted(p) {
			t.Fatalf("client %d indices not sorted", c)
		}
		for _, i := range p {
			if i < 0 || i >= n {
				t.Fatalf("client %d holds index %d outside [0, %d)", c, i, n)
			}
			if seen[i] {
				t.Fatalf("index %d held twice", i)
			}
			seen[i] = true
		}
		total += len(p)
	}
	if total != n {
		t.Fatalf("parts hold %d indices, want %d", total, n)
	}
}

// meanEntropy is the average over clients of the entropy (nats) of each
// client's label distribution.
func meanEntropy(t *testing.T, labels []uint8, numClasses int, parts [][]int) float64 {
	t.Helper()
	hist, err := Stats(labels, numClasses, parts)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, h := range hist {
		total := 0
		for _, c := range h {
			total += c
		}
		for _, c := range h {
			if c > 0 {
				p := float64(c) / float64(total)
				sum -= p * math.Log(p)
			}
		}
	}
	return sum / float64(len(hist))
}

type partitioner struct {
	name string
	n    int
	run  func(seed uint64) ([][]int, error)
}

func partitioners() []partitioner {
	labels := synthLabels(5000, 10, 7)
	return []partitioner{
		{"IID", 1001, func(s uint64) ([][]int, error) { return IID(1001, 7, s) }},
		{"IID one client", 5, func(s uint64) ([][]int, error) { return IID(5, 1, s) }},
		{"IID client per example", 9, func(s uint64) ([][]int, error) { return IID(9, 9, s) }},
		{"Dirichlet", len(labels), func(s uint64) ([][]int, error) { return Dirichlet(labels, 10, 20, 0.5, s) }},
		{"Dirichlet small alpha", len(labels), func(s uint64) ([][]int, error) {
			return Dirichlet(labels, 10, 8, 0.05, s)
		}},
		{"Dirichlet min size", len(labels), func(s uint64) ([][]int, error) {
			return Dirichlet(labels, 10, 10, 1, s, WithMinSize(100))
		}},
		{"Dirichlet balanced", len(labels), func(s uint64) ([][]int, error) {
			return Dirichlet(labels, 10, 30, 0.1, s, WithSelfBalancing(true))
		}},
		{"Dirichlet min alpha", len(labels), func(s uint64) ([][]int, error) {
			return Dirichlet(labels, 10, 30, MinAlpha, s, WithMinSize(0))
		}},
		{"Dirichlet max alpha", len(labels), func(s uint64) ([][]int, error) { return Dirichlet(labels, 10, 30, MaxAlpha, s) }},
		{"Shards", len(labels), func(s uint64) ([][]int, error) { return Shards(labels, 25, 2, s) }},
		{"Shards uneven", 1003, func(s uint64) ([][]int, error) { return Shards(labels[:1003], 7, 3, s) }},
		{"Shards one per example", 12, func(s uint64) ([][]int, error) { return Shards(labels[:12], 4, 3, s) }},
	}
}

func TestPartitionProperties(t *testing.T) {
	for _, p := range partitioners() {
		t.Run(p.name, func(t *testing.T) {
			a, err := p.run(1)
			if err != nil {
				t.Fatal(err)
			}
			checkCover(t, p.n, a)

			again, err := p.run(1)
			if err != nil {
				t.Fatal(err)
			}
			if !equalParts(a, again) {
				t.Error("same seed gave different partitions")
			}

			other, err := p.run(2)
			if err != nil {
				t.Fatal(err)
			}
			checkCover(t, p.n, other)
			if len(a) > 1 && equalParts(a, other) {
				t.Error("seeds 1 and 2 gave the same partition")
			}
		})
	}
}

func equalParts(a, b [][]int) bool {
	return slices.EqualFunc(a, b, func(x, y []int) bool { return slices.Equal(x, y) })
}

func TestIIDSizes(t *testing.T) {
	for _, tc := range []struct{ n, clients int }{{10, 3}, {100, 10}, {101, 10}, {7, 7}} {
		parts, err := IID(tc.n, tc.clients, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(parts) != tc.clients {
			t.Fatalf("IID(%d, %d): %d parts", tc.n, tc.clients, len(parts))
		}
		lo, hi := tc.n, 0
		for _, p := range parts {
			lo, hi = min(lo, len(p)), max(hi, len(p))
		}
		if hi-lo > 1 {
			t.Errorf("IID(%d, %d): sizes range %d..%d", tc.n, tc.clients, lo, hi)
		}
	}
}

func TestDirichletSkew(t *testing.T) {
	labels := synthLabels(10000, 10, 11)
	iid, err := IID(len(labels), 20, 5)
	if err != nil {
		t.Fatal(err)
	}
	iidH := meanEntropy(t, labels, 10, iid)

	var prev float64
	for i, alpha := range []float64{0.05, 0.5, 100} {
		parts, err := Dirichlet(labels, 10, 20, alpha, 5)
		if err != nil {
			t.Fatal(err)
		}
		h := meanEntropy(t, labels, 10, parts)
		t.Logf("alpha %v: mean label entropy %.3f (IID %.3f)", alpha, h, iidH)
		if i > 0 && h <= prev {
			t.Errorf("alpha %v: entropy %.3f not above that of smaller alpha (%.3f)", alpha, h, prev)
		}
		prev = h
		switch {
		case alpha < 1 && h >= 0.8*iidH:
			t.Errorf("alpha %v: entropy %.3f shows little skew against IID %.3f", alpha, h, iidH)
		case alpha >= 100 && h < 0.95*iidH:
			t.Errorf("alpha %v: entropy %.3f far below IID %.3f", alpha, h, iidH)
		}
	}
}

func TestDirichletMinSize(t *testing.T) {
	labels := synthLabels(3000, 10, 3)
	for _, tc := range []struct {
		minSize   int
		balancing bool
	}{{1, false}, {40, false}, {100, true}} {
		parts, err := Dirichlet(labels, 10, 20, 0.3, 9, WithMinSize(tc.minSize), WithSelfBalancing(tc.balancing))
		if err != nil {
			t.Fatalf("min size %d: %v", tc.minSize, err)
		}
		for c, p := range parts {
			if len(p) < tc.minSize {
				t.Errorf("min size %d: client %d has %d", tc.minSize, c, len(p))
			}
		}
	}
}

func TestDirichletGivesUp(t *testing.T) {
	// With 2 classes and tiny alpha nearly every class lands on one client,
	// so 40 clients cannot all be served.
	labels := synthLabels(2000, 2, 3)
	_, err := Dirichlet(labels, 2, 40, 0.001, 1, WithMaxAttempts(25))
	if !errors.Is(err, ErrPartition) {
		t.Fatalf("Dirichlet error = %v, want ErrPartition", err)
	}
}

// Balancing only hands a class to clients under their fair share, so no
// client can exceed that share by more than one class's worth.
func TestDirichletSelfBalancing(t *testing.T) {
	labels := synthLabels(6000, 10, 5)
	hist, err := Stats(labels, 10, [][]int{seq(len(labels))})
	if err != nil {
		t.Fatal(err)
	}
	bound := len(labels)/30 + slices.Max(hist[0])
	parts, err := Dirichlet(labels, 10, 30, 0.1, 4, WithSelfBalancing(true))
	if err != nil {
		t.Fatal(err)
	}
	for c, p := range parts {
		if len(p) > bound {
			t.Errorf("client %d has %d examples, more than %d", c, len(p), bound)
		}
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestShardsFewLabels(t *testing.T) {
	// 10 classes of 100 cut into 20 shards of 50: every shard is one class,
	// so every client sees at most shardsPerClient classes.
	labels := make([]uint8, 1000)
	for i := range labels {
		labels[i] = uint8(i % 10)
	}
	parts, err := Shards(labels, 10, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	checkCover(t, len(labels), parts)
	hist, err := Stats(labels, 10, parts)
	if err != nil {
		t.Fatal(err)
	}
	for c, h := range hist {
		classes := 0
		for _, n := range h {
			if n > 0 {
				classes++
			}
		}
		if classes > 2 || len(parts[c]) != 100 {
			t.Errorf("client %d: %d examples over %d classes, want 100 over at most 2", c, len(parts[c]), classes)
		}
	}
}

func TestPartitionErrors(t *testing.T) {
	labels := synthLabels(100, 10, 1)
	tests := []struct {
		name string
		run  func() ([][]int, error)
	}{
		{"IID zero clients", func() ([][]int, error) { return IID(10, 0, 1) }},
		{"IID more clients than examples", func() ([][]int, error) { return IID(3, 4, 1) }},
		{"IID negative n", func() ([][]int, error) { return IID(-1, 1, 1) }},
		{"Dirichlet zero clients", func() ([][]int, error) { return Dirichlet(labels, 10, 0, 1, 1) }},
		{"Dirichlet zero classes", func() ([][]int, error) { return Dirichlet(labels, 0, 2, 1, 1) }},
		{"Dirichlet 257 classes", func() ([][]int, error) { return Dirichlet(labels, 257, 2, 1, 1) }},
		{"Dirichlet label out of range", func() ([][]int, error) { return Dirichlet(labels, 5, 2, 1, 1) }},
		{"Dirichlet alpha 0", func() ([][]int, error) { return Dirichlet(labels, 10, 2, 0, 1) }},
		{"Dirichlet alpha negative", func() ([][]int, error) { return Dirichlet(labels, 10, 2, -1, 1) }},
		{"Dirichlet alpha NaN", func() ([][]int, error) { return Dirichlet(labels, 10, 2, math.NaN(), 1) }},
		{"Dirichlet alpha Inf", func() ([][]int, error) { return Dirichlet(labels, 10, 2, math.Inf(1), 1) }},
		{"Dirichlet alpha too small", func() ([][]int, error) { return Dirichlet(labels, 10, 2, MinAlpha/2, 1) }},
		{"Dirichlet alpha too large", func() ([][]int, error) { return Dirichlet(labels, 10, 2, MaxAlpha*2, 1) }},
		{"Dirichlet negative min size", func() ([][]int, error) { return Dirichlet(labels, 10, 2, 1, 1, WithMinSize(-1)) }},
		{"Dirichlet zero attempts", func() ([][]int, error) { return Dirichlet(labels, 10, 2, 1, 1, WithMaxAttempts(0)) }},
		{"Dirichlet infeasible min size", func() ([][]int, error) { return Dirichlet(labels, 10, 10, 1, 1, WithMinSize(11)) }},
		{"Dirichlet no labels", func() ([][]int, error) { return Dirichlet(nil, 10, 1, 1, 1) }},
		{"Shards zero clients", func() ([][]int, error) { return Shards(labels, 0, 2, 1) }},
		{"Shards zero per client", func() ([][]int, error) { return Shards(labels, 2, 0, 1) }},
		{"Shards too many shards", func() ([][]int, error) { return Shards(labels, 51, 2, 1) }},
		{"Shards overflowing count", func() ([][]int, error) { return Shards(labels, math.MaxInt, math.MaxInt, 1) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parts, err := tt.run()
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("error = %v, want ErrInvalidArgument", err)
			}
			if parts != nil {
				t.Error("parts returned with error")
			}
		})
	}
}

func TestStats(t *testing.T) {
	labels := []uint8{0, 1, 1, 2, 2, 2}
	got, err := Stats(labels, 4, [][]int{{0, 1}, {2, 3, 4, 5}, nil})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{1, 1, 0, 0}, {0, 1, 3, 0}, {0, 0, 0, 0}}
	if !equalParts(got, want) {
		t.Errorf("Stats = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		numClasses int
		parts      [][]int
	}{
		{3, [][]int{{6}}},
		{3, [][]int{{-1}}},
		{2, [][]int{{3}}},
		{0, nil},
	} {
		if _, err := Stats(labels, tc.numClasses, tc.parts); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Stats(%d classes, %v) error = %v, want ErrInvalidArgument", tc.numClasses, tc.parts, err)
		}
	}
}

func BenchmarkDirichlet(b *testing.B) {
	labels := synthLabels(60000, 10, 1)
	for _, clients := range []int{10, 100} {
		b.Run(fmt.Sprint(clients, "clients"), func(b *testing.B) {
			for i := range b.N {
				if _, err := Dirichlet(labels, 10, clients, 0.5, uint64(i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
