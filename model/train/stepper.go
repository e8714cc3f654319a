package train

import (
	"errors"
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// ErrCursor reports a Seek to a position outside the data.
var ErrCursor = errors.New("train: cursor out of range")

// Stepper is Train cut into single mini-batch updates, for a trainer that
// checkpoints, resumes and averages parameters between steps. Step after
// Step visits exactly the batches Train visits, in the same order and with
// the same arithmetic, so k·BatchesPerEpoch steps from a model equal Train
// for k epochs bit for bit. Unlike Train it has no last epoch: h.Epochs is
// validated but otherwise ignored, and the caller decides when to stop.
//
// Where a Stepper is in its data is its cursor (epoch, batch): the next
// Step runs batch number batch of sgd.Batches(sgd.Order(n, seed, epoch),
// h.BatchSize). The example order depends on nothing but (n, seed, epoch),
// so parameters and a cursor are the whole training state: a new Stepper
// given them through SetModel and Seek continues exactly where the old one
// stopped.
//
// With h.Mu > 0 the FedProx anchor is the model given to NewStepper and
// stays there through SetModel, as Train's stays at the model it started
// from; to resume such a run, build the new Stepper from the same starting
// model, then SetModel and Seek.
//
// A Stepper is not safe for concurrent use.
type Stepper struct {
	d      *data.Dataset
	h      sgd.Hyper
	m      *model.Model
	ls     []layer
	anchor []layer
	n      *net

	cursor
}

// NewStepper returns a Stepper at cursor (0, 0) training a copy of m on d.
func NewStepper(m *model.Model, d *data.Dataset, h sgd.Hyper, seed uint64) (*Stepper, error) {
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("train: new stepper: %w", err)
	}
	if d == nil || d.Len() == 0 {
		return nil, fmt.Errorf("train: new stepper: empty dataset")
	}
	own := m.Clone()
	ls, err := layersOf(own, d.Dim, d.NumClasses)
	if err != nil {
		return nil, fmt.Errorf("train: new stepper: %w", err)
	}
	s := &Stepper{d: d, h: h, m: own, ls: ls,
		n:      newNet(ls, min(h.BatchSize, d.Len())),
		cursor: newCursor(d.Len(), h.BatchSize, seed),
	}
	if h.Mu > 0 {
		// A copy of its own, so that the caller changing m later cannot
		// move the anchor.
		if s.anchor, err = layersOf(m.Clone(), d.Dim, d.NumClasses); err != nil {
			return nil, fmt.Errorf("train: new stepper: %w", err)
		}
	}
	return s, nil
}

// Step runs the batch at the cursor, updates the parameters in place and
// advances the cursor, to the next epoch after its last batch. The metrics
// are the batch's, measured before the update. A non-finite loss is
// reported as ErrDiverged after the update has been applied: the
// parameters are then no longer worth training on.
func (s *Stepper) Step() (Metrics, error) {
	batch := s.peek()
	loss, c, err := s.n.step(s.d, batch, s.anchor, s.h)
	if err != nil {
		return Metrics{}, err
	}
	s.advance()
	met := Metrics{Loss: loss, Accuracy: float64(c) / float64(len(batch)), Examples: len(batch)}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return met, fmt.Errorf("%w: batch loss %v", ErrDiverged, loss)
	}
	return met, nil
}

// Model returns the Stepper's own model, not a copy: each Step changes its
// values in place, so clone it to keep a snapshot, and do not change it
// (use SetModel). Handing it to checkpoint.Saver.Save is fine, since Save
// copies before returning.
func (s *Stepper) Model() *model.Model { return s.m }

// SetModel copies m's parameters into the Stepper, for resuming from a
// checkpoint or taking the result of a parameter average. m must have the
// same tensors as the Stepper's model (ErrArch otherwise) and finite values
// (model.Validate's error otherwise); on error nothing changes. The cursor
// and, with FedProx, the anchor stay where they are.
func (s *Stepper) SetModel(m *model.Model) error { return setParams(s.m, m) }

// setParams copies m's values into dst, whose tensors m must have, all
// finite; on error dst is unchanged.
func setParams(dst, m *model.Model) error {
	if m == nil || !m.Layout().Equal(dst.Layout()) {
		return fmt.Errorf("train: set model: %w: tensors differ from the stepper's", ErrArch)
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("train: set model: %w", err)
	}
	for i, t := range m.Tensors {
		copy(dst.Tensors[i].Data, t.Data)
	}
	return nil
}
