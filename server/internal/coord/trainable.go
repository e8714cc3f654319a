package coord

import (
	"fmt"
	"path"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Bounds on Task.trainable, which an API client writes.
const (
	maxTrainableEntries = 256
	maxTrainableEntry   = 256
	trainableLoRA       = "lora"
)

// Trainable resolves task.trainable against the base model: the ascending
// indices of the tensors that train (nil when every tensor does) and the
// model of just those tensors, sharing base's storage, whose layout is the
// update's. Each entry is a tensor name, a path.Match pattern, or "lora";
// an entry that matches nothing, a malformed pattern, or a list that
// matches every tensor's complement of nothing but nothing at all is
// refused, so a typo cannot silently freeze or train the wrong tensors.
func Trainable(task *pb.Task, base *model.Model) ([]int, *model.Model, error) {
	entries := task.GetTrainable()
	if len(entries) == 0 {
		return nil, base, nil
	}
	if len(entries) > maxTrainableEntries {
		return nil, nil, fmt.Errorf("trainable: %d entries, at most %d", len(entries), maxTrainableEntries)
	}
	on := make([]bool, len(base.Tensors))
	for _, e := range entries {
		if e == "" || len(e) > maxTrainableEntry {
			return nil, nil, fmt.Errorf("trainable: entry %q must be 1 to %d bytes", e, maxTrainableEntry)
		}
		if _, err := path.Match(e, ""); err != nil {
			return nil, nil, fmt.Errorf("trainable: %q is not a valid pattern: %v", e, err)
		}
		hit := false
		for i, t := range base.Tensors {
			var ok bool
			if e == trainableLoRA {
				ok = lm.IsLoRA(t.Name)
			} else {
				ok, _ = path.Match(e, t.Name)
			}
			if ok {
				on[i], hit = true, true
			}
		}
		if !hit {
			what := "no tensor of the base model"
			if e == trainableLoRA {
				what = "no LoRA adapter in the base model (add them with fleetlearn model lora add)"
			}
			return nil, nil, fmt.Errorf("trainable: %q matches %s", e, what)
		}
	}
	var idx []int
	for i := range base.Tensors {
		if on[i] {
			idx = append(idx, i)
		}
	}
	if len(idx) == len(base.Tensors) {
		return nil, base, nil
	}
	sub, err := base.Select(idx)
	return idx, sub, err
}

func planTrainable(idx []int) []uint32 {
	if idx == nil {
		return nil
	}
	out := make([]uint32, len(idx))
	for k, i := range idx {
		out[k] = uint32(i)
	}
	return out
}
