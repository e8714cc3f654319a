package seq

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Param is one tensor of the architecture, in model order.
type Param struct {
	Name  string
	Shape []int
	Layer int
	Bias  bool
}

// ParamList is the architecture's tensors in model order: each layer's
// weight, then its bias.
func (a *Arch) ParamList() []Param {
	var ps []Param
	for i, l := range a.Layers {
		if !l.HasParams() {
			continue
		}
		p := strconv.Itoa(i)
		ps = append(ps, Param{Name: p + ".weight", Shape: l.WeightShape(), Layer: i},
			Param{Name: p + ".bias", Shape: l.BiasShape(), Layer: i, Bias: true})
	}
	return ps
}

// Binding is which of a model's tensors (indices in model order) a layer
// uses; -1 where it has none.
type Binding struct {
	W, B  int
	LoraA int // LoRA adapter A [r, in] of a dense layer
	LoraB int // LoRA adapter B [out, r]
	Rank  int
}

// Bind matches a model's tensors, given by name and shape in model order,
// with the architecture's parameters: every parameter must be there with
// its exact shape, a dense layer may carry a LoRA adapter, and nothing else
// may. It returns one Binding per layer.
func (a *Arch) Bind(names []string, shapes [][]int) ([]Binding, error) {
	if len(names) != len(shapes) {
		return nil, fmt.Errorf("%w: %d names for %d shapes", ErrArch, len(names), len(shapes))
	}
	idx := make(map[string]int, len(names))
	for i, n := range names {
		if _, dup := idx[n]; dup {
			return nil, fmt.Errorf("%w: tensor %q twice", ErrArch, n)
		}
		idx[n] = i
	}
	used := make([]bool, len(names))
	get := func(name string, want []int) (int, error) {
		i, ok := idx[name]
		if !ok {
			return -1, fmt.Errorf("%w: the model has no tensor %q %v that the architecture needs", ErrArch, name, want)
		}
		if !slices.Equal(shapes[i], want) {
			return -1, fmt.Errorf("%w: tensor %q is %v, the architecture needs %v", ErrArch, name, shapes[i], want)
		}
		used[i] = true
		return i, nil
	}
	bs := make([]Binding, len(a.Layers))
	for li, l := range a.Layers {
		b := Binding{W: -1, B: -1, LoraA: -1, LoraB: -1}
		if l.HasParams() {
			p := strconv.Itoa(li)
			var err error
			if b.W, err = get(p+".weight", l.WeightShape()); err != nil {
				return nil, err
			}
			if b.B, err = get(p+".bias", l.BiasShape()); err != nil {
				return nil, err
			}
			ia, hasA := idx[p+".lora_a"]
			_, hasB := idx[p+".lora_b"]
			if hasA || hasB {
				if l.Kind != Dense {
					return nil, fmt.Errorf("%w: layer %d (%s) has a LoRA adapter; only dense layers take one", ErrArch, li, l.Kind)
				}
				if !hasA || !hasB {
					return nil, fmt.Errorf("%w: layer %d has only one of %s.lora_a and %s.lora_b", ErrArch, li, p, p)
				}
				sa := shapes[ia]
				if len(sa) != 2 || sa[0] < 1 || sa[0] > MaxRank {
					return nil, fmt.Errorf("%w: tensor %q is %v, want [r, %d] with r from 1 to %d", ErrArch, p+".lora_a", sa, l.In.Size(), MaxRank)
				}
				b.Rank = sa[0]
				if b.LoraA, err = get(p+".lora_a", []int{b.Rank, l.In.Size()}); err != nil {
					return nil, err
				}
				if b.LoraB, err = get(p+".lora_b", []int{l.Out, b.Rank}); err != nil {
					return nil, err
				}
			}
		}
		bs[li] = b
	}
	for i, u := range used {
		if !u {
			return nil, fmt.Errorf("%w: tensor %q is not a parameter of %s", ErrArch, names[i], clip(a.String()))
		}
	}
	return bs, nil
}

// IsLoRA says whether a tensor name is a LoRA adapter's.
func IsLoRA(name string) bool {
	return strings.HasSuffix(name, ".lora_a") || strings.HasSuffix(name, ".lora_b")
}

// MatShape is the matrix a tensor of shape s is held as by the kernels: the
// first dimension as rows, the rest as columns; rank 0 and 1 are one row.
func MatShape(s []int) (rows, cols int) {
	switch len(s) {
	case 0:
		return 1, 1
	case 1:
		return 1, s[0]
	}
	cols = 1
	for _, d := range s[1:] {
		cols *= d
	}
	return s[0], cols
}
