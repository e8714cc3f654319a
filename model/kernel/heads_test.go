package kernel_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/model/kernel"
)

func TestSplitMergeHeads(t *testing.T) {
	const seqs, T, H, dh = 3, 4, 2, 5
	r := rand.New(rand.NewPCG(1, 2))
	x := randMat(r, seqs*T, H*dh)
	y := kernel.NewMat(seqs*H*T, dh)
	if err := kernel.SplitHeads(x, y, T, H); err != nil {
		t.Fatal(err)
	}
	for s := 0; s < seqs; s++ {
		for h := 0; h < H; h++ {
			for tk := 0; tk < T; tk++ {
				for j := 0; j < dh; j++ {
					want := x.Data[(s*T+tk)*H*dh+h*dh+j]
					if got := y.Data[((s*H+h)*T+tk)*dh+j]; got != want {
						t.Fatalf("seq %d head %d token %d col %d: %v, want %v", s, h, tk, j, got, want)
					}
				}
			}
		}
	}
	back := kernel.NewMat(seqs*T, H*dh)
	if err := kernel.MergeHeads(y, back, T, H); err != nil {
		t.Fatal(err)
	}
	for i := range x.Data {
		if back.Data[i] != x.Data[i] {
			t.Fatalf("merge(split(x)) differs at %d", i)
		}
	}
	for _, bad := range []struct {
		x, y       kernel.Mat
		seq, heads int
		want       error
	}{
		{x, kernel.NewMat(seqs*H*T, dh+1), T, H, kernel.ErrShape},
		{x, y, 5, H, kernel.ErrShape},
		{x, y, T, 3, kernel.ErrShape},
		{x, y, 0, H, kernel.ErrArgument},
		{x, y, T, -1, kernel.ErrArgument},
		{kernel.Mat{Rows: 4, Cols: 4}, y, T, H, kernel.ErrShape},
	} {
		if err := kernel.SplitHeads(bad.x, bad.y, bad.seq, bad.heads); !errors.Is(err, bad.want) {
			t.Errorf("split %v→%v seq %d heads %d: %v, want %v", bad.x, bad.y, bad.seq, bad.heads, err, bad.want)
		}
		if err := kernel.MergeHeads(bad.y, bad.x, bad.seq, bad.heads); !errors.Is(err, bad.want) {
			t.Errorf("merge %v→%v seq %d heads %d: %v, want %v", bad.y, bad.x, bad.seq, bad.heads, err, bad.want)
		}
	}
}

func TestAdamW(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p, g := randMat(r, 3, 4), randMat(r, 3, 4)
	m, v := kernel.NewMat(3, 4), kernel.NewMat(3, 4)
	ref := append([]float64(nil), make([]float64, 12)...)
	refM, refV := make([]float64, 12), make([]float64, 12)
	for i := range ref {
		ref[i] = float64(p.Data[i])
	}
	h := kernel.AdamW{LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1}
	for step := 1; step <= 5; step++ {
		h.Step = step
		if err := kernel.AdamWStep(p, g, m, v, h); err != nil {
			t.Fatal(err)
		}
		for i := range ref {
			gi := float64(g.Data[i])
			refM[i] = 0.9*refM[i] + 0.1*gi
			refV[i] = 0.999*refV[i] + 0.001*gi*gi
			mh := refM[i] / (1 - math.Pow(0.9, float64(step)))
			vh := refV[i] / (1 - math.Pow(0.999, float64(step)))
			ref[i] -= 0.01 * (mh/(math.Sqrt(vh)+1e-8) + 0.1*ref[i])
		}
	}
	for i := range ref {
		if d := math.Abs(float64(p.Data[i]) - ref[i]); d > 1e-5 {
			t.Errorf("value %d: %v, float64 reference %v", i, p.Data[i], ref[i])
		}
	}
	// The first step moves every value by about lr, whatever the gradient's
	// scale: Adam's normalisation.
	q, big := kernel.NewMat(1, 2), kernel.Mat{Rows: 1, Cols: 2, Data: []float32{1e6, -1e-6}}
	if err := kernel.AdamWStep(q, big, kernel.NewMat(1, 2), kernel.NewMat(1, 2), kernel.AdamW{LR: 0.1, Beta1: 0.9, Beta2: 0.99, Eps: 1e-12, Step: 1}); err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(q.Data[0])+0.1) > 1e-6 || math.Abs(float64(q.Data[1])-0.1) > 1e-6 {
		t.Errorf("first step %v, want [-0.1 0.1]", q.Data)
	}
	for _, bad := range []kernel.AdamW{
		{LR: -1, Beta1: 0.9, Beta2: 0.9, Eps: 1, Step: 1},
		{LR: 1, Beta1: 1, Beta2: 0.9, Eps: 1, Step: 1},
		{LR: 1, Beta1: 0.9, Beta2: float32(math.NaN()), Eps: 1, Step: 1},
		{LR: 1, Beta1: 0.9, Beta2: 0.9, Eps: 0, Step: 1},
		{LR: 1, Beta1: 0.9, Beta2: 0.9, Eps: 1, Step: 0},
		{LR: 1, Beta1: 0.9, Beta2: 0.9, Eps: 1, WeightDecay: -1, Step: 1},
	} {
		if err := kernel.AdamWStep(p, g, m, v, bad); !errors.Is(err, kernel.ErrArgument) {
			t.Errorf("%+v: %v, want ErrArgument", bad, err)
		}
	}
	if err := kernel.AdamWStep(p, kernel.NewMat(4, 3), m, v, h); !errors.Is(err, kernel.ErrShape) {
		t.Errorf("mismatched gradient: %v, want ErrShape", err)
	}
}
