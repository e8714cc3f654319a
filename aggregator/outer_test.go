package aggregator_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator"
)

func mustOuter(t testing.TB, dim int, opts ...aggregator.Option) *aggregator.Outer {
	t.Helper()
	o, err := aggregator.NewOuter(dim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func randVec(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func TestOuterDefaults(t *testing.T) {
	o := mustOuter(t, 4)
	if o.LR() != 0.7 || o.Momentum() != 0.9 || o.Dim() != 4 || o.Steps() != 0 {
		t.Errorf("NewOuter(4) = lr %v, momentum %v, dim %d, steps %d; want 0.7, 0.9, 4, 0",
			o.LR(), o.Momentum(), o.Dim(), o.Steps())
	}
	o = mustOuter(t, 4, aggregator.WithServerLR(0.3), aggregator.WithMomentum(0), aggregator.WithTau(5))
	if o.LR() != 0.3 || o.Momentum() != 0 {
		t.Errorf("with options: lr %v, momentum %v; want 0.3, 0", o.LR(), o.Momentum())
	}
}

// TestOuterPlainIsAveraging: with μ = 0 and lr = 1 the outer step is plain
// (FedAvg) averaging of the islands' parameters, bit for bit.
func TestOuterPlainIsAveraging(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const dim = 1000
	for _, weights := range [][]float64{nil, {3, 1, 7, 120}} {
		theta := randVec(r, dim, 1)
		islands := make([][]float32, 4)
		for i := range islands {
			islands[i] = randVec(r, dim, 1)
			for j := range islands[i] {
				islands[i][j] += theta[j]
			}
		}
		w := weights
		if w == nil {
			w = []float64{1, 1, 1, 1}
		}
		want, err := aggregator.WeightedMean(islands, w)
		if err != nil {
			t.Fatal(err)
		}
		o := mustOuter(t, dim, aggregator.WithServerLR(1), aggregator.WithMomentum(0))
		for step := range 3 { // no state carries over with μ = 0
			if err := o.Step(theta, islands, weights); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(theta, want) {
				t.Fatalf("weights %v, step %d: outer step differs from WeightedMean", weights, step)
			}
		}
	}
}

// TestOuterNesterovByHand checks PyTorch's SGD(nesterov=True) recurrence on
// values exact in binary: lr 0.5, μ 0.5, θ₀ = 1, Δ = 1 then 1 then −2.
//
//	b₁ = 1,              θ₁ = 1 − 0.5·(1 + 0.5·1)      = 0.25
//	b₂ = 0.5 + 1 = 1.5,  θ₂ = 0.25 − 0.5·(1 + 0.75)    = −0.625
//	b₃ = 0.75 − 2,       θ₃ = −0.625 − 0.5·(−2 − 0.625) = 0.6875
func TestOuterNesterovByHand(t *testing.T) {
	o := mustOuter(t, 1, aggregator.WithServerLR(0.5), aggregator.WithMomentum(0.5))
	theta := []float32{1}
	for i, c := range []struct{ delta, theta, buf float32 }{
		{1, 0.25, 1}, {1, -0.625, 1.5}, {-2, 0.6875, -1.25},
	} {
		if err := o.Apply(theta, []float32{c.delta}); err != nil {
			t.Fatal(err)
		}
		if theta[0] != c.theta {
			t.Errorf("step %d: theta = %v, want %v", i+1, theta[0], c.theta)
		}
		state, _ := o.MarshalBinary()
		if b := math.Float32frombits(binary.LittleEndian.Uint32(state[21:])); b != c.buf {
			t.Errorf("step %d: momentum buffer = %v, want %v", i+1, b, c.buf)
		}
	}
	if o.Steps() != 3 {
		t.Errorf("Steps = %d, want 3", o.Steps())
	}
}

// TestOuterStepIsPseudoGradient: Step from the islands' parameters is Apply
// with Δ = θ − mean, to float32 rounding of Δ, and follows a float64
// reference of the Nesterov recurrence.
func TestOuterStepIsPseudoGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const dim, islands, steps = 200, 3, 5
	theta := randVec(r, dim, 1)
	ref := make([]float64, dim)
	buf := make([]float64, dim)
	for j := range ref {
		ref[j] = float64(theta[j])
	}
	o := mustOuter(t, dim)
	for range steps {
		params := make([][]float32, islands)
		for i := range params {
			params[i] = slices.Clone(theta)
			for j, d := range randVec(r, dim, 0.01) {
				params[i][j] -= d
			}
		}
		mean, err := aggregator.WeightedMean(params, []float64{1, 2, 3})
		if err != nil {
			t.Fatal(err)
		}
		for j := range ref {
			d := float64(theta[j]) - float64(mean[j])
			buf[j] = 0.9*buf[j] + d
			ref[j] -= 0.7 * (d + 0.9*buf[j])
		}
		if err := o.Step(theta, params, []float64{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		for j := range ref {
			if math.Abs(float64(theta[j])-ref[j]) > 1e-5*(1+math.Abs(ref[j])) {
				t.Fatalf("theta[%d] = %v, float64 reference %v", j, theta[j], ref[j])
			}
		}
	}
}

// TestOuterRestoreIsBitExact persists the state mid-run, restores it into a
// fresh optimizer, as after a server restart, and checks both continue
// identically.
func TestOuterRestoreIsBitExact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const dim = 64
	a := mustOuter(t, dim)
	ta := randVec(r, dim, 1)
	deltas := make([][]float32, 6)
	for i := range deltas {
		deltas[i] = randVec(r, dim, 0.1)
	}
	for _, d := range deltas[:3] {
		if err := a.Apply(ta, d); err != nil {
			t.Fatal(err)
		}
	}
	state, err := a.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(state) != 21+4*dim {
		t.Errorf("state is %d bytes, want %d", len(state), 21+4*dim)
	}
	b := mustOuter(t, dim)
	if err := b.UnmarshalBinary(state); err != nil {
		t.Fatal(err)
	}
	if b.Steps() != 3 {
		t.Errorf("restored Steps = %d, want 3", b.Steps())
	}
	tb := slices.Clone(ta)
	for _, d := range deltas[3:] {
		if err := a.Apply(ta, d); err != nil {
			t.Fatal(err)
		}
		if err := b.Apply(tb, d); err != nil {
			t.Fatal(err)
		}
	}
	for i := range ta {
		if math.Float32bits(ta[i]) != math.Float32bits(tb[i]) {
			t.Fatalf("theta[%d]: restored %v, uninterrupted %v", i, tb[i], ta[i])
		}
	}
	sa, _ := a.MarshalBinary()
	sb, _ := b.MarshalBinary()
	if !bytes.Equal(sa, sb) {
		t.Error("restored state diverged from the uninterrupted one")
	}
}

func TestNewOuterRefusesBadConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		dim  int
		opts []aggregator.Option
	}{
		{"zero dim", 0, nil},
		{"negative dim", -1, nil},
		{"zero lr", 3, []aggregator.Option{aggregator.WithServerLR(0)}},
		{"negative lr", 3, []aggregator.Option{aggregator.WithServerLR(-0.7)}},
		{"NaN lr", 3, []aggregator.Option{aggregator.WithServerLR(math.NaN())}},
		{"infinite lr", 3, []aggregator.Option{aggregator.WithServerLR(math.Inf(1))}},
		{"momentum 1", 3, []aggregator.Option{aggregator.WithMomentum(1)}},
		{"negative momentum", 3, []aggregator.Option{aggregator.WithMomentum(-0.1)}},
		{"NaN momentum", 3, []aggregator.Option{aggregator.WithMomentum(math.NaN())}},
	} {
		if _, err := aggregator.NewOuter(c.dim, c.opts...); !errors.Is(err, aggregator.ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", c.name, err)
		}
	}
}

// TestOuterRefusalsChangeNothing: every refused step leaves θ and the state
// as they were.
func TestOuterRefusalsChangeNothing(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	good := [][]float32{{1, 2}, {3, 4}}
	for _, c := range []struct {
		name    string
		theta   []float32
		islands [][]float32
		weights []float64
		want    error
	}{
		{"short theta", []float32{1}, good, nil, aggregator.ErrShape},
		{"short island", []float32{1, 2}, [][]float32{{1, 2}, {3}}, nil, aggregator.ErrShape},
		{"no islands", []float32{1, 2}, nil, nil, aggregator.ErrEmpty},
		{"weights mismatch", []float32{1, 2}, good, []float64{1}, aggregator.ErrConfig},
		{"zero weight", []float32{1, 2}, good, []float64{1, 0}, aggregator.ErrWeight},
		{"NaN weight", []float32{1, 2}, good, []float64{math.NaN(), 1}, aggregator.ErrWeight},
		{"NaN island", []float32{1, 2}, [][]float32{{1, nan}, {3, 4}}, nil, aggregator.ErrNonFinite},
		{"infinite theta", []float32{inf, 2}, good, nil, aggregator.ErrNonFinite},
		{"overflow", []float32{-math.MaxFloat32, 2}, [][]float32{{math.MaxFloat32, 2}}, nil, aggregator.ErrNonFinite},
	} {
		o := mustOuter(t, 2)
		warm := []float32{0, 0}
		if err := o.Apply(warm, []float32{0.5, -0.5}); err != nil {
			t.Fatal(err)
		}
		before, _ := o.MarshalBinary()
		theta := slices.Clone(c.theta)
		err := o.Step(theta, c.islands, c.weights)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
		if after, _ := o.MarshalBinary(); !bytes.Equal(before, after) {
			t.Errorf("%s: refused step changed the state", c.name)
		}
		for i := range theta {
			if math.Float32bits(theta[i]) != math.Float32bits(c.theta[i]) {
				t.Errorf("%s: refused step changed theta to %v", c.name, theta)
				break
			}
		}
	}
	o := mustOuter(t, 2)
	theta := []float32{1, 2}
	for _, d := range [][]float32{{1}, {nan, 0}, {0, -inf}} {
		if err := o.Apply(theta, d); err == nil {
			t.Errorf("Apply(%v) accepted", d)
		}
	}
	if theta[0] != 1 || theta[1] != 2 || o.Steps() != 0 {
		t.Errorf("refused Apply changed theta to %v or steps to %d", theta, o.Steps())
	}
}

func TestOuterUnmarshalRefusesBadState(t *testing.T) {
	o := mustOuter(t, 2)
	if err := o.Apply([]float32{0, 0}, []float32{0.5, -1}); err != nil {
		t.Fatal(err)
	}
	good, _ := o.MarshalBinary()
	edit := func(f func(b []byte)) []byte { b := slices.Clone(good); f(b); return b }
	wide, _ := mustOuter(t, 3).MarshalBinary()
	rule, _ := mustRule(t, aggregator.FedAvgM, 2).MarshalBinary()
	for _, c := range []struct {
		name  string
		state []byte
	}{
		{"empty", nil},
		{"header cut", good[:20]},
		{"vector cut", good[:len(good)-1]},
		{"trailing byte", append(slices.Clone(good), 0)},
		{"magic", edit(func(b []byte) { b[0] = 'X' })},
		{"rule state", rule},
		{"version", edit(func(b []byte) { b[4] = 2 })},
		{"dimension", wide},
		{"dimension field", edit(func(b []byte) { binary.LittleEndian.PutUint64(b[5:], 1<<62) })},
		{"NaN momentum", edit(func(b []byte) { binary.LittleEndian.PutUint32(b[21:], 0x7fc00000) })},
		{"infinite momentum", edit(func(b []byte) { binary.LittleEndian.PutUint32(b[25:], 0xff800000) })},
	} {
		fresh := mustOuter(t, 2)
		before, _ := fresh.MarshalBinary()
		if err := fresh.UnmarshalBinary(c.state); !errors.Is(err, aggregator.ErrState) {
			t.Errorf("%s: err = %v, want ErrState", c.name, err)
		}
		if after, _ := fresh.MarshalBinary(); !bytes.Equal(before, after) {
			t.Errorf("%s: refused state changed the optimizer", c.name)
		}
	}
}

// FuzzUnmarshalOuterState feeds arbitrary bytes to the outer state decoder:
// it must refuse with ErrState and no change, or accept state that
// re-encodes to the same bytes and steps to a finite θ or refuses to step.
func FuzzUnmarshalOuterState(f *testing.F) {
	const dim = 3
	o := mustOuter(f, dim)
	for range 2 {
		if err := o.Apply([]float32{1, 2, 3}, []float32{0.5, -0.25, 0.125}); err != nil {
			f.Fatal(err)
		}
		b, _ := o.MarshalBinary()
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte("FLDO\x01\x03\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		o := mustOuter(t, dim)
		before, _ := o.MarshalBinary()
		err := o.UnmarshalBinary(b)
		after, _ := o.MarshalBinary()
		if err != nil {
			if !errors.Is(err, aggregator.ErrState) {
				t.Fatalf("error %v does not wrap ErrState", err)
			}
			if !bytes.Equal(before, after) {
				t.Fatal("refused state changed the optimizer")
			}
			return
		}
		if !bytes.Equal(after, b) {
			t.Fatalf("accepted %x but re-encodes as %x", b, after)
		}
		theta := []float32{0, 0, 0}
		if err := o.Apply(theta, []float32{1e-3, -1e-3, 0}); err != nil && !errors.Is(err, aggregator.ErrNonFinite) {
			t.Fatalf("Apply after restore: %v", err)
		}
		for _, x := range theta {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("restored state stepped to %v", theta)
			}
		}
	})
}
