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

// decoded decodes what Compress sent, as the receiver does, and returns
// the values and the step (scale) of each.
func decoded(t testing.TB, bits int, b []byte, n int) (vals []float32, step []float64) {
	t.Helper()
	step = make([]float64, n)
	switch bits {
	case 8:
		q, err := quant.Decode(b, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range step {
			step[i] = float64(q.Scale(i))
		}
		return q.Dequantize(), step
	case 4:
		q, err := quant.Decode4(b, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range step {
			step[i] = float64(q.Scale(i))
		}
		return q.Dequantize(), step
	}
	t.Fatalf("bits %d", bits)
	return nil, nil
}

// TestFeedbackSum: over R rounds of the same x, what was sent sums to
// R·x − e_R up to the float32 rounding of x + e and of the new residual,
// the residual stays within one step of every coordinate, so the running
// mean of what was sent is within step/R of x; the receiver decodes
// exactly what Compress said it would.
func TestFeedbackSum(t *testing.T) {
	const n, rounds = 1001, 200
	x := randVec(rand.New(rand.NewPCG(11, 11)), n)
	for _, bits := range []int{8, 4} {
		var f quant.Feedback
		src := rand.NewPCG(12, uint64(bits))
		sum := make([]float64, n)
		tol := make([]float64, n)
		var maxStep float64
		for r := range rounds {
			prev := f.Residual()
			enc, sent, err := f.Compress(x, bits, 64, src)
			if err != nil {
				t.Fatal(err)
			}
			got, step := decoded(t, bits, enc, n)
			if !slices.Equal(got, sent) {
				t.Fatalf("%d bits, round %d: the receiver decodes other values than sent", bits, r)
			}
			e := f.Residual()
			for i := range x {
				y := x[i]
				if prev != nil {
					y += prev[i]
				}
				tol[i] += halfULP(y) + halfULP(e[i])
				if math.Abs(float64(e[i])) > step[i] {
					t.Fatalf("%d bits, round %d: residual %v at %d beyond the step %v", bits, r, e[i], i, step[i])
				}
				sum[i] += float64(sent[i])
				maxStep = max(maxStep, step[i])
			}
		}
		e := f.Residual()
		var worst float64
		for i, v := range x {
			want := rounds*float64(v) - float64(e[i])
			// Summing R float32 values in float64 adds its own rounding.
			slack := tol[i] + rounds*0x1p-52*math.Abs(sum[i])
			if d := math.Abs(sum[i] - want); d > slack {
				t.Errorf("%d bits, x[%d]: sum of sent %v, R·x − e_R %v, off by %.3g > %.3g", bits, i, sum[i], want, d, slack)
			}
			worst = max(worst, math.Abs(sum[i]/rounds-float64(v)))
		}
		if worst > (maxStep+1e-6)/rounds {
			t.Errorf("%d bits: running mean of %d rounds off by up to %.3g, over step/R = %.3g", bits, rounds, worst, maxStep/rounds)
		}
	}
}

// TestFeedbackBeatsPlain: the mean of R plain stochastic quantizations is
// unbiased only in expectation, off by about step/√R, while error feedback
// leaves it off by at most step/R.
func TestFeedbackBeatsPlain(t *testing.T) {
	const n, rounds = 4096, 100
	x := randVec(rand.New(rand.NewPCG(13, 13)), n)
	for _, bits := range []int{8, 4} {
		var f quant.Feedback
		fbSrc, plainSrc := rand.NewPCG(14, 1), rand.NewPCG(14, 2)
		fb, plain := make([]float64, n), make([]float64, n)
		for range rounds {
			_, sent, err := f.Compress(x, bits, 64, fbSrc)
			if err != nil {
				t.Fatal(err)
			}
			var once quant.Feedback // a fresh residual each round: plain quantization
			_, p, err := once.Compress(x, bits, 64, plainSrc)
			if err != nil {
				t.Fatal(err)
			}
			for i := range x {
				fb[i] += float64(sent[i])
				plain[i] += float64(p[i])
			}
		}
		fbErr, plainErr := relL2(fb, rounds, x), relL2(plain, rounds, x)
		t.Logf("%d bits, mean of %d rounds: relative L2 error %.3g with error feedback, %.3g without", bits, rounds, fbErr, plainErr)
		// step/R against step·0.4/√R: about 4 times better at R = 100.
		if !(fbErr*3 < plainErr) {
			t.Errorf("%d bits: error feedback %.3g, plain %.3g: want feedback well below", bits, fbErr, plainErr)
		}
	}
}

// relL2 returns ‖sum/k − x‖ / ‖x‖.
func relL2(sum []float64, k int, x []float32) float64 {
	var num, den float64
	for i, v := range x {
		d := sum[i]/float64(k) - float64(v)
		num += d * d
		den += float64(v) * float64(v)
	}
	return math.Sqrt(num / den)
}

// TestFeedbackPersist: a residual saved and restored between rounds gives
// the same encodings as one kept in memory.
func TestFeedbackPersist(t *testing.T) {
	x := randVec(rand.New(rand.NewPCG(15, 15)), 777)
	var kept, saved quant.Feedback
	srcKept, srcSaved := rand.NewPCG(16, 16), rand.NewPCG(16, 16)
	for r := range 6 {
		a, _, err := kept.Compress(x, 4, 100, srcKept)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := saved.Compress(x, 4, 100, srcSaved)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("round %d: restored residual encodes differently", r)
		}
		blob, err := saved.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if len(blob) != 9+4*len(x) {
			t.Fatalf("residual of %d values is %d bytes, want %d", len(x), len(blob), 9+4*len(x))
		}
		saved = quant.Feedback{}
		if err := saved.UnmarshalBinary(blob); err != nil {
			t.Fatal(err)
		}
		if again, _ := saved.MarshalBinary(); !bytes.Equal(again, blob) {
			t.Fatalf("round %d: restored residual re-encodes differently", r)
		}
	}
	// A fresh Feedback persists as empty and stays fresh.
	var fresh, back quant.Feedback
	blob, _ := fresh.MarshalBinary()
	if err := back.UnmarshalBinary(blob); err != nil || back.Len() != 0 || len(blob) != 9 {
		t.Errorf("fresh residual: %d bytes, restored with Len %d (%v)", len(blob), back.Len(), err)
	}
}

// TestFeedbackRefuses: bad arguments are refused with the right sentinel
// and leave the residual as it was, so the round can be retried.
func TestFeedbackRefuses(t *testing.T) {
	x := []float32{1, -2, 3, 0.25}
	var f quant.Feedback
	src := rand.NewPCG(17, 17)
	if _, _, err := f.Compress(x, 4, 2, src); err != nil {
		t.Fatal(err)
	}
	before := f.Residual()
	huge := slices.Clone(x)
	huge[0] = quant.MaxAbs
	for _, c := range []struct {
		name  string
		x     []float32
		bits  int
		block int
		rng   rand.Source
		want  error
	}{
		{"3 bits", x, 3, 2, src, quant.ErrConfig},
		{"16 bits", x, 16, 2, src, quant.ErrConfig},
		{"block 0", x, 4, 0, src, quant.ErrConfig},
		{"no source", x, 8, 2, nil, quant.ErrConfig},
		{"longer", append(slices.Clone(x), 1), 4, 2, src, quant.ErrShape},
		{"shorter", x[:3], 8, 2, src, quant.ErrShape},
		{"NaN", []float32{1, float32(math.NaN()), 0, 0}, 4, 2, src, quant.ErrRange},
		{"infinity", []float32{1, 0, float32(math.Inf(-1)), 0}, 8, 2, src, quant.ErrRange},
	} {
		if _, _, err := f.Compress(c.x, c.bits, c.block, c.rng); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
		if !slices.Equal(f.Residual(), before) {
			t.Fatalf("%s: refused round changed the residual", c.name)
		}
	}
	// x within MaxAbs but x + e beyond it.
	blob := []byte("FLEF\x01\x04\x00\x00\x00")
	blob = binary.LittleEndian.AppendUint32(blob, math.Float32bits(0x1p100))
	blob = append(blob, make([]byte, 12)...)
	var g quant.Feedback
	if err := g.UnmarshalBinary(blob); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Compress(huge, 8, 2, src); !errors.Is(err, quant.ErrRange) {
		t.Errorf("x + e beyond MaxAbs: err = %v, want ErrRange", err)
	}
	if g.Residual()[0] != 0x1p100 {
		t.Error("x + e beyond MaxAbs: refused round changed the residual")
	}
	// Reset starts over, for a model of another size.
	f.Reset()
	if _, _, err := f.Compress(x[:3], 8, 2, src); err != nil || f.Len() != 3 {
		t.Errorf("after Reset: Len %d, err %v", f.Len(), err)
	}
}

func TestFeedbackUnmarshalRefuses(t *testing.T) {
	good := []byte("FLEF\x01\x02\x00\x00\x00")
	good = binary.LittleEndian.AppendUint32(good, math.Float32bits(0.5))
	good = binary.LittleEndian.AppendUint32(good, math.Float32bits(-0.25))
	edit := func(f func(b []byte)) []byte { b := slices.Clone(good); f(b); return b }
	put32 := func(off int, v uint32) []byte {
		return edit(func(b []byte) { binary.LittleEndian.PutUint32(b[off:], v) })
	}
	var f quant.Feedback
	if err := f.UnmarshalBinary(good); err != nil || !slices.Equal(f.Residual(), []float32{0.5, -0.25}) {
		t.Fatalf("good residual: %v, %v", f.Residual(), err)
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header cut", good[:8]},
		{"body cut", good[:len(good)-1]},
		{"trailing byte", append(slices.Clone(good), 0)},
		{"magic", edit(func(b []byte) { b[0] = 'X' })},
		{"an update, not a residual", []byte("FLQ8\x01\x00\x00\x00\x00")},
		{"version", edit(func(b []byte) { b[4] = 2 })},
		{"length mismatch", put32(5, 3)},
		{"length beyond MaxLen", put32(5, 1<<31)},
		{"NaN", put32(9, 0x7fc00000)},
		{"infinity", put32(13, 0xff800000)},
		{"beyond MaxAbs", put32(9, math.Float32bits(math.Nextafter32(quant.MaxAbs, 2*quant.MaxAbs)))},
	} {
		if err := f.UnmarshalBinary(c.b); !errors.Is(err, quant.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", c.name, err)
		}
		if !slices.Equal(f.Residual(), []float32{0.5, -0.25}) {
			t.Fatalf("%s: refused residual changed the old one", c.name)
		}
	}
}

// FuzzFeedbackUnmarshal feeds arbitrary bytes to the residual decoder: it
// must refuse with ErrFormat and keep the old residual, or accept one that
// re-encodes to the same bytes and holds finite values within MaxAbs.
func FuzzFeedbackUnmarshal(f *testing.F) {
	var fb quant.Feedback
	if _, _, err := fb.Compress([]float32{1, -2, 3, 0.5, 0}, 4, 2, rand.NewPCG(0, 0)); err != nil {
		f.Fatal(err)
	}
	b, _ := fb.MarshalBinary()
	f.Add(b)
	f.Add(b[:len(b)-1])
	f.Add([]byte("FLEF\x01\x00\x00\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		old := []byte("FLEF\x01\x01\x00\x00\x00\x00\x00\x80\x3f") // [1]
		var fb quant.Feedback
		if err := fb.UnmarshalBinary(old); err != nil {
			t.Fatal(err)
		}
		if err := fb.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, quant.ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			if !slices.Equal(fb.Residual(), []float32{1}) {
				t.Fatal("refused residual changed the old one")
			}
			return
		}
		again, err := fb.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("accepted %x but re-encodes as %x (%v)", b, again, err)
		}
		for i, v := range fb.Residual() {
			if !(math.Abs(float64(v)) <= quant.MaxAbs) {
				t.Fatalf("accepted residual value %v at %d", v, i)
			}
		}
	})
}

// TestFeedbackFigures measures, at block 256 on 100,000 standard Gaussian
// values, the bytes per value of each encoding and the relative L2 error
// ‖x̂ − x‖/‖x‖ of one round and of the mean of 10 rounds of the same x,
// with and without error feedback. Run with -v for the table; the checks
// hold the figures to what the theory says they must be.
func TestFeedbackFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("quantizes 100,000 values 40 times; seconds under -race")
	}
	const n, rounds, block = 100_000, 10, quant.DefaultBlock
	r := rand.New(rand.NewPCG(21, 21))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	t.Logf("float32: 4.0000 bytes/value")
	for _, bits := range []int{8, 4} {
		var fb quant.Feedback
		fbSrc, plainSrc := rand.NewPCG(22, uint64(bits)), rand.NewPCG(23, uint64(bits))
		fbSum, plainSum := make([]float64, n), make([]float64, n)
		var one float64
		var size int
		var step []float64
		for k := range rounds {
			enc, sent, err := fb.Compress(x, bits, block, fbSrc)
			if err != nil {
				t.Fatal(err)
			}
			_, step = decoded(t, bits, enc, n)
			var plain quant.Feedback
			_, p, err := plain.Compress(x, bits, block, plainSrc)
			if err != nil {
				t.Fatal(err)
			}
			for i := range x {
				fbSum[i] += float64(sent[i])
				plainSum[i] += float64(p[i])
			}
			if k == 0 {
				size = len(enc)
				one = relL2(plainSum, 1, x)
			}
		}
		nb := (n + block - 1) / block
		want := 13 + 4*nb + n*bits/8
		if size != want {
			t.Errorf("%d bits: %d bytes, want %d", bits, size, want)
		}
		plainMean, fbMean := relL2(plainSum, rounds, x), relL2(fbSum, rounds, x)
		t.Logf("int%d: %.4f bytes/value (%g + 4/%d); relative L2 error: one round %.4f, mean of %d rounds %.4f without error feedback, %.4f with",
			bits, float64(size)/n, float64(bits)/8, block, one, rounds, plainMean, fbMean)
		// One round: stochastic rounding has variance p(1−p)·s², about
		// s²/6 on average, with s ≈ 2.9/k for the largest of 256 Gaussians.
		k := map[int]float64{8: 127, 4: 7}[bits]
		if predicted := 2.9 / k / math.Sqrt(6); one < predicted/2 || one > predicted*2 {
			t.Errorf("%d bits: one-round error %.4f, predicted about %.4f", bits, one, predicted)
		}
		// Independent rounds average the error down by √R.
		if ratio := plainMean / one; ratio < 0.8/math.Sqrt(rounds) || ratio > 1.25/math.Sqrt(rounds) {
			t.Errorf("%d bits: mean of %d plain rounds is %.3f of one round's error, want about 1/√%d", bits, rounds, ratio, rounds)
		}
		// Error feedback: within one step of the last round, over R.
		var bound, norm float64
		for i, v := range x {
			bound += step[i] * step[i]
			norm += float64(v) * float64(v)
		}
		if bound = math.Sqrt(bound/norm) / rounds; fbMean > bound || !(fbMean < plainMean) {
			t.Errorf("%d bits: error-feedback mean error %.4f, want under step/R = %.4f and under plain %.4f", bits, fbMean, bound, plainMean)
		}
	}
}
