package kernel_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/floats"
	"github.com/fleetlearn/fleetlearn/model/kernel"
)

func cloneMat(m kernel.Mat) kernel.Mat {
	return kernel.Mat{Rows: m.Rows, Cols: m.Cols, Data: slices.Clone(m.Data)}
}

func ids(vs ...float32) kernel.Mat { return kernel.Mat{Rows: len(vs), Cols: 1, Data: vs} }

// weighted is Σ w·y in float64: a loss whose gradient with respect to y is w.
func weighted(w, y kernel.Mat) float64 {
	var s float64
	for i, v := range y.Vals() {
		s += float64(w.Data[i]) * float64(v)
	}
	return s
}

// checkGrad compares analytic with central differences of loss in every
// value of vals. The step is the one float32 actually takes, so rounding of
// vals±h does not bias the quotient.
func checkGrad(t *testing.T, name string, vals, analytic []float32, loss func() float64, h, tol float64) {
	t.Helper()
	for i, orig := range vals {
		up, down := orig+float32(h), orig-float32(h)
		vals[i] = up
		lu := loss()
		vals[i] = down
		ld := loss()
		vals[i] = orig
		num := (lu - ld) / (float64(up) - float64(down))
		if a := float64(analytic[i]); math.Abs(num-a) > tol*(1+math.Abs(a)) {
			t.Errorf("%s: gradient[%d] = %v, central difference %v", name, i, a, num)
		}
	}
}

func TestTransformerArgumentErrors(t *testing.T) {
	m := func(r, c int) kernel.Mat { return kernel.NewMat(r, c) }
	short := kernel.Mat{Rows: 4, Cols: 4, Data: make([]float32, 3)}
	ln := func(x, g, b, y, mean, rstd kernel.Mat, eps float32) error {
		return kernel.LayerNorm(x, g, b, y, mean, rstd, eps)
	}
	lng := func(dy, x, g, mean, rstd, dx, dg, db kernel.Mat) error {
		return kernel.LayerNormGrad(dy, x, g, mean, rstd, dx, dg, db)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"embedding ids two columns", kernel.Embedding(m(5, 3), m(2, 2), m(2, 3)), kernel.ErrShape},
		{"embedding ids rows", kernel.Embedding(m(5, 3), ids(0, 1, 2), m(2, 3)), kernel.ErrShape},
		{"embedding out cols", kernel.Embedding(m(5, 3), ids(0, 1), m(2, 4)), kernel.ErrShape},
		{"embedding short table", kernel.Embedding(short, ids(0), m(1, 4)), kernel.ErrShape},
		{"embedding negative out", kernel.Embedding(m(5, 3), ids(0), kernel.Mat{Rows: -1, Cols: 3}), kernel.ErrShape},
		{"embedding_grad ids rows", kernel.EmbeddingGrad(m(2, 3), ids(0), m(5, 3)), kernel.ErrShape},
		{"embedding_grad cols", kernel.EmbeddingGrad(m(2, 3), ids(0, 1), m(5, 4)), kernel.ErrShape},
		{"embedding_grad short dout", kernel.EmbeddingGrad(short, ids(0, 1, 2, 3), m(5, 4)), kernel.ErrShape},
		{"layer_norm y shape", ln(m(2, 3), m(1, 3), m(1, 3), m(3, 2), m(2, 1), m(2, 1), 1e-5), kernel.ErrShape},
		{"layer_norm gamma", ln(m(2, 3), m(1, 2), m(1, 3), m(2, 3), m(2, 1), m(2, 1), 1e-5), kernel.ErrShape},
		{"layer_norm beta", ln(m(2, 3), m(1, 3), m(1, 4), m(2, 3), m(2, 1), m(2, 1), 1e-5), kernel.ErrShape},
		{"layer_norm mean", ln(m(2, 3), m(1, 3), m(1, 3), m(2, 3), m(1, 1), m(2, 1), 1e-5), kernel.ErrShape},
		{"layer_norm rstd", ln(m(2, 3), m(1, 3), m(1, 3), m(2, 3), m(2, 1), m(3, 1), 1e-5), kernel.ErrShape},
		{"layer_norm no columns", ln(m(2, 0), m(1, 0), m(1, 0), m(2, 0), m(2, 1), m(2, 1), 1e-5), kernel.ErrShape},
		{"layer_norm short x", ln(short, m(1, 4), m(1, 4), m(4, 4), m(4, 1), m(4, 1), 1e-5), kernel.ErrShape},
		{"layer_norm eps 0", ln(m(2, 3), m(1, 3), m(1, 3), m(2, 3), m(2, 1), m(2, 1), 0), kernel.ErrArgument},
		{"layer_norm eps negative", ln(m(2, 3), m(1, 3), m(1, 3), m(2, 3), m(2, 1), m(2, 1), -1e-5), kernel.ErrArgument},
		{"layer_norm eps above 1", ln(m(2, 3), m(1, 3), m(1, 3), m(2, 3), m(2, 1), m(2, 1), 2), kernel.ErrArgument},
		{"layer_norm eps NaN", ln(m(2, 3), m(1, 3), m(1, 3), m(2, 3), m(2, 1), m(2, 1), float32(math.NaN())), kernel.ErrArgument},
		{"layer_norm_grad dy", lng(m(2, 2), m(2, 3), m(1, 3), m(2, 1), m(2, 1), m(2, 3), m(1, 3), m(1, 3)), kernel.ErrShape},
		{"layer_norm_grad dx", lng(m(2, 3), m(2, 3), m(1, 3), m(2, 1), m(2, 1), m(3, 3), m(1, 3), m(1, 3)), kernel.ErrShape},
		{"layer_norm_grad gamma", lng(m(2, 3), m(2, 3), m(1, 2), m(2, 1), m(2, 1), m(2, 3), m(1, 3), m(1, 3)), kernel.ErrShape},
		{"layer_norm_grad mean", lng(m(2, 3), m(2, 3), m(1, 3), m(3, 1), m(2, 1), m(2, 3), m(1, 3), m(1, 3)), kernel.ErrShape},
		{"layer_norm_grad rstd", lng(m(2, 3), m(2, 3), m(1, 3), m(2, 1), m(1, 1), m(2, 3), m(1, 3), m(1, 3)), kernel.ErrShape},
		{"layer_norm_grad dgamma", lng(m(2, 3), m(2, 3), m(1, 3), m(2, 1), m(2, 1), m(2, 3), m(1, 4), m(1, 3)), kernel.ErrShape},
		{"layer_norm_grad dbeta", lng(m(2, 3), m(2, 3), m(1, 3), m(2, 1), m(2, 1), m(2, 3), m(1, 3), m(1, 1)), kernel.ErrShape},
		{"layer_norm_grad short dy", lng(short, m(4, 4), m(1, 4), m(4, 1), m(4, 1), m(4, 4), m(1, 4), m(1, 4)), kernel.ErrShape},
		{"gelu shape", kernel.GELU(m(2, 3), m(3, 2)), kernel.ErrShape},
		{"gelu short", kernel.GELU(short, m(4, 4)), kernel.ErrShape},
		{"gelu_grad x", kernel.GELUGrad(m(2, 3), m(2, 2), m(2, 3)), kernel.ErrShape},
		{"gelu_grad dx", kernel.GELUGrad(m(2, 3), m(2, 3), m(1, 3)), kernel.ErrShape},
		{"softmax shape", kernel.Softmax(m(2, 3), m(2, 2), 0), kernel.ErrShape},
		{"softmax causal columns", kernel.Softmax(m(8, 4), m(8, 4), 3), kernel.ErrShape},
		{"softmax causal negative", kernel.Softmax(m(8, 4), m(8, 4), -4), kernel.ErrArgument},
		{"softmax short", kernel.Softmax(short, m(4, 4), 4), kernel.ErrShape},
		{"softmax_grad y", kernel.SoftmaxGrad(m(2, 3), m(3, 3), m(2, 3)), kernel.ErrShape},
		{"softmax_grad dx", kernel.SoftmaxGrad(m(2, 3), m(2, 3), m(2, 4)), kernel.ErrShape},
		{"batched_gemm batch 0", kernel.BatchedGemm(false, false, 1, m(4, 3), m(6, 2), 0, m(4, 2), 0), kernel.ErrArgument},
		{"batched_gemm batch negative", kernel.BatchedGemm(false, false, 1, m(4, 3), m(6, 2), 0, m(4, 2), -2), kernel.ErrArgument},
		{"batched_gemm A rows", kernel.BatchedGemm(false, false, 1, m(5, 3), m(6, 3), 0, m(4, 3), 2), kernel.ErrShape},
		{"batched_gemm B rows", kernel.BatchedGemm(false, false, 1, m(4, 3), m(7, 3), 0, m(4, 3), 2), kernel.ErrShape},
		{"batched_gemm C rows", kernel.BatchedGemm(false, false, 1, m(4, 3), m(6, 3), 0, m(5, 3), 2), kernel.ErrShape},
		{"batched_gemm inner", kernel.BatchedGemm(false, false, 1, m(4, 3), m(8, 2), 0, m(4, 2), 2), kernel.ErrShape},
		{"batched_gemm out", kernel.BatchedGemm(false, true, 1, m(4, 3), m(8, 3), 0, m(4, 3), 2), kernel.ErrShape},
		{"batched_gemm short", kernel.BatchedGemm(false, false, 1, short, m(8, 4), 0, m(4, 4), 2), kernel.ErrShape},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
}

// TestEmbeddingIDErrors checks that ids which are not row indices are refused
// and that a refused call leaves its output untouched, even when the bad id
// comes after good ones.
func TestEmbeddingIDErrors(t *testing.T) {
	table := kernel.Mat{Rows: 3, Cols: 2, Data: []float32{1, 2, 3, 4, 5, 6}}
	for _, bad := range []float32{3, -1, 0.5, 1e30, float32(math.NaN()), float32(math.Inf(1))} {
		out := kernel.Mat{Rows: 2, Cols: 2, Data: []float32{7, 7, 7, 7}}
		if err := kernel.Embedding(table, ids(1, bad), out); !errors.Is(err, kernel.ErrLabel) {
			t.Errorf("id %v: embedding got %v, want ErrLabel", bad, err)
		}
		if !slices.Equal(out.Data, []float32{7, 7, 7, 7}) {
			t.Errorf("id %v: refused embedding wrote %v", bad, out.Data)
		}
		dtable := kernel.NewMat(3, 2)
		dout := kernel.Mat{Rows: 2, Cols: 2, Data: []float32{1, 1, 1, 1}}
		if err := kernel.EmbeddingGrad(dout, ids(0, bad), dtable); !errors.Is(err, kernel.ErrLabel) {
			t.Errorf("id %v: embedding_grad got %v, want ErrLabel", bad, err)
		}
		if kernel.Norm2(dtable) != 0 {
			t.Errorf("id %v: refused embedding_grad wrote %v", bad, dtable.Data)
		}
	}
}

func TestEmbedding(t *testing.T) {
	table := kernel.Mat{Rows: 3, Cols: 2, Data: []float32{1, 2, 3, 4, 5, 6}}
	tok := ids(2, 0, 2)
	out := kernel.NewMat(3, 2)
	if err := kernel.Embedding(table, tok, out); err != nil || !slices.Equal(out.Data, []float32{5, 6, 1, 2, 5, 6}) {
		t.Fatalf("embedding %v %v", out.Data, err)
	}
	// Repeated ids accumulate, and the call adds to what dtable held.
	dtable := kernel.Mat{Rows: 3, Cols: 2, Data: []float32{0, 0, 10, 10, 0, 0}}
	dout := kernel.Mat{Rows: 3, Cols: 2, Data: []float32{1, 2, 3, 4, 5, 6}}
	if err := kernel.EmbeddingGrad(dout, tok, dtable); err != nil || !slices.Equal(dtable.Data, []float32{3, 4, 10, 10, 6, 8}) {
		t.Fatalf("embedding_grad %v %v", dtable.Data, err)
	}

	r := rand.New(rand.NewPCG(5, 6))
	table, w := randMat(r, 4, 3), randMat(r, 5, 3)
	tok = ids(3, 1, 3, 0, 3)
	out = kernel.NewMat(5, 3)
	dtable = kernel.NewMat(4, 3)
	if err := kernel.EmbeddingGrad(w, tok, dtable); err != nil {
		t.Fatal(err)
	}
	checkGrad(t, "embedding table", table.Data, dtable.Data, func() float64 {
		if err := kernel.Embedding(table, tok, out); err != nil {
			t.Fatal(err)
		}
		return weighted(w, out)
	}, 1e-2, 1e-4)
}

func TestLayerNormForward(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const n, d = 5, 16
	x, gamma, beta := randMat(r, n, d), randMat(r, 1, d), randMat(r, 1, d)
	// A row far from zero keeps its precision: its statistics are float64.
	for j := 0; j < d; j++ {
		x.Data[4*d+j] = 1000 + x.Data[4*d+j]*1e-2
	}
	y, mean, rstd := kernel.NewMat(n, d), kernel.NewMat(n, 1), kernel.NewMat(n, 1)
	const eps = 1e-5
	if err := kernel.LayerNorm(x, gamma, beta, y, mean, rstd, eps); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		row := x.Data[i*d : (i+1)*d]
		var mu, v float64
		for _, e := range row {
			mu += float64(e)
		}
		mu /= d
		for _, e := range row {
			v += (float64(e) - mu) * (float64(e) - mu)
		}
		rs := 1 / math.Sqrt(v/d+eps)
		if math.Abs(float64(mean.Data[i])-mu) > 1e-6*(1+math.Abs(mu)) || math.Abs(float64(rstd.Data[i])-rs) > 1e-6*rs {
			t.Errorf("row %d: mean %v rstd %v, want %v %v", i, mean.Data[i], rstd.Data[i], mu, rs)
		}
		for j, e := range row {
			want := (float64(e)-mu)*rs*float64(gamma.Data[j]) + float64(beta.Data[j])
			if got := float64(y.Data[i*d+j]); math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
				t.Errorf("y[%d,%d] = %v, want %v", i, j, got, want)
			}
		}
	}
	// y may alias x.
	in := cloneMat(x)
	if err := kernel.LayerNorm(in, gamma, beta, in, kernel.NewMat(n, 1), kernel.NewMat(n, 1), eps); err != nil || !floats.SameBits(in.Data, y.Data) {
		t.Fatalf("layer_norm in place differs: %v", err)
	}
}

func TestLayerNormGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const n, d = 3, 8
	x, gamma, beta, w := randMat(r, n, d), randMat(r, 1, d), randMat(r, 1, d), randMat(r, n, d)
	y, mean, rstd := kernel.NewMat(n, d), kernel.NewMat(n, 1), kernel.NewMat(n, 1)
	loss := func() float64 {
		if err := kernel.LayerNorm(x, gamma, beta, y, mean, rstd, 1e-5); err != nil {
			t.Fatal(err)
		}
		return weighted(w, y)
	}
	loss()
	dx, dgamma, dbeta := kernel.NewMat(n, d), kernel.NewMat(1, d), kernel.NewMat(1, d)
	if err := kernel.LayerNormGrad(w, x, gamma, mean, rstd, dx, dgamma, dbeta); err != nil {
		t.Fatal(err)
	}
	checkGrad(t, "layer_norm x", x.Data, dx.Data, loss, 1e-2, 2e-3)
	checkGrad(t, "layer_norm gamma", gamma.Data, dgamma.Data, loss, 1e-2, 2e-3)
	checkGrad(t, "layer_norm beta", beta.Data, dbeta.Data, loss, 1e-2, 2e-3)

	// dgamma and dbeta accumulate; dx is overwritten, and may alias dy.
	loss()
	g2, b2 := cloneMat(dgamma), cloneMat(dbeta)
	dy := cloneMat(w)
	if err := kernel.LayerNormGrad(dy, x, gamma, mean, rstd, dy, g2, b2); err != nil {
		t.Fatal(err)
	}
	if !floats.SameBits(dy.Data, dx.Data) {
		t.Errorf("layer_norm_grad in place: dx differs")
	}
	for j := range d {
		if math.Abs(float64(g2.Data[j]-2*dgamma.Data[j])) > 1e-5*math.Abs(float64(dgamma.Data[j])) ||
			math.Abs(float64(b2.Data[j]-2*dbeta.Data[j])) > 1e-5*math.Abs(float64(dbeta.Data[j])) {
			t.Fatalf("dgamma/dbeta did not accumulate: %v %v after %v %v", g2.Data, b2.Data, dgamma.Data, dbeta.Data)
		}
	}
}

func TestGELU(t *testing.T) {
	// PyTorch's gelu(x, approximate="tanh") at these points.
	x := kernel.Mat{Rows: 1, Cols: 6, Data: []float32{1, -1, 2, -3, 0.5, 0}}
	want := []float64{0.8411919906082768, -0.15880800939172324, 1.954597694087775, -0.0036373920817729943, 0.34571400982514394, 0}
	y := kernel.NewMat(1, 6)
	if err := kernel.GELU(x, y); err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		if math.Abs(float64(y.Data[i])-w) > 1e-7*(1+math.Abs(w)) {
			t.Errorf("gelu(%v) = %v, want %v", x.Data[i], y.Data[i], w)
		}
	}
	if err := kernel.GELU(x, x); err != nil || !floats.SameBits(x.Data, y.Data) {
		t.Errorf("gelu in place: %v, %v", x.Data, err)
	}

	r := rand.New(rand.NewPCG(11, 12))
	x, w := randMat(r, 4, 6), randMat(r, 4, 6)
	for i := range x.Data {
		x.Data[i] *= 2 // reach the tails as well as the bend
	}
	y = kernel.NewMat(4, 6)
	dx := kernel.NewMat(4, 6)
	if err := kernel.GELUGrad(w, x, dx); err != nil {
		t.Fatal(err)
	}
	checkGrad(t, "gelu", x.Data, dx.Data, func() float64 {
		if err := kernel.GELU(x, y); err != nil {
			t.Fatal(err)
		}
		return weighted(w, y)
	}, 1e-2, 1e-3)
}

// TestSoftmaxCausal checks the mask on (heads·T)×T scores: masked columns get
// exactly 0 whatever they hold (NaN and Inf included), the others are positive
// and each row sums to 1.
func TestSoftmaxCausal(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const T = 5
	x := randMat(r, 3*T, T)
	for row := 0; row < x.Rows; row++ {
		for c := row%T + 1; c < T; c++ {
			x.Data[row*T+c] = []float32{float32(math.NaN()), float32(math.Inf(1)), 1e30}[c%3]
		}
	}
	x.Data[2*T*T+T*4] = 1e30 // a huge visible score must not overflow
	y := kernel.NewMat(3*T, T)
	for i := range y.Data {
		y.Data[i] = float32(math.NaN()) // every value of y must be written
	}
	if err := kernel.Softmax(x, y, T); err != nil {
		t.Fatal(err)
	}
	for row := 0; row < y.Rows; row++ {
		var s float64
		for c := 0; c < T; c++ {
			v := y.Data[row*T+c]
			if c > row%T && math.Float32bits(v) != 0 {
				t.Errorf("row %d: masked column %d holds %v", row, c, v)
			}
			if c <= row%T && !(v >= 0 && v <= 1) {
				t.Errorf("row %d: column %d holds %v", row, c, v)
			}
			s += float64(v)
		}
		if math.Abs(s-1) > 1e-6 {
			t.Errorf("row %d sums to %v", row, s)
		}
	}
	if y.Data[0] != 1 {
		t.Errorf("the first row of a block sees only itself: %v", y.Data[:T])
	}
	// Unmasked, a row matches exp(x)/Σexp(x) and y may alias x.
	x = randMat(r, 2, 7)
	y = kernel.NewMat(2, 7)
	if err := kernel.Softmax(x, y, 0); err != nil {
		t.Fatal(err)
	}
	for row := 0; row < 2; row++ {
		var s float64
		for _, v := range x.Data[row*7 : (row+1)*7] {
			s += math.Exp(float64(v))
		}
		for c, v := range x.Data[row*7 : (row+1)*7] {
			if want := math.Exp(float64(v)) / s; math.Abs(float64(y.Data[row*7+c])-want) > 1e-7 {
				t.Errorf("softmax[%d,%d] = %v, want %v", row, c, y.Data[row*7+c], want)
			}
		}
	}
	if err := kernel.Softmax(x, x, 0); err != nil || !floats.SameBits(x.Data, y.Data) {
		t.Errorf("softmax in place differs: %v", err)
	}
}

func TestSoftmaxGradient(t *testing.T) {
	for _, causal := range []int{0, 4} {
		r := rand.New(rand.NewPCG(15, uint64(causal)))
		x, w := randMat(r, 8, 4), randMat(r, 8, 4)
		y := kernel.NewMat(8, 4)
		loss := func() float64 {
			if err := kernel.Softmax(x, y, causal); err != nil {
				t.Fatal(err)
			}
			return weighted(w, y)
		}
		loss()
		dx := kernel.NewMat(8, 4)
		if err := kernel.SoftmaxGrad(w, y, dx); err != nil {
			t.Fatal(err)
		}
		name := "softmax"
		if causal > 0 {
			name = "causal softmax"
			for row := 0; row < 8; row++ {
				for c := row%causal + 1; c < causal; c++ {
					if dx.Data[row*4+c] != 0 {
						t.Errorf("%s: masked dx[%d,%d] = %v", name, row, c, dx.Data[row*4+c])
					}
				}
			}
		}
		checkGrad(t, name, x.Data, dx.Data, loss, 1e-2, 1e-3)
		loss() // checkGrad left y at a perturbed x
		dy := cloneMat(w)
		if err := kernel.SoftmaxGrad(dy, y, dy); err != nil || !floats.SameBits(dy.Data, dx.Data) {
			t.Errorf("%s: softmax_grad in place differs: %v", name, err)
		}
	}
}

// TestBatchedGemmMatchesGemm checks every transpose combination bit for bit
// against Gemm called on each block by hand.
func TestBatchedGemmMatchesGemm(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	const batch, m, n, k = 3, 5, 4, 6
	for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
		ar, ac := m, k
		if tr[0] {
			ar, ac = k, m
		}
		br, bc := k, n
		if tr[1] {
			br, bc = n, k
		}
		a, b, c := randMat(r, batch*ar, ac), randMat(r, batch*br, bc), randMat(r, batch*m, n)
		want := cloneMat(c)
		if err := kernel.BatchedGemm(tr[0], tr[1], 0.75, a, b, 0.5, c, batch); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < batch; i++ {
			view := func(x kernel.Mat, rows int) kernel.Mat {
				return kernel.Mat{Rows: rows, Cols: x.Cols, Data: x.Data[i*rows*x.Cols : (i+1)*rows*x.Cols]}
			}
			if err := kernel.Gemm(tr[0], tr[1], 0.75, view(a, ar), view(b, br), 0.5, view(want, m)); err != nil {
				t.Fatal(err)
			}
		}
		if !floats.SameBits(c.Data, want.Data) {
			t.Errorf("trans %v: batched result differs from per-block gemm", tr)
		}
		if kernel.Norm2(c) == 0 {
			t.Errorf("trans %v: empty result", tr)
		}
	}
	// An empty inner dimension scales C by beta, as Gemm does.
	c := kernel.Mat{Rows: 2, Cols: 1, Data: []float32{2, 4}}
	if err := kernel.BatchedGemm(false, false, 1, kernel.NewMat(2, 0), kernel.NewMat(0, 1), 0.5, c, 2); err != nil || !slices.Equal(c.Data, []float32{1, 2}) {
		t.Errorf("k = 0: %v %v", c.Data, err)
	}
	if got := kernel.BatchedGemmFLOPs(32, 128, 128, 64); got != 32*kernel.GemmFLOPs(128, 128, 64) {
		t.Errorf("flops %d", got)
	}
}

// TestTransformerDeterminism runs every kernel twice on equal inputs.
func TestTransformerDeterminism(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	const n, d, T = 8, 16, 4
	x, dy, gamma, beta := randMat(r, n, d), randMat(r, n, d), randMat(r, 1, d), randMat(r, 1, d)
	scores, table, tok := randMat(r, 2*T, T), randMat(r, 10, d), ids(3, 1, 4, 1, 5, 9, 2, 6)
	run := func() [][]float32 {
		var outs [][]float32
		add := func(err error, ms ...kernel.Mat) {
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				outs = append(outs, slices.Clone(m.Data))
			}
		}
		emb, dtab := kernel.NewMat(n, d), kernel.NewMat(10, d)
		add(kernel.Embedding(table, tok, emb), emb)
		add(kernel.EmbeddingGrad(dy, tok, dtab), dtab)
		y, mean, rstd := kernel.NewMat(n, d), kernel.NewMat(n, 1), kernel.NewMat(n, 1)
		add(kernel.LayerNorm(x, gamma, beta, y, mean, rstd, 1e-5), y, mean, rstd)
		dx, dg, db := kernel.NewMat(n, d), kernel.NewMat(1, d), kernel.NewMat(1, d)
		add(kernel.LayerNormGrad(dy, x, gamma, mean, rstd, dx, dg, db), dx, dg, db)
		g, dgx := kernel.NewMat(n, d), kernel.NewMat(n, d)
		add(kernel.GELU(x, g), g)
		add(kernel.GELUGrad(dy, x, dgx), dgx)
		p, dp, ds := kernel.NewMat(2*T, T), cloneMat(scores), kernel.NewMat(2*T, T)
		add(kernel.Softmax(scores, p, T), p)
		add(kernel.SoftmaxGrad(dp, p, ds), ds)
		c := kernel.NewMat(n, n/2)
		add(kernel.BatchedGemm(false, true, 0.25, x, dy, 0, c, 2), c)
		return outs
	}
	first, second := run(), run()
	for i := range first {
		if !floats.SameBits(first[i], second[i]) {
			t.Errorf("output %d differs between equal runs", i)
		}
	}
}

// attention is one causal self-attention head with a residual, a GELU and a
// language-model head, composed from the kernels: the end-to-end check that
// their backward passes chain into the gradient of the loss.
type attention struct {
	B, T, D, V                       int
	tok, labels                      kernel.Mat
	table, gamma, beta               kernel.Mat
	wq, wk, wv, wo, wlm              kernel.Mat
	h, a, mean, rstd, q, k, v, s, p  kernel.Mat
	o, res, g, logits, dlogits       kernel.Mat
	dtable, dgamma, dbeta            kernel.Mat
	dwq, dwk, dwv, dwo, dwlm         kernel.Mat
	dg, dres, do, dp, ds, dq, dk, dv kernel.Mat
	da, dh, dx                       kernel.Mat
}

func newAttention(r *rand.Rand) *attention {
	const B, T, D, V = 2, 4, 6, 7
	f := &attention{B: B, T: T, D: D, V: V,
		tok:    ids(1, 3, 3, 0, 6, 2, 1, 1),
		labels: ids(3, 3, 0, 6, 2, 1, 1, 5),
	}
	scaled := func(rows, cols int, s float32) kernel.Mat {
		m := randMat(r, rows, cols)
		kernel.Scale(s, m)
		return m
	}
	f.table, f.gamma, f.beta = scaled(V, D, 1), scaled(1, D, 1), scaled(1, D, 0.5)
	f.wq, f.wk, f.wv, f.wo, f.wlm = scaled(D, D, 0.5), scaled(D, D, 0.5), scaled(D, D, 0.5), scaled(D, D, 0.5), scaled(V, D, 0.5)
	n := B * T
	for _, m := range []*kernel.Mat{&f.h, &f.a, &f.q, &f.k, &f.v, &f.o, &f.res, &f.g, &f.dg, &f.dres, &f.do, &f.dq, &f.dk, &f.dv, &f.da, &f.dh, &f.dx} {
		*m = kernel.NewMat(n, D)
	}
	for _, m := range []*kernel.Mat{&f.s, &f.p, &f.dp, &f.ds} {
		*m = kernel.NewMat(n, T)
	}
	f.mean, f.rstd = kernel.NewMat(n, 1), kernel.NewMat(n, 1)
	f.logits, f.dlogits = kernel.NewMat(n, V), kernel.NewMat(n, V)
	f.dtable, f.dgamma, f.dbeta = kernel.NewMat(V, D), kernel.NewMat(1, D), kernel.NewMat(1, D)
	f.dwq, f.dwk, f.dwv, f.dwo, f.dwlm = kernel.NewMat(D, D), kernel.NewMat(D, D), kernel.NewMat(D, D), kernel.NewMat(D, D), kernel.NewMat(V, D)
	return f
}

func must(t *testing.T, errs ...error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func (f *attention) forward(t *testing.T) float64 {
	t.Helper()
	scale := float32(1 / math.Sqrt(float64(f.D)))
	must(t,
		kernel.Embedding(f.table, f.tok, f.h),
		kernel.LayerNorm(f.h, f.gamma, f.beta, f.a, f.mean, f.rstd, 1e-5),
		kernel.Gemm(false, false, 1, f.a, f.wq, 0, f.q),
		kernel.Gemm(false, false, 1, f.a, f.wk, 0, f.k),
		kernel.Gemm(false, false, 1, f.a, f.wv, 0, f.v),
		kernel.BatchedGemm(false, true, scale, f.q, f.k, 0, f.s, f.B),
		kernel.Softmax(f.s, f.p, f.T),
		kernel.BatchedGemm(false, false, 1, f.p, f.v, 0, f.o, f.B))
	copy(f.res.Data, f.h.Data)
	must(t,
		kernel.Gemm(false, false, 1, f.o, f.wo, 1, f.res),
		kernel.GELU(f.res, f.g),
		kernel.Gemm(false, true, 1, f.g, f.wlm, 0, f.logits))
	loss, err := kernel.SoftmaxXent(f.logits, f.labels, f.dlogits)
	must(t, err)
	return loss
}

func (f *attention) backward(t *testing.T) {
	t.Helper()
	scale := float32(1 / math.Sqrt(float64(f.D)))
	must(t,
		kernel.Gemm(false, false, 1, f.dlogits, f.wlm, 0, f.dg),
		kernel.Gemm(true, false, 1, f.dlogits, f.g, 0, f.dwlm),
		kernel.GELUGrad(f.dg, f.res, f.dres),
		kernel.Gemm(false, true, 1, f.dres, f.wo, 0, f.do),
		kernel.Gemm(true, false, 1, f.o, f.dres, 0, f.dwo),
		kernel.BatchedGemm(false, true, 1, f.do, f.v, 0, f.dp, f.B),
		kernel.BatchedGemm(true, false, 1, f.p, f.do, 0, f.dv, f.B),
		kernel.SoftmaxGrad(f.dp, f.p, f.ds),
		kernel.BatchedGemm(false, false, scale, f.ds, f.k, 0, f.dq, f.B),
		kernel.BatchedGemm(true, false, scale, f.ds, f.q, 0, f.dk, f.B),
		kernel.Gemm(false, true, 1, f.dq, f.wq, 0, f.da),
		kernel.Gemm(false, true, 1, f.dk, f.wk, 1, f.da),
		kernel.Gemm(false, true, 1, f.dv, f.wv, 1, f.da),
		kernel.Gemm(true, false, 1, f.a, f.dq, 0, f.dwq),
		kernel.Gemm(true, false, 1, f.a, f.dk, 0, f.dwk),
		kernel.Gemm(true, false, 1, f.a, f.dv, 0, f.dwv))
	kernel.Scale(0, f.dgamma)
	kernel.Scale(0, f.dbeta)
	kernel.Scale(0, f.dtable)
	copy(f.dh.Data, f.dres.Data)
	must(t,
		kernel.LayerNormGrad(f.da, f.h, f.gamma, f.mean, f.rstd, f.dx, f.dgamma, f.dbeta),
		kernel.Axpy(1, f.dx, f.dh),
		kernel.EmbeddingGrad(f.dh, f.tok, f.dtable))
}

func TestAttentionHeadGradient(t *testing.T) {
	f := newAttention(rand.New(rand.NewPCG(21, 22)))
	loss := f.forward(t)
	if !(loss > 0) {
		t.Fatalf("loss %v", loss)
	}
	f.backward(t)
	for _, p := range []struct {
		name      string
		val, grad kernel.Mat
	}{
		{"table", f.table, f.dtable}, {"gamma", f.gamma, f.dgamma}, {"beta", f.beta, f.dbeta},
		{"wq", f.wq, f.dwq}, {"wk", f.wk, f.dwk}, {"wv", f.wv, f.dwv}, {"wo", f.wo, f.dwo}, {"wlm", f.wlm, f.dwlm},
	} {
		if kernel.Norm2(p.grad) == 0 {
			t.Errorf("%s: zero gradient", p.name)
		}
		checkGrad(t, p.name, p.val.Data, p.grad.Data, func() float64 { return f.forward(t) }, 1e-2, 1e-3)
	}
}

// Benchmarks at the sizes of a 1M-parameter decoder: d = 256, T = 128, 4
// heads of 64, a batch of 8 sequences (1024 token rows).
const (
	benchD, benchT, benchHeads, benchSeqs = 256, 128, 4, 8
	benchRows                             = benchSeqs * benchT
)

func BenchmarkLayerNorm(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x, gamma, beta := randMat(r, benchRows, benchD), randMat(r, 1, benchD), randMat(r, 1, benchD)
	y, mean, rstd := kernel.NewMat(benchRows, benchD), kernel.NewMat(benchRows, 1), kernel.NewMat(benchRows, 1)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.LayerNorm(x, gamma, beta, y, mean, rstd, 1e-5); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSoftmaxCausal(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	x := randMat(r, benchSeqs*benchHeads*benchT, benchT)
	y := kernel.NewMat(x.Rows, x.Cols)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.Softmax(x, y, benchT); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBatchedGemm is the attention scores Q·Kᵀ of every head of the batch.
func BenchmarkBatchedGemm(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	const batch, dh = benchSeqs * benchHeads, benchD / benchHeads
	q, k := randMat(r, batch*benchT, dh), randMat(r, batch*benchT, dh)
	s := kernel.NewMat(batch*benchT, benchT)
	for b.Loop() {
		if err := kernel.BatchedGemm(false, true, 0.125, q, k, 0, s, batch); err != nil {
			b.Fatal(err)
		}
	}
	flops := kernel.BatchedGemmFLOPs(batch, benchT, benchT, dh)
	b.ReportMetric(float64(flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// TestEmptyRowsDoNoWork: a matrix with no columns has no values however many
// rows it claims, and a host charging work per value charges nothing for it.
// Every kernel must return at once on such operands, with shapes still
// checked, rather than walk the rows: with math.MaxInt rows, a kernel that
// loops would not return before the test binary's timeout.
func TestEmptyRowsDoNoWork(t *testing.T) {
	const huge = math.MaxInt
	empty := kernel.Mat{Rows: huge}
	none := kernel.Mat{}
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"bias_add", func() error { return kernel.BiasAdd(empty, none) }},
		{"col_sum", func() error { return kernel.ColSum(empty, none) }},
		{"softmax", func() error { return kernel.Softmax(empty, empty, 0) }},
		{"softmax_grad", func() error { return kernel.SoftmaxGrad(empty, empty, empty) }},
		// One token of no width split into huge heads: huge empty rows out.
		{"split_heads", func() error { return kernel.SplitHeads(kernel.Mat{Rows: 1}, empty, 1, huge) }},
		{"merge_heads", func() error { return kernel.MergeHeads(empty, kernel.Mat{Rows: 1}, 1, huge) }},
		// huge blocks of one empty row each: BatchedGemm must not call Gemm per block.
		{"batched_gemm", func() error { return kernel.BatchedGemm(false, false, 1, empty, none, 0, empty, huge) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err != nil {
				t.Fatalf("%s on empty rows: %v", tc.name, err)
			}
		})
	}
	// Shapes are still checked when there is nothing to compute.
	if err := kernel.BatchedGemm(false, false, 1, kernel.Mat{Rows: 2}, kernel.NewMat(4, 1), 0, kernel.Mat{Rows: 2}, 2); !errors.Is(err, kernel.ErrShape) {
		t.Errorf("batched_gemm with mismatched empty blocks: %v, want ErrShape", err)
	}
}
