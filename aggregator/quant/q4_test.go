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

func mustQuantize4(t testing.TB, x []float32, block int, seed uint64) quant.Quantized4 {
	t.Helper()
	q, err := quant.Quantize4(x, block, rand.NewPCG(seed, 0))
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestQ4ErrorBound: every code is in [−7, 7] and within one step of
// x/scale, so the dequantized value is within scale of x (plus its own
// float32 rounding); the scale is the smallest float32 ≥ max|x|/7.
func TestQ4ErrorBound(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	x := randVec(r, 1001) // four blocks, the last one short, odd length
	x[300] = 0
	x[301] = float32(math.SmallestNonzeroFloat32)
	x[302] = -quant.MaxAbs
	x[1000] = -x[999]
	for seed := range uint64(20) {
		q := mustQuantize4(t, x, quant.DefaultBlock, seed)
		deq := q.Dequantize()
		if q.Len() != len(x) || len(deq) != len(x) || q.Block() != quant.DefaultBlock {
			t.Fatalf("Len %d, Block %d, %d dequantized, want %d, %d, %d", q.Len(), q.Block(), len(deq), len(x), quant.DefaultBlock, len(x))
		}
		for i, v := range x {
			s, c := q.Scale(i), q.Code(i)
			if c < -7 || c > 7 {
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
	q := mustQuantize4(t, x, quant.DefaultBlock, 0)
	for lo := 0; lo < len(x); lo += quant.DefaultBlock {
		var m float64
		for _, v := range x[lo:min(lo+quant.DefaultBlock, len(x))] {
			m = max(m, math.Abs(float64(v)))
		}
		s := q.Scale(lo)
		below := math.Nextafter32(s, 0)
		if float64(s)*7 < m || float64(below)*7 >= m {
			t.Errorf("block at %d: scale %v for max %v, want the smallest float32 ≥ max/7", lo, s, m)
		}
	}
}

// TestQ4Unbiased: the mean of many independent dequantizations converges
// on x, within 6·scale/(2√K) for K draws (each rounding error has variance
// at most scale²/4), and a half-step value rounds both ways.
func TestQ4Unbiased(t *testing.T) {
	const n, draws = 512, 4000
	x := randVec(rand.New(rand.NewPCG(2, 2)), n)
	src := rand.NewPCG(7, 7)
	sum := make([]float64, n)
	for range draws {
		q, err := quant.Quantize4(x, 64, src)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range q.Dequantize() {
			sum[i] += float64(v)
		}
	}
	q := mustQuantize4(t, x, 64, 0)
	var bias float64
	for i, v := range x {
		s := float64(q.Scale(i))
		mean := sum[i] / draws
		if tol := 6 * s / (2 * math.Sqrt(draws)); math.Abs(mean-float64(v)) > tol {
			t.Errorf("x[%d] = %v: mean of %d dequantizations %v, off by %.3g > %.3g", i, v, draws, mean, mean-float64(v), tol)
		}
		bias += (mean - float64(v)) / s
	}
	if bias /= n; math.Abs(bias) > 6/(2*math.Sqrt(draws*n)) {
		t.Errorf("mean error over all values is %.4g scale steps, want about 0", bias)
	}
	half := []float32{7, 0.5}
	ups := 0
	for seed := range uint64(1000) {
		if mustQuantize4(t, half, 2, seed).Code(1) == 1 {
			ups++
		}
	}
	if ups < 400 || ups > 600 {
		t.Errorf("0.5 rounded up %d times in 1000, want about 500", ups)
	}
}

// TestQ4Layout pins the wire format: the header, the scales, then code 2j
// in the low nibble of byte j and code 2j+1 in the high one, a zero high
// nibble after an odd last code.
func TestQ4Layout(t *testing.T) {
	// Integral x/scale rounds the same way for every draw.
	q := mustQuantize4(t, []float32{7, -7, 0, 3, -7}, 4, 0)
	b, err := q.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("FLQ4\x01\x05\x00\x00\x00\x04\x00\x00\x00")
	want = binary.LittleEndian.AppendUint32(want, math.Float32bits(1))
	want = binary.LittleEndian.AppendUint32(want, math.Float32bits(1))
	want = append(want, 0x97, 0x30, 0x09)
	if !bytes.Equal(b, want) {
		t.Fatalf("encoding\n%x\nwant\n%x", b, want)
	}
	for i, c := range []int8{7, -7, 0, 3, -7} {
		if q.Code(i) != c {
			t.Errorf("code %d = %d, want %d", i, q.Code(i), c)
		}
	}
}

// TestQ4Size: 13 + 4·⌈n/block⌉ + ⌈n/2⌉ bytes, about 7.8 times smaller
// than float32 at block 256.
func TestQ4Size(t *testing.T) {
	const n = 1 << 20
	x := randVec(rand.New(rand.NewPCG(3, 3)), n)
	q := mustQuantize4(t, x, quant.DefaultBlock, 0)
	b, err := q.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if want := 13 + 4*(n/quant.DefaultBlock) + n/2; len(b) != want || q.EncodedLen() != want {
		t.Errorf("encoding is %d bytes (EncodedLen %d), want %d", len(b), q.EncodedLen(), want)
	}
	if ratio := float64(4*n) / float64(len(b)); ratio < 7.7 || ratio > 8 {
		t.Errorf("float32 / encoded = %.3f, want about 7.76", ratio)
	}
	for _, c := range []struct{ n, want int }{{1, 13 + 4 + 1}, {2, 13 + 4 + 1}, {257, 13 + 8 + 129}} {
		if got := mustQuantize4(t, x[:c.n], quant.DefaultBlock, 0).EncodedLen(); got != c.want {
			t.Errorf("%d values encode to %d bytes, want %d", c.n, got, c.want)
		}
	}
}

// TestQ4Deterministic: the same seed gives the same bytes, another seed
// other bytes, and the source advances by exactly one draw per value.
func TestQ4Deterministic(t *testing.T) {
	x := randVec(rand.New(rand.NewPCG(4, 4)), 3001)
	enc := func(seed uint64) []byte {
		b, err := mustQuantize4(t, x, 100, seed).MarshalBinary()
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
	if _, err := quant.Quantize4(x, 100, src); err != nil {
		t.Fatal(err)
	}
	for range x {
		ref.Uint64()
	}
	if src.Uint64() != ref.Uint64() {
		t.Error("Quantize4 did not draw exactly one value per element")
	}
}

func TestQ4ZeroBlock(t *testing.T) {
	x := make([]float32, 11)
	x[9] = float32(math.Copysign(0, -1))
	q := mustQuantize4(t, x, 4, 0)
	for i, v := range q.Dequantize() {
		if v != 0 || q.Scale(i) != 0 || q.Code(i) != 0 {
			t.Fatalf("zeros dequantize to %v at %d (scale %v, code %d)", v, i, q.Scale(i), q.Code(i))
		}
	}
}

func TestQuantize4Refuses(t *testing.T) {
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
		{"infinity", []float32{float32(math.Inf(1))}, 256, src, quant.ErrRange},
		{"beyond MaxAbs", []float32{math.Nextafter32(quant.MaxAbs, 2*quant.MaxAbs)}, 256, src, quant.ErrRange},
	} {
		if _, err := quant.Quantize4(c.x, c.block, c.rng); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := (quant.Quantized4{}).MarshalBinary(); !errors.Is(err, quant.ErrShape) {
		t.Errorf("encoding the zero value: err = %v, want ErrShape", err)
	}
}

func TestQ4RoundTrip(t *testing.T) {
	for _, n := range []int{1, 2, 699, 700} {
		x := randVec(rand.New(rand.NewPCG(6, uint64(n))), n)
		q := mustQuantize4(t, x, quant.DefaultBlock, 1)
		b, _ := q.MarshalBinary()
		got, err := quant.Decode4(b, n)
		if err != nil {
			t.Fatalf("%d values: %v", n, err)
		}
		if !slices.Equal(got.Dequantize(), q.Dequantize()) {
			t.Errorf("%d values: decoded values differ", n)
		}
		if again, _ := got.MarshalBinary(); !bytes.Equal(again, b) {
			t.Errorf("%d values: decoded value re-encodes differently", n)
		}
		if _, err := quant.Decode4(b, n+1); !errors.Is(err, quant.ErrShape) {
			t.Errorf("%d values: decode for another length: err = %v, want ErrShape", n, err)
		}
	}
	// The two formats do not pass for each other.
	b8, _ := mustQuantize(t, []float32{1, 2}, 2, 0).MarshalBinary()
	if _, err := quant.Decode4(b8, 2); !errors.Is(err, quant.ErrFormat) {
		t.Errorf("int8 encoding given to Decode4: err = %v, want ErrFormat", err)
	}
	b4, _ := mustQuantize4(t, []float32{1, 2}, 2, 0).MarshalBinary()
	if _, err := quant.Decode(b4, 2); !errors.Is(err, quant.ErrFormat) {
		t.Errorf("int4 encoding given to Decode: err = %v, want ErrFormat", err)
	}
}

func TestDecode4Refuses(t *testing.T) {
	// 5 values in blocks of 4: scales at 13 and 17, codes at 21..23, the
	// high nibble of 23 padding.
	q := mustQuantize4(t, []float32{1, -2, 3, 0.5, 7}, 4, 0)
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
		{"magic", edit(func(b []byte) { b[3] = '8' })},
		{"version", edit(func(b []byte) { b[4] = 2 })},
		{"zero length", put32(5, 0)},
		{"length beyond MaxLen", put32(5, 1<<31)},
		{"length mismatch", put32(5, 7)},
		{"block 0", put32(9, 0)},
		{"block too large", put32(9, quant.MaxBlock+1)},
		{"block mismatch", put32(9, 2)},
		{"negative scale", put32(13, math.Float32bits(-1))},
		{"negative zero scale", put32(13, 1<<31)},
		{"NaN scale", put32(13, 0x7fc00000)},
		{"infinite scale", put32(17, 0x7f800000)},
		{"oversized scale", put32(13, math.Float32bits(quant.MaxAbs))},
		{"code -8 low", edit(func(b []byte) { b[21] = b[21]&0xf0 | 0x08 })},
		{"code -8 high", edit(func(b []byte) { b[22] = b[22]&0x0f | 0x80 })},
		{"padding nibble", edit(func(b []byte) { b[23] |= 0x10 })},
		{"code in a zero block", edit(func(b []byte) {
			binary.LittleEndian.PutUint32(b[17:], 0)
		})},
	} {
		var got quant.Quantized4
		if err := got.UnmarshalBinary(c.b); !errors.Is(err, quant.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", c.name, err)
		}
		if got.Len() != 0 {
			t.Errorf("%s: refused encoding changed the value", c.name)
		}
	}
}

// FuzzDecode4 feeds arbitrary bytes to the 4-bit decoder: it must refuse
// with ErrFormat, or accept an encoding that re-encodes to the same bytes
// and dequantizes to finite values with codes in [−7, 7].
func FuzzDecode4(f *testing.F) {
	for _, x := range [][]float32{{1, -2, 3, 0.5, 0}, {0, 0, 0}, {quant.MaxAbs, -1e-30}, {-7}} {
		q := mustQuantize4(f, x, 2, 0)
		b, _ := q.MarshalBinary()
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var q quant.Quantized4
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
			if c := q.Code(i); c < -7 || c > 7 {
				t.Fatalf("accepted code %d at %d", c, i)
			}
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 2*quant.MaxAbs {
				t.Fatalf("accepted encoding dequantizes to %v at %d", v, i)
			}
		}
	})
}
