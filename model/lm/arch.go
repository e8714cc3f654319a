package lm

import (
	"fmt"
	"strings"
)

// Param names one model parameter and its shape, in the order the host
// holds them.
type Param struct {
	Name  string
	Shape []int
}

// Limits on what Parse accepts, so hostile shapes cannot size buffers.
const (
	MaxVocab   = 1 << 16
	MaxContext = 4096
	MaxDim     = 4096
	MaxLayers  = 64
	MaxRank    = 256
)

// Linear is one Linear layer: weight W [out, in], an optional bias [out] and
// an optional LoRA adapter A [r, in], B [out, r]. Fields are parameter
// indices; -1 means absent.
type Linear struct {
	Name          string // without ".weight"
	W, Bias, A, B int
	In, Out, Rank int
}

// Block is one transformer block's parameter indices.
type Block struct {
	LN1W, LN1B, LN2W, LN2B int
	Q, K, V, Proj, FC, Out Linear
}

// Arch is a parsed model: its sizes and where each tensor is in the
// parameter list.
type Arch struct {
	Vocab, Context, Dim, Hidden, Heads int
	TokEmb, PosEmb, LNFW, LNFB         int
	Blocks                             []Block
	Head                               Linear
	// Params is the parameter list Parse read.
	Params []Param
}

// Parse reads the architecture from the parameter list. heads is the number
// of attention heads (0: Dim/32, at least 1); it must divide Dim. Every
// parameter must be one the architecture names: an unknown tensor is
// refused rather than silently left untrained.
func Parse(params []Param, heads int) (*Arch, error) {
	idx := make(map[string]int, len(params))
	for i, p := range params {
		if _, dup := idx[p.Name]; dup {
			return nil, fmt.Errorf("%w: parameter %q appears twice", ErrArch, p.Name)
		}
		idx[p.Name] = i
	}
	used := make([]bool, len(params))
	get := func(name string, shape ...int) (int, error) {
		i, ok := idx[name]
		if !ok {
			return -1, fmt.Errorf("%w: no parameter %q", ErrArch, name)
		}
		got := params[i].Shape
		if len(got) != len(shape) {
			return -1, fmt.Errorf("%w: %s has shape %v, want %v", ErrArch, name, got, shape)
		}
		for j := range shape {
			if shape[j] >= 0 && got[j] != shape[j] {
				return -1, fmt.Errorf("%w: %s has shape %v, want %v", ErrArch, name, got, shape)
			}
		}
		used[i] = true
		return i, nil
	}
	tok, err := get("tok_emb.weight", -1, -1)
	if err != nil {
		return nil, err
	}
	a := &Arch{Params: params, TokEmb: tok, Vocab: params[tok].Shape[0], Dim: params[tok].Shape[1]}
	switch {
	case a.Vocab < 1 || a.Vocab > MaxVocab:
		return nil, fmt.Errorf("%w: vocabulary %d, want 1..%d", ErrArch, a.Vocab, MaxVocab)
	case a.Dim < 1 || a.Dim > MaxDim:
		return nil, fmt.Errorf("%w: width %d, want 1..%d", ErrArch, a.Dim, MaxDim)
	}
	if a.PosEmb, err = get("pos_emb.weight", -1, a.Dim); err != nil {
		return nil, err
	}
	if a.Context = params[a.PosEmb].Shape[0]; a.Context < 1 || a.Context > MaxContext {
		return nil, fmt.Errorf("%w: context %d, want 1..%d", ErrArch, a.Context, MaxContext)
	}
	if heads == 0 {
		heads = max(1, a.Dim/32)
	}
	if heads < 1 || a.Dim%heads != 0 {
		return nil, fmt.Errorf("%w: %d heads do not divide width %d", ErrArch, heads, a.Dim)
	}
	a.Heads = heads
	linear := func(name string, out, in int, bias bool) (Linear, error) {
		l := Linear{Name: name, Bias: -1, A: -1, B: -1, In: in, Out: out}
		var err error
		if l.W, err = get(name+".weight", out, in); err != nil {
			return l, err
		}
		if l.Out, l.In = params[l.W].Shape[0], params[l.W].Shape[1]; bias {
			if l.Bias, err = get(name+".bias", l.Out); err != nil {
				return l, err
			}
		}
		_, hasA := idx[name+".lora_a"]
		_, hasB := idx[name+".lora_b"]
		if hasA || hasB {
			if l.A, err = get(name+".lora_a", -1, l.In); err != nil {
				return l, err
			}
			l.Rank = params[l.A].Shape[0]
			if l.Rank < 1 || l.Rank > MaxRank {
				return l, fmt.Errorf("%w: %s.lora_a rank %d, want 1..%d", ErrArch, name, l.Rank, MaxRank)
			}
			if l.B, err = get(name+".lora_b", l.Out, l.Rank); err != nil {
				return l, err
			}
		}
		return l, nil
	}
	for i := 0; ; i++ {
		p := fmt.Sprintf("blocks.%d.", i)
		if _, ok := idx[p+"ln1.weight"]; !ok {
			break
		}
		if i >= MaxLayers {
			return nil, fmt.Errorf("%w: more than %d blocks", ErrArch, MaxLayers)
		}
		var b Block
		var err error
		ln := func(name string) int {
			if err != nil {
				return -1
			}
			var j int
			j, err = get(p+name, a.Dim)
			return j
		}
		b.LN1W, b.LN1B, b.LN2W, b.LN2B = ln("ln1.weight"), ln("ln1.bias"), ln("ln2.weight"), ln("ln2.bias")
		if err != nil {
			return nil, err
		}
		for _, l := range []struct {
			dst     *Linear
			name    string
			out, in int
			bias    bool
		}{{&b.Q, "attn.q", a.Dim, a.Dim, false}, {&b.K, "attn.k", a.Dim, a.Dim, false}, {&b.V, "attn.v", a.Dim, a.Dim, false},
			{&b.Proj, "attn.proj", a.Dim, a.Dim, false}, {&b.FC, "mlp.fc", -1, a.Dim, true}} {
			if *l.dst, err = linear(p+l.name, l.out, l.in, l.bias); err != nil {
				return nil, err
			}
		}
		if i == 0 {
			a.Hidden = b.FC.Out
			if a.Hidden < 1 || a.Hidden > 4*MaxDim {
				return nil, fmt.Errorf("%w: MLP width %d, want 1..%d", ErrArch, a.Hidden, 4*MaxDim)
			}
		} else if b.FC.Out != a.Hidden {
			return nil, fmt.Errorf("%w: block %d MLP width %d, block 0 has %d", ErrArch, i, b.FC.Out, a.Hidden)
		}
		if b.Out, err = linear(p+"mlp.proj", a.Dim, a.Hidden, true); err != nil {
			return nil, err
		}
		a.Blocks = append(a.Blocks, b)
	}
	if len(a.Blocks) == 0 {
		return nil, fmt.Errorf("%w: no transformer blocks (blocks.0.ln1.weight missing)", ErrArch)
	}
	if a.LNFW, err = get("ln_f.weight", a.Dim); err != nil {
		return nil, err
	}
	if a.LNFB, err = get("ln_f.bias", a.Dim); err != nil {
		return nil, err
	}
	if a.Head, err = linear("lm_head", a.Vocab, a.Dim, false); err != nil {
		return nil, err
	}
	for i, u := range used {
		if !u {
			return nil, fmt.Errorf("%w: parameter %q is not part of the architecture", ErrArch, params[i].Name)
		}
	}
	return a, nil
}

// Linears lists every Linear layer of the model, blocks first, in order.
func (a *Arch) Linears() []*Linear {
	var ls []*Linear
	for i := range a.Blocks {
		b := &a.Blocks[i]
		ls = append(ls, &b.Q, &b.K, &b.V, &b.Proj, &b.FC, &b.Out)
	}
	return append(ls, &a.Head)
}

// Decayed says whether AdamW's weight decay applies to parameter i: the
// matrices of Linear layers and their adapters, not embeddings, norms or
// biases.
func (a *Arch) Decayed(i int) bool {
	n := a.Params[i].Name
	return (strings.HasSuffix(n, ".weight") && len(a.Params[i].Shape) == 2 && !strings.HasSuffix(n, "_emb.weight")) ||
		IsLoRA(n)
}

// IsLoRA says whether the tensor called name is a LoRA adapter:
// "<layer>.lora_a" or "<layer>.lora_b".
func IsLoRA(name string) bool {
	return strings.HasSuffix(name, ".lora_a") || strings.HasSuffix(name, ".lora_b")
}

// LoRATargets are the Linear layer names an adapter may be put on, as
// suffixes: "attn.q" matches every block's query projection.
var LoRATargets = []string{"attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj", "lm_head"}
