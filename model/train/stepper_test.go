package train_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
	"github.com/fleetlearn/fleetlearn/model/train"
)

// bitsEqual compares two models value by value on their bit patterns, so that
// -0 versus 0 or two different NaNs count as differences.
func bitsEqual(t *testing.T, what string, a, b *model.Model) {
	t.Helper()
	if !a.Layout().Equal(b.Layout()) {
		t.Fatalf("%s: layouts differ", what)
	}
	va, vb := a.Flatten(), b.Flatten()
	for i := range va {
		if math.Float32bits(va[i]) != math.Float32bits(vb[i]) {
			t.Fatalf("%s: parameter %d is %v, want %v", what, i, va[i], vb[i])
		}
	}
}

func stepN(t *testing.T, s *train.Stepper, n int) {
	t.Helper()
	for range n {
		if _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStepperMatchesTrainAndResumes(t *testing.T) {
	// 203 examples in batches of 16: a short last batch in every epoch.
	d := datatest.Synthetic(203, 8, 3, 5)
	init, err := train.InitMLP([]int{8, 16, 3}, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, mu := range []float32{0, 0.1} {
		t.Run(fmt.Sprintf("mu=%v", mu), func(t *testing.T) {
			h := sgd.Hyper{Epochs: 3, BatchSize: 16, LearningRate: 0.2, Mu: mu, EvalBatchSize: 64}
			want, _, err := train.Train(init, d, h, 11)
			if err != nil {
				t.Fatal(err)
			}
			s, err := train.NewStepper(init, d, h, 11)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.BatchesPerEpoch(); got != 13 {
				t.Fatalf("BatchesPerEpoch = %d, want 13", got)
			}
			total := h.Epochs * s.BatchesPerEpoch()
			examples := 0
			for range total {
				met, err := s.Step()
				if err != nil {
					t.Fatal(err)
				}
				examples += met.Examples
			}
			if examples != h.Epochs*d.Len() {
				t.Fatalf("%d examples stepped, want %d", examples, h.Epochs*d.Len())
			}
			if e, b := s.Cursor(); e != h.Epochs || b != 0 {
				t.Fatalf("cursor after %d epochs = (%d, %d)", h.Epochs, e, b)
			}
			bitsEqual(t, "stepper vs Train", s.Model(), want)
			if init.HashHex() == want.HashHex() {
				t.Fatal("training did not change the model")
			}

			// Stop at M (mid-epoch, at an epoch boundary, after one step),
			// carry params and cursor to a new Stepper, finish there.
			for _, m := range []int{1, 7, 13, 20, total - 1} {
				a, err := train.NewStepper(init, d, h, 11)
				if err != nil {
					t.Fatal(err)
				}
				stepN(t, a, m)
				params := a.Model().Clone()
				epoch, batch := a.Cursor()
				stepN(t, a, 1) // the old stepper moving on must not leak into the new one

				b, err := train.NewStepper(init, d, h, 11)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.SetModel(params); err != nil {
					t.Fatal(err)
				}
				if err := b.Seek(epoch, batch); err != nil {
					t.Fatal(err)
				}
				stepN(t, b, total-m)
				bitsEqual(t, fmt.Sprintf("resumed at step %d", m), b.Model(), want)
			}
		})
	}
}

// TestStepperResumeIsSensitive checks that the bitwise comparison above can
// fail: resuming one batch off lands somewhere else.
func TestStepperResumeIsSensitive(t *testing.T) {
	d := datatest.Synthetic(100, 6, 2, 1)
	init, _ := train.InitMLP([]int{6, 2}, 2)
	h := sgd.Hyper{Epochs: 1, BatchSize: 10, LearningRate: 0.1, EvalBatchSize: 10}
	a, err := train.NewStepper(init, d, h, 4)
	if err != nil {
		t.Fatal(err)
	}
	stepN(t, a, 10)
	b, _ := train.NewStepper(init, d, h, 4)
	if err := b.Seek(0, 1); err != nil {
		t.Fatal(err)
	}
	stepN(t, b, 9)
	if a.Model().HashHex() == b.Model().HashHex() {
		t.Fatal("skipping batch 0 gave the same parameters")
	}
	c, _ := train.NewStepper(init, d, h, 5) // another seed, another order
	stepN(t, c, 5)
	a2, _ := train.NewStepper(init, d, h, 4)
	stepN(t, a2, 5)
	if a2.Model().HashHex() == c.Model().HashHex() {
		t.Fatal("another seed gave the same parameters after half an epoch")
	}
}

func TestStepperRefuses(t *testing.T) {
	d := datatest.Synthetic(50, 4, 2, 1)
	init, _ := train.InitMLP([]int{4, 2}, 1)
	h := sgd.Hyper{Epochs: 1, BatchSize: 8, LearningRate: 0.1, EvalBatchSize: 8}
	if _, err := train.NewStepper(init, d, sgd.Hyper{}, 1); !errors.Is(err, sgd.ErrHyper) {
		t.Fatalf("zero hyper: %v", err)
	}
	if _, err := train.NewStepper(init, nil, h, 1); err == nil {
		t.Fatal("nil dataset accepted")
	}
	wrong, _ := train.InitMLP([]int{5, 2}, 1)
	if _, err := train.NewStepper(wrong, d, h, 1); !errors.Is(err, train.ErrArch) {
		t.Fatalf("wrong input width: %v", err)
	}
	s, err := train.NewStepper(init, d, h, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]int{{-1, 0}, {0, -1}, {0, 7}, {3, 100}} {
		if err := s.Seek(c[0], c[1]); !errors.Is(err, train.ErrCursor) {
			t.Errorf("Seek(%d, %d) = %v, want ErrCursor", c[0], c[1], err)
		}
	}
	if err := s.Seek(2, 6); err != nil {
		t.Fatalf("Seek to the last batch of epoch 2: %v", err)
	}
	if _, err := s.Step(); err != nil {
		t.Fatal(err)
	}
	if e, b := s.Cursor(); e != 3 || b != 0 {
		t.Fatalf("cursor after the last batch = (%d, %d), want (3, 0)", e, b)
	}
	before := s.Model().Clone()
	if err := s.SetModel(wrong); !errors.Is(err, train.ErrArch) {
		t.Fatalf("SetModel with other tensors: %v", err)
	}
	nan := before.Clone()
	nan.Tensors[0].Data[0] = float32(math.NaN())
	if err := s.SetModel(nan); !errors.Is(err, model.ErrNonFinite) {
		t.Fatalf("SetModel with NaN: %v", err)
	}
	bitsEqual(t, "after refused SetModel", s.Model(), before)
}
