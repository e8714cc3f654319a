package kernel_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/model/kernel"
)

func randMat(r *rand.Rand, rows, cols int) kernel.Mat {
	m := kernel.NewMat(rows, cols)
	for i := range m.Data {
		m.Data[i] = float32(r.NormFloat64())
	}
	return m
}

func at(m kernel.Mat, i, j int, trans bool) float64 {
	if trans {
		i, j = j, i
	}
	return float64(m.Data[i*m.Cols+j])
}

// TestGemmMatchesNaive checks every transpose combination against a float64 triple loop.
func TestGemmMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		m, n, k        int
		transA, transB bool
		alpha, beta    float32
	}{
		{3, 4, 5, false, false, 1, 0},
		{3, 4, 5, true, false, 0.5, 1},
		{3, 4, 5, false, true, -1, 2},
		{7, 1, 9, true, true, 2, 0.25},
		{1, 1, 1, false, false, 1, 0},
		{64, 33, 17, false, true, 1, 0},
	} {
		ar, ac := tc.m, tc.k
		if tc.transA {
			ar, ac = ac, ar
		}
		br, bc := tc.k, tc.n
		if tc.transB {
			br, bc = bc, br
		}
		a, b, c := randMat(r, ar, ac), randMat(r, br, bc), randMat(r, tc.m, tc.n)
		want := make([]float64, len(c.Data))
		for i := 0; i < tc.m; i++ {
			for j := 0; j < tc.n; j++ {
				var s float64
				for l := 0; l < tc.k; l++ {
					s += at(a, i, l, tc.transA) * at(b, l, j, tc.transB)
				}
				want[i*tc.n+j] = float64(tc.alpha)*s + float64(tc.beta)*float64(c.Data[i*tc.n+j])
			}
		}
		if err := kernel.Gemm(tc.transA, tc.transB, tc.alpha, a, b, tc.beta, c); err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			if math.Abs(float64(c.Data[i])-w) > 1e-4*(1+math.Abs(w)) {
				t.Fatalf("%+v: c[%d] = %v, want %v", tc, i, c.Data[i], w)
			}
		}
	}
}

func TestShapeErrors(t *testing.T) {
	m := func(r, c int) kernel.Mat { return kernel.NewMat(r, c) }
	short := kernel.Mat{Rows: 4, Cols: 4, Data: make([]float32, 3)}
	for name, err := range map[string]error{
		"gemm inner":       kernel.Gemm(false, false, 1, m(2, 3), m(4, 2), 0, m(2, 2)),
		"gemm out":         kernel.Gemm(false, true, 1, m(2, 3), m(4, 3), 0, m(2, 3)),
		"gemm short data":  kernel.Gemm(false, false, 1, short, m(4, 4), 0, m(4, 4)),
		"gemm negative":    kernel.Gemm(false, false, 1, kernel.Mat{Rows: -1, Cols: 2}, m(2, 2), 0, m(1, 2)),
		"bias length":      kernel.BiasAdd(m(2, 3), m(1, 4)),
		"col_sum length":   kernel.ColSum(m(2, 3), m(1, 2)),
		"relu shape":       kernel.ReLU(m(2, 3), m(3, 2)),
		"relu_grad shape":  kernel.ReLUGrad(m(2, 3), m(2, 3), m(2, 2)),
		"axpy shape":       kernel.Axpy(1, m(2, 3), m(2, 4)),
		"xent labels":      func() error { _, err := kernel.SoftmaxXent(m(2, 3), m(3, 1), kernel.Mat{}); return err }(),
		"xent grad":        func() error { _, err := kernel.SoftmaxXent(m(2, 3), m(2, 1), m(2, 2)); return err }(),
		"correct labels":   func() error { _, err := kernel.CountCorrect(m(2, 3), m(1, 1)); return err }(),
		"xent short input": func() error { _, err := kernel.SoftmaxXent(short, m(4, 1), kernel.Mat{}); return err }(),
	} {
		if !errors.Is(err, kernel.ErrShape) {
			t.Errorf("%s: got %v, want ErrShape", name, err)
		}
	}
}

func TestLabelErrors(t *testing.T) {
	logits := kernel.NewMat(2, 3)
	for _, bad := range []float32{3, -1, 0.5, float32(math.NaN())} {
		labels := kernel.Mat{Rows: 2, Cols: 1, Data: []float32{0, bad}}
		if _, err := kernel.SoftmaxXent(logits, labels, kernel.Mat{}); !errors.Is(err, kernel.ErrLabel) {
			t.Errorf("label %v: softmax_xent got %v", bad, err)
		}
		if _, err := kernel.CountCorrect(logits, labels); !errors.Is(err, kernel.ErrLabel) {
			t.Errorf("label %v: count_correct got %v", bad, err)
		}
	}
}

// TestSoftmaxXentGradient checks the analytic gradient against central differences.
func TestSoftmaxXentGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	logits := randMat(r, 4, 5)
	labels := kernel.Mat{Rows: 4, Cols: 1, Data: []float32{0, 4, 2, 2}}
	grad := kernel.NewMat(4, 5)
	loss, err := kernel.SoftmaxXent(logits, labels, grad)
	if err != nil {
		t.Fatal(err)
	}
	if loss <= 0 {
		t.Fatalf("loss %v", loss)
	}
	const h = 1e-2
	for i := range logits.Data {
		orig := logits.Data[i]
		logits.Data[i] = orig + h
		up, _ := kernel.SoftmaxXent(logits, labels, kernel.Mat{})
		logits.Data[i] = orig - h
		down, _ := kernel.SoftmaxXent(logits, labels, kernel.Mat{})
		logits.Data[i] = orig
		if num := (up - down) / (2 * h); math.Abs(num-float64(grad.Data[i])) > 1e-3 {
			t.Fatalf("grad[%d] = %v, numeric %v", i, grad.Data[i], num)
		}
	}
	// Huge logits must not overflow: the log-sum-exp is shifted by the row max.
	big := kernel.Mat{Rows: 1, Cols: 2, Data: []float32{1e30, 0}}
	l, err := kernel.SoftmaxXent(big, kernel.Mat{Rows: 1, Cols: 1, Data: []float32{1}}, kernel.Mat{})
	if err != nil || math.IsInf(l, 0) || math.IsNaN(l) || l < 1e29 {
		t.Fatalf("loss for huge logits: %v, %v", l, err)
	}
}

func TestElementwise(t *testing.T) {
	x := kernel.Mat{Rows: 2, Cols: 2, Data: []float32{-1, 2, 0, 3}}
	y := kernel.NewMat(2, 2)
	if err := kernel.ReLU(x, y); err != nil || y.Data[0] != 0 || y.Data[1] != 2 || y.Data[2] != 0 {
		t.Fatalf("relu %v %v", y.Data, err)
	}
	dy := kernel.Mat{Rows: 2, Cols: 2, Data: []float32{5, 6, 7, 8}}
	dx := kernel.NewMat(2, 2)
	if err := kernel.ReLUGrad(dy, x, dx); err != nil || dx.Data[0] != 0 || dx.Data[1] != 6 || dx.Data[2] != 0 || dx.Data[3] != 8 {
		t.Fatalf("relu_grad %v %v", dx.Data, err)
	}
	b := kernel.Mat{Rows: 1, Cols: 2, Data: []float32{10, 20}}
	if err := kernel.BiasAdd(x, b); err != nil || x.Data[0] != 9 || x.Data[3] != 23 {
		t.Fatalf("bias_add %v %v", x.Data, err)
	}
	out := kernel.NewMat(1, 2)
	if err := kernel.ColSum(x, out); err != nil || out.Data[0] != 19 || out.Data[1] != 45 {
		t.Fatalf("col_sum %v %v", out.Data, err)
	}
	if n := kernel.Norm2(kernel.Mat{Rows: 1, Cols: 2, Data: []float32{3, 4}}); n != 5 {
		t.Fatalf("norm2 %v", n)
	}
	z := kernel.Mat{Rows: 1, Cols: 2, Data: []float32{float32(math.NaN()), 1}}
	kernel.Scale(0, z)
	if z.Data[0] != 0 || z.Data[1] != 0 {
		t.Fatalf("scale by 0 must clear NaN: %v", z.Data)
	}
	logits := kernel.Mat{Rows: 3, Cols: 2, Data: []float32{1, 2, 3, 0, 5, 5}}
	labels := kernel.Mat{Rows: 3, Cols: 1, Data: []float32{1, 1, 0}}
	if c, err := kernel.CountCorrect(logits, labels); err != nil || c != 2 {
		t.Fatalf("count_correct %d %v (ties go to the lowest index)", c, err)
	}
}

func ExampleGemm() {
	a := kernel.Mat{Rows: 1, Cols: 2, Data: []float32{1, 2}}
	w := kernel.Mat{Rows: 3, Cols: 2, Data: []float32{1, 0, 0, 1, 1, 1}} // [out, in], as PyTorch stores Linear weights
	y := kernel.NewMat(1, 3)
	_ = kernel.Gemm(false, true, 1, a, w, 0, y) // y = a·wᵀ
	fmt.Println(y.Data)
	// Output: [1 2 3]
}
