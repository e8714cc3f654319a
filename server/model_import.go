package server

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// checkParent refuses an import whose parent the registry does not hold,
// and a model that cannot have been derived from that parent: every tensor
// of the parent other than a LoRA adapter must be in the model with the
// same shape. Values may differ (the model was trained further), and the
// model may add tensors (LoRA adapters) or drop the parent's adapters (a
// merge); what lineage must not do is link models of different
// architectures, which would send a lineage query from a pool job to a
// model trained from something else.
func (v *service) checkParent(ctx context.Context, parent string, m *model.Model) error {
	if _, err := v.s.store.Model(ctx, parent); errors.Is(err, backend.ErrNotFound) {
		return fmt.Errorf("parent model %s is not in the registry; fleetlearn model list shows the models: %w", parent, backend.ErrPrecondition)
	} else if err != nil {
		return err
	}
	b, err := v.blobs.Get(ctx, parent)
	if err != nil {
		return fmt.Errorf("parent model %s: %w", parent, err)
	}
	pm, err := model.DecodeSafetensors(b)
	if err != nil {
		return fmt.Errorf("parent model %s: %w", parent, err)
	}
	shapes := make(map[string][]int, len(m.Tensors))
	for _, t := range m.Tensors {
		shapes[t.Name] = t.Shape
	}
	for _, t := range pm.Tensors {
		if lm.IsLoRA(t.Name) {
			continue
		}
		s, ok := shapes[t.Name]
		switch {
		case !ok:
			return invalid("the model has no tensor %s, which its parent %s has: a model derived from it keeps its parent's tensors (LoRA adapters aside); "+
				"import it without --parent if it is another architecture", t.Name, parent)
		case !slices.Equal(s, t.Shape):
			return invalid("tensor %s is %v in the model and %v in its parent %s: a model derived from it keeps its parent's shapes; "+
				"import it without --parent if it is another architecture", t.Name, s, t.Shape, parent)
		}
	}
	return nil
}
