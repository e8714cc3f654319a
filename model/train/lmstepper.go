package train

import (
	"fmt"
	"math"
	"slices"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/kernel"
	"github.com/fleetlearn/fleetlearn/model/lm"
)

// LMStepper is TrainLM cut into single AdamW steps, for a trainer that
// checkpoints, resumes and averages between steps, as Stepper is for the
// MLP: step after step it visits TrainLM's batches in TrainLM's order with
// the same arithmetic. Its state is the parameters, the cursor and AdamW's
// moments and step count (OptimizerState), so a resumed run that restores
// all three continues bit for bit. h.Epochs and h.MaxSteps are ignored; the
// caller decides when to stop.
type LMStepper struct {
	d  *data.Dataset
	h  lm.Hyper
	m  *model.Model
	k  *kops
	tr *lm.Trainer[*kernel.Mat]

	cursor
}

// NewLMStepper returns an LMStepper at cursor (0, 0) training a copy of the
// language model m on d; trainable lists the parameters that train (empty:
// all).
func NewLMStepper(m *model.Model, d *data.Dataset, h lm.Hyper, seed uint64, trainable []int) (*LMStepper, error) {
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("train: new lm stepper: %w", err)
	}
	own := m.Clone()
	a, ms, err := lmArch(own, d, h)
	if err != nil {
		return nil, fmt.Errorf("train: new lm stepper: %w", err)
	}
	mask, err := lm.Trainable(len(ms), trainable)
	if err != nil {
		return nil, fmt.Errorf("train: new lm stepper: %w", err)
	}
	k := &kops{d: d}
	tr, err := lm.NewTrainer[*kernel.Mat](k, a, ms, mask, d.Len(), h, min(h.BatchSize, d.Len()))
	if err != nil {
		return nil, fmt.Errorf("train: new lm stepper: %w", err)
	}
	return &LMStepper{d: d, h: h, m: own, k: k, tr: tr,
		cursor: newCursor(d.Len(), h.BatchSize, seed)}, nil
}

// Step runs the batch at the cursor and advances it. The metrics are the
// batch's (accuracy per predicted token), before the update.
func (s *LMStepper) Step() (Metrics, error) {
	batch := s.peek()
	loss, c := s.tr.Step(batch)
	if s.k.err != nil {
		return Metrics{}, fmt.Errorf("train: lm step: %w", s.k.err)
	}
	s.advance()
	tokens := len(batch) * s.d.Dim
	met := Metrics{Loss: loss, Accuracy: float64(c) / float64(tokens), Examples: len(batch)}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return met, fmt.Errorf("%w: batch loss %v", ErrDiverged, loss)
	}
	return met, nil
}

// Model returns the stepper's own model, changed in place by each Step.
func (s *LMStepper) Model() *model.Model { return s.m }

// SetModel copies m's parameters in, as Stepper.SetModel does.
func (s *LMStepper) SetModel(m *model.Model) error { return setParams(s.m, m) }

// optimizer-state tensor names: the moments of parameter <name> and the
// step count.
const (
	adamFirst  = "adamw.m."
	adamSecond = "adamw.v."
	adamStep   = "adamw.step"
)

// OptimizerState returns a copy of AdamW's state as a model: tensors
// "adamw.m.<name>" and "adamw.v.<name>" for every trainable parameter and
// "adamw.step" (one value, exact up to lm.MaxSteps), to checkpoint beside
// the parameters.
func (s *LMStepper) OptimizerState() *model.Model { return s.optimizer(slices.Clone[[]float32]) }

// OptimizerView is OptimizerState without the copies: the moments' tensors
// share AdamW's memory and are valid only until the next Step. A caller
// that copies them anyway, as checkpoint.Saver does, saves the training
// loop a copy of twice the trainable parameters.
func (s *LMStepper) OptimizerView() *model.Model {
	return s.optimizer(func(v []float32) []float32 { return v })
}

// optimizer is AdamW's state with each moment's values passed through vals.
func (s *LMStepper) optimizer(vals func([]float32) []float32) *model.Model {
	mm, vv := s.tr.Moments()
	var ts []model.Tensor
	for i, t := range s.m.Tensors {
		if mm[i] == nil {
			continue
		}
		ts = append(ts, model.Tensor{Name: adamFirst + t.Name, Shape: slices.Clone(t.Shape), Data: vals(mm[i].Vals())},
			model.Tensor{Name: adamSecond + t.Name, Shape: slices.Clone(t.Shape), Data: vals(vv[i].Vals())})
	}
	ts = append(ts, model.Tensor{Name: adamStep, Shape: []int{1}, Data: []float32{float32(s.tr.Steps())}})
	return &model.Model{Tensors: ts}
}

// SetOptimizerState restores what OptimizerState returned. A state that does
// not fit the stepper's trainable parameters is refused and changes nothing.
func (s *LMStepper) SetOptimizerState(st *model.Model) error {
	want := s.OptimizerState()
	if st == nil || !st.Layout().Equal(want.Layout()) {
		return fmt.Errorf("train: set optimizer state: %w: tensors differ from the stepper's", ErrArch)
	}
	step := st.Tensors[len(st.Tensors)-1].Data[0]
	if !(step >= 0 && step <= lm.MaxSteps) || step != float32(int(step)) {
		return fmt.Errorf("train: set optimizer state: %w: step %v", ErrArch, step)
	}
	for _, t := range st.Tensors {
		for _, v := range t.Data {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("train: set optimizer state: %w: %s is not finite", ErrArch, t.Name)
			}
		}
	}
	mm, vv := s.tr.Moments()
	j := 0
	for i := range s.m.Tensors {
		if mm[i] == nil {
			continue
		}
		copy(mm[i].Data, st.Tensors[j].Data)
		copy(vv[i].Data, st.Tensors[j+1].Data)
		j += 2
	}
	s.tr.SetSteps(int(step))
	return nil
}

// IsLM says whether m is a language model in package lm's layout (its
// "tok_emb.weight" tensor names it so), as opposed to an MLP.
func IsLM(m *model.Model) bool { return m != nil && tensorOf(m, "tok_emb.weight") != nil }
