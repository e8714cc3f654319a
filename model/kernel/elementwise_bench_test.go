package kernel_test

import (
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/model/kernel"
)

// The element-wise benchmarks run on the activations of one LM layer of the
// benchmark batch (benchRows×benchD, 1 MiB) and on the attention scores of
// BenchmarkSoftmaxCausal, so that their bytes per second compare directly.

func BenchmarkGELU(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	x := randMat(r, benchRows, benchD)
	y := kernel.NewMat(x.Rows, x.Cols)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.GELU(x, y); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGELUGrad(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	x, dy := randMat(r, benchRows, benchD), randMat(r, benchRows, benchD)
	dx := kernel.NewMat(x.Rows, x.Cols)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.GELUGrad(dy, x, dx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSoftmax(b *testing.B) {
	r := rand.New(rand.NewPCG(11, 12))
	x := randMat(r, benchSeqs*benchHeads*benchT, benchT)
	y := kernel.NewMat(x.Rows, x.Cols)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.Softmax(x, y, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAdamW(b *testing.B) {
	r := rand.New(rand.NewPCG(13, 14))
	p, g := randMat(r, benchRows, benchD), randMat(r, benchRows, benchD)
	m, v := kernel.NewMat(p.Rows, p.Cols), kernel.NewMat(p.Rows, p.Cols)
	h := kernel.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 3}
	b.SetBytes(4 * int64(p.Len()))
	for b.Loop() {
		if err := kernel.AdamWStep(p, g, m, v, h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAxpy(b *testing.B) {
	r := rand.New(rand.NewPCG(15, 16))
	x, y := randMat(r, benchRows, benchD), randMat(r, benchRows, benchD)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.Axpy(1e-3, x, y); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScale(b *testing.B) {
	r := rand.New(rand.NewPCG(17, 18))
	x := randMat(r, benchRows, benchD)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		kernel.Scale(0.999, x)
	}
}

func BenchmarkBiasAdd(b *testing.B) {
	r := rand.New(rand.NewPCG(19, 20))
	x, bias := randMat(r, benchRows, benchD), randMat(r, 1, benchD)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.BiasAdd(x, bias); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkColSum(b *testing.B) {
	r := rand.New(rand.NewPCG(21, 22))
	x, out := randMat(r, benchRows, benchD), kernel.NewMat(1, benchD)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.ColSum(x, out); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReLU(b *testing.B) {
	r := rand.New(rand.NewPCG(23, 24))
	x := randMat(r, benchRows, benchD)
	y := kernel.NewMat(x.Rows, x.Cols)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.ReLU(x, y); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReLUGrad(b *testing.B) {
	r := rand.New(rand.NewPCG(25, 26))
	x, dy := randMat(r, benchRows, benchD), randMat(r, benchRows, benchD)
	dx := kernel.NewMat(x.Rows, x.Cols)
	b.SetBytes(4 * int64(x.Len()))
	for b.Loop() {
		if err := kernel.ReLUGrad(dy, x, dx); err != nil {
			b.Fatal(err)
		}
	}
}
