package quant_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
)

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		// Magnitudes spread over several octaves, so blocks differ in scale.
		x[i] = float32(r.NormFloat64() * math.Exp2(float64(r.IntN(8)-4)))
	}
	return x
}

func mustQuantize(t testing.TB, x []float32, block int, seed uint64) quant.Quantized {
	t.Helper()
	q, err := quant.Quantize(x, block, rand.NewPCG(seed, 0))
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// halfULP is half a unit in the last place of float32 x: the rounding of a
// dequantized value.
func halfULP(x float32) float64 {
	a := float32(math.Abs(float64(x)))
	return float64(math.Nextafter32(a, float32(math.Inf(1)))-a) / 2
}

// TestErrorBound: every code is within one step of x/scale, so the
// dequantized value is within scale of x (plus its own float32 rounding),
// and every code is in [−127, 127].
func TestErrorBound(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	x := randVec(r, 1000) // four blocks, the last one short
	x[300] = 0            // and a few exact values
	x[301] = float32(math.SmallestNonzeroFloat32)
	x[302] = -quant.MaxAbs
	for seed := range uint64(20) {
		q := mustQuantize(t, x, quant.DefaultBlock, seed)
		deq := q.Dequantize()
		if q.Len() != len(x) || len(deq) != len(x) || q.Block() != quant.DefaultBlock {
			t.Fatalf("Len %d, Block %d, %d dequantized, want %d, %d, %d", q.Len(), q.Block(), len(deq), len(x), quant.DefaultBlock, len(x))
		}
		for i, v := range x {
			s, c := q.Scale(i), q.Code(i)
			if c < -127 {
				t.Fatalf("x[%d]: code %d", i, c)
			}
			if e := math.Abs(float64(v) - float64(c)*float64(s)); !(e < float64(s)) && !(e == 0) {
				t.Fatalf("x[%d] = %v: code %d × scale %v is %v away, not under the scale", i, v, c, s, e)
			}
			if e := math.Abs(float64(v) - float64(deq[i])); e > float64(s)+halfULP(deq[i]) {
				t.Fatalf("x[%d] = %v dequantizes to %v, %v away, over the scale %v", i, v, deq[i], e, s)
			}
		}
	}
	// The scale is max|x|/127 per block, rounded up no further than one
	// float32 step.
	q := mustQuantize(t, x, quant.DefaultBlock, 0)
	for lo := 0; lo < len(x); lo += quant.DefaultBlock {
		var m float64
		for _, v := range x[lo:min(lo+quant.DefaultBlock, len(x))] {
			m = max(m, math.Abs(float64(v)))
		}
		s := q.Scale(lo)
		below := math.Nextafter32(s, 0)
		if float64(s)*127 < m || float64(below)*127 >= m {
			t.Errorf("block at %d: scale %v for max %v, want the smallest float32 ≥ max/127", lo, s, m)
		}
	}
}

// TestUnbiased: the mean of many independent dequantizations converges on
// x. Each value's rounding error has variance at most scale²/4, so over K
// draws the mean is within 6·scale/(2√K) of x except with negligible
// probability (and the seeds are fixed).
func TestUnbiased(t *testing.T) {
	const n, draws = 512, 4000
	r := rand.New(rand.NewPCG(2, 2))
	x := randVec(r, n)
	src := rand.NewPCG(7, 7)
	sum := make([]float64, n)
	for range draws {
		q, err := quant.Quantize(x, 64, src)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range q.Dequantize() {
			sum[i] += float64(v)
		}
	}
	q := mustQuantize(t, x, 64, 0)
	var bias float64
	for i, v := range x {
		s := float64(q.Scale(i))
		mean := sum[i] / draws
		if tol := 6 * s / (2 * math.Sqrt(draws)); math.Abs(mean-float64(v)) > tol {
			t.Errorf("x[%d] = %v: mean of %d dequantizations %v, off by %.3g > %.3g", i, v, draws, mean, mean-float64(v), tol)
		}
		bias += (mean - float64(v)) / s
	}
	// Averaged over all values, in units of their scale, a systematic
	// bias of half a percent of a step would show.
	if bias /= n; math.Abs(bias) > 6/(2*math.Sqrt(draws*n)) {
		t.Errorf("mean error over all values is %.4g scale steps, want about 0", bias)
	}
	// Round-to-nearest would fail the test above; check the rounding is
	// stochastic: a value halfway between two codes goes both ways.
	half := []float32{127, 0.5}
	ups := 0
	for seed := range uint64(1000) {
		if mustQuantize(t, half, 2, seed).Code(1) == 1 {
			ups++
		}
	}
	if ups < 400 || ups > 600 {
		t.Errorf("0.5 rounded up %d times in 1000, want about 500", ups)
	}
}

// TestSize: the encoding is 13 + 4·⌈n/block⌉ + n bytes, about 4 times
// smaller than float32.
func TestSize(t *testing.T) {
	const n = 1 << 20
	x := randVec(rand.New(rand.NewPCG(3, 3)), n)
	q := mustQuantize(t, x, quant.DefaultBlock, 0)
	b, err := q.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if want := 13 + 4*(n/quant.DefaultBlock) + n; len(b) != want || q.EncodedLen() != want {
		t.Errorf("encoding is %d bytes (EncodedLen %d), want %d", len(b), q.EncodedLen(), want)
	}
	if ratio := float64(4*n) / float64(len(b)); ratio < 3.9 || ratio > 4 {
		t.Errorf("float32 / encoded = %.3f, want about 3.94", ratio)
	}
	// A short tail block still costs a whole scale.
	if got := mustQuantize(t, x[:257], quant.DefaultBlock, 0).EncodedLen(); got != 13+8+257 {
		t.Errorf("257 values encode to %d bytes, want %d", got, 13+8+257)
	}
}

// TestDeterministic: the same seed gives the same bytes, another seed other
// bytes, and the source advances by exactly one draw per value.
func TestDeterministic(t *testing.T) {
	x := randVec(rand.New(rand.NewPCG(4, 4)), 3000)
	enc := func(seed uint64) []byte {
		b, err := mustQuantize(t, x, 100, seed).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.Equal(enc(9), enc(9)) {
		t.Error("same seed, different encodings")
	}
	if bytes.Equal(enc(9), enc(10)) {
		t.Error("different seeds, same encoding")
	}
	src, ref := rand.NewPCG(5, 5), rand.NewPCG(5, 5)
	if _, err := quant.Quantize(x, 100, src); err != nil {
		t.Fatal(err)
	}
	for range x {
		ref.Uint64()
	}
	if src.Uint64() != ref.Uint64() {
		t.Error("Quantize did not draw exactly one value per element")
	}
}

func TestZeroBlock(t *testing.T) {
	x := make([]float32, 10)
	x[9] = float32(math.Copysign(0, -1))
	q := mustQuantize(t, x, 4, 0)
	for i, v := range q.Dequantize() {
		if v != 0 || q.Scale(i) != 0 || q.Code(i) != 0 {
			t.Fatalf("zeros dequantize to %v at %d (scale %v, code %d)", v, i, q.Scale(i), q.Code(i))
		}
	}
}

func TestQuantizeRefuses(t *testing.T) {
	src := rand.NewPCG(0, 0)
	for _, c := range []struct {
		name  string
		x     []float32
		block int
		rng   rand.Source
		want  error
	}{
		{"empty", nil, 256, src, quant.ErrShape},
		{"block 0", []float32{1}, 0, src, quant.ErrConfig},
		{"block too large", []float32{1}, quant.MaxBlock + 1, src, quant.ErrConfig},
		{"no source", []float32{1}, 256, nil, quant.ErrConfig},
		{"NaN", []float32{1, float32(math.NaN())}, 256, src, quant.ErrRange},
		{"infinity", []float32{float32(math.Inf(-1))}, 256, src, quant.ErrRange},
		{"beyond MaxAbs", []float32{math.Nextafter32(quant.MaxAbs, 2*quant.MaxAbs)}, 256, src, quant.ErrRange},
	} {
		if _, err := quant.Quantize(c.x, c.block, c.rng); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := (quant.Quantized{}).MarshalBinary(); !errors.Is(err, quant.ErrShape) {
		t.Errorf("encoding the zero value: err = %v, want ErrShape", err)
	}
}

func TestRoundTrip(t *testing.T) {
	x := randVec(rand.New(rand.NewPCG(6, 6)), 700)
	q := mustQuantize(t, x, quant.DefaultBlock, 1)
	b, _ := q.MarshalBinary()
	got, err := quant.Decode(b, len(x))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Dequantize(), q.Dequantize()) {
		t.Error("decoded values differ")
	}
	if again, _ := got.MarshalBinary(); !bytes.Equal(again, b) {
		t.Error("decoded value re-encodes differently")
	}
	if _, err := quant.Decode(b, len(x)+1); !errors.Is(err, quant.ErrShape) {
		t.Errorf("decode for another length: err = %v, want ErrShape", err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	// 5 values in blocks of 4: scales at 13 and 17, codes at 21..25.
	q := mustQuantize(t, []float32{1, -2, 3, 0.5, 0}, 4, 0)
	good, _ := q.MarshalBinary()
	edit := func(f func(b []byte)) []byte { b := slices.Clone(good); f(b); return b }
	put32 := func(off int, v uint32) []byte {
		return edit(func(b []byte) { binary.LittleEndian.PutUint32(b[off:], v) })
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header cut", good[:12]},
		{"body cut", good[:len(good)-1]},
		{"trailing byte", append(slices.Clone(good), 0)},
		{"magic", edit(func(b []byte) { b[3] = '4' })},
		{"version", edit(func(b []byte) { b[4] = 2 })},
		{"zero length", put32(5, 0)},
		{"length beyond MaxLen", put32(5, 1<<31)},
		{"length mismatch", put32(5, 6)},
		{"block 0", put32(9, 0)},
		{"block too large", put32(9, quant.MaxBlock+1)},
		{"block mismatch", put32(9, 5)},
		{"negative scale", put32(13, math.Float32bits(-1))},
		{"negative zero scale", put32(13, 1<<31)},
		{"NaN scale", put32(13, 0x7fc00000)},
		{"infinite scale", put32(17, 0x7f800000)},
		{"oversized scale", put32(13, math.Float32bits(quant.MaxAbs))},
		{"code -128", edit(func(b []byte) { b[22] = 0x80 })},
		{"code in a zero block", edit(func(b []byte) {
			binary.LittleEndian.PutUint32(b[17:], 0)
			b[25] = 1
		})},
	} {
		var got quant.Quantized
		if err := got.UnmarshalBinary(c.b); !errors.Is(err, quant.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", c.name, err)
		}
		if got.Len() != 0 {
			t.Errorf("%s: refused encoding changed the value", c.name)
		}
	}
}

// FuzzDecode feeds arbitrary bytes to the decoder: it must refuse with
// ErrFormat, or accept an encoding that re-encodes to the same bytes and
// dequantizes to finite values.
func FuzzDecode(f *testing.F) {
	for _, x := range [][]float32{{1, -2, 3, 0.5, 0}, {0, 0, 0}, {quant.MaxAbs, -1e-30}} {
		q := mustQuantize(f, x, 2, 0)
		b, _ := q.MarshalBinary()
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte("FLQ8\x01\x01\x00\x00\x00\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var q quant.Quantized
		if err := q.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, quant.ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			if q.Len() != 0 {
				t.Fatal("refused encoding changed the value")
			}
			return
		}
		again, err := q.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("accepted %x but re-encodes as %x (%v)", b, again, err)
		}
		for i, v := range q.Dequantize() {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 2*quant.MaxAbs {
				t.Fatalf("accepted encoding dequantizes to %v at %d", v, i)
			}
		}
	})
}
